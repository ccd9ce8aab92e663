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

/* One call's shape and buffers: the model's sizes, the step, and scratch for one layer's values. */
typedef struct {
    int64_t tokens, hidden, H, KVH, D, inter, q_size, kv_size, qkv_size;
    float eps, sm_scale;
    int lanes, nthreads;
    const int64_t *step, *out_slots;
    const float *cos, *sin_signed;
    float *qf, *attn, *lse;                            /* fp32 q, attention out, lse */
    uint16_t *h, *qkv, *qk, *a, *gate_up, *act;        /* bf16 norm out, qkv, q|k roped, attention out, MLP */
} Call;

/* Whether the step may run: every out slot in the pool, an extend step's layout in range. */
static int step_ok(const Call *c, int64_t num_slots) {
    for (int64_t t = 0; t < c->tokens; t++)
        if (c->out_slots[t] < 0 || c->out_slots[t] >= num_slots) return -2;
    const int64_t *st = c->step;
    if (st[KIND] == EXTEND &&
        !extend_layout_ok((const void *)st[TABLE], st[TABLE_STRIDE], (int)st[TABLE_WIDE], (const int64_t *)st[ROWS],
                          (const int64_t *)st[PREFIX_LENS], (const int64_t *)st[EXTEND_LENS],
                          (const int64_t *)st[Q_STARTS], st[REQUESTS], (const int64_t *)st[BOUNDS], 1))
        return -3;
    return 0;
}

/* The new tokens' K / V into the caches, their queries as fp32 (the attention kernels' input). */
static void store_kv(const Call *c, uint16_t *kc, uint16_t *vc) {
    const int64_t q_size = c->q_size, kv_size = c->kv_size;
    _Pragma("omp parallel for schedule(static) num_threads(c->nthreads) if (c->nthreads > 1 && c->tokens > 64)")
    for (int64_t t = 0; t < c->tokens; t++) {
        const uint16_t *qt = c->qk + t * (q_size + kv_size);
        memcpy(kc + c->out_slots[t] * kv_size, qt + q_size, kv_size * sizeof(uint16_t));
        memcpy(vc + c->out_slots[t] * kv_size, c->qkv + t * c->qkv_size + q_size + kv_size, kv_size * sizeof(uint16_t));
        for (int64_t i = 0; i < q_size; i++) c->qf[t * q_size + i] = load_bf16(qt, i);
    }
}

/* attention (fp32, rounded to bf16 into c->a) of the step's queries over their contexts: 0, or
 * the extend kernel's refusal (-3) or failure to allocate (-1). */
static int attend(const Call *c, const uint16_t *kc, const uint16_t *vc) {
    const int64_t *st = c->step;
    if (st[KIND] == DECODE) {
        decode_bf16(c->qf, kc, vc, (const int64_t *)st[SLOTS], (const int64_t *)st[OFFSETS], st[REQUESTS], c->H,
                    c->KVH, c->D, c->sm_scale, c->attn, c->lse, c->nthreads);
    } else {
        memset(c->attn, 0, c->tokens * c->q_size * sizeof(float)); /* rows no request covers */
        const int got = extend_bf16(c->qf, kc, vc, (const void *)st[TABLE], st[TABLE_STRIDE], (int)st[TABLE_WIDE],
                                    (const int64_t *)st[ROWS], (const int64_t *)st[PREFIX_LENS],
                                    (const int64_t *)st[EXTEND_LENS], (const int64_t *)st[Q_STARTS], st[REQUESTS],
                                    c->H, c->KVH, c->D, c->sm_scale, c->attn, c->nthreads,
                                    (const int64_t *)st[BOUNDS], 1, NULL);
        if (got != 0) return got == -2 ? -3 : -1;
    }
    const int64_t q_size = c->q_size;
    _Pragma("omp parallel for schedule(static) num_threads(c->nthreads) if (c->nthreads > 1 && c->tokens > 64)")
    for (int64_t t = 0; t < c->tokens; t++)
        for (int64_t i = t * q_size; i < (t + 1) * q_size; i++) c->a[i] = round_bf16(c->attn[i]);
    return 0;
}

