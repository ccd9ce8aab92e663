/* A bf16 model's CPU forward through all its decoder layers in one call: runtime/model/model.py's
 * DecoderLayer.forward with the other kernels of this folder, for the common case (no LoRA, no
 * q/k norm; a decode step whose requests' contexts the decode kernel reads whole, or an extend
 * step), so that the ~25 torch ops and ctypes calls a layer costs from Python run as C calls
 * instead (runtime/model/fused_layers.py says which steps). Per layer, over the step's tokens:
 *
 *   h, residual  = rmsnorm(x, residual)            input_layernorm (x alone at layer 0)
 *   qkv          = linear(h, qkv_proj) (+ bias)    cpu_linear.c, the packed layout
 *   q|k          = rope(q|k)                        cpu_elementwise.c, torch's rounding
 *   caches[out_slots] = k, v
 *   a            = round(attention(q, context))    cpu_decode.c / cpu_extend.c, fp32, rounded to bf16
 *   h, residual  = rmsnorm(linear(a, o_proj), residual)
 *   x            = linear(silu_mul(linear(h, gate_up_proj)), down_proj)
 *
 * the same calls, in the same order, on the same values as the layer-by-layer path, so the
 * result is that path's bit for bit (tests/runtime/test_fused_layers.py). Built with the
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
int extend_bf16(const float *q, const uint16_t *kc, const uint16_t *vc, const void *table, int64_t table_stride,
                int wide, const int64_t *rows, const int64_t *prefix_lens, const int64_t *extend_lens,
                const int64_t *q_starts, int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                float scale, float *out, int nthreads, const int64_t *bounds, int causal, float *lse);
int extend_layout_ok(const void *table, int64_t table_stride, int wide, const int64_t *rows,
                     const int64_t *prefix_lens, const int64_t *extend_lens, const int64_t *q_starts, int64_t batch,
                     const int64_t *bounds, int causal);
void silu_mul_bf16(const uint16_t *gate_up, int64_t rows, int64_t inter, uint16_t *out, int nthreads);

/* One layer's tensors, as addresses: row l of the [num_layers, LAYER_PTRS] table. */
enum { INPUT_NORM, QKV, QKV_BIAS, O_PROJ, POST_NORM, GATE_UP, DOWN, K_CACHE, V_CACHE, LAYER_PTRS };
/* The model's shape: dims[...] */
enum { HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, NUM_SLOTS, DIMS };
/* The step's attention: step[KIND] DECODE, request b's context slots[offsets[b]:offsets[b + 1]]
 * (its new token last), or EXTEND, the extend kernel's table, rows, lengths and bounds. */
enum { KIND, REQUESTS, SLOTS, OFFSETS, STEP_DECODE_ARGS };
enum { TABLE = 2, TABLE_STRIDE, TABLE_WIDE, ROWS, PREFIX_LENS, EXTEND_LENS, Q_STARTS, BOUNDS, STEP_EXTEND_ARGS };
enum { DECODE, EXTEND };

/* x [tokens, hidden] bf16: the token embeddings in, the last layer's MLP output out; residual
 * [tokens, hidden] fp32 out: the stream before it (model.py's (x, residual) after the loop).
 * cos, sin_signed fp32 [tokens, head_dim]: each token's RoPE rows; out_slots [tokens]: where its
 * K / V go. 0 on success; before anything is written, -2 a slot in out_slots out of range, -3
 * an extend step's layout out of range (cpu_extend.c's check); -1 no memory. */
