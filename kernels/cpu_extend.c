/* Extend (prefill) attention on CPU: each request's new tokens, causally, over its whole context
 * (cached prefix + the new tokens, whose K / V the caller stored already), K / V read from the
 * cache through the request's row of the slot table, an online softmax per block of keys.
 *
 *   work item = (request, KV head g, tile of TQ new tokens); its rows are the tile's tokens times
 *   the G query heads that share KV head g (R = TQ * G rows, token-major):
 *
 *       for each block of BK keys the tile's last token can see
 *           kt[d][j] = K[slot(k0 + j), g, d]         (transposed, fp32)
 *           s[r][j]  = q[r] . kt[:, j]               (4 rows x BK keys per pass: register tiles)
 *           mask keys after the row's own position, online softmax in base 2
 *           acc[r]  += sum_j p[r][j] * V[slot(k0 + j), g]
 *
 * The products are register tiles written with the compiler's vector extension (VEC floats), so
 * each K / V element loaded is used by 4 (scores) or 2 (values) rows. Items run on `nthreads`
 * OpenMP threads, the heavier last tiles of a request first.
 *
 * Contract (checked by the Python caller, kernels/native.py): q is fp32 [tokens, num_heads,
 * head_dim] contiguous, pre-scaled by nothing (`scale` is the softmax scale); caches are
 * [slots, num_kv_heads, head_dim] contiguous; request b's context is slot-table row rows[b],
 * entries 0 .. prefix_lens[b] + extend_lens[b] (int32, or int64 when table_wide), its new
 * tokens are q rows q_starts[b] ..; num_heads = G * num_kv_heads, G <= MAX_GROUP, head_dim a
 * multiple of VEC up to MAX_HEAD_DIM. Writes those rows of out (fp32, shaped as q); other rows
 * are left as they are. Returns 0; -2, computing nothing, when a request's row, lengths, q rows
 * or slot ids fall outside `bounds` ({table rows, table columns, q rows, cache slots}); -1 when a
 * thread could not allocate its scratch (out is then incomplete).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

#define VEC 16            /* floats in one vector register tile */
#define BK 32             /* keys per block: two vectors */
#define MAX_ROWS 128      /* rows of a tile: TQ * G */
#define MAX_GROUP 64
#define MAX_HEAD_DIM 256
#define LOG2E 1.4426950408889634f
#define MASKED (-1e30f)   /* a masked score (finite: -ffast-math assumes no infinities) */

typedef float vf __attribute__((vector_size(VEC * sizeof(float))));

typedef struct {
    float *qt;   /* [MAX_ROWS][D] the tile's queries, scaled by scale * log2(e) */
    float *acc;  /* [MAX_ROWS][D] */
    float *kt;   /* [D][BK] */
    float *vb;   /* [BK][D] */
    float *s;    /* [MAX_ROWS][BK] */
    float m[MAX_ROWS], l[MAX_ROWS];
} Scratch;

static inline int64_t slot_at(const void *table, int wide, int64_t i) {
    return wide ? ((const int64_t *)table)[i] : (int64_t)((const int32_t *)table)[i];
}

/* Whether every request's row, lengths, q rows and slots lie inside what `bounds` gives:
 * {table rows, table columns, q rows, cache slots}. One pass over the contexts' slot ids. */
static int layout_ok(const void *table, int64_t table_stride, int wide, const int64_t *rows,
                     const int64_t *prefix_lens, const int64_t *extend_lens, const int64_t *q_starts,
                     int64_t batch, const int64_t *bounds) {
    for (int64_t b = 0; b < batch; b++) {
        const int64_t n = prefix_lens[b] + extend_lens[b];
        if (rows[b] < 0 || rows[b] >= bounds[0] || prefix_lens[b] < 0 || extend_lens[b] < 0 || n > bounds[1] ||
            q_starts[b] < 0 || q_starts[b] + extend_lens[b] > bounds[2])
            return 0;
        if (extend_lens[b] == 0) continue;
        const char *tb = (const char *)table + rows[b] * table_stride * (wide ? 8 : 4);
        for (int64_t i = 0; i < n; i++) {
            const int64_t slot = slot_at(tb, wide, i);
            if (slot < 0 || slot >= bounds[3]) return 0;
        }
    }
    return 1;
}

