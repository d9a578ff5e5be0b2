// Lab 7's plain reference: the tile blur with a two-stage pipeline written
// the way the CUDA C++ Programming Guide writes one ("Asynchronous Data
// Copies using cuda::pipeline", its multi-stage example): a pipeline the
// whole block shares (cuda::pipeline_shared_state), each tile copied by
// one cuda::memcpy_async(block, ...) of all the block's threads into
// stage (tile % STAGES), consumer_wait before reading it and
// consumer_release after. No __syncthreads: the shared pipeline's barriers
// order the block. It is not one of the lab's lessons but its yardstick:
// the lab's own kernels are held to it in the same run, as lab 5 holds its
// runner to plain driver calls. STAGES is 2 in the lab (the guide's
// stages_count); TILE, THREADS and VEC as for every tile kernel.
#include <cooperative_groups.h>
#include <cuda/pipeline>
#include "tile_blur.cuh"

#ifndef STAGES
#define STAGES 2
#endif

#pragma nv_diag_suppress static_var_with_dynamic_init

extern "C" __global__ void __launch_bounds__(THREADS)
tile_plain(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    auto block = cooperative_groups::this_thread_block();
    extern __shared__ float4 smem4[];  // STAGES * SPAN floats
    float* slots = reinterpret_cast<float*>(smem4);
    __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, STAGES> state;
    auto pipe = cuda::make_pipeline(block, &state);
    // The k-th tile of this block is blockIdx.x + k * gridDim.x (a grid-stride loop).
    const unsigned int mine = (tiles > blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    TRACE_BLOCK_START();
    for (unsigned int compute = 0, fetch = 0; compute < mine; ++compute) {
        // Keep the pipeline full: every tile up to compute + STAGES - 1 on its way.
        for (; fetch < mine && fetch < compute + STAGES; ++fetch) {
            TRACE_FROM(copy);
            pipe.producer_acquire();
            const size_t tile = blockIdx.x + (size_t)fetch * gridDim.x;
            cuda::memcpy_async(block, slots + (fetch % STAGES) * SPAN, in + tile * TILE, cuda::aligned_size_t<16>(SPAN * sizeof(float)), pipe);
            pipe.producer_commit();
            TRACE_SPAN(PHASE_COPY, fetch, copy);
        }
        TRACE_FROM(wait);
        pipe.consumer_wait();
        TRACE_SPAN(PHASE_WAIT, compute, wait);
        TRACE_FROM(work);
        blur_tile(slots + (compute % STAGES) * SPAN, out + (blockIdx.x + (size_t)compute * gridDim.x) * TILE, threadIdx.x, THREADS);
        pipe.consumer_release();
        TRACE_SPAN(PHASE_COMPUTE, compute, work);
    }
    TRACE_BLOCK_END();
}
