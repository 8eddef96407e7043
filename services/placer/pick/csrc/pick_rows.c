/* The placer's pick in C, for the standard filters and scorers: rescoring a RowTable's rows, and ranking
 * one request's totals. Each function is one loop where the numpy path (filters.py, scorers.py, table.py,
 * framework.py) makes about a hundred calls of a microsecond each, whatever the row count.
 *
 * The numpy code is the reference: every formula here repeats one there, operation for operation and in
 * the same order, so both round alike and the tests can ask for equal decisions and equal totals. Built
 * with -ffp-contract=off for that reason: a fused multiply-add rounds once where numpy rounds twice.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Clock-event reason bits (nvml_bits.py). */
#define POWER_SLOWDOWN (0x4ULL | 0x80ULL)
#define THERMAL_SLOWDOWN (0x20ULL | 0x40ULL | 0x8ULL)
#define HW_THERMAL (0x40ULL | 0x8ULL)
#define DEFAULT_SLOWDOWN_C 87.0

enum { MODEL_AFFINITY = 0, LOAD = 1, BATCH_ISOLATION = 2, THERMAL_HEADROOM = 3, NODE_RESERVE = 4 };
enum { MAX_SCORERS = 8 };

/* The snapshot's columns (numpy bool is one byte), and one model's residency (NULL: model unknown). */
typedef struct {
    const uint8_t *live, *draining, *has_thermal, *resident, *host_copy, *listed;
    const double *deadline_s, *running, *waiting, *max_running, *batch_running, *batch_waiting;
    const double *kv_usage, *memory_free_bytes, *temperature_c, *slowdown_c, *shutdown_c, *trend;
    const uint64_t *reasons;
    const int32_t *zone, *rack, *host;
    const double *reserve_rank;
    double weight_bytes;
} Columns;

/* One RowTable: its arrays, its scorers in weight order, and the constants of the standard config. */
typedef struct {
    uint8_t *passed, *degraded; /* degraded NULL: the class never avoids a degraded GPU */
    uint8_t *seen;              /* scratch: a zeroed byte per row, left zeroed */
    double *base, *scores;      /* scores: [n_scorers][capacity], C order */
    int64_t capacity, n_scorers;
    int64_t scorer[MAX_SCORERS];
    double weight[MAX_SCORERS];
    int64_t batch;          /* the table's class is BATCH (batch_isolation) */
    int64_t thermal_filter; /* not_thermally_critical is among the filters */
    double penalty, near_band_c, degraded_slowdown_c;
    double kv_full_fraction, shutdown_margin_c;                      /* FilterConfig */
    double span_c, horizon_s, scorer_slowdown_c, no_sample, batch_kv; /* ScorerConfig */
    double reserve_fraction;                                          /* ScorerConfig */
} Table;

static double slowdown_of(double reported, double fallback) { return reported > 0.0 ? reported : fallback; }

static int passes(const Columns *c, const Table *t, int64_t r, double now) {
    if (!c->live[r] || !(c->deadline_s[r] > now) || c->draining[r]) return 0; /* live, healthy */
    if (c->resident == NULL) return 0;                                       /* model_loadable */
    int fits = c->memory_free_bytes[r] >= c->weight_bytes;
    if (!(c->resident[r] || c->host_copy[r] || (c->listed[r] && fits))) return 0;
    if (!(c->kv_usage[r] < t->kv_full_fraction) || !(c->resident[r] || fits)) return 0; /* memory */
    if (t->thermal_filter && c->has_thermal[r]) { /* not_thermally_critical */
        double temp = c->temperature_c[r], shutdown = c->shutdown_c[r];
        int below_shutdown = shutdown <= 0.0 || temp < shutdown - t->shutdown_margin_c;
        int hw = (c->reasons[r] & HW_THERMAL) != 0;
        int past = temp >= slowdown_of(c->slowdown_c[r], DEFAULT_SLOWDOWN_C);
        if (!below_shutdown || (hw && past)) return 0;
    }
    return 1;
}