/* One decoder layer (its row p of the table) over x and residual, in place. */
static int layer(const Call *c, const int64_t *p, int first, uint16_t *x, float *residual) {
    const int64_t T = c->tokens, hidden = c->hidden;
    uint16_t *kc = (uint16_t *)p[K_CACHE], *vc = (uint16_t *)p[V_CACHE];
    rmsnorm_bf16(x, hidden, first ? NULL : residual, (const uint16_t *)p[INPUT_NORM], c->eps, T, hidden, c->lanes,
                 c->h, residual, c->nthreads);
    linear_bf16((const uint32_t *)p[QKV], c->h, T, hidden, c->qkv_size, (const float *)p[QKV_BIAS], c->qkv,
                c->nthreads);
    rope_bf16(c->qkv, c->qkv_size, c->cos, c->sin_signed, T, c->H + c->KVH, c->D, c->qk, c->nthreads);
    store_kv(c, kc, vc);
    const int status = attend(c, kc, vc);
    if (status != 0) return status;
    linear_bf16((const uint32_t *)p[O_PROJ], c->a, T, c->q_size, hidden, NULL, x, c->nthreads);
    rmsnorm_bf16(x, hidden, residual, (const uint16_t *)p[POST_NORM], c->eps, T, hidden, c->lanes, c->h, residual,
                 c->nthreads);
    linear_bf16((const uint32_t *)p[GATE_UP], c->h, T, hidden, 2 * c->inter, NULL, c->gate_up, c->nthreads);
    silu_mul_bf16(c->gate_up, T, c->inter, c->act, c->nthreads);
    linear_bf16((const uint32_t *)p[DOWN], c->act, T, c->inter, hidden, NULL, x, c->nthreads);
    return 0;
}

/* x [tokens, hidden] bf16: the token embeddings in, the last layer's MLP output out; residual
 * [tokens, hidden] fp32 out: the stream before it (model.py's (x, residual) after the loop).
 * cos, sin_signed fp32 [tokens, head_dim]: each token's RoPE rows; out_slots [tokens]: where its
 * K / V go. 0 on success; before anything is written, -2 a slot in out_slots out of range, -3
 * an extend step's layout out of range (cpu_extend.c's check); -1 no memory. */
int forward_layers_bf16(int64_t num_layers, const int64_t *layers, const int64_t *dims, int64_t tokens, float eps,
                        float sm_scale, int lanes, uint16_t *x, float *residual, const float *cos,
                        const float *sin_signed, const int64_t *out_slots, const int64_t *step, int nthreads) {
    Call c = {.tokens = tokens, .hidden = dims[HIDDEN], .H = dims[HEADS], .KVH = dims[KV_HEADS], .D = dims[HEAD_DIM],
              .inter = dims[INTER], .eps = eps, .sm_scale = sm_scale, .lanes = lanes, .nthreads = nthreads,
              .step = step, .out_slots = out_slots, .cos = cos, .sin_signed = sin_signed};
    c.q_size = c.H * c.D, c.kv_size = c.KVH * c.D, c.qkv_size = c.q_size + 2 * c.kv_size;
    int status = step_ok(&c, dims[NUM_SLOTS]);
    if (status != 0) return status;
    const int64_t floats = tokens * (2 * c.q_size + c.H);
    const int64_t halves = tokens * (c.hidden + c.qkv_size + c.q_size + c.kv_size + c.q_size + 3 * c.inter);
    char *scratch = malloc(floats * sizeof(float) + halves * sizeof(uint16_t));
    if (!scratch) return -1;
    c.qf = (float *)scratch, c.attn = c.qf + tokens * c.q_size, c.lse = c.attn + tokens * c.q_size;
    c.h = (uint16_t *)(c.lse + tokens * c.H), c.qkv = c.h + tokens * c.hidden, c.qk = c.qkv + tokens * c.qkv_size;
    c.a = c.qk + tokens * (c.q_size + c.kv_size), c.gate_up = c.a + tokens * c.q_size;
    c.act = c.gate_up + tokens * 2 * c.inter;
    for (int64_t l = 0; l < num_layers && status == 0; l++)
        status = layer(&c, layers + l * LAYER_PTRS, l == 0, x, residual);
    free(scratch);
    return status;
}
