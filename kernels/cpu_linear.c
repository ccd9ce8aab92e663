/* bf16 linear layers on CPU with AVX512-BF16: y = x @ W^T (+ bias) for bf16 x [M, K] and y [M, N].
 *
 * W [N, K] is packed once, at load, with its pairs of entries in the vector lanes:
 *
 *   wp[b][p][l] = (W[16 b + l][2 p], W[16 b + l][2 p + 1])     one uint32 per lane, 16 lanes
 *
 * so one instruction adds, for 16 output columns at once, the two exact products of a pair of x's
 * entries (broadcast, read as they lie in the row) with the pair of each column's weights, into
 * fp32. A register tile of up to 4 blocks of 16 columns by 6 rows streams each block's packed
 * weights once (contiguous, K / 2 x 64 bytes) for all its rows: at one to six rows a decode
 * step's projections run at the speed the weights stream from memory, and larger batches reuse
 * each 64-column panel from cache for every 6 rows. Each output is its row's sum in a fixed
 * order whatever the batch (rows do not share sums), rounded once to bf16 (to nearest even),
 * the bias added in fp32.
 * Threads split the columns. Only where the compiler targets AVX512-BF16 (`linear_lanes()`).
 *
 * Contract (checked by the Python caller, kernels/native_layers.py): K even, N a multiple of 16; x, y
 * contiguous; bias fp32 [N] or NULL.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define LINEAR_LANES 1

static inline __attribute__((always_inline)) void tile(const uint32_t *wp, const uint16_t *x, int64_t K,
                                                       uint16_t *y, int64_t N, int64_t n0, const float *bias,
                                                       const int NB, const int MR) {
    const int64_t K2 = K / 2;
    const uint32_t *w0 = wp + (n0 / 16) * K2 * 16;
    __m512 a[4][6];
    for (int b = 0; b < NB; b++) {
        const __m512 init = bias ? _mm512_loadu_ps(bias + n0 + 16 * b) : _mm512_setzero_ps();
        for (int m = 0; m < MR; m++) a[b][m] = init;
    }
    for (int64_t p = 0; p < K2; p++) {
        __m512bh wv[4];
        for (int b = 0; b < NB; b++) {
            const uint32_t *wb = w0 + (b * K2 + p) * 16;
            wv[b] = (__m512bh)_mm512_loadu_si512(wb);
            _mm_prefetch((const char *)wb + 1024, _MM_HINT_T1);
        }
        for (int m = 0; m < MR; m++) {
            uint32_t pair;
            memcpy(&pair, x + m * K + 2 * p, sizeof pair);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int b = 0; b < NB; b++) a[b][m] = _mm512_dpbf16_ps(a[b][m], wv[b], xv);
        }
    }
    for (int b = 0; b < NB; b++)
        for (int m = 0; m < MR; m++)
            _mm256_storeu_si256((__m256i *)(y + m * N + n0 + 16 * b), (__m256i)_mm512_cvtneps_pbh(a[b][m]));
}

#define TILE_CASE(NB, MR) \
    case (NB - 1) * 8 + MR - 1: tile(wp, x + m0 * K, K, y + m0 * N, N, n, bias, NB, MR); break;

void linear_bf16(const uint32_t *wp, const uint16_t *x, int64_t M, int64_t K, int64_t N, const float *bias,
                 uint16_t *y, int nthreads) {
    const int64_t panels = (N + 63) / 64;
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && panels > 1)")
    for (int64_t panel = 0; panel < panels; panel++) {
        const int64_t n0 = panel * 64, cols = N - n0 < 64 ? N - n0 : 64;
        for (int64_t m0 = 0; m0 < M; m0 += 6) {
            const int64_t MR = M - m0 < 6 ? M - m0 : 6; /* up to 4 blocks x 6 rows: 24 accumulators */
            for (int64_t c0 = 0; c0 < cols;) {
                const int64_t NB = (cols - c0) / 16 < 4 ? (cols - c0) / 16 : 4, n = n0 + c0;
                switch ((NB - 1) * 8 + MR - 1) {
                    TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4) TILE_CASE(1, 5) TILE_CASE(1, 6)
                    TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3) TILE_CASE(2, 4) TILE_CASE(2, 5) TILE_CASE(2, 6)
                    TILE_CASE(3, 1) TILE_CASE(3, 2) TILE_CASE(3, 3) TILE_CASE(3, 4) TILE_CASE(3, 5) TILE_CASE(3, 6)
                    TILE_CASE(4, 1) TILE_CASE(4, 2) TILE_CASE(4, 3) TILE_CASE(4, 4) TILE_CASE(4, 5) TILE_CASE(4, 6)
                }
                c0 += 16 * NB;
            }
        }
    }
}
#else
#define LINEAR_LANES 0
void linear_bf16(const uint32_t *wp, const uint16_t *x, int64_t M, int64_t K, int64_t N, const float *bias,
                 uint16_t *y, int nthreads) {
    (void)wp; (void)x; (void)M; (void)K; (void)N; (void)bias; (void)y; (void)nthreads;
}
#endif

/* 1 where linear_bf16 is built (the compiler targets AVX512-BF16), else 0: the caller keeps oneDNN. */
int linear_lanes(void) { return LINEAR_LANES; }
