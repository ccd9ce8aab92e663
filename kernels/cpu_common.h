/* What the native CPU kernels share: bf16 loads and a thread-local flush-to-zero mode. */
#ifndef RADIXFLOW_CPU_COMMON_H
#define RADIXFLOW_CPU_COMMON_H

#include <stdint.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

static inline float load_f32(const float *p, int64_t i) { return p[i]; }

static inline float load_bf16(const uint16_t *p, int64_t i) {
    uint32_t u = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* While a kernel runs, its thread flushes denormals to zero (exp of scores far below the max
 * would otherwise take the CPU's slow path); the caller's float modes are restored after. */
static inline unsigned enter_ftz(void) {
#if defined(__SSE__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* flush-to-zero | denormals-are-zero */
    return csr;
#else
    return 0;
#endif
}

static inline void leave_ftz(unsigned csr) {
#if defined(__SSE__)
    _mm_setcsr(csr);
#else
    (void)csr;
#endif
}

#endif
