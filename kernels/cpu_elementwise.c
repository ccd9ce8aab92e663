/* The CPU forward's elementwise passes fused, with the torch path's rounding (runtime/model/model.py
 * rmsnorm_cpu, rotate_cpu): RoPE in one pass, RMSNorm's scaling in one pass after torch's
 * residual add and mean of squares (kernels/native.py; the mean's summation order decides
 * near-ties in bf16, so it stays torch's):
 *
 *   rmsnorm:   out = w * round(h * (1 / sqrt(var + eps)))                 rmsnorm_scale_*
 *   rope:      out = round(fma(swap_halves(x), sin_signed, x * cos))      rope_*
 *
 * where round is to the model's dtype (bf16: to nearest even; fp32: nothing). Built with
 * -fno-fast-math -ffp-contract=off (kernels/native.py), so each operation rounds as torch's does
 * (torch's CPU build fuses addcmul's multiply-add, hence the fma): the results are the torch
 * path's bit for bit (tests/kernels/test_native_elementwise.py). SmolLM2's greedy answer to "What
 * is the capital of France?" starts at a near-tie that one bf16 unit in one RMSNorm flips.
 * Rows split over `nthreads` OpenMP threads. Callers (kernels/native.py) check dtypes, shapes
 * and strides.
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

DEFINE_RMSNORM_SCALE(rmsnorm_scale_f32, float, load_f32, STORE_F32)
DEFINE_RMSNORM_SCALE(rmsnorm_scale_bf16, uint16_t, load_bf16, STORE_BF16)
DEFINE_ROPE(rope_f32, float, load_f32, STORE_F32)
DEFINE_ROPE(rope_bf16, uint16_t, load_bf16, STORE_BF16)
