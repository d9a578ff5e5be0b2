// Lab 7's workload, shared by every tile kernel: a 9-tap blur,
//   out[i] = sum over k of W[k] * in[i + k - RADIUS],
// over an input padded with RADIUS zeros at each end, so that tile t's
// inputs, halo included, are one aligned run: padded[t*TILE .. t*TILE+SPAN).
// Each output is 9 FMAs in a fixed order (and NVRTC runs with
// --fmad=false), so the CPU reference gives the same bits.
//
// The host compiles each kernel with -DTILE=... (outputs per tile, a
// multiple of 4) and -DTHREADS=... (threads per block); the stage kernels
// also take -DSTAGES=....
#pragma once

#ifndef TILE
#define TILE 4096
#endif
#ifndef THREADS
#define THREADS 256
#endif
#define RADIUS 4
// Inputs per tile: the tile and a halo of RADIUS on each side. SPAN * 4
// bytes is a multiple of 16, so every tile starts 16-byte aligned.
#define SPAN (TILE + 2 * RADIUS)

static_assert(TILE % 4 == 0, "TILE must be a multiple of 4 (16-byte copies)");

// Output j of a tile whose inputs start at s (s[j + RADIUS] is input j).
// Binomial weights (1 8 28 56 70 56 28 8 1) / 256: exact in f32.
__device__ __forceinline__ float blur_at(const float* s, int j) {
    float acc = 0.0f;
    acc = fmaf(0.00390625f, s[j + 0], acc);
    acc = fmaf(0.03125f, s[j + 1], acc);
    acc = fmaf(0.109375f, s[j + 2], acc);
    acc = fmaf(0.21875f, s[j + 3], acc);
    acc = fmaf(0.2734375f, s[j + 4], acc);
    acc = fmaf(0.21875f, s[j + 5], acc);
    acc = fmaf(0.109375f, s[j + 6], acc);
    acc = fmaf(0.03125f, s[j + 7], acc);
    acc = fmaf(0.00390625f, s[j + 8], acc);
    return acc;
}
