/* prefix + load's ranking (sim/policies.py's _PrefixLoad) in one call: llm-d's queue scorer over the
 * fleet's range, its prefix-cache scorer on the rows its index matched, the best candidate within the
 * tie tolerance drawn in row order. numpy made a dozen calls of a microsecond or more for this on every
 * pick, most of the baseline's run. Every operation is numpy's, in numpy's order (no fused
 * multiply-add: built with -ffp-contract=off), so the totals and the decision are the same;
 * tests/sim/test_prefix_load.py holds both paths to the Picker's decisions. */
#include <stdint.h>

enum { EXCLUDED = 1, MATCHED = 2 }; /* mask */

typedef struct {
    const double *waiting;
    const uint8_t *passed;
    const uint8_t *mask;
    const double *prefix_score;
    double low, high, queue_weight;
} Ranking;

static inline int candidate(const Ranking *k, int64_t r) { return k->passed[r] && k->mask[r] != EXCLUDED; }

/* 2 x queue + 3 x prefix, as the numpy path forms it: (high - w) / (high - low) * 2, then + the prefix */
static inline double total_at(const Ranking *k, int64_t r) {
    double total = k->high == k->low ? 1.0 * k->queue_weight
                                     : (k->high - k->waiting[r]) / (k->high - k->low) * k->queue_weight;
    return k->mask[r] == MATCHED ? total + k->prefix_score[r] : total;
}

/* The chosen row, or -1 when no candidate is left. waiting: every row's queue (n rows, the range is the
 * fleet's); passed: the filters' verdict per row; excluded: rows the request leaves out; prefix_rows /
 * held: the rows the index holds some of the prompt on (each once) and their blocks, of total_blocks;
 * uniform: the tie-break's next draw, used only where several rows tie (then *drew is 1); *held_out:
 * the chosen row's blocks. Scratch: mask (n zeroed bytes, left zeroed) and prefix_score (n doubles). */
int64_t rank_prefix_load(const double *waiting, const uint8_t *passed, int64_t n, const int64_t *excluded,
                         int64_t n_excluded, const int64_t *prefix_rows, const int64_t *held, int64_t n_prefix,
                         int64_t total_blocks, double queue_weight, double prefix_weight, double tolerance,
                         double uniform, uint8_t *mask, double *prefix_score, int64_t *drew, int64_t *held_out) {
    Ranking k = {waiting, passed, mask, prefix_score, 0.0, 0.0, queue_weight};
    for (int64_t r = 0; r < n; r++) { /* numpy's min(initial=0.0) and max(initial=0.0) */
        if (waiting[r] < k.low) k.low = waiting[r];
        if (waiting[r] > k.high) k.high = waiting[r];
    }
    for (int64_t i = 0; i < n_excluded; i++) mask[excluded[i]] = EXCLUDED;
    for (int64_t i = 0; i < n_prefix; i++) {
        int64_t r = prefix_rows[i];
        if (mask[r] != EXCLUDED) mask[r] = MATCHED;
        prefix_score[r] = (double)held[i] / (double)total_blocks * prefix_weight;
    }
    double best = -1.0 / 0.0;
    int any = 0;
    for (int64_t r = 0; r < n; r++) {
        if (!candidate(&k, r)) continue;
        double total = total_at(&k, r);
        if (!any || total > best) best = total;
        any = 1;
    }
    int64_t chosen = -1, ties = 0;
    if (any) {
        double floor = best - tolerance;
        for (int64_t r = 0; r < n; r++) ties += candidate(&k, r) && total_at(&k, r) >= floor;
        int64_t position = 0;
        if (ties > 1) { /* TieBreak.draw: min(int(u x n), n - 1) */
            position = (int64_t)(uniform * (double)ties);
            if (position > ties - 1) position = ties - 1;
        }
        for (int64_t r = 0, seen = 0; r < n; r++) {
            if (candidate(&k, r) && total_at(&k, r) >= floor && seen++ == position) {
                chosen = r;
                break;
            }
        }
    }
    *drew = ties > 1;
    *held_out = 0;
    for (int64_t i = 0; i < n_prefix; i++) {
        if (prefix_rows[i] == chosen) *held_out = held[i];
        mask[prefix_rows[i]] = 0;
    }
    for (int64_t i = 0; i < n_excluded; i++) mask[excluded[i]] = 0;
    return chosen;
}
