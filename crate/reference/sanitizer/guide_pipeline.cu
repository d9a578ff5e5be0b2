// What compute-sanitizer's synccheck says of lab 7's plain CUDA reference,
// kernels/tile_plain.cu (the Programming Guide's multi-stage loop on one
// cuda::pipeline the whole block shares), beside the lab's tile_async
// (a pipeline per thread and __syncthreads), on the same input.
//
// Build and run on a GPU from the repository root (sm_80 and up):
//   nvcc -std=c++17 -arch=native -rdc=true -Ikernels -o /tmp/guide_pipeline \
//     crate/reference/sanitizer/guide_pipeline.cu kernels/tile_plain.cu kernels/tile_async.cu
//   /tmp/guide_pipeline                                      # 0 outputs differ
//   compute-sanitizer --tool racecheck /tmp/guide_pipeline   # 0 hazards
//   compute-sanitizer --tool synccheck /tmp/guide_pipeline   # "Barrier error detected. Missing wait." in tile_plain only
//
// On an H200 (CUDA 13, driver 580; 2026-11-29) the two kernels' 4,354,048
// outputs were identical, racecheck found no hazard, and synccheck reported
// "Missing wait" on the pipeline's first barrier in tile_plain, and nothing
// in tile_async. Running STAGES empty stages through the pipeline before
// the block exits (so that the last consumer_release arrivals are waited
// for) did not change the report. MAINTAINERS runs synccheck with
// tile_plain excluded, and says why.
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
extern "C" __global__ void tile_plain(const float*, float*, unsigned int);
extern "C" __global__ void tile_async(const float*, float*, unsigned int);
#ifndef STAGES
#define STAGES 2  // as kernels/tile_plain.cu has it (the lab's)
#endif
#include "tile_blur.cuh"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    unsigned tiles = 132 * 8 + 7;
    size_t n = (size_t)tiles * TILE, padded = n + 2 * RADIUS;
    std::vector<float> h(padded);
    for (size_t i = 0; i < padded; ++i) h[i] = (i < RADIUS || i >= n + RADIUS) ? 0.f : (float)((i * 2654435761u) % 1000) / 1000.f;
    float *in, *a, *b;
    CK(cudaMalloc(&in, padded * 4)); CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4));
    CK(cudaMemcpy(in, h.data(), padded * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(a, 0xff, n * 4)); CK(cudaMemset(b, 0xfe, n * 4));
    size_t smem = STAGES * SPAN * 4;
    CK(cudaFuncSetAttribute(tile_plain, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(tile_async, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tile_plain<<<264, THREADS, smem>>>(in, a, tiles);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    tile_async<<<264, THREADS, smem>>>(in, b, tiles);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<float> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0; for (size_t i = 0; i < n; ++i) bad += ha[i] != hb[i];
    printf("tiles %u: %zu of %zu outputs differ\n", tiles, bad, n);
    return bad != 0;
}
