/* Decode attention on CPU: one query token per request over its context's KV slots, read in
 * place from the cache (no gather, no padding), an online softmax per block of tokens.
 *
 *   request b:  for each block of context tokens
 *       scores[j][i] = scale * q[b, j] . K[slot_i, j / G]     (G query heads share a KV head)
 *       rescale the running max / sum / output, then  acc[j] += exp(s - m) * V[slot_i, j / G]
 *
 * Two builds of the same contract. Where the compiler targets AVX-512 (F and BW), the keys of a
 * block lie in the vector lanes for the scores: per KV head, the block's 32 K rows (16 per
 * half) are transposed in registers, 16 x 16 entries at a time, so each entry of a head's query
 * multiplies 16 keys per instruction and no sum runs across lanes; a bf16 cache whose queries
 * are bf16 values (a bf16 model's) sums pairs of products per instruction with AVX512-BF16, its
 * K words transposed as they lie in the cache (each product exact, sums fp32). The values keep
 * head_dim in the lanes: register tiles of up to 4 heads x 64 entries accumulate over the
 * block, each V row converted once per tile. Elsewhere (and for head dims not a multiple of 16)
 * a portable loop reads each token's K (then V) row whole and sums each head's dot product.
 *
 * Both read a block's rows for every KV head before the next block (one contiguous run of the
 * cache per token) and prefetch the rows ahead: the cache of a long batch does not fit in any
 * CPU cache, and reading it head by head ran ~1.6x slower.
 *
 * Built by kernels/native.py with the machine's C compiler (-O3 -march=native -ffast-math, so
 * the loops over head_dim and the block's exps are vectorized); one entry point per cache
 * element type (fp32, bf16; other caches take the torch path). Requests are split over
 * `nthreads` OpenMP threads.
 *
 * Contract (checked by the Python caller): q is fp32 [batch, num_heads, head_dim] contiguous;
 * caches are [slots, num_kv_heads, head_dim] contiguous; request b's context is
 * slots[offsets[b] .. offsets[b+1]); num_heads = G * num_kv_heads <= MAX_HEADS,
 * head_dim <= MAX_HEAD_DIM, num_kv_heads * head_dim <= MAX_KV_ROW. Writes out (fp32 [batch,
 * num_heads, head_dim], the attention output) and lse (fp32 [batch, num_heads], the log of the
 * softmax denominator plus the max score: what merging with another part of the context needs).
 * A request with no context gets zeros and lse = -inf. `decode_lanes()` says which build runs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

#define BLOCK 32
#define PREFETCH 4        /* tokens ahead whose K / V rows are prefetched */
#define MAX_HEADS 64
#define MAX_HEAD_DIM 256
#define MAX_KV_ROW 4096   /* num_kv_heads * head_dim */

/* Prefetch the cache row (row_bytes from cache + slots[i] * row_bytes) of token i, if i < limit. */
static inline void prefetch_row(const void *cache, const int64_t *slots, int64_t i, int64_t limit,
                                int64_t row_bytes) {
    if (i < limit) {
        const char *p = (const char *)cache + slots[i] * row_bytes;
        for (int64_t c = 0; c < row_bytes; c += 64) __builtin_prefetch(p + c);
    }
}

/* ---- keys in lanes (AVX-512) ---------------------------------------------------------------- */

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define LANES 1
#if defined(__AVX512BF16__)
#define LANES_DP 1
#else
#define LANES_DP 0
#endif
/* Prefetches into L2 (locality 2, prefetcht1): into L1 (the default) they evicted the rows in
 * use and ran ~2x slower from DRAM on a batch of 16 x 640 tokens. */
#define HINT 2
#define KB 32               /* keys per block: two halves of 16 lanes */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define MASKED (-1e30f)     /* a masked score (finite: -ffast-math assumes no infinities) */

/* One thread's scratch. */
typedef struct {
    __m512 kt[2][MAX_HEAD_DIM];                     /* a KV head's block of keys, transposed: [half][entry] */
    float s[MAX_HEADS][KB] __attribute__((aligned(64))); /* a KV head's scores, then weights (log2 units) */
    float acc[MAX_HEADS * MAX_HEAD_DIM] __attribute__((aligned(64)));
    float qs[MAX_HEADS * MAX_HEAD_DIM];             /* q * scale * log2(e) */
    uint32_t qp[MAX_HEADS * MAX_HEAD_DIM / 2];      /* q as bf16 pairs (unscaled) */
    float m[MAX_HEADS], l[MAX_HEADS], c[MAX_HEADS]; /* running max, running sum, the block's correction */
    const char *kr[KB], *vr[KB];                    /* the block's K / V rows (a zero row past the context) */
    const char *kn[KB], *vn[KB];                    /* the next block's */
} Lanes;

