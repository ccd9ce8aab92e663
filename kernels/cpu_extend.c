/* Extend (prefill) attention on CPU: each request's new tokens, causally, over its whole context
 * (cached prefix + the new tokens, whose K / V the caller stored already), K / V read from the
 * cache through the request's row of the slot table, an online softmax per block of keys.
 *
 *   work item = (request, KV head g, tile of TQ new tokens); its rows are the tile's tokens times
 *   the G query heads that share KV head g (R = TQ * G rows, token-major), held "rows in lanes":
 *   one vector holds one entry of VEC rows (qT[d][r], accT[d][r], sT[j][r]):
 *
 *       for each block of BK keys the tile's last token can see
 *           sT[j][r]  = sum_d qT[d][r] * K[slot(k0 + j), g, d]   (each K entry broadcast)
 *           mask keys after the row's own position, online softmax in base 2 (per lane)
 *           accT[d][r] += sum_j sT[j][r] * V[slot(k0 + j), g, d] (each V entry broadcast)
 *
 * The keys' and values' entries are read straight from the cache rows and broadcast, so nothing
 * is transposed per key; register tiles of KJ keys (or DJ value entries) by VJ row vectors use
 * each broadcast VJ times and each row vector KJ (DJ) times. The scores of bf16 caches, on CPUs
 * with AVX512-BF16, sum pairs of bf16 products per instruction (twice the products of an fp32
 * FMA): the queries as bf16 pairs (exact for a bf16 model's queries; the softmax scale applied
 * to the fp32 scores), the key pairs read as they lie in the cache; each product is exact and
 * the sums are fp32. The softmax weights stay fp32 for the values: rounded to bf16 (as the
 * Triton kernel's `p.to(v.dtype)`), they moved a tiny model's greedy tokens off what the decode
 * kernel gives the same positions (jump-forward on and off then disagreed). The other products
 * are fp32 vector FMAs written with the compiler's vector extension. Items run on `nthreads`
 * OpenMP threads, the heavier last tiles of a request first.
 *
 * Contract (checked by the Python caller, kernels/native.py): q is fp32 [tokens, num_heads,
 * head_dim] contiguous, pre-scaled by nothing (`scale` is the softmax scale); caches are
 * [slots, num_kv_heads, head_dim] contiguous; request b's context is slot-table row rows[b],
 * entries 0 .. prefix_lens[b] + extend_lens[b] (int32, or int64 when table_wide), its new
 * tokens are q rows q_starts[b] ..; num_heads = G * num_kv_heads, G <= MAX_GROUP, head_dim a
 * multiple of VEC up to MAX_HEAD_DIM. Writes those rows of out (fp32, shaped as q); other rows
 * are left as they are. causal = 0: each request's rows attend to its prefix_lens[b] keys alone,
 * all of them (a shared prefix's part of decode); lse, when not NULL, gets each row's natural-log
 * softmax denominator ([tokens, num_heads], as q's rows). Returns 0; -2, computing nothing, when
 * a request's row, lengths, q rows or slot ids fall outside `bounds` ({table rows, table columns,
 * q rows, cache slots}), or a request not causal has rows but no keys; -1 when a
 * thread could not allocate its scratch (out is then incomplete).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

#define VEC 16            /* floats in one vector register tile */
#define BK 32             /* keys per block */
#define MAX_ROWS 128      /* rows of a tile: TQ * G */
#define MAX_GROUP 64
#define MAX_HEAD_DIM 256
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define MASKED (-1e30f)   /* a masked score (finite: -ffast-math assumes no infinities) */

typedef float vf __attribute__((vector_size(VEC * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VEC * sizeof(int32_t))));

#define NV (MAX_ROWS / VEC) /* row vectors of a full tile (RV <= NV for a tile of R rows) */

/* One thread's scratch; RV = ceil(R / VEC) row vectors. */
typedef struct {
    vf qT[MAX_HEAD_DIM * NV];   /* [D][RV] the tile's queries, scaled by scale * log2(e) */
    vf accT[MAX_HEAD_DIM * NV]; /* [D][RV] */
    vf sT[BK * NV];             /* [BK][RV] scores, then softmax weights */
    vf m[NV], l[NV], c[NV];     /* running max, running sum, the block's correction */
    vf bsum[NV];                /* the block's sum of weights */
    vi lim[NV];                 /* each row's last visible key position */
    const void *kp[BK + 4], *vp[BK + 4]; /* the block's K / V rows in the cache (+ zero rows) */
    uint32_t qT2[MAX_HEAD_DIM / 2 * MAX_ROWS] __attribute__((aligned(64))); /* [D / 2][RV] bf16 pairs */
} Scratch;