static double score_of(const Columns *c, const Table *t, int64_t kind, int64_t r) {
    switch (kind) {
    case MODEL_AFFINITY:
        if (c->resident == NULL) return 0.0;
        return (double)(c->resident[r] + (c->resident[r] | c->host_copy[r])) * 0.5;
    case LOAD: {
        double busy = c->running[r] + c->waiting[r];
        busy /= c->max_running[r] > 1.0 ? c->max_running[r] : 1.0;
        busy += c->kv_usage[r];
        busy *= -0.5;
        return busy + 1.0;
    }
    case BATCH_ISOLATION: {
        double work = c->running[r] + c->waiting[r];
        double batch = c->batch_running[r] + c->batch_waiting[r];
        double share = work > 0.0 ? batch / work : 0.0;
        if (!t->batch) return share * -1.0 + 1.0;
        if (c->batch_waiting[r] > 0.0 || work >= c->max_running[r] || c->kv_usage[r] >= t->batch_kv) return 0.0;
        return share;
    }
    case NODE_RESERVE: {
        double reserved = c->reserve_rank[r] < t->reserve_fraction ? 1.0 : 0.0;
        return t->batch ? 1.0 - reserved : reserved;
    }
    default: { /* THERMAL_HEADROOM */
        double slowdown = slowdown_of(c->slowdown_c[r], t->scorer_slowdown_c);
        double rising = c->trend[r] > 0.0 ? c->trend[r] : 0.0;
        double score = slowdown - c->temperature_c[r];
        score -= rising * t->horizon_s;
        score /= t->span_c;
        score = score > 0.0 ? score : 0.0;
        score = score < 1.0 ? score : 1.0;
        if (c->reasons[r] & POWER_SLOWDOWN) score = score * 0.25;
        if (c->reasons[r] & THERMAL_SLOWDOWN) score = 0.0;
        if (!c->has_thermal[r]) score = t->no_sample;
        return score;
    }
    }
}

static double clamp(double v) { /* clamp_scores: NaN as 0 */
    v = fmax(v, 0.0);
    return v < 1.0 ? v : 1.0;
}

static int degraded_at(const Columns *c, const Table *t, int64_t r) {
    if (!c->has_thermal[r]) return 0;
    int throttled = (c->reasons[r] & (THERMAL_SLOWDOWN | POWER_SLOWDOWN)) != 0;
    double slowdown = slowdown_of(c->slowdown_c[r], t->degraded_slowdown_c);
    return throttled || c->temperature_c[r] >= slowdown - t->near_band_c;
}

/* Rescores rows[0..n) (or rows 0..n when rows is NULL; repeats allowed, each rescored once) at now. Returns the change in
 * the count of passed rows; *valid_until becomes min(*valid_until, the passed rows' deadlines). */
int64_t rescore_rows(const Columns *c, Table *t, const int64_t *rows, int64_t n, double now, double *valid_until) {
    int64_t delta = 0;
    double until = *valid_until;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows ? rows[i] : i;
        if (rows) { /* a row written many times since is rescored once */
            if (t->seen[r]) continue;
            t->seen[r] = 1;
        }
        int ok = passes(c, t, r, now);
        double total = 0.0;
        for (int64_t s = 0; s < t->n_scorers; s++) {
            double v = clamp(score_of(c, t, t->scorer[s], r));
            t->scores[s * t->capacity + r] = v;
            total += t->weight[s] * v;
        }
        if (t->degraded) {
            int d = degraded_at(c, t, r);
            total -= t->penalty * (double)d;
            t->degraded[r] = (uint8_t)d;
        }
        delta += ok - t->passed[r];
        t->passed[r] = (uint8_t)ok;
        t->base[r] = ok ? total : -INFINITY;
        if (ok && c->deadline_s[r] < until) until = c->deadline_s[r];
    }
    if (rows)
        for (int64_t i = 0; i < n; i++) t->seen[rows[i]] = 0;
    *valid_until = until;
    return delta;
}

/* One request's ranking. Its scorers, in weight order, are of two kinds: TOPOLOGY (the standard
 * topology scorer: the caller's label codes, -1 where unknown, and the rows carrying each) and SPARSE
 * (any other: the Python scorer wrote values[rows[i]], repeats allowed). Scratch, all per row and left
 * as found: touched and seen (zeroed bytes), adjusted (a total wherever touched), and touched_rows. */
enum { TOPOLOGY = 0, SPARSE = 1, MAX_REQUEST = 4 };
typedef struct {
    int64_t n_request;
    int64_t kind[MAX_REQUEST];
    double weight[MAX_REQUEST];
    const int64_t *rows[MAX_REQUEST];
    int64_t n_rows[MAX_REQUEST];
    const double *values[MAX_REQUEST];
    int32_t zone, rack, host;
    const int64_t *labelled[3];
    int64_t n_labelled[3];
    const int64_t *excluded;
    int64_t n_excluded;
    uint8_t *touched, *seen;
    double *adjusted;
    int64_t *touched_rows;
} Request;

/* The topology scorer: 1.0 on the caller's host, 0.7 in its rack, 0.4 in its zone, else 0. */
static const double LEVEL_SCORE[3] = {0.4, 0.7, 1.0}; /* zone, rack, host */
static double topology_of(const Columns *c, const Request *q, int64_t r) {
    double v = (q->zone != -1 && c->zone[r] == q->zone) ? LEVEL_SCORE[0] : 0.0;
    v = (q->rack != -1 && c->rack[r] == q->rack) ? LEVEL_SCORE[1] : v;
    return (q->host != -1 && c->host[r] == q->host) ? LEVEL_SCORE[2] : v;
}