static const float zero_row[MAX_KV_ROW];

/* r[i][e] -> r[e][i] for 16 x 16 32-bit entries. */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    }
}

/* 16 entries of a cache row from entry e, as fp32. */
static inline __attribute__((always_inline)) __m512 load16(const char *row, const int bf16, int64_t e) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * e))), 16));
    return _mm512_loadu_ps((const float *)row + e);
}

/* Whether every entry of q is a bf16 value (its low 16 bits zero): then pair products are exact. */
static int bf16_values(const float *q, int64_t count) {
    uint32_t low = 0;
    for (int64_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, q + i, sizeof u);
        low |= u & 0xffffu;
    }
    return low == 0;
}

/* acc[j][d0 ..) of JT heads from jt (of KV head g), NV vectors of head_dim: rescaled by the
 * block's correction, then the block's weighted V rows added. */
static inline __attribute__((always_inline)) void values_tile(Lanes *w, int64_t g, int64_t G, int64_t jt,
                                                              int64_t d0, int64_t nb, const int64_t D,
                                                              const int bf16, const int JT, const int NV) {
    __m512 a[4][4];
    for (int jj = 0; jj < JT; jj++) {
        const __m512 c = _mm512_set1_ps(w->c[jt + jj]);
        const float *ap = w->acc + (g * G + jt + jj) * D + d0;
        for (int v = 0; v < NV; v++) a[jj][v] = _mm512_mul_ps(_mm512_loadu_ps(ap + 16 * v), c);
    }
    for (int64_t i = 0; i < nb; i++) {
        const char *vp = w->vr[i] + (g * D + d0) * (bf16 ? 2 : 4);
        if (jt == 0) /* the next block's row, once per head_dim tile */
            for (int c = 0; c < NV * 16 * (bf16 ? 2 : 4); c += 64)
                __builtin_prefetch(w->vn[i] + (g * D + d0) * (bf16 ? 2 : 4) + c, 0, HINT);
        __m512 x[4];
        for (int v = 0; v < NV; v++) x[v] = load16(vp, bf16, 16 * v);
        for (int jj = 0; jj < JT; jj++) {
            const __m512 p = _mm512_set1_ps(w->s[jt + jj][i]);
            for (int v = 0; v < NV; v++) a[jj][v] = _mm512_fmadd_ps(p, x[v], a[jj][v]);
        }
    }
    for (int jj = 0; jj < JT; jj++) {
        float *ap = w->acc + (g * G + jt + jj) * D + d0;
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(ap + 16 * v, a[jj][v]);
    }
}

#define VALUES_CASE(JT, NV) \
    case (JT - 1) * 4 + NV - 1: values_tile(w, g, G, jt, d0, nb, D, bf16, JT, NV); break;

