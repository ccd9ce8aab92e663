/* Decode attention on CPU: one query token per request over its context's KV slots, read in
 * place from the cache (no gather, no padding), an online softmax per block of tokens.
 *
 *   request b:  for each block of BLOCK context tokens
 *       scores[j][i] = scale * q[b, j] . K[slot_i, j / G]     (G query heads share a KV head)
 *       rescale the running max / sum / output, then  acc[j] += exp(s - m) * V[slot_i, j / G]
 *
 * A token's K (then V) row is read whole, every KV head at once (one contiguous run of the
 * cache), and the rows PREFETCH tokens ahead are prefetched: the cache of a long batch does not
 * fit in any CPU cache, and reading it head by head ran ~1.6x slower.
 *
 * Built by kernels/native.py with the machine's C compiler (-O3 -march=native -ffast-math, so
 * the inner loops over head_dim and the block's exps are vectorized); one entry point per cache
 * element type (fp32, bf16; other caches take the torch path). Requests are split over
 * `nthreads` OpenMP threads.
 *
 * Contract (checked by the Python caller): q is fp32 [batch, num_heads, head_dim] contiguous;
 * caches are [slots, num_kv_heads, head_dim] contiguous; request b's context is
 * slots[offsets[b] .. offsets[b+1]); num_heads = G * num_kv_heads <= MAX_HEADS,
 * head_dim <= MAX_HEAD_DIM, num_kv_heads * head_dim <= MAX_KV_ROW. Writes out (fp32 [batch,
 * num_heads, head_dim], the attention output) and lse (fp32 [batch, num_heads], the log of the
 * softmax denominator plus the max score: what merging with another part of the context needs).
 * A request with no context gets zeros and lse = -inf.
 */
#include <math.h>
#include <stdint.h>
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
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)")      \
        for (int64_t b = 0; b < batch; b++) {                                                         \
            const unsigned csr = enter_ftz();                                                         \
            const float *qb = q + b * HD;                                                             \
            const int64_t *sb = slots + offsets[b], n = offsets[b + 1] - offsets[b];                  \
            float *ob = out + b * HD, *lb = lse + b * num_heads;                                      \
            /* the common head sizes as constants: their loops over head_dim unroll */                \
            if (head_dim == 64)                                                                       \
                NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, 64, scale, ob, lb);            \
            else if (head_dim == 128)                                                                 \
                NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, 128, scale, ob, lb);           \
            else                                                                                      \
                NAME##_row(qb, kc, vc, sb, n, num_heads, num_kv_heads, head_dim, scale, ob, lb);      \
            leave_ftz(csr);                                                                           \
        }                                                                                             \
    }

DEFINE_DECODE(decode_f32, float, load_f32)
DEFINE_DECODE(decode_bf16, uint16_t, load_bf16)
