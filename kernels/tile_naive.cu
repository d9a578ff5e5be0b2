// Lab 7, kernel 1: naive tiled. Each block loops over tiles (a persistent
// grid): every thread loads its share of the tile into registers and
// stores it to shared memory, the block syncs, computes the tile from
// shared memory, and syncs again before the next load. While the block
// computes, none of its loads are in flight; while it loads, it computes
// nothing.
#include "tile_blur.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
tile_naive(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    extern __shared__ float4 smem4[];  // SPAN floats
    const float* s = reinterpret_cast<const float*>(smem4);
    const float4* in4 = reinterpret_cast<const float4*>(in);
    TRACE_BLOCK_START();
    for (unsigned int t = blockIdx.x; t < tiles; t += gridDim.x) {
        TRACE_FROM(copy);
        const float4* src = in4 + (size_t)t * (TILE / 4);
        for (int v = threadIdx.x; v < SPAN / 4; v += THREADS) {
            smem4[v] = src[v];
        }
        TRACE_SPAN(PHASE_COPY, (t - blockIdx.x) / gridDim.x, copy);
        TRACE_FROM(loaded);
        __syncthreads();
        TRACE_SPAN(PHASE_WAIT, (t - blockIdx.x) / gridDim.x, loaded);
        TRACE_FROM(compute);
        blur_tile(s, out + (size_t)t * TILE, threadIdx.x, THREADS);
        TRACE_SPAN(PHASE_COMPUTE, (t - blockIdx.x) / gridDim.x, compute);
        TRACE_FROM(done);
        __syncthreads();
        TRACE_SPAN(PHASE_WAIT, (t - blockIdx.x) / gridDim.x, done);
    }
    TRACE_BLOCK_END();
}