/* One request; head_dim a multiple of 16 (of 32 with dp: bf16 pair products). */
static inline __attribute__((always_inline)) void lanes_row(Lanes *w, const float *q, const char *kc,
                                                            const char *vc, const int64_t *slots, int64_t n,
                                                            int64_t H, int64_t KVH, const int64_t D, float scale,
                                                            float *out, float *lse, const int bf16, const int dp) {
    const int64_t G = H / KVH, esz = bf16 ? 2 : 4, row_bytes = KVH * D * esz;
    const int64_t W = dp ? D / 2 : D; /* lane entries per key and KV head: bf16 pairs, or entries */
    const float qscale = scale * LOG2E;
    if (dp)
        for (int64_t i = 0; i < H * D / 2; i++) {
            uint32_t x, y;
            memcpy(&x, q + 2 * i, sizeof x);
            memcpy(&y, q + 2 * i + 1, sizeof y);
            w->qp[i] = (x >> 16) | (y & 0xffff0000u);
        }
    else
        for (int64_t i = 0; i < H * D; i++) w->qs[i] = q[i] * qscale;
    for (int64_t j = 0; j < H; j++) { w->m[j] = MASKED; w->l[j] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * H * D);
    for (int64_t t0 = 0; t0 < n; t0 += KB) {
        const int64_t nb = n - t0 < KB ? n - t0 : KB;
        for (int64_t i = 0; i < KB; i++) {
            w->kr[i] = i < nb ? kc + slots[t0 + i] * row_bytes : (const char *)zero_row;
            w->vr[i] = i < nb ? vc + slots[t0 + i] * row_bytes : (const char *)zero_row;
        }
        for (int64_t i = 0; i < KB; i++) { /* the next block's rows, prefetched as this one's are read */
            const int64_t next = t0 + KB + i;
            w->kn[i] = next < n ? kc + slots[next] * row_bytes : (const char *)zero_row;
            w->vn[i] = next < n ? vc + slots[next] * row_bytes : (const char *)zero_row;
        }
        for (int64_t g = 0; g < KVH; g++) {
            for (int half = 0; half < 2; half++)
                for (int64_t c0 = 0; c0 < W; c0 += 16) {
                    __m512 r[16];
                    for (int i = 0; i < 16; i++) {
                        const char *kp = w->kr[16 * half + i] + g * D * esz;
                        __builtin_prefetch(w->kn[16 * half + i] + g * D * esz + c0 * (dp ? 4 : esz), 0, HINT);
                        r[i] = dp ? _mm512_loadu_ps(kp + 4 * c0) : load16(kp, bf16, c0);
                    }
                    transpose16(r);
                    for (int e = 0; e < 16; e++) w->kt[half][c0 + e] = r[e];
                }
            for (int64_t jj = 0; jj < G; jj++) {
                const int64_t j = g * G + jj;
                __m512 a[4], b[4];
                for (int u = 0; u < 4; u++) a[u] = b[u] = _mm512_setzero_ps();
                for (int64_t e = 0; e < W; e += 4)
                    for (int u = 0; u < 4; u++) {
#if LANES_DP
                        if (dp) {
                            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)w->qp[j * W + e + u]);
                            a[u] = _mm512_dpbf16_ps(a[u], (__m512bh)w->kt[0][e + u], x);
                            b[u] = _mm512_dpbf16_ps(b[u], (__m512bh)w->kt[1][e + u], x);
                            continue;
                        }
#endif
                        const __m512 x = _mm512_set1_ps(w->qs[j * D + e + u]);
                        a[u] = _mm512_fmadd_ps(w->kt[0][e + u], x, a[u]);
                        b[u] = _mm512_fmadd_ps(w->kt[1][e + u], x, b[u]);
                    }
                __m512 s0 = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
                __m512 s1 = _mm512_add_ps(_mm512_add_ps(b[0], b[1]), _mm512_add_ps(b[2], b[3]));
                if (dp) {
                    s0 = _mm512_mul_ps(s0, _mm512_set1_ps(qscale));
                    s1 = _mm512_mul_ps(s1, _mm512_set1_ps(qscale));
                }
                _mm512_store_ps(w->s[jj], s0);
                _mm512_store_ps(w->s[jj] + 16, s1);
                for (int64_t i = nb; i < KB; i++) w->s[jj][i] = MASKED;
            }
            for (int64_t jj = 0; jj < G; jj++) { /* the online softmax of the block */
                const int64_t j = g * G + jj;
                float *sj = w->s[jj], bm = MASKED, sum = 0.0f, corr = 1.0f;
                for (int i = 0; i < KB; i++) bm = sj[i] > bm ? sj[i] : bm;
                if (bm > w->m[j]) {
                    corr = exp2f(w->m[j] - bm);
                    w->m[j] = bm;
                }
                const float mj = w->m[j];
                for (int i = 0; i < KB; i++) {
                    sj[i] = exp2f(sj[i] - mj);
                    sum += sj[i];
                }
                w->l[j] = w->l[j] * corr + sum;
                w->c[jj] = corr;
            }
            for (int64_t jt = 0; jt < G; jt += 4) {
                const int64_t JT = G - jt < 4 ? G - jt : 4;
                for (int64_t d0 = 0; d0 < D; d0 += 64) {
                    const int64_t NV = (D - d0) / 16 < 4 ? (D - d0) / 16 : 4;
                    switch ((JT - 1) * 4 + NV - 1) {
                        VALUES_CASE(1, 1) VALUES_CASE(1, 2) VALUES_CASE(1, 3) VALUES_CASE(1, 4)
                        VALUES_CASE(2, 1) VALUES_CASE(2, 2) VALUES_CASE(2, 3) VALUES_CASE(2, 4)
                        VALUES_CASE(3, 1) VALUES_CASE(3, 2) VALUES_CASE(3, 3) VALUES_CASE(3, 4)
                        VALUES_CASE(4, 1) VALUES_CASE(4, 2) VALUES_CASE(4, 3) VALUES_CASE(4, 4)
                    }
                }
            }
        }
    }
    for (int64_t j = 0; j < H; j++) {
        const float inv = 1.0f / w->l[j];
        for (int64_t d = 0; d < D; d++) out[j * D + d] = w->acc[j * D + d] * inv;
        lse[j] = (w->m[j] + log2f(w->l[j])) * LN2;
    }
}