/* s[r][0..BK) = qt[r] . kt[:, 0..BK) for rows r0 .. r0 + 3 */
static inline __attribute__((always_inline)) void scores4(const float *qt, const float *kt, float *s,
                                                          int64_t r0, const int64_t D) {
    vf a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0}, e0 = {0}, e1 = {0};
    const float *q0 = qt + r0 * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
    for (int64_t d = 0; d < D; d++) {
        const vf k0 = *(const vf *)(kt + d * BK), k1 = *(const vf *)(kt + d * BK + VEC);
        a0 += q0[d] * k0; a1 += q0[d] * k1;
        b0 += q1[d] * k0; b1 += q1[d] * k1;
        c0 += q2[d] * k0; c1 += q2[d] * k1;
        e0 += q3[d] * k0; e1 += q3[d] * k1;
    }
    vf *o = (vf *)(s + r0 * BK);
    o[0] = a0; o[1] = a1; o[2] = b0; o[3] = b1; o[4] = c0; o[5] = c1; o[6] = e0; o[7] = e1;
}

/* acc[r] += sum_j<nb s[r][j] * vb[j] for rows r0, r0 + 1 */
static inline __attribute__((always_inline)) void values2(const float *s, const float *vb, float *acc,
                                                          int64_t r0, int64_t nb, const int64_t D) {
    enum { MAX_DV = MAX_HEAD_DIM / VEC };
    const int64_t DV = D / VEC;
    vf x[MAX_DV], y[MAX_DV];
    vf *ax = (vf *)(acc + r0 * D), *ay = (vf *)(acc + (r0 + 1) * D);
    for (int64_t c = 0; c < DV; c++) { x[c] = ax[c]; y[c] = ay[c]; }
    const float *sx = s + r0 * BK, *sy = sx + BK;
    for (int64_t j = 0; j < nb; j++) {
        const vf *v = (const vf *)(vb + j * D);
        const float p = sx[j], q = sy[j];
        for (int64_t c = 0; c < DV; c++) { x[c] += p * v[c]; y[c] += q * v[c]; }
    }
    for (int64_t c = 0; c < DV; c++) { ax[c] = x[c]; ay[c] = y[c]; }
}

