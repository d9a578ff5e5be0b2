// Lab 7, kernel 4: warp-specialized. Each warp has one job: warp 0 loads
// tiles into shared memory (cp.async), the middle warps compute,
// the last warp stores results to device memory. Two pipelines of STAGES
// slots join them, each a pair of barriers per slot ("full": the slot may
// be read, "empty": it may be written again):
//   loader -> compute: input slots (SPAN floats each);
//   compute -> storer: output slots (TILE floats each).
// While the compute warps work on tile k, the loader fills the slot of
// tile k+1 and the storer drains tile k-1: ping-pong stages.
#include <cuda/barrier>
#include <cooperative_groups.h>
#include "tile_blur.cuh"

#ifndef STAGES
#define STAGES 2
#endif
#define COMPUTE_THREADS (THREADS - 64)
static_assert(THREADS >= 96 && THREADS % 32 == 0, "one loader warp, compute warps, one storer warp");

#pragma nv_diag_suppress static_var_with_dynamic_init

using barrier = cuda::barrier<cuda::thread_scope_block>;

extern "C" __global__ void __launch_bounds__(THREADS)
tile_warp_specialized(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    extern __shared__ float4 smem4[];  // STAGES * SPAN input floats, then STAGES * TILE output floats
    float* in_slots = reinterpret_cast<float*>(smem4);
    float* out_slots = in_slots + STAGES * SPAN;
    __shared__ barrier in_full[STAGES], in_empty[STAGES], out_full[STAGES], out_empty[STAGES];
    auto block = cooperative_groups::this_thread_block();
    if (block.thread_rank() == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // Each pipeline's barriers count the threads on both of its ends.
            init(&in_full[s], 32 + COMPUTE_THREADS);
            init(&in_empty[s], 32 + COMPUTE_THREADS);
            init(&out_full[s], COMPUTE_THREADS + 32);
            init(&out_empty[s], COMPUTE_THREADS + 32);
        }
    }
    block.sync();
    TRACE_BLOCK_START();

    const int warp = threadIdx.x / 32;
    const unsigned int mine = (tiles > blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    if (warp == 0) {
        // Loader: each lane copies 16-byte pieces with cp.async (as
        // kernel 2 does; on Hopper libcu++ would turn a warp's
        // cuda::memcpy_async into one TMA copy, which is kernel 5's lesson)
        // and has its arrival on the slot's "full" barrier made when its
        // copies have landed (cp.async.mbarrier.arrive.noinc), so it never
        // waits for them and moves on to the next slot.
        const int lane = threadIdx.x % 32;
        for (unsigned int k = 0; k < mine; ++k) {
            const int s = k % STAGES;
            TRACE_FROM(wait);
            in_empty[s].arrive_and_wait();
            TRACE_SPAN(PHASE_WAIT, k, wait);
            TRACE_FROM(copy);
            const float4* src = reinterpret_cast<const float4*>(in + (blockIdx.x + (size_t)k * gridDim.x) * TILE);
            const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(in_slots + s * SPAN));
            for (int v = lane; v < SPAN / 4; v += 32) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * v), "l"(src + v) : "memory");
            }
            const unsigned int full = static_cast<unsigned int>(__cvta_generic_to_shared(cuda::device::barrier_native_handle(in_full[s])));
            asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(full) : "memory");
            TRACE_SPAN(PHASE_COPY, k, copy);
        }
    } else if (warp == THREADS / 32 - 1) {
        // Storer.
        const int lane = threadIdx.x % 32;
        for (int s = 0; s < STAGES; ++s) (void)out_empty[s].arrive();  // every output slot starts empty
        for (unsigned int k = 0; k < mine; ++k) {
            const int s = k % STAGES;
            TRACE_FROM(wait);
            out_full[s].arrive_and_wait();
            TRACE_SPAN(PHASE_WAIT, k, wait);
            TRACE_FROM(store);
            const float4* src = reinterpret_cast<const float4*>(out_slots + s * TILE);
            float4* dst = reinterpret_cast<float4*>(out + (blockIdx.x + (size_t)k * gridDim.x) * TILE);
            for (int v = lane; v < TILE / 4; v += 32) dst[v] = src[v];
            (void)out_empty[s].arrive();
            TRACE_SPAN(PHASE_STORE, k, store);
        }
    } else {
        // Compute.
        const int c = threadIdx.x - 32;
        for (int s = 0; s < STAGES; ++s) (void)in_empty[s].arrive();  // every input slot starts empty
        for (unsigned int k = 0; k < mine; ++k) {
            const int s = k % STAGES;
            TRACE_FROM(wait);
            in_full[s].arrive_and_wait();
            out_empty[s].arrive_and_wait();
            TRACE_SPAN(PHASE_WAIT, k, wait);
            TRACE_FROM(compute);
            blur_tile(in_slots + s * SPAN, out_slots + s * TILE, c, COMPUTE_THREADS);
            (void)in_empty[s].arrive();
            (void)out_full[s].arrive();
            TRACE_SPAN(PHASE_COMPUTE, k, compute);
        }
    }
    TRACE_BLOCK_END();
}