/* Row r's total so far, adjusted from its base on first touch. */
static double *adjusted_at(const Request *q, const double *base, int64_t r, int64_t *n_touched) {
    if (!q->touched[r]) {
        q->touched[r] = 1;
        q->adjusted[r] = base[r];
        q->touched_rows[(*n_touched)++] = r;
    }
    return &q->adjusted[r];
}

/* Adds weight * values[r] (or * value where values is NULL) to each row r of rows once: numpy's fancy
 * += adds a repeated row once, and a row already seen this scorer is skipped. */
static void add_once(const Request *q, const double *base, int64_t n, const int64_t *rows, int64_t n_rows,
                     const double *values, double value, double weight, int64_t *n_touched) {
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t r = rows[i];
        if (r < 0 || r >= n || q->seen[r]) continue; /* not a row: a scorer's bug must not write past */
        q->seen[r] = 1;
        *adjusted_at(q, base, r, n_touched) += (values ? values[r] : value) * weight;
    }
}

static void unsee(const Request *q, int64_t n, const int64_t *rows, int64_t n_rows) {
    for (int64_t i = 0; i < n_rows; i++)
        if (rows[i] >= 0 && rows[i] < n) q->seen[rows[i]] = 0;
}

/* The ranking _leaders returns, of base plus the request's scorers (-inf where excluded): every row
 * within tolerance of the best, in row order, if more than runners_up tie; else the best
 * min(runners_up + 1, finite rows), equal totals in row order. Fills leaders, their totals and their
 * topology scores; returns how many leaders, *ties how many tie with the best.
 *
 * Only the rows a request scorer touches get a total of their own; one pass then reads every other
 * row's base as it is, keeping the best runners_up + 1 sorted by insertion (a row below the last one
 * kept costs a compare). A second pass runs only when all of those tie. */
int64_t rank_rows(const Columns *c, const double *base, int64_t n, const Request *q, double tolerance,
                  int64_t runners_up, double *leader_totals, int64_t *leaders, double *topo, int64_t *ties) {
    int64_t n_touched = 0;
    for (int64_t k = 0; k < q->n_request; k++) { /* scorer by scorer: each row adds them in weight order */
        if (q->kind[k] == TOPOLOGY) { /* host, rack, zone: a row's first level is its score */
            for (int level = 2; level >= 0; level--)
                add_once(q, base, n, q->labelled[level], q->n_labelled[level], NULL, LEVEL_SCORE[level],
                         q->weight[k], &n_touched);
            for (int level = 0; level < 3; level++) unsee(q, n, q->labelled[level], q->n_labelled[level]);
        } else {
            add_once(q, base, n, q->rows[k], q->n_rows[k], q->values[k], 0.0, q->weight[k], &n_touched);
            unsee(q, n, q->rows[k], q->n_rows[k]);
        }
    }
    for (int64_t e = 0; e < q->n_excluded; e++) *adjusted_at(q, base, q->excluded[e], &n_touched) = -INFINITY;
    const uint8_t *touched = q->touched;
    const double *adjusted = q->adjusted;
    int64_t kept = 0, limit = runners_up + 1;
    double last = -INFINITY; /* the total of the last row kept, once limit are */
    for (int64_t r = 0; r < n; r++) {
        double t = touched[r] ? adjusted[r] : base[r];
        if (kept == limit ? t <= last : t == -INFINITY) continue; /* later rows rank after equal ones */
        int64_t i = kept < limit ? kept++ : kept - 1;
        while (i > 0 && t > leader_totals[i - 1]) {
            leaders[i] = leaders[i - 1];
            leader_totals[i] = leader_totals[i - 1];
            i--;
        }
        leaders[i] = r;
        leader_totals[i] = t;
        last = leader_totals[kept - 1];
    }
    int64_t tied = 0;
    if (kept > 0) {
        double floor = leader_totals[0] - tolerance;
        while (tied < kept && leader_totals[tied] >= floor) tied++;
        if (tied == limit) { /* more may tie than were kept: every tie, in row order */
            tied = 0;
            for (int64_t r = 0; r < n; r++) {
                double t = touched[r] ? adjusted[r] : base[r];
                leaders[tied] = r;
                leader_totals[tied] = t;
                tied += t >= floor;
            }
            kept = tied;
        }
    }
    for (int64_t i = 0; i < n_touched; i++) q->touched[q->touched_rows[i]] = 0;
    *ties = tied;
    for (int64_t i = 0; i < kept; i++) topo[i] = topology_of(c, q, leaders[i]);
    return kept;
}
