/* Decode attention on CPU: one query token per request over its context's KV slots, read in
 * place from the cache (no gather, no padding), an online softmax per block of tokens.
 *
 *   request b, KV head h:  for each block of BLOCK context tokens
 *       scores[g][i] = scale * q[b, h*G + g] . K[slot_i, h]     (G query heads share KV head h)
 *       rescale the running max / sum / output, then  acc[g] += exp(s - m) * V[slot_i, h]
 *
 * Built by kernels/native.py with the machine's C compiler (-O3 -march=native -ffast-math, so
 * the inner loops over head_dim and the block's exps are vectorized); one entry point per cache
 * element type (fp32, bf16; other caches take the torch path). Rows (request, KV head) are split
 * over `nthreads` OpenMP threads.
 *
 * Contract (checked by the Python caller): q is fp32 [batch, num_heads, head_dim] contiguous;
 * caches are [slots, num_kv_heads, head_dim] contiguous; request b's context is
 * slots[offsets[b] .. offsets[b+1]); num_heads = G * num_kv_heads with G <= MAX_GROUP and
 * head_dim <= MAX_HEAD_DIM. Writes out (fp32 [batch, num_heads, head_dim], the attention
 * output) and lse (fp32 [batch, num_heads], the log of the softmax denominator plus the max
 * score: what merging with another part of the context needs). A request with no context gets
 * zeros and lse = -inf.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 32
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256

static inline float load_f32(const float *p, int64_t i) { return p[i]; }

static inline float load_bf16(const uint16_t *p, int64_t i) {
    uint32_t u = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define DEFINE_DECODE(NAME, T, LOAD)                                                                   \
    static void NAME##_row(const float *q, const T *kc, const T *vc, const int64_t *slots,             \
                           int64_t n, int64_t G, int64_t D, int64_t kv_stride, float scale,            \
                           float *out, float *lse) {                                                  \
        float acc[MAX_GROUP][MAX_HEAD_DIM];                                                           \
        float s[MAX_GROUP][BLOCK];                                                                    \
        float m[MAX_GROUP], l[MAX_GROUP];                                                             \
        float x[MAX_HEAD_DIM];                                                                        \
        if (n == 0) {                                                                                 \
            for (int64_t g = 0; g < G; g++) {                                                         \
                memset(out + g * D, 0, sizeof(float) * D);                                            \
                lse[g] = -INFINITY;                                                                   \
            }                                                                                         \
            return;                                                                                   \
        }                                                                                             \
        for (int64_t g = 0; g < G; g++) {                                                             \
            memset(acc[g], 0, sizeof(float) * D);                                                     \
            l[g] = 0.0f;                                                                              \
        }                                                                                             \
        for (int64_t t0 = 0; t0 < n; t0 += BLOCK) {                                                   \
            const int64_t nb = n - t0 < BLOCK ? n - t0 : BLOCK;                                       \
            for (int64_t i = 0; i < nb; i++) {                                                        \
                const T *k = kc + slots[t0 + i] * kv_stride;                                          \
                for (int64_t d = 0; d < D; d++) x[d] = LOAD(k, d);                                    \
                for (int64_t g = 0; g < G; g++) {                                                     \
                    const float *qg = q + g * D;                                                      \
                    float dot = 0.0f;                                                                 \
                    for (int64_t d = 0; d < D; d++) dot += qg[d] * x[d];                              \
                    s[g][i] = dot * scale;                                                            \
                }                                                                                     \
            }                                                                                         \
            for (int64_t g = 0; g < G; g++) {                                                         \
                float bm = s[g][0];                                                                   \
                for (int64_t i = 1; i < nb; i++) bm = s[g][i] > bm ? s[g][i] : bm;                     \
                if (t0 == 0) {                                                                        \
                    m[g] = bm;                                                                        \
                } else if (bm > m[g]) {                                                               \
                    const float c = expf(m[g] - bm);                                                  \
                    l[g] *= c;                                                                        \
                    for (int64_t d = 0; d < D; d++) acc[g][d] *= c;                                   \
                    m[g] = bm;                                                                        \
                }                                                                                     \
                float sum = 0.0f;                                                                     \
                for (int64_t i = 0; i < nb; i++) {                                                    \
                    s[g][i] = expf(s[g][i] - m[g]);                                                   \
                    sum += s[g][i];                                                                   \
                }                                                                                     \
                l[g] += sum;                                                                          \
            }                                                                                         \
            for (int64_t i = 0; i < nb; i++) {                                                        \
                const T *v = vc + slots[t0 + i] * kv_stride;                                          \
                for (int64_t d = 0; d < D; d++) x[d] = LOAD(v, d);                                    \
                for (int64_t g = 0; g < G; g++) {                                                     \
                    const float p = s[g][i];                                                          \
                    for (int64_t d = 0; d < D; d++) acc[g][d] += p * x[d];                            \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int64_t g = 0; g < G; g++) {                                                             \
            const float inv = 1.0f / l[g];                                                            \
            for (int64_t d = 0; d < D; d++) out[g * D + d] = acc[g][d] * inv;                         \
            lse[g] = m[g] + logf(l[g]);                                                               \
        }                                                                                             \
    }                                                                                                 \
                                                                                                      \
    void NAME(const float *q, const T *kc, const T *vc, const int64_t *slots, const int64_t *offsets, \
              int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,  \
              float *out, float *lse, int nthreads) {                                                 \
        const int64_t G = num_heads / num_kv_heads, D = head_dim, kv_stride = num_kv_heads * D;       \
        const int64_t rows = batch * num_kv_heads;                                                    \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)")      \
        for (int64_t r = 0; r < rows; r++) {                                                          \
            const int64_t b = r / num_kv_heads, h = r % num_kv_heads;                                 \
            const int64_t head = b * num_heads + h * G;                                               \
            NAME##_row(q + head * D, kc + h * D, vc + h * D, slots + offsets[b],                      \
                       offsets[b + 1] - offsets[b], G, D, kv_stride, scale, out + head * D,           \
                       lse + head);                                                                   \
        }                                                                                             \
    }

DEFINE_DECODE(decode_f32, float, load_f32)
DEFINE_DECODE(decode_bf16, uint16_t, load_bf16)
