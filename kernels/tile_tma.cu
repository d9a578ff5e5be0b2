// Lab 7, kernel 5 (Hopper, sm_90 and up): the tensor memory accelerator.
// One thread hands each whole tile to the TMA as one bulk copy
// (cp.async.bulk), which counts the bytes it delivers on the slot's
// mbarrier; the block's threads wait on that barrier and compute. No
// thread spends instructions on addresses or per-16-byte copies: the
// copy engine inside the SM does it, STAGES tiles ahead.
#include <cuda/barrier>
#include <cooperative_groups.h>
#include "tile_blur.cuh"

#ifndef STAGES
#define STAGES 2
#endif

#pragma nv_diag_suppress static_var_with_dynamic_init

using barrier = cuda::barrier<cuda::thread_scope_block>;

extern "C" __global__ void __launch_bounds__(THREADS)
tile_tma(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    extern __shared__ float4 smem4[];  // STAGES * SPAN floats
    float* slots = reinterpret_cast<float*>(smem4);
    __shared__ barrier full[STAGES];
    auto block = cooperative_groups::this_thread_block();
    const unsigned int mine = (tiles > blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    if (block.thread_rank() == 0) {
        for (int s = 0; s < STAGES; ++s) init(&full[s], THREADS);
        // Make the barriers' initialization visible to the TMA (the async proxy).
        cuda::device::experimental::fence_proxy_async_shared_cta();
    }
    block.sync();
    TRACE_BLOCK_START();
    // One thread issues a bulk copy of tile k into slot k % STAGES.
    auto fetch = [&](unsigned int k) {
        size_t tile = blockIdx.x + (size_t)k * gridDim.x;
        cuda::memcpy_async(slots + (k % STAGES) * SPAN, in + tile * TILE, cuda::aligned_size_t<16>(SPAN * sizeof(float)), full[k % STAGES]);
    };
    if (block.thread_rank() == 0) {
        for (unsigned int k = 0; k < mine && k < STAGES; ++k) {
            TRACE_FROM(copy);
            fetch(k);
            TRACE_SPAN(PHASE_COPY, k, copy);
        }
    }
    for (unsigned int k = 0; k < mine; ++k) {
        const int s = k % STAGES;
        TRACE_FROM(wait);
        barrier::arrival_token token = full[s].arrive();
        full[s].wait(std::move(token));
        TRACE_SPAN(PHASE_WAIT, k, wait);
        TRACE_FROM(compute);
        blur_tile(slots + s * SPAN, out + (blockIdx.x + (size_t)k * gridDim.x) * TILE, threadIdx.x, THREADS);
        TRACE_SPAN(PHASE_COMPUTE, k, compute);
        // Every thread is done reading slot s before the TMA refills it.
        TRACE_FROM(done);
        block.sync();
        TRACE_SPAN(PHASE_WAIT, k, done);
        if (block.thread_rank() == 0 && k + STAGES < mine) {
            TRACE_FROM(copy);
            fetch(k + STAGES);
            TRACE_SPAN(PHASE_COPY, k + STAGES, copy);
        }
    }
    TRACE_BLOCK_END();
}
