/* Lab 4's CPU work for the CuPy reference: the same argmin as
 * overlap-lab's `labs::callback::work::heavy_argmin` (16 running minima,
 * then the first index of the smallest; `passes` times, every pass must
 * agree), so both sides do the same work per iteration. Called through
 * ctypes, which releases Python's GIL for the call. The function times
 * itself (CLOCK_MONOTONIC), so the duration excludes waiting for the GIL.
 * Returns the index, or -1 if two passes disagreed. */
#include <math.h>
#include <stdint.h>
#include <time.h>

static int64_t argmin_once(const float *scores, int64_t n) {
    float lanes[16];
    for (int i = 0; i < 16; i++) lanes[i] = INFINITY;
    int64_t blocks = n / 16 * 16;
    for (int64_t b = 0; b < blocks; b += 16)
        for (int i = 0; i < 16; i++) {
            float x = scores[b + i];
            lanes[i] = x < lanes[i] ? x : lanes[i];
        }
    float min = INFINITY;
    for (int64_t i = blocks; i < n; i++) min = scores[i] < min ? scores[i] : min;
    for (int i = 0; i < 16; i++) min = lanes[i] < min ? lanes[i] : min;
    for (int64_t i = 0; i < n; i++)
        if (scores[i] == min) return i;
    return 0;
}

int64_t heavy_argmin(const float *scores, int64_t n, uint32_t passes, double *elapsed_ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int64_t first = argmin_once(scores, n), result = first;
    for (uint32_t p = 1; p < passes; p++) {
        /* What Rust's black_box does there: the scores may have changed, so
         * no pass can be merged with another. */
        __asm__ volatile("" ::: "memory");
        if (argmin_once(scores, n) != first) result = -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    *elapsed_ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    return result;
}