/* One request on the lanes build; 0 where it does not apply (head_dim), the caller then runs
 * the portable loop. */
static inline __attribute__((always_inline)) int lanes_request(Lanes *w, const float *q, const void *kc,
                                                               const void *vc, const int64_t *slots, int64_t n,
                                                               int64_t H, int64_t KVH, int64_t D, float scale,
                                                               float *out, float *lse, const int bf16) {
    if (w == NULL || n == 0 || D % 16 != 0) return 0;
    const char *k = (const char *)kc, *v = (const char *)vc;
    const int dp = LANES_DP && bf16 && D % 32 == 0 && bf16_values(q, H * D);
    if (dp && D == 64) lanes_row(w, q, k, v, slots, n, H, KVH, 64, scale, out, lse, bf16, 1);
    else if (dp && D == 128) lanes_row(w, q, k, v, slots, n, H, KVH, 128, scale, out, lse, bf16, 1);
    else if (dp) lanes_row(w, q, k, v, slots, n, H, KVH, D, scale, out, lse, bf16, 1);
    else if (D == 16) lanes_row(w, q, k, v, slots, n, H, KVH, 16, scale, out, lse, bf16, 0);
    else if (D == 64) lanes_row(w, q, k, v, slots, n, H, KVH, 64, scale, out, lse, bf16, 0);
    else if (D == 128) lanes_row(w, q, k, v, slots, n, H, KVH, 128, scale, out, lse, bf16, 0);
    else lanes_row(w, q, k, v, slots, n, H, KVH, D, scale, out, lse, bf16, 0);
    return 1;
}

static inline Lanes *lanes_scratch(void) { return aligned_alloc(64, sizeof(Lanes)); }
#else
#define LANES 0
#define LANES_DP 0
typedef struct Lanes Lanes;
static inline int lanes_request(Lanes *w, const float *q, const void *kc, const void *vc, const int64_t *slots,
                                int64_t n, int64_t H, int64_t KVH, int64_t D, float scale, float *out, float *lse,
                                const int bf16) {
    (void)w; (void)q; (void)kc; (void)vc; (void)slots; (void)n; (void)H; (void)KVH; (void)D; (void)scale;
    (void)out; (void)lse; (void)bf16;
    return 0;
}
static inline Lanes *lanes_scratch(void) { return NULL; }
#endif

/* 0: the portable loop; 1: keys in lanes; 2: keys in lanes with bf16 pair products. */
int decode_lanes(void) { return LANES + LANES_DP; }

/* ---- the portable loop -------------------------------------------------------------------- */