static inline int64_t slot_at(const void *table, int wide, int64_t i) {
    return wide ? ((const int64_t *)table)[i] : (int64_t)((const int32_t *)table)[i];
}

/* Whether every request's row, lengths, q rows and slots lie inside what `bounds` gives:
 * {table rows, table columns, q rows, cache slots}, and (not causal) every request with rows has
 * keys. One pass over the contexts' slot ids. */
static int layout_ok(const void *table, int64_t table_stride, int wide, const int64_t *rows,
                     const int64_t *prefix_lens, const int64_t *extend_lens, const int64_t *q_starts,
                     int64_t batch, const int64_t *bounds, int causal) {
    for (int64_t b = 0; b < batch; b++) {
        const int64_t n = causal ? prefix_lens[b] + extend_lens[b] : prefix_lens[b];
        if (rows[b] < 0 || rows[b] >= bounds[0] || prefix_lens[b] < 0 || extend_lens[b] < 0 || n > bounds[1] ||
            q_starts[b] < 0 || q_starts[b] + extend_lens[b] > bounds[2] || (n == 0 && extend_lens[b] > 0))
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

/* ---- rows in lanes: a vector holds one entry of VEC query rows ---------------------------- */

#define KJ 4                /* keys per score register tile */
#define DJ 4                /* head_dim entries per value register tile */
#define VJ 4                /* row vectors per register tile */

static inline vf vsplat(float x) { return (vf){0} + x; }
static inline vf vmax(vf a, vf b) {
    const vi m = a > b;
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

/* ---- bf16 caches with AVX512-BF16: pairs of bf16 products summed into fp32 per instruction -- */

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif

typedef uint32_t vu __attribute__((vector_size(VEC * sizeof(uint32_t))));
/* x and y rounded to bf16 (to nearest even; finite inputs) as one pair: x in the low half. */
static inline uint32_t pair_bf16_1(float x, float y) {
    uint32_t bx, by;
    memcpy(&bx, &x, sizeof bx);
    memcpy(&by, &y, sizeof by);
    bx += 0x7fffu + ((bx >> 16) & 1u);
    by += 0x7fffu + ((by >> 16) & 1u);
    return (bx >> 16) | (by & 0xffff0000u);
}

static inline uint32_t pair_at(const uint16_t *p, int64_t i) {
    uint32_t u;
    memcpy(&u, p + i, sizeof u);
    return u;
}

/* sT[j][v0 ..) = qs * sum_p qT2[p][v] . (k_j[2p], k_j[2p + 1]) for keys j < nb (KJ at a time),
 * VC row vectors from v0; qT2 holds each row's query entries as bf16 pairs. */
static inline __attribute__((always_inline)) void scores_dp(const vu *qT2, const uint16_t *const *kp, vf *sT,
                                                            int64_t nb, int64_t RV, int64_t v0, const int64_t VC,
                                                            const int64_t D, float qs) {
#if HAVE_DPBF16
    for (int64_t j = 0; j < nb; j += KJ) {
        __m512 a[KJ][VJ];
        for (int64_t i = 0; i < KJ; i++)
            for (int64_t v = 0; v < VC; v++) a[i][v] = _mm512_setzero_ps();
        const uint16_t *k0 = kp[j], *k1 = kp[j + 1], *k2 = kp[j + 2], *k3 = kp[j + 3];
        for (int64_t p = 0; p < D / 2; p++) {
            const __m512bh b0 = (__m512bh)_mm512_set1_epi32((int)pair_at(k0, 2 * p));
            const __m512bh b1 = (__m512bh)_mm512_set1_epi32((int)pair_at(k1, 2 * p));
            const __m512bh b2 = (__m512bh)_mm512_set1_epi32((int)pair_at(k2, 2 * p));
            const __m512bh b3 = (__m512bh)_mm512_set1_epi32((int)pair_at(k3, 2 * p));
            const vu *qp = qT2 + p * RV + v0;
            for (int64_t v = 0; v < VC; v++) {
                const __m512bh x = (__m512bh)qp[v];
                a[0][v] = _mm512_dpbf16_ps(a[0][v], x, b0); a[1][v] = _mm512_dpbf16_ps(a[1][v], x, b1);
                a[2][v] = _mm512_dpbf16_ps(a[2][v], x, b2); a[3][v] = _mm512_dpbf16_ps(a[3][v], x, b3);
            }
        }
        for (int64_t i = 0; i < KJ; i++)
            for (int64_t v = 0; v < VC; v++) sT[(j + i) * RV + v0 + v] = (vf)a[i][v] * qs;
    }
#else
    (void)qT2; (void)kp; (void)sT; (void)nb; (void)RV; (void)v0; (void)VC; (void)D; (void)qs;
    abort(); /* unreachable: the bf16 tile takes this path only where HAVE_DPBF16 */
#endif
}

#define DEFINE_EXTEND(NAME, T, LOAD, DP)                                                               \
    /* sT[j][v0 ..) = sum_d qT[d][v] * k_j[d] for keys j < nb (KJ at a time; kp is padded with a       \
     * zero row up to a multiple of KJ), VC row vectors from v0. */                                    \
    static inline __attribute__((always_inline)) void NAME##_scores(                                   \
        const vf *qT, const T *const *kp, vf *sT, int64_t nb, int64_t RV, int64_t v0,                  \
        const int64_t VC, const int64_t D) {                                                           \
        for (int64_t j = 0; j < nb; j += KJ) {                                                         \
            vf a[KJ][VJ];                                                                              \
            for (int64_t i = 0; i < KJ; i++)                                                           \
                for (int64_t v = 0; v < VC; v++) a[i][v] = (vf){0};                                    \
            const T *k0 = kp[j], *k1 = kp[j + 1], *k2 = kp[j + 2], *k3 = kp[j + 3];                    \
            for (int64_t d = 0; d < D; d++) {                                                          \
                const vf b0 = vsplat(LOAD(k0, d)), b1 = vsplat(LOAD(k1, d));                           \
                const vf b2 = vsplat(LOAD(k2, d)), b3 = vsplat(LOAD(k3, d));                           \
                const vf *qd = qT + d * RV + v0;                                                       \
                for (int64_t v = 0; v < VC; v++) {                                                     \
                    a[0][v] += qd[v] * b0; a[1][v] += qd[v] * b1;                                      \
                    a[2][v] += qd[v] * b2; a[3][v] += qd[v] * b3;                                      \
                }                                                                                      \
            }                                                                                          \
            for (int64_t i = 0; i < KJ; i++)                                                           \
                for (int64_t v = 0; v < VC; v++) sT[(j + i) * RV + v0 + v] = a[i][v];                  \
        }                                                                                              \
    }                                                                                                  \
                                                                                                       \
    /* accT[d][v0 ..) += sum_{j < nb} sT[j][v] * v_j[d], VC row vectors from v0 */                     \
    static inline __attribute__((always_inline)) void NAME##_values(                                   \
        const vf *sT, const T *const *vp, vf *accT, int64_t nb, int64_t RV, int64_t v0,                \
        const int64_t VC, const int64_t D) {                                                           \
        for (int64_t d0 = 0; d0 < D; d0 += DJ) {                                                       \
            vf a[DJ][VJ];                                                                              \
            for (int64_t i = 0; i < DJ; i++)                                                           \
                for (int64_t v = 0; v < VC; v++) a[i][v] = accT[(d0 + i) * RV + v0 + v];               \
            for (int64_t j = 0; j < nb; j++) {                                                         \
                const T *vr = vp[j];                                                                   \
                const vf b0 = vsplat(LOAD(vr, d0)), b1 = vsplat(LOAD(vr, d0 + 1));                     \
                const vf b2 = vsplat(LOAD(vr, d0 + 2)), b3 = vsplat(LOAD(vr, d0 + 3));                 \
                const vf *pj = sT + j * RV + v0;                                                       \
                for (int64_t v = 0; v < VC; v++) {                                                     \
                    a[0][v] += pj[v] * b0; a[1][v] += pj[v] * b1;                                      \
                    a[2][v] += pj[v] * b2; a[3][v] += pj[v] * b3;                                      \
                }                                                                                      \
            }                                                                                          \
            for (int64_t i = 0; i < DJ; i++)                                                           \
                for (int64_t v = 0; v < VC; v++) accT[(d0 + i) * RV + v0 + v] = a[i][v];               \
        }                                                                                              \
    }                                                                                                  \
                                                                                                       \
    /* One work item: tokens i0 .. i0 + nt of a request (prefix `prefix`) on KV head g; causal, or     \
     * every row over the prefix alone. */                                                             \
    static inline __attribute__((always_inline)) void NAME##_tile(                                     \
        Scratch *w, const float *q, const T *kc, const T *vc, const void *table, int wide,             \
        int64_t prefix, int64_t i0, int64_t nt, int64_t g, int64_t H, int64_t KVH, const int64_t D,    \
        float scale, float *out, int causal, float *lse) {                                             \
        static const T zero_row[MAX_HEAD_DIM];                                                         \
        const int64_t G = H / KVH, R = nt * G, RV = (R + VEC - 1) / VEC, row = KVH * D;                \
        const float qs = scale * LOG2E;                                                                \
        vf *qT = w->qT, *accT = w->accT, *sT = w->sT;                                                  \
        /* keys the tile can see; the first row's last visible one */                                  \
        const int64_t n = causal ? prefix + i0 + nt : prefix;                                          \
        const int64_t first_pos = causal ? prefix + i0 : n - 1;                                        \
        for (int64_t r = 0; r < RV * VEC; r++) {                                                       \
            float *lane = (float *)qT + r; /* qT[d][r / VEC][r % VEC] */                               \
            const float *src = q + (i0 + r / G) * H * D + (g * G + r % G) * D;                         \
            if (DP) /* bf16 pairs, unscaled (a bf16 model's queries are bf16 values) */                \
                for (int64_t p = 0; p < D / 2; p++)                                                    \
                    w->qT2[p * RV * VEC + r] = r < R ? pair_bf16_1(src[2 * p], src[2 * p + 1]) : 0u;   \
            else                                                                                       \
                for (int64_t d = 0; d < D; d++) lane[d * RV * VEC] = r < R ? src[d] * qs : 0.0f;       \
            ((int32_t *)w->lim)[r] = (int32_t)(r < R && causal ? first_pos + r / G : n - 1);           \
        }                                                                                              \
        for (int64_t v = 0; v < RV; v++) { w->m[v] = vsplat(MASKED); w->l[v] = (vf){0}; }              \
        memset(accT, 0, sizeof(vf) * D * RV);                                                          \
        for (int64_t j = 0; j < BK + KJ; j++) { w->kp[j] = zero_row; w->vp[j] = zero_row; }            \
        for (int64_t k0 = 0; k0 < n; k0 += BK) {                                                       \
            const int64_t nb = n - k0 < BK ? n - k0 : BK;                                              \
            for (int64_t j = 0; j < nb; j++) {                                                         \
                const int64_t slot = slot_at(table, wide, k0 + j);                                     \
                w->kp[j] = kc + slot * row + g * D;                                                    \
                w->vp[j] = vc + slot * row + g * D;                                                    \
            }                                                                                          \
            for (int64_t j = nb; j < BK; j++) w->kp[j] = zero_row;                                     \
            /* the next block's rows, into L2 (prefetcht1): into L1 they evicted the rows in use; a   \
             * 16-token turn over 100K keys ran 1.37x slower (session 33) */                           \
            for (int64_t j = k0 + BK; j < k0 + 2 * BK && j < n; j++) {                                 \
                const int64_t slot = slot_at(table, wide, j);                                          \
                for (int64_t c = 0; c < D * (int64_t)sizeof(T); c += 64) {                             \
                    __builtin_prefetch((const char *)(kc + slot * row + g * D) + c, 0, 2);             \
                    __builtin_prefetch((const char *)(vc + slot * row + g * D) + c, 0, 2);             \
                }                                                                                      \
            }                                                                                          \
            for (int64_t v0 = 0; v0 < RV; v0 += VJ) {                                                  \
                const T *const *kp = (const T *const *)w->kp;                                          \
                const uint16_t *const *kb = (const uint16_t *const *)w->kp;                            \
                const vu *q2 = (const vu *)w->qT2;                                                     \
                switch ((RV - v0 < VJ ? RV - v0 : VJ) + (DP ? 4 : 0)) {                                \
                case 1: NAME##_scores(qT, kp, sT, nb, RV, v0, 1, D); break;                            \
                case 2: NAME##_scores(qT, kp, sT, nb, RV, v0, 2, D); break;                            \
                case 3: NAME##_scores(qT, kp, sT, nb, RV, v0, 3, D); break;                            \
                case 4: NAME##_scores(qT, kp, sT, nb, RV, v0, 4, D); break;                            \
                case 5: scores_dp(q2, kb, sT, nb, RV, v0, 1, D, qs); break;                            \
                case 6: scores_dp(q2, kb, sT, nb, RV, v0, 2, D, qs); break;                            \
                case 7: scores_dp(q2, kb, sT, nb, RV, v0, 3, D, qs); break;                            \
                default: scores_dp(q2, kb, sT, nb, RV, v0, 4, D, qs); break;                           \
                }                                                                                      \
            }                                                                                          \
            if (causal && k0 + nb - 1 > first_pos) { /* keys past a row's position: masked there */    \
                for (int64_t j = 0; j < nb; j++)                                                       \
                    for (int64_t v = 0; v < RV; v++) {                                                 \
                        const vi hide = w->lim[v] < (int32_t)(k0 + j);                                 \
                        const vi s = (vi)sT[j * RV + v];                                               \
                        sT[j * RV + v] = (vf)((s & ~hide) | ((vi)vsplat(MASKED) & hide));              \
                    }                                                                                  \
            }                                                                                          \
            for (int64_t v = 0; v < RV; v++) {                                                         \
                vf bm = w->m[v];                                                                       \
                for (int64_t j = 0; j < nb; j++) bm = vmax(bm, sT[j * RV + v]);                        \
                w->c[v] = bm; /* the new running max */                                                \
            }                                                                                          \
            {                                                                                          \
                float *mf = (float *)w->m, *cf = (float *)w->c, *lf = (float *)w->l;                   \
                float *bs = (float *)w->bsum;                                                          \
                for (int64_t r = 0; r < RV * VEC; r++) {                                               \
                    const float corr = cf[r] > mf[r] ? exp2f(mf[r] - cf[r]) : 1.0f;                    \
                    mf[r] = cf[r];                                                                     \
                    cf[r] = corr;                                                                      \
                    bs[r] = 0.0f;                                                                      \
                }                                                                                      \
                for (int64_t j = 0; j < nb; j++) {                                                     \
                    float *sj = (float *)(sT + j * RV);                                                \
                    for (int64_t r = 0; r < RV * VEC; r++) {                                           \
                        sj[r] = exp2f(sj[r] - mf[r]);                                                  \
                        bs[r] += sj[r];                                                                \
                    }                                                                                  \
                }                                                                                      \
                for (int64_t r = 0; r < RV * VEC; r++) lf[r] = lf[r] * cf[r] + bs[r];                  \
            }                                                                                          \
            for (int64_t d = 0; d < D; d++)                                                            \
                for (int64_t v = 0; v < RV; v++) accT[d * RV + v] *= w->c[v];                          \
            for (int64_t v0 = 0; v0 < RV; v0 += VJ) {                                                  \
                const T *const *vp = (const T *const *)w->vp;                                          \
                switch (RV - v0 < VJ ? RV - v0 : VJ) {                                                 \
                case 1: NAME##_values(sT, vp, accT, nb, RV, v0, 1, D); break;                          \
                case 2: NAME##_values(sT, vp, accT, nb, RV, v0, 2, D); break;                          \
                case 3: NAME##_values(sT, vp, accT, nb, RV, v0, 3, D); break;                          \
                default: NAME##_values(sT, vp, accT, nb, RV, v0, 4, D); break;                         \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        const float *af = (const float *)accT, *lf = (const float *)w->l;                              \
        for (int64_t r = 0; r < R; r++) {                                                              \
            float *dst = out + (i0 + r / G) * H * D + (g * G + r % G) * D;                             \
            const float inv = 1.0f / lf[r];                                                            \
            for (int64_t d = 0; d < D; d++) dst[d] = af[d * RV * VEC + r] * inv;                       \
            if (lse != NULL) /* natural log of the row's softmax denominator */                        \
                lse[(i0 + r / G) * H + g * G + r % G] =                                                \
                    (((const float *)w->m)[r] + log2f(lf[r])) * LN2;                                   \
        }                                                                                              \
    }                                                                                                  \
                                                                                                       \
    int NAME(const float *q, const T *kc, const T *vc, const void *table, int64_t table_stride,        \
              int wide, const int64_t *rows, const int64_t *prefix_lens, const int64_t *extend_lens,   \
              const int64_t *q_starts, int64_t batch, int64_t num_heads, int64_t num_kv_heads,         \
              int64_t head_dim, float scale, float *out, int nthreads, const int64_t *bounds,          \
              int causal, float *lse) {                                                                \
        const int64_t G = num_heads / num_kv_heads, HD = num_heads * head_dim;                         \
        if (!layout_ok(table, table_stride, wide, rows, prefix_lens, extend_lens, q_starts, batch,     \
                       bounds, causal))                                                                \
            return -2;                                                                                 \
        const int64_t tq = MAX_ROWS / G < 32 ? MAX_ROWS / G : 32; /* tokens per tile */                \
        int64_t *item_start = malloc(sizeof(int64_t) * (batch + 1));                                   \
        if (item_start == NULL) return -1;                                                             \
        item_start[0] = 0;                                                                             \
        for (int64_t b = 0; b < batch; b++)                                                            \
            item_start[b + 1] = item_start[b] + (extend_lens[b] + tq - 1) / tq * num_kv_heads;         \
        const int64_t items = item_start[batch];                                                       \
        int failed = 0;                                                                                \
        _Pragma("omp parallel num_threads(nthreads) if (nthreads > 1 && items > 1)")                   \
        {                                                                                              \
            Scratch *rw = aligned_alloc(64, sizeof(Scratch));                                          \
            if (rw == NULL) {                                                                          \
                _Pragma("omp atomic write")                                                            \
                failed = 1;                                                                            \
            }                                                                                          \
            const unsigned csr = enter_ftz();                                                          \
            int64_t b = 0;                                                                             \
            _Pragma("omp for schedule(dynamic, 1)")                                                    \
            for (int64_t it = 0; it < items; it++) {                                                   \
                if (rw == NULL) continue;                                                              \
                while (item_start[b + 1] <= it) b++;                                                   \
                while (item_start[b] > it) b--;                                                        \
                const int64_t local = it - item_start[b], ntiles = (extend_lens[b] + tq - 1) / tq;     \
                const int64_t tile = ntiles - 1 - local / num_kv_heads, g = local % num_kv_heads;      \
                const int64_t i0 = tile * tq;                                                          \
                const int64_t nt = extend_lens[b] - i0 < tq ? extend_lens[b] - i0 : tq;                \
                const char *tb = (const char *)table + rows[b] * table_stride * (wide ? 8 : 4);        \
                const float *qb = q + q_starts[b] * HD;                                                \
                float *ob = out + q_starts[b] * HD;                                                    \
                float *lb = lse == NULL ? NULL : lse + q_starts[b] * num_heads;                        \
                /* the common head sizes as constants: their loops over head_dim unroll */             \
                if (head_dim == 16)                                                                    \
                    NAME##_tile(rw, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,        \
                                num_kv_heads, 16, scale, ob, causal, lb);                              \
                else if (head_dim == 64)                                                               \
                    NAME##_tile(rw, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,        \
                                num_kv_heads, 64, scale, ob, causal, lb);                              \
                else if (head_dim == 128)                                                              \
                    NAME##_tile(rw, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,        \
                                num_kv_heads, 128, scale, ob, causal, lb);                             \
                else                                                                                   \
                    NAME##_tile(rw, qb, kc, vc, tb, wide, prefix_lens[b], i0, nt, g, num_heads,        \
                                num_kv_heads, head_dim, scale, ob, causal, lb);                        \
            }                                                                                          \
            leave_ftz(csr);                                                                            \
            free(rw);                                                                                  \
        }                                                                                              \
        free(item_start);                                                                              \
        return failed ? -1 : 0;                                                                        \
    }

DEFINE_EXTEND(extend_f32, float, load_f32, 0)
DEFINE_EXTEND(extend_bf16, uint16_t, load_bf16, HAVE_DPBF16)

/* 1 when extend_bf16 sums bf16 pair products (AVX512-BF16 at build time), else 0. */
int extend_bf16_pairs(void) { return HAVE_DPBF16; }

/* layout_ok for a caller that must know before it writes anything (cpu_layers.c). */
int extend_layout_ok(const void *table, int64_t table_stride, int wide, const int64_t *rows,
                     const int64_t *prefix_lens, const int64_t *extend_lens, const int64_t *q_starts, int64_t batch,
                     const int64_t *bounds, int causal) {
    return layout_ok(table, table_stride, wide, rows, prefix_lens, extend_lens, q_starts, batch, bounds, causal);
}
