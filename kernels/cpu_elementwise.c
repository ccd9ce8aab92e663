/* The CPU forward's elementwise passes fused, with the torch path's rounding (runtime/model/model.py
 * rmsnorm_cpu, rotate_cpu): RoPE in one pass, RMSNorm in one pass with the residual add and the
 * mean of squares summed in torch's own order (the mean's summation order decides near-ties in
 * bf16; kernels/native_layers.py `sum_lanes` checks the order is torch's, else RMSNorm keeps
 * torch's mean and only the scaling runs here):
 *
 *   rmsnorm:   h = residual + x, var = mean(h * h) in torch's order, then  rmsnorm_*
 *              out = w * round(h * (1 / sqrt(var + eps)))                 rmsnorm_scale_* (var given)
 *   rope:      out = round(fma(swap_halves(x), sin_signed, x * cos))      rope_*
 *
 * where round is to the model's dtype (bf16: to nearest even; fp32: nothing). Built with
 * -fno-fast-math -ffp-contract=off (kernels/native.py), so each operation rounds as torch's does
 * (torch's CPU build fuses addcmul's multiply-add, hence the fma): the results are the torch
 * path's bit for bit (tests/kernels/test_native_elementwise.py). SmolLM2's greedy answer to "What
 * is the capital of France?" starts at a near-tie that one bf16 unit in one RMSNorm flips.
 * Rows split over `nthreads` OpenMP threads. Callers (kernels/native_layers.py) check dtypes,
 * shapes and strides.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_bf16.h"

/* out [rows, dim] = w [dim] * round(h * (1 / sqrt(var[row] + eps))) for h fp32 [rows, dim] (row
 * stride h_stride), var fp32 [rows]. */
#define DEFINE_RMSNORM_SCALE(NAME, T, LOAD, STORE_ROUNDED)                                             \
    void NAME(const float *h, int64_t h_stride, const float *var, const T *w, float eps, int64_t rows,    \
              int64_t dim, T *out, int nthreads) {                                                     \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows > 1)") \
        for (int64_t r = 0; r < rows; r++) {                                                           \
            const float inv = 1.0f / sqrtf(var[r] + eps), *hr = h + r * h_stride;                      \
            T *o = out + r * dim;                                                                      \
            for (int64_t i = 0; i < dim; i++) STORE_ROUNDED(o, i, LOAD(w, i) * ROUND_##T(hr[i] * inv)); \
        }                                                                                              \
    }

/* x [rows, heads, D] (row stride x_stride, heads contiguous), cos / sin_signed fp32 [rows, D]
 * -> out [rows, heads, D] contiguous. */
#define DEFINE_ROPE(NAME, T, LOAD, STORE_ROUNDED)                                                      \
    void NAME(const T *x, int64_t x_stride, const float *cos, const float *sin_signed, int64_t rows,      \
              int64_t heads, int64_t D, T *out, int nthreads) {                                        \
        const int64_t half = D / 2;                                                                    \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows > 1)") \
        for (int64_t r = 0; r < rows; r++) {                                                           \
            const float *c = cos + r * D, *s = sin_signed + r * D;                                     \
            for (int64_t hd = 0; hd < heads; hd++) {                                                   \
                const T *xh = x + r * x_stride + hd * D;                                               \
                T *o = out + (r * heads + hd) * D;                                                     \
                for (int64_t i = 0; i < half; i++) {                                                   \
                    STORE_ROUNDED(o, i, fmaf(LOAD(xh, i + half), s[i], LOAD(xh, i) * c[i]));           \
                }                                                                                      \
                for (int64_t i = half; i < D; i++) {                                                   \
                    STORE_ROUNDED(o, i, fmaf(LOAD(xh, i - half), s[i], LOAD(xh, i) * c[i]));           \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

/* torch's CPU sum of the squares of n contiguous fp32 values (h.pow(2).sum(-1)) in its order: its
 * vectorized inner reduction with `lanes` per vector (8 or 16; native.py finds which one torch
 * runs by comparing): four vectors per step into a four-level cascade of partial sums (each level
 * taken up every 16 steps), the vectors left over, then the scalar tail, then the lanes in order.
 * n >= lanes. */