int forward_layers_bf16(int64_t num_layers, const int64_t *layers, const int64_t *dims, int64_t tokens, float eps,
                        float sm_scale, int lanes, uint16_t *x, float *residual, const float *cos,
                        const float *sin_signed, const int64_t *out_slots, const int64_t *step, int nthreads) {
    const int64_t hidden = dims[HIDDEN], H = dims[HEADS], KVH = dims[KV_HEADS], D = dims[HEAD_DIM];
    const int64_t inter = dims[INTER], q_size = H * D, kv_size = KVH * D, qkv_size = q_size + 2 * kv_size;
    for (int64_t t = 0; t < tokens; t++)
        if (out_slots[t] < 0 || out_slots[t] >= dims[NUM_SLOTS]) return -2;
    if (step[KIND] == EXTEND &&
        !extend_layout_ok((const void *)step[TABLE], step[TABLE_STRIDE], (int)step[TABLE_WIDE],
                          (const int64_t *)step[ROWS], (const int64_t *)step[PREFIX_LENS],
                          (const int64_t *)step[EXTEND_LENS], (const int64_t *)step[Q_STARTS], step[REQUESTS],
                          (const int64_t *)step[BOUNDS], 1))
        return -3;
    /* scratch: fp32 q | attention out | lse, then bf16 h | qkv | q|k roped | attention out | gate_up | act */
    const int64_t floats = tokens * (2 * q_size + H);
    const int64_t halves = tokens * (hidden + qkv_size + q_size + kv_size + q_size + 3 * inter);
    char *scratch = malloc(floats * sizeof(float) + halves * sizeof(uint16_t));
    if (!scratch) return -1;
    float *qf = (float *)scratch, *attn = qf + tokens * q_size, *lse = attn + tokens * q_size;
    uint16_t *h = (uint16_t *)(lse + tokens * H), *qkv = h + tokens * hidden, *qk = qkv + tokens * qkv_size;
    uint16_t *a = qk + tokens * (q_size + kv_size), *gate_up = a + tokens * q_size, *act = gate_up + tokens * 2 * inter;
    int status = 0;
    for (int64_t l = 0; l < num_layers && status == 0; l++) {
        const int64_t *p = layers + l * LAYER_PTRS;
        uint16_t *kc = (uint16_t *)p[K_CACHE], *vc = (uint16_t *)p[V_CACHE];
        rmsnorm_bf16(x, hidden, l == 0 ? NULL : residual, (const uint16_t *)p[INPUT_NORM], eps, tokens, hidden,
                     lanes, h, residual, nthreads);
        linear_bf16((const uint32_t *)p[QKV], h, tokens, hidden, qkv_size, (const float *)p[QKV_BIAS], qkv,
                    nthreads);
        rope_bf16(qkv, qkv_size, cos, sin_signed, tokens, H + KVH, D, qk, nthreads);
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && tokens > 64)")
        for (int64_t t = 0; t < tokens; t++) {
            const uint16_t *qt = qk + t * (q_size + kv_size);
            memcpy(kc + out_slots[t] * kv_size, qt + q_size, kv_size * sizeof(uint16_t));
            memcpy(vc + out_slots[t] * kv_size, qkv + t * qkv_size + q_size + kv_size, kv_size * sizeof(uint16_t));
            for (int64_t i = 0; i < q_size; i++) qf[t * q_size + i] = load_bf16(qt, i);
        }
        if (step[KIND] == DECODE) {
            decode_bf16(qf, kc, vc, (const int64_t *)step[SLOTS], (const int64_t *)step[OFFSETS], step[REQUESTS], H,
                        KVH, D, sm_scale, attn, lse, nthreads);
        } else {
            memset(attn, 0, tokens * q_size * sizeof(float)); /* rows no request covers */
            const int got = extend_bf16(qf, kc, vc, (const void *)step[TABLE], step[TABLE_STRIDE],
                                        (int)step[TABLE_WIDE], (const int64_t *)step[ROWS],
                                        (const int64_t *)step[PREFIX_LENS], (const int64_t *)step[EXTEND_LENS],
                                        (const int64_t *)step[Q_STARTS], step[REQUESTS], H, KVH, D, sm_scale, attn,
                                        nthreads, (const int64_t *)step[BOUNDS], 1, NULL);
            if (got != 0) {
                status = got == -2 ? -3 : -1;
                break;
            }
        }
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && tokens > 64)")
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t i = t * q_size; i < (t + 1) * q_size; i++) a[i] = round_bf16(attn[i]);
        linear_bf16((const uint32_t *)p[O_PROJ], a, tokens, q_size, hidden, NULL, x, nthreads);
        rmsnorm_bf16(x, hidden, residual, (const uint16_t *)p[POST_NORM], eps, tokens, hidden, lanes, h, residual,
                     nthreads);
        linear_bf16((const uint32_t *)p[GATE_UP], h, tokens, hidden, 2 * inter, NULL, gate_up, nthreads);
        silu_mul_bf16(gate_up, tokens, inter, act, nthreads);
        linear_bf16((const uint32_t *)p[DOWN], act, tokens, inter, hidden, NULL, x, nthreads);
    }
    free(scratch);
    return status;
}
