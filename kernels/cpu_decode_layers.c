/* A bf16 model's decode step through all its decoder layers in one call: the CPU forward of
 * runtime/model/model.py (DecoderLayer.forward) with the other kernels of this folder, for the
 * common case (no LoRA, no q/k norm, each request's context read whole by the decode kernel), so
 * that the ~25 torch ops and ctypes calls a layer costs from Python run as C calls instead. Per
 * layer, for the batch's rows (one new token each):
 *
 *   h, residual  = rmsnorm(x, residual)            input_layernorm (x alone at layer 0)
 *   qkv          = linear(h, qkv_proj) (+ bias)    cpu_linear.c, the packed layout
 *   q|k          = rope(q|k)                        cpu_elementwise.c, torch's rounding
 *   caches[out_slots] = k, v
 *   a            = round(attention(q, context))    cpu_decode.c, fp32, rounded to bf16
 *   h, residual  = rmsnorm(linear(a, o_proj), residual)
 *   x            = linear(silu_mul(linear(h, gate_up_proj)), down_proj)
 *
 * the same calls, in the same order, on the same values as the layer-by-layer path, so the
 * result is that path's bit for bit (tests/runtime/test_fused_decode.py). Built with the
 * elementwise passes' strict float flags (kernels/native.py); it only moves values between the
 * kernels.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_bf16.h"

void rmsnorm_bf16(const uint16_t *x, int64_t x_stride, const float *residual, const uint16_t *w, float eps,
                  int64_t rows, int64_t dim, int lanes, uint16_t *out, float *h, int nthreads);
void linear_bf16(const uint32_t *wp, const uint16_t *x, int64_t M, int64_t K, int64_t N, const float *bias,
                 uint16_t *y, int nthreads);
void rope_bf16(const uint16_t *x, int64_t x_stride, const float *cos, const float *sin_signed, int64_t rows,
               int64_t heads, int64_t D, uint16_t *out, int nthreads);
void decode_bf16(const float *q, const uint16_t *kc, const uint16_t *vc, const int64_t *slots,
                 const int64_t *offsets, int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 float scale, float *out, float *lse, int nthreads);
void silu_mul_bf16(const uint16_t *gate_up, int64_t rows, int64_t inter, uint16_t *out, int nthreads);

/* One layer's tensors, as addresses: row l of the [num_layers, LAYER_PTRS] table. */
enum { INPUT_NORM, QKV, QKV_BIAS, O_PROJ, POST_NORM, GATE_UP, DOWN, K_CACHE, V_CACHE, LAYER_PTRS };
/* The model's shape: dims[...] */
enum { HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, NUM_SLOTS, DIMS };

/* x [batch, hidden] bf16: the token embeddings in, the last layer's MLP output out; residual
 * [batch, hidden] fp32 out: the stream before it (model.py's (x, residual) after the loop).
 * cos, sin_signed fp32 [batch, head_dim]: each row's RoPE rows. out_slots [batch]: where each new
 * token's K / V go; request b's context is slots[offsets[b]:offsets[b + 1]] (its new token's slot
 * last). 0 on success, -2 a slot in out_slots out of range (nothing written), -1 no memory. */
int decode_layers_bf16(int64_t num_layers, const int64_t *layers, const int64_t *dims, int64_t batch, float eps,
                       float sm_scale, int lanes, uint16_t *x, float *residual, const float *cos,
                       const float *sin_signed, const int64_t *out_slots, const int64_t *slots,
                       const int64_t *offsets, int nthreads) {
    const int64_t hidden = dims[HIDDEN], H = dims[HEADS], KVH = dims[KV_HEADS], D = dims[HEAD_DIM];
    const int64_t inter = dims[INTER], q_size = H * D, kv_size = KVH * D, qkv_size = q_size + 2 * kv_size;
    for (int64_t b = 0; b < batch; b++)
        if (out_slots[b] < 0 || out_slots[b] >= dims[NUM_SLOTS]) return -2;
    /* scratch: bf16 h | qkv | q|k roped | attention out | gate_up | act, then fp32 q | out | lse */
    const int64_t halves = batch * (hidden + qkv_size + q_size + kv_size + q_size + 3 * inter);
    const int64_t floats = batch * (2 * q_size + H);
    char *scratch = malloc(halves * sizeof(uint16_t) + floats * sizeof(float) + 64);
    if (!scratch) return -1;
    float *qf = (float *)scratch, *attn = qf + batch * q_size, *lse = attn + batch * q_size;
    uint16_t *h = (uint16_t *)(lse + batch * H), *qkv = h + batch * hidden, *qk = qkv + batch * qkv_size;
    uint16_t *a = qk + batch * (q_size + kv_size), *gate_up = a + batch * q_size, *act = gate_up + batch * 2 * inter;
    for (int64_t l = 0; l < num_layers; l++) {
        const int64_t *p = layers + l * LAYER_PTRS;
        uint16_t *kc = (uint16_t *)p[K_CACHE], *vc = (uint16_t *)p[V_CACHE];
        rmsnorm_bf16(x, hidden, l == 0 ? NULL : residual, (const uint16_t *)p[INPUT_NORM], eps, batch, hidden,
                     lanes, h, residual, nthreads);
        linear_bf16((const uint32_t *)p[QKV], h, batch, hidden, qkv_size, (const float *)p[QKV_BIAS], qkv, nthreads);
        rope_bf16(qkv, qkv_size, cos, sin_signed, batch, H + KVH, D, qk, nthreads);
        for (int64_t b = 0; b < batch; b++) {
            const uint16_t *qb = qk + b * (q_size + kv_size);
            memcpy(kc + out_slots[b] * kv_size, qb + q_size, kv_size * sizeof(uint16_t));
            memcpy(vc + out_slots[b] * kv_size, qkv + b * qkv_size + q_size + kv_size, kv_size * sizeof(uint16_t));
            for (int64_t i = 0; i < q_size; i++) qf[b * q_size + i] = load_bf16(qb, i);
        }
        decode_bf16(qf, kc, vc, slots, offsets, batch, H, KVH, D, sm_scale, attn, lse, nthreads);
        for (int64_t i = 0; i < batch * q_size; i++) a[i] = round_bf16(attn[i]);
        linear_bf16((const uint32_t *)p[O_PROJ], a, batch, q_size, hidden, NULL, x, nthreads);
        rmsnorm_bf16(x, hidden, residual, (const uint16_t *)p[POST_NORM], eps, batch, hidden, lanes, h, residual,
                     nthreads);
        linear_bf16((const uint32_t *)p[GATE_UP], h, batch, hidden, 2 * inter, NULL, gate_up, nthreads);
        silu_mul_bf16(gate_up, batch, inter, act, nthreads);
        linear_bf16((const uint32_t *)p[DOWN], act, batch, inter, hidden, NULL, x, nthreads);
    }
    free(scratch);
    return 0;
}