static float torch_sum_squares(const float *h, int64_t n, int lanes) {
    enum { ILP = 4, LEVELS = 4, LEVEL_POWER = 4, LEVEL_STEP = 1 << LEVEL_POWER, MAX_LANES = 16 };
    const int64_t vectors = n / lanes, steps = vectors / ILP;
    float acc[LEVELS][ILP][MAX_LANES] = {{{0}}};
    int64_t i = 0;
    /* torch's level power is max(4, ceil(log2(steps)) / 4): 4 below 2^20 steps (n < 2^25) */
    while (i + LEVEL_STEP <= steps) {
        for (int64_t j = 0; j < LEVEL_STEP; j++, i++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    const float x = h[(i * ILP + k) * lanes + l];
                    acc[0][k][l] += x * x;
                }
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & ((int64_t)(LEVEL_STEP - 1) << (j * LEVEL_POWER))) != 0) break;
        }
    }
    for (; i < steps; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++) {
                const float x = h[(i * ILP + k) * lanes + l];
                acc[0][k][l] += x * x;
            }
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = steps * ILP; v < vectors; v++)
        for (int l = 0; l < lanes; l++) {
            const float x = h[v * lanes + l];
            acc[0][0][l] += x * x;
        }
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    float sum = 0.0f;
    for (int64_t t = vectors * lanes; t < n; t++) sum += h[t] * h[t];
    for (int l = 0; l < lanes; l++) sum += acc[0][0][l];
    return sum;
}

/* The whole RMSNorm: h [rows, dim] = residual + x (fp32; x alone where residual is NULL; h may be
 * residual itself), out = w * round(h * (1 / sqrt(mean(h * h) + eps))). x rows at x_stride. */
#define DEFINE_RMSNORM(NAME, T, LOAD, STORE_ROUNDED)                                                   \
    void NAME(const T *x, int64_t x_stride, const float *residual, const T *w, float eps, int64_t rows,   \
              int64_t dim, int lanes, T *out, float *h, int nthreads) {                                \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows > 1)") \
        for (int64_t r = 0; r < rows; r++) {                                                           \
            const T *xr = x + r * x_stride;                                                            \
            float *hr = h + r * dim;                                                                   \
            if (residual) {                                                                            \
                const float *res = residual + r * dim;                                                 \
                for (int64_t i = 0; i < dim; i++) hr[i] = res[i] + LOAD(xr, i);                        \
            } else {                                                                                   \
                for (int64_t i = 0; i < dim; i++) hr[i] = LOAD(xr, i);                                 \
            }                                                                                          \
            const float var = torch_sum_squares(hr, dim, lanes) / (float)dim;                          \
            const float inv = 1.0f / sqrtf(var + eps);                                                 \
            T *o = out + r * dim;                                                                      \
            for (int64_t i = 0; i < dim; i++) STORE_ROUNDED(o, i, LOAD(w, i) * ROUND_##T(hr[i] * inv)); \
        }                                                                                              \
    }

/* torch's mean of squares per row (tests, and native.py's check of the lane count). */
void mean_squares(const float *h, int64_t rows, int64_t dim, int lanes, float *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = torch_sum_squares(h + r * dim, dim, lanes) / (float)dim;
}

DEFINE_RMSNORM(rmsnorm_f32, float, load_f32, STORE_F32)
DEFINE_RMSNORM(rmsnorm_bf16, uint16_t, load_bf16, STORE_BF16)
DEFINE_RMSNORM_SCALE(rmsnorm_scale_f32, float, load_f32, STORE_F32)
DEFINE_RMSNORM_SCALE(rmsnorm_scale_bf16, uint16_t, load_bf16, STORE_BF16)
DEFINE_ROPE(rope_f32, float, load_f32, STORE_F32)
DEFINE_ROPE(rope_bf16, uint16_t, load_bf16, STORE_BF16)
