// Lab 7, kernels 2 and 3: tiles copied to shared memory asynchronously
// (cuda::memcpy_async through a cuda::pipeline: cp.async on sm_80 and up),
// STAGES tiles in flight. Each thread issues the copies of its share of the
// next tiles, then waits only for its copies of the oldest; a block sync
// makes everyone's copies of that tile visible, and the block computes it
// while the newer tiles land. STAGES=2 is double buffering; STAGES=1 waits
// for each tile as the naive kernel does, without the trip through
// registers.
#include <cuda/pipeline>
#include "tile_blur.cuh"

#ifndef STAGES
#define STAGES 2
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    extern __shared__ float4 smem4[];  // STAGES * SPAN floats
    const float* smem = reinterpret_cast<const float*>(smem4);
    // A pipeline per thread: its copies are committed as one batch per tile,
    // and consumer_wait waits for the oldest batch (cp.async.wait_group).
    cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
    // The k-th tile of this block is blockIdx.x + k * gridDim.x, in slot k % STAGES.
    const unsigned int mine = (tiles > blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    unsigned int fetched = 0;
    TRACE_BLOCK_START();
    for (unsigned int k = 0; k < mine; ++k) {
        // Slot fetched % STAGES was last read for tile fetched - STAGES,
        // which the whole block finished before the sync that ended it.
        for (; fetched < mine && fetched < k + STAGES; ++fetched) {
            TRACE_FROM(copy);
            const float4* src = reinterpret_cast<const float4*>(in + (blockIdx.x + (size_t)fetched * gridDim.x) * TILE);
            float4* dst = smem4 + (fetched % STAGES) * (SPAN / 4);
            pipe.producer_acquire();
            for (int v = threadIdx.x; v < SPAN / 4; v += THREADS) {
                cuda::memcpy_async(dst + v, src + v, cuda::aligned_size_t<16>(16), pipe);
            }
            pipe.producer_commit();
            TRACE_SPAN(PHASE_COPY, fetched, copy);
        }
        TRACE_FROM(wait);
        pipe.consumer_wait();
        __syncthreads();  // every thread's copies of tile k have landed
        TRACE_SPAN(PHASE_WAIT, k, wait);
        TRACE_FROM(compute);
        const float* s = smem + (k % STAGES) * SPAN;
        blur_tile(s, out + (blockIdx.x + (size_t)k * gridDim.x) * TILE, threadIdx.x, THREADS);
        TRACE_SPAN(PHASE_COMPUTE, k, compute);
        TRACE_FROM(done);
        pipe.consumer_release();
        __syncthreads();  // every thread is done reading slot k % STAGES
        TRACE_SPAN(PHASE_WAIT, k, done);
    }
    TRACE_BLOCK_END();
}