#define DEFINE_EXTEND(NAME, T, LOAD)                                                                   \
    /* One work item: tokens i0 .. i0 + nt of a request (prefix `prefix`) on KV head g. */            \
    static inline __attribute__((always_inline)) void NAME##_tile(                                    \
        Scratch *w, const float *q, const T *kc, const T *vc, const void *table, int wide,            \
        int64_t prefix, int64_t i0, int64_t nt, int64_t g, int64_t H, int64_t KVH, const int64_t D,   \
        float scale, float *out) {                                                                    \
        const int64_t G = H / KVH, R = nt * G, R4 = (R + 3) & ~(int64_t)3, row = KVH * D;             \
        const float qs = scale * LOG2E;                                                               \
        float *qt = w->qt, *acc = w->acc, *kt = w->kt, *vb = w->vb, *s = w->s;                        \
        for (int64_t r = 0; r < R4; r++) {                                                            \
            float *dst = qt + r * D;                                                                  \
            if (r < R) {                                                                              \
                const float *src = q + (i0 + r / G) * H * D + (g * G + r % G) * D;                    \
                for (int64_t d = 0; d < D; d++) dst[d] = src[d] * qs;                                 \
            } else {                                                                                  \
                memset(dst, 0, sizeof(float) * D);                                                    \
            }                                                                                         \
            w->m[r] = MASKED;                                                                         \
            w->l[r] = 0.0f;                                                                           \
        }                                                                                             \
        memset(acc, 0, sizeof(float) * R4 * D);                                                       \
        const int64_t first_pos = prefix + i0, n = prefix + i0 + nt; /* keys the tile can see */      \
        for (int64_t k0 = 0; k0 < n; k0 += BK) {                                                      \
            const int64_t nb = n - k0 < BK ? n - k0 : BK;                                             \
            for (int64_t j = k0 + BK; j < k0 + 2 * BK && j < n; j++) { /* the next block's rows */    \
                const int64_t slot = slot_at(table, wide, j);                                         \
                for (int64_t c = 0; c < D * (int64_t)sizeof(T); c += 64) {                            \
                    __builtin_prefetch((const char *)(kc + slot * row + g * D) + c);                  \
                    __builtin_prefetch((const char *)(vc + slot * row + g * D) + c);                  \
                }                                                                                     \
            }                                                                                         \
            for (int64_t j = 0; j < nb; j++) {                                                        \
                const int64_t slot = slot_at(table, wide, k0 + j);                                    \
                const T *k = kc + slot * row + g * D, *v = vc + slot * row + g * D;                   \
                for (int64_t d = 0; d < D; d++) vb[j * D + d] = LOAD(v, d);                           \
                for (int64_t d = 0; d < D; d++) kt[d * BK + j] = LOAD(k, d);                          \
            }                                                                                         \
            for (int64_t j = nb; j < BK; j++)                                                         \
                for (int64_t d = 0; d < D; d++) kt[d * BK + j] = 0.0f;                                \
            for (int64_t r = 0; r < R4; r += 4) scores4(qt, kt, s, r, D);                             \
            const int diagonal = k0 + BK - 1 > first_pos;                                             \
            for (int64_t r = 0; r < R4; r++) {                                                        \
                float *sr = s + r * BK;                                                               \
                if (diagonal) {                                                                       \
                    const int64_t visible = (r < R ? first_pos + r / G : n - 1) - k0 + 1;             \
                    for (int64_t j = visible < 0 ? 0 : visible; j < BK; j++) sr[j] = MASKED;          \
                }                                                                                     \
                float bm = sr[0];                                                                     \
                for (int64_t j = 1; j < BK; j++) bm = sr[j] > bm ? sr[j] : bm;                        \
                const float m_new = bm > w->m[r] ? bm : w->m[r];                                      \
                float sum = 0.0f;                                                                     \
                for (int64_t j = 0; j < BK; j++) {                                                    \
                    sr[j] = exp2f(sr[j] - m_new);                                                     \
                    sum += sr[j];                                                                     \
                }                                                                                     \
                if (m_new > w->m[r]) {                                                                \
                    const float c = exp2f(w->m[r] - m_new);                                           \
                    w->l[r] *= c;                                                                     \
                    float *ar = acc + r * D;                                                          \
                    for (int64_t d = 0; d < D; d++) ar[d] *= c;                                       \
                    w->m[r] = m_new;                                                                  \
                }                                                                                     \
                w->l[r] += sum;                                                                       \
            }                                                                                         \
            for (int64_t r = 0; r < R4; r += 2) values2(s, vb, acc, r, nb, D);                        \
        }                                                                                             \
        for (int64_t r = 0; r < R; r++) {                                                             \
            float *dst = out + (i0 + r / G) * H * D + (g * G + r % G) * D;                            \
            const float inv = 1.0f / w->l[r], *ar = acc + r * D;                                      \
            for (int64_t d = 0; d < D; d++) dst[d] = ar[d] * inv;                                     \
        }                                                                                             \
    }                                                                                                 \
                                                                                                      \
    int NAME(const float *q, const T *kc, const T *vc, const void *table, int64_t table_stride,       \
              int wide, const int64_t *rows, const int64_t *prefix_lens, const int64_t *extend_lens,  \
              const int64_t *q_starts, int64_t batch, int64_t num_heads, int64_t num_kv_heads,        \
              int64_t head_dim, float scale, float *out, int nthreads, const int64_t *bounds) {       \
        const int64_t G = num_heads / num_kv_heads, HD = num_heads * head_dim;                        \
        if (!layout_ok(table, table_stride, wide, rows, prefix_lens, extend_lens, q_starts, batch,    \
                       bounds))                                                                       \
            return -2;                                                                                \
        const int64_t tq = MAX_ROWS / G < 32 ? MAX_ROWS / G : 32; /* tokens per tile */               \
        int64_t *item_start = malloc(sizeof(int64_t) * (batch + 1));                                  \
        if (item_start == NULL) return -1;                                                            \
        item_start[0] = 0;                                                                            \
        for (int64_t b = 0; b < batch; b++)                                                           \
            item_start[b + 1] = item_start[b] + (extend_lens[b] + tq - 1) / tq * num_kv_heads;        \
        const int64_t items = item_start[batch];                                                      \
        int failed = 0;                                                                               \
        _Pragma("omp parallel num_threads(nthreads) if (nthreads > 1 && items > 1)")                  \
        {                                                                                             \
            Scratch w = {0};                                                                          \
            const size_t big = sizeof(float) * MAX_ROWS * head_dim;                                   \
            const size_t blk = sizeof(float) * BK * head_dim;                                         \
            char *mem = aligned_alloc(64, 2 * big + 2 * blk + sizeof(float) * MAX_ROWS * BK);         \
            if (mem == NULL) {                                                                        \
                _Pragma("omp atomic write")                                                           \
                failed = 1;                                                                           \
            } else {                                                                                  \
                w.qt = (float *)mem;                                                                  \
                w.acc = (float *)(mem + big);                                                         \
                w.kt = (float *)(mem + 2 * big);                                                      \
                w.vb = (float *)(mem + 2 * big + blk);                                                \
                w.s = (float *)(mem + 2 * big + 2 * blk);                                             \
            }                                                                                         \
            const unsigned csr = enter_ftz();                                                         \
            int64_t b = 0;                                                                            \
            _Pragma("omp for schedule(dynamic, 1)")                                                   \
            for (int64_t it = 0; it < items; it++) {                                                  \
                if (mem == NULL) continue;                                                            \
                while (item_start[b + 1] <= it) b++;                                                  \
                while (item_start[b] > it) b--;                                                       \
                const int64_t local = it - item_start[b], ntiles = (extend_lens[b] + tq - 1) / tq;    \
                const int64_t tile = ntiles - 1 - local / num_kv_heads, g = local % num_kv_heads;     \
                const int64_t i0 = tile * tq;                                                         \
                const int64_t nt = extend_lens[b] - i0 < tq ? extend_lens[b] - i0 : tq;               \
                const char *tb = (const char *)table + rows[b] * table_stride * (wide ? 8 : 4);       \
                const float *qb = q + q_starts[b] * HD;                                               \
                float *ob = out + q_starts[b] * HD;                                                   \
                /* the common head sizes as constants: their loops over head_dim unroll */            \
                if (head_dim == 64)                                                                   \
                    NAME##_tile(&w, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,       \
                                num_kv_heads, 64, scale, ob);                                         \
                else if (head_dim == 128)                                                             \
                    NAME##_tile(&w, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,       \
                                num_kv_heads, 128, scale, ob);                                        \
                else                                                                                  \
                    NAME##_tile(&w, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,       \
                                num_kv_heads, head_dim, scale, ob);                                   \
            }                                                                                         \
            leave_ftz(csr);                                                                           \
            free(mem);                                                                                \
        }                                                                                             \
        free(item_start);                                                                             \
        return failed ? -1 : 0;                                                                       \
    }

DEFINE_EXTEND(extend_f32, float, load_f32)
DEFINE_EXTEND(extend_bf16, uint16_t, load_bf16)
