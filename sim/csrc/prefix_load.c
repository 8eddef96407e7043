/* prefix + load's pick (sim/policies.py's _PrefixLoad) in one call: llm-d's prefix index walked along
 * the prompt's chain (sim/llm_d_prefix.py's LlmDPrefixIndex.match), its queue scorer over the fleet's
 * range, its prefix-cache scorer on the rows the walk matched, the best candidate within the tie
 * tolerance drawn in row order. numpy made two dozen calls of a microsecond or more for this on every
 * pick, most of the baseline's run. Every operation is numpy's, in numpy's order (no fused
 * multiply-add: built with -ffp-contract=off), so the blocks, the totals and the decision are the same;
 * tests/sim/test_prefix_load.py holds both paths to the Picker's decisions. */
#include <stdint.h>

enum { EXCLUDED = 1, MATCHED = 2 }; /* mask */
enum { BLOCK_TOKENS = 16, MAX_BLOCKS = 256 }; /* llm_d_prefix.py's */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* llm_d_prefix.blocks: whole blocks of a prompt's first tokens (never negative here). */
static inline int64_t blocks_of(int64_t tokens) { return min64(tokens / BLOCK_TOKENS, MAX_BLOCKS); }

/* LlmDPrefixIndex.match over the chain's elements the index knows, in order up to the first it does
 * not: element e is chain[4e..4e+3] = (address of its servers' rows, -1 for one not in the snapshot;
 * address of how far along it each was sent; how many servers; where the element ends in the prompt,
 * in tokens). A server's blocks on an element are min(sent, end) / 16, at most 256; a row's match is
 * its server's on the deepest element walked, whatever it is there (numpy's unique over the reversed
 * elements); the walk ends after an element no server holds to its end. The rows holding some of the
 * prompt, each once, go into rows[] and their blocks into held_at[row]; returns how many. mask: zeroed
 * bytes per row, left zeroed. */
int64_t match_prefix(const int64_t *chain, int64_t n_elements, int64_t *rows, int64_t *held_at,
                     uint8_t *mask) {
    int64_t n_rows = 0;
    for (int64_t e = 0; e < n_elements; e++) {
        const int64_t *row_of = (const int64_t *)(intptr_t)chain[4 * e];
        const int64_t *sent = (const int64_t *)(intptr_t)chain[4 * e + 1];
        int64_t servers = chain[4 * e + 2], end = chain[4 * e + 3], most = 0;
        for (int64_t j = 0; j < servers; j++) {
            int64_t held = min64(min64(sent[j], end) / BLOCK_TOKENS, MAX_BLOCKS);
            if (j == 0 || held > most) most = held;
            int64_t r = row_of[j];
            if (r < 0) continue;
            if (!mask[r]) { /* listed once */
                mask[r] = 1;
                rows[n_rows++] = r;
            }
            held_at[r] = held;
        }
        if (most < blocks_of(end)) break;
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t r = rows[i];
        mask[r] = 0;
        if (held_at[r] > 0) rows[kept++] = r;
    }
    return kept;
}

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
 * fleet's); passed: the filters' verdict per row; excluded: rows the request leaves out; chain /
 * n_elements: the index's elements along the prompt (match_prefix above), of total_blocks; uniform: the
 * tie-break's next draw, used only where several rows tie (then *drew is 1); *held_out: the chosen
 * row's blocks. Scratch, per row: mask (zeroed bytes, left zeroed), prefix_score (doubles), held_at
 * (int64) and rows (int64). */
int64_t rank_prefix_load(const double *waiting, const uint8_t *passed, int64_t n, const int64_t *excluded,
                         int64_t n_excluded, const int64_t *chain, int64_t n_elements, int64_t total_blocks,
                         double queue_weight, double prefix_weight, double tolerance, double uniform,
                         uint8_t *mask, double *prefix_score, int64_t *held_at, int64_t *rows, int64_t *drew,
                         int64_t *held_out) {
    Ranking k = {waiting, passed, mask, prefix_score, 0.0, 0.0, queue_weight};
    for (int64_t r = 0; r < n; r++) { /* numpy's min(initial=0.0) and max(initial=0.0) */
        if (waiting[r] < k.low) k.low = waiting[r];
        if (waiting[r] > k.high) k.high = waiting[r];
    }
    int64_t n_prefix = match_prefix(chain, n_elements, rows, held_at, mask);
    for (int64_t i = 0; i < n_excluded; i++) mask[excluded[i]] = EXCLUDED;
    for (int64_t i = 0; i < n_prefix; i++) {
        int64_t r = rows[i];
        if (mask[r] != EXCLUDED) mask[r] = MATCHED;
        prefix_score[r] = (double)held_at[r] / (double)total_blocks * prefix_weight;
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
        if (rows[i] == chosen) *held_out = held_at[rows[i]];
        mask[rows[i]] = 0;
    }
    for (int64_t i = 0; i < n_excluded; i++) mask[excluded[i]] = 0;
    return chosen;
}