#define DEFINE_DECODE(NAME, T, LOAD)                                                                   \
    static inline __attribute__((always_inline)) void NAME##_row(                                     \
        const float *q, const T *kc, const T *vc, const int64_t *slots, int64_t n, int64_t H,         \
        int64_t KVH, const int64_t D, float scale, float *out, float *lse) {                          \
        const int64_t G = H / KVH, row = KVH * D;                                                     \
        float acc[MAX_HEADS * MAX_HEAD_DIM];                                                          \
        float s[MAX_HEADS][BLOCK];                                                                    \
        float m[MAX_HEADS], l[MAX_HEADS];                                                             \
        float x[MAX_KV_ROW];                                                                          \
        if (n == 0) {                                                                                 \
            memset(out, 0, sizeof(float) * H * D);                                                    \
            for (int64_t j = 0; j < H; j++) lse[j] = -INFINITY;                                       \
            return;                                                                                   \
        }                                                                                             \
        memset(acc, 0, sizeof(float) * H * D);                                                        \
        for (int64_t j = 0; j < H; j++) l[j] = 0.0f;                                                  \
        for (int64_t t0 = 0; t0 < n; t0 += BLOCK) {                                                   \
            const int64_t nb = n - t0 < BLOCK ? n - t0 : BLOCK;                                       \
            for (int64_t i = 0; i < nb; i++) {                                                        \
                prefetch_row(kc, slots, t0 + i + PREFETCH, n, row * (int64_t)sizeof(T));              \
                const T *k = kc + slots[t0 + i] * row;                                                \
                for (int64_t d = 0; d < row; d++) x[d] = LOAD(k, d);                                  \
                for (int64_t j = 0; j < H; j++) {                                                     \
                    const float *qj = q + j * D, *xj = x + (j / G) * D;                               \
                    float dot = 0.0f;                                                                 \
                    for (int64_t d = 0; d < D; d++) dot += qj[d] * xj[d];                             \
                    s[j][i] = dot * scale;                                                            \
                }                                                                                     \
            }                                                                                         \
            for (int64_t j = 0; j < H; j++) {                                                         \
                float bm = s[j][0];                                                                   \
                for (int64_t i = 1; i < nb; i++) bm = s[j][i] > bm ? s[j][i] : bm;                     \
                if (t0 == 0) {                                                                        \
                    m[j] = bm;                                                                        \
                } else if (bm > m[j]) {                                                               \
                    const float c = expf(m[j] - bm);                                                  \
                    l[j] *= c;                                                                        \
                    for (int64_t d = 0; d < D; d++) acc[j * D + d] *= c;                              \
                    m[j] = bm;                                                                        \
                }                                                                                     \
                float sum = 0.0f;                                                                     \
                for (int64_t i = 0; i < nb; i++) {                                                    \
                    s[j][i] = expf(s[j][i] - m[j]);                                                   \
                    sum += s[j][i];                                                                   \
                }                                                                                     \
                l[j] += sum;                                                                          \
            }                                                                                         \
            for (int64_t i = 0; i < nb; i++) {                                                        \
                prefetch_row(vc, slots, t0 + i + PREFETCH, n, row * (int64_t)sizeof(T));              \
                const T *v = vc + slots[t0 + i] * row;                                                \
                for (int64_t d = 0; d < row; d++) x[d] = LOAD(v, d);                                  \
                for (int64_t j = 0; j < H; j++) {                                                     \
                    const float p = s[j][i], *xj = x + (j / G) * D;                                   \
                    float *aj = acc + j * D;                                                          \
                    for (int64_t d = 0; d < D; d++) aj[d] += p * xj[d];                               \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int64_t j = 0; j < H; j++) {                                                             \
            const float inv = 1.0f / l[j];                                                            \
            for (int64_t d = 0; d < D; d++) out[j * D + d] = acc[j * D + d] * inv;                    \
            lse[j] = m[j] + logf(l[j]);                                                               \
        }                                                                                             \
    }                                                                                                 \
                                                                                                      \
    void NAME(const float *q, const T *kc, const T *vc, const int64_t *slots, const int64_t *offsets, \
              int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,  \
              float *out, float *lse, int nthreads) {                                                 \
        const int64_t HD = num_heads * head_dim;                                                      \
        _Pragma("omp parallel num_threads(nthreads) if (nthreads > 1 && batch > 1)") {                \
            Lanes *w = lanes_scratch(); /* NULL: the portable loop */                                 \
            _Pragma("omp for schedule(dynamic, 1)")                                                   \
            for (int64_t b = 0; b < batch; b++) {                                                     \
                const unsigned csr = enter_ftz();                                                     \
                const float *qb = q + b * HD;                                                         \
                const int64_t *sb = slots + offsets[b], n = offsets[b + 1] - offsets[b];              \
                float *ob = out + b * HD, *lb = lse + b * num_heads;                                  \
                if (lanes_request(w, qb, kc, vc, sb, n, num_heads, num_kv_heads, head_dim, scale, ob, \
                                  lb, sizeof(T) == 2)) {                                              \
                } /* the common head sizes as constants: their loops over head_dim unroll */          \
                else if (head_dim == 64)                                                              \
                    NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, 64, scale, ob, lb);        \
                else if (head_dim == 128)                                                             \
                    NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, 128, scale, ob, lb);       \
                else                                                                                  \
                    NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, head_dim, scale, ob, lb);  \
                leave_ftz(csr);                                                                       \
            }                                                                                         \
            free(w);                                                                                  \
        }                                                                                             \
    }

DEFINE_DECODE(decode_f32, float, load_f32)
DEFINE_DECODE(decode_bf16, uint16_t, load_bf16)
