/* SiLU-and-mul for the CPU forward's MLP in one pass (runtime/model/model.py silu_mul_cpu is the
 * torch twin): out = round(round(silu(gate)) * up) for gate_up = | gate | up |, round to the
 * model's dtype. Built with the other kernels' -ffast-math, which vectorizes the exp: silu may
 * then differ from torch's in the last bit, a bf16 unit in the last place now and then. */
#include <math.h>
#include <stdint.h>

#include "cpu_bf16.h"

/* gate_up [rows, 2 * inter] contiguous -> out [rows, inter]. */
#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE_ROUNDED)                                                  \
    void NAME(const T *gate_up, int64_t rows, int64_t inter, T *out, int nthreads) {                   \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows > 1)") \
        for (int64_t r = 0; r < rows; r++) {                                                           \
            const T *g = gate_up + r * 2 * inter, *u = g + inter;                                      \
            T *o = out + r * inter;                                                                    \
            for (int64_t i = 0; i < inter; i++) {                                                      \
                const float x = LOAD(g, i);                                                            \
                STORE_ROUNDED(o, i, ROUND_##T(x / (1.0f + expf(-x))) * LOAD(u, i));                    \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_SILU_MUL(silu_mul_f32, float, load_f32, STORE_F32)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, load_bf16, STORE_BF16)
