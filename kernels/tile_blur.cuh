// Lab 7's workload, shared by every tile kernel: a 9-tap blur,
//   out[i] = sum over k of W[k] * in[i + k - RADIUS],
// over an input padded with RADIUS zeros at each end, so that tile t's
// inputs, halo included, are one aligned run: padded[t*TILE .. t*TILE+SPAN).
// Each output is 9 FMAs in a fixed order (and NVRTC runs with
// --fmad=false), so the CPU reference gives the same bits.
//
// The host compiles each kernel with -DTILE=... (outputs per tile, a
// multiple of 4), -DTHREADS=... (threads per block) and -DVEC=... (1 or 4:
// outputs a thread computes and stores at once, see blur_tile); the stage
// kernels also take -DSTAGES=....
#pragma once

#ifndef TILE
#define TILE 4096
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef VEC
#define VEC 4
#endif
#define RADIUS 4
// Inputs per tile: the tile and a halo of RADIUS on each side. SPAN * 4
// bytes is a multiple of 16, so every tile starts 16-byte aligned.
#define SPAN (TILE + 2 * RADIUS)

static_assert(TILE % 4 == 0, "TILE must be a multiple of 4 (16-byte copies)");
static_assert(VEC == 1 || VEC == 4, "VEC must be 1 (one output at a time) or 4 (a float4 at a time)");

// What a warp is doing, for lab 7's warp timeline.
#define PHASE_COPY 0     // moving a tile in: loads through registers, or issuing its copies
#define PHASE_WAIT 1     // waiting: for a tile's copies, at a block barrier, for a free slot
#define PHASE_COMPUTE 2  // blurring a tile (and storing it, but in the warp-specialized kernel)
#define PHASE_STORE 3    // the storer warp writing a tile's results to device memory

// The warp timeline. Built with -DTILE_TRACE only for the diagram (never for
// timed runs): lane 0 of each warp of block 0 reads the SM's cycle counter
// around each phase of the block's tiles TRACE_FIRST .. TRACE_FIRST +
// TRACE_TILES - 1 (after the pipelines have filled). A span goes to the
// warp's own slots in shared memory (phase << 16 | tile, and the low 32 bits
// of its start and end cycles): a global store, or an atomic counter, would
// queue behind the warp's device-memory traffic, and the diagram would show
// the stamps. Each warp copies its slots to tile_trace when it finishes (3
// words a span: 1 << 63 | warp << 32 | phase << 16 | tile, start, end).
// Block 0's thread 0 pairs the cycle counter with the global nanosecond
// timer when it starts and ends (tile_trace_clock), so the host can turn
// cycles into time. Without TILE_TRACE the macros are empty and the kernels
// compile to the same code as before.
#ifdef TILE_TRACE
#ifndef TRACE_FIRST
#define TRACE_FIRST 4
#endif
#ifndef TRACE_TILES
#define TRACE_TILES 8
#endif
// At most 5 stamps a tile (the TMA kernel's thread 0).
#define TRACE_PER_WARP (6 * TRACE_TILES)
__device__ unsigned long long tile_trace[3 * 32 * TRACE_PER_WARP];
__device__ unsigned long long tile_trace_clock[4];
// A stamp first waits for the thread's own loads and stores to land (a
// block-scope fence), so a phase's memory traffic counts in that phase; the
// "memory" clobbers keep the compiler from moving loads and stores across
// it.
__device__ __forceinline__ long long trace_cycles() {
    long long c;
    __threadfence_block();
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    return c;
}
__device__ __forceinline__ unsigned long long trace_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
__device__ __forceinline__ bool trace_lane() {
    return blockIdx.x == 0 && threadIdx.x % 32 == 0;
}
__device__ __forceinline__ void trace_span(unsigned int phase, unsigned int k, long long start, unsigned int& seq, unsigned int* slots) {
    const long long end = trace_cycles();
    if (k < TRACE_FIRST || k >= TRACE_FIRST + TRACE_TILES) return;
    if (trace_lane() && seq < TRACE_PER_WARP) {
        unsigned int* slot = slots + 3 * ((threadIdx.x / 32) * TRACE_PER_WARP + seq);
        slot[0] = (phase << 16) | k;
        slot[1] = (unsigned int)start;
        slot[2] = (unsigned int)end;
    }
    ++seq;
}
__device__ __forceinline__ void trace_clock(int at) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        tile_trace_clock[2 * at] = trace_ns();
        tile_trace_clock[2 * at + 1] = (unsigned long long)trace_cycles();
    }
}
// Lane 0 copies its warp's spans out (after its last stamp).
__device__ __forceinline__ void trace_flush(unsigned int seq, const unsigned int* slots) {
    if (!trace_lane()) return;
    const unsigned int warp = threadIdx.x / 32;
    for (unsigned int j = 0; j < seq && j < TRACE_PER_WARP; ++j) {
        const unsigned int* slot = slots + 3 * (warp * TRACE_PER_WARP + j);
        unsigned long long* out = tile_trace + 3 * (warp * TRACE_PER_WARP + j);
        out[0] = (1ull << 63) | ((unsigned long long)warp << 32) | slot[0];
        out[1] = slot[1];
        out[2] = slot[2];
    }
}
// TRACE_BLOCK_START() opens the trace (the block's slots, each thread's
// span count) and pairs the clocks; TRACE_FROM(t) starts a phase;
// TRACE_SPAN(phase, k, t) ends it for the block's k-th tile;
// TRACE_BLOCK_END() pairs the clocks again and writes the spans out.
#define TRACE_BLOCK_START()                                            \
    __shared__ unsigned int trace_slots[3 * (THREADS / 32) * TRACE_PER_WARP]; \
    unsigned int trace_seq = 0;                                        \
    trace_clock(0)
#define TRACE_FROM(t) const long long t = trace_cycles()
#define TRACE_SPAN(phase, k, t) trace_span(phase, k, t, trace_seq, trace_slots)
#define TRACE_BLOCK_END() \
    trace_clock(1);       \
    trace_flush(trace_seq, trace_slots)
#else
#define TRACE_FROM(t)
#define TRACE_SPAN(phase, k, t)
#define TRACE_BLOCK_START()
#define TRACE_BLOCK_END()
#endif

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

// The whole tile: outputs 0 .. TILE-1 from the tile's inputs in shared
// memory `s` (SPAN floats, 16-byte aligned) into `dst` (TILE floats,
// 16-byte aligned: device memory, or the warp-specialized kernel's output
// slot), by `count` threads of which this is number `first`.
//   VEC 1: a thread takes one output at a time: 9 four-byte shared loads
//          and one four-byte store per output.
//   VEC 4: a thread takes four neighbouring outputs at a time: their 12
//          inputs in three 16-byte shared loads, one 16-byte store. The
//          same FMAs in the same order, so the same bits; a quarter of the
//          stores and a third of the shared-memory traffic, which the
//          asynchronous copies into shared memory share with it.
__device__ __forceinline__ void blur_tile(const float* s, float* dst, int first, int count) {
#if VEC == 4
    const float4* s4 = reinterpret_cast<const float4*>(s);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int q = first; q < TILE / 4; q += count) {
        const float4 a = s4[q], b = s4[q + 1], c = s4[q + 2];
        const float w[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
        d4[q] = make_float4(blur_at(w, 0), blur_at(w, 1), blur_at(w, 2), blur_at(w, 3));
    }
#else
    for (int j = first; j < TILE; j += count) dst[j] = blur_at(s, j);
#endif
}
