/* Rounding fp32 to bf16 (to nearest even, NaN kept) and the round trip, for the elementwise passes. */
#ifndef RADIXFLOW_CPU_BF16_H
#define RADIXFLOW_CPU_BF16_H

#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

static inline uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_value(float f) { return load_bf16((const uint16_t[]){round_bf16(f)}, 0); }

#define ROUND_float(v) (v)
#define ROUND_uint16_t(v) bf16_value(v)
#define STORE_F32(p, i, v) ((p)[i] = (v))
#define STORE_BF16(p, i, v) ((p)[i] = round_bf16(v))

#endif
