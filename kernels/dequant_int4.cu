// Lab 9's 4-bit weights turned into the FP8 (E4M3) bytes its FP8 GEMMs read
// (crate/src/labs/offload/int4.rs has the layout and the CPU's twin,
// Int4Matrix::e4m3_bits).
//
// A matrix of `rows` (input) x `cols` (output) values, stored by output:
// output j's inputs in a run, two a byte (the even input in the low nibble),
// each its integer plus 8; one FP16 scale per GROUP inputs of an output
// (a multiple of 8, set at compile time, -DGROUP=128 for lab 9: a constant
// turns the group's index into a shift, not a division). A
// value is its integer times its group's factor (the group's scale over the
// matrix's FP8 scale `matrix_scale`: one IEEE division, rounded, made once
// for 8 values), rounded to FP32, then to E4M3 (to nearest, ties to even;
// saturating, though no value exceeds 448). With a division per value
// instead the kernel was bound by its divisions, not by memory (ncu on an
// H200: 73% of the SMs' throughput, 3% of DRAM's). The output has the same
// order: byte j * rows + k.
//
#ifndef GROUP
#error "compile with -DGROUP=<inputs a scale covers>"
#endif
#if GROUP % 8 != 0
#error "GROUP must be a multiple of 8: a thread's 8 inputs share one scale"
#endif

// Each thread turns 8 inputs of an output (one 32-bit word of nibbles, rows
// a multiple of the group) into one 64-bit word of 8 E4M3 bytes: reads and writes
// both run along memory. Halves and E4M3 pairs are handled as bits and
// converted by PTX's cvt (sm_89 and later), so no CUDA header is needed.

__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Two floats as two E4M3 bytes: `lo` in the low byte, `hi` in the high.
__device__ __forceinline__ unsigned long long e4m3_pair(float lo, float hi) {
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return (unsigned long long)pair;
}

extern "C" __global__ void dequant_int4_e4m3(const unsigned int* __restrict__ packed, const unsigned short* __restrict__ scales,
                                             unsigned long long* __restrict__ out, unsigned long long rows, unsigned long long cols,
                                             unsigned int matrix_scale_bits) {
    const float matrix_scale = __int_as_float((int)matrix_scale_bits);
    const unsigned long long words = rows * cols / 8;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const unsigned long long col = (8 * i) / rows;
        const unsigned long long row = (8 * i) % rows;
        const unsigned int nibbles = __ldg(packed + i);
        // The 8 inputs share a group (a multiple of 8).
        const float factor = half_to_float(__ldg(scales + col * (rows / GROUP) + row / GROUP)) / matrix_scale;
        unsigned long long bytes = 0;
        for (int t = 0; t < 8; t += 2) {
            const float lo = (float)((int)((nibbles >> (4 * t)) & 0xF) - 8) * factor;
            const float hi = (float)((int)((nibbles >> (4 * t + 4)) & 0xF) - 8) * factor;
            bytes |= e4m3_pair(lo, hi) << (8 * t);
        }
        out[i] = bytes;
    }
}
