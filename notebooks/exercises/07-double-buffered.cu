// Lab 7's exercise: make this kernel double-buffered.
//
// As given, it is the naive kernel: each thread copies its share of a tile
// into shared memory through registers, the block syncs, computes, syncs,
// and only then starts loading the next tile. Nothing is in flight while
// the block computes.
//
// Your task: keep STAGES (2) tiles in flight with asynchronous copies.
//   * make a per-thread pipeline:  cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
//   * before computing tile k, issue the copies of every tile up to k + STAGES - 1
//     into slot (tile % STAGES): pipe.producer_acquire(); one
//     cuda::memcpy_async(dst + v, src + v, cuda::aligned_size_t<16>(16), pipe) per float4;
//     pipe.producer_commit();
//   * pipe.consumer_wait() waits for this thread's copies of the oldest tile;
//     then a __syncthreads() so every thread's copies of it have landed;
//   * compute, pipe.consumer_release(), and a __syncthreads() before the
//     slot you just read can be filled again.
// The checker compiles this file with NVRTC (-DTILE, -DTHREADS, -DSTAGES=2),
// checks every output against the CPU reference, and times it against the
// naive kernel with one block per SM.
#include <cuda/pipeline>
#include "tile_blur.cuh"

#ifndef STAGES
#define STAGES 2
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles) {
    extern __shared__ float4 smem4[];  // STAGES * SPAN floats: STAGES slots
    const float* smem = reinterpret_cast<const float*>(smem4);
    // The k-th tile of this block is blockIdx.x + k * gridDim.x.
    const unsigned int mine = (tiles > blockIdx.x) ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    for (unsigned int k = 0; k < mine; ++k) {
        // TODO: replace this synchronous copy with asynchronous copies of
        // the tiles ahead, into slot (tile % STAGES).
        const float4* src = reinterpret_cast<const float4*>(in + (blockIdx.x + (size_t)k * gridDim.x) * TILE);
        for (int v = threadIdx.x; v < SPAN / 4; v += THREADS) {
            smem4[v] = src[v];
        }
        __syncthreads();
        const float* s = smem;  // TODO: the slot of tile k
        float* dst = out + (blockIdx.x + (size_t)k * gridDim.x) * TILE;
        for (int j = threadIdx.x; j < TILE; j += THREADS) {
            dst[j] = blur_at(s, j);
        }
        __syncthreads();
    }
}
