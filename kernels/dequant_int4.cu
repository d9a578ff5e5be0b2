// Lab 9's 4-bit weights turned back into FP16 on the GPU, for the FP16 GEMM
// (crate/src/labs/offload/int4.rs has the layout and the CPU's twin).
//
// A matrix of `rows` (input) x `cols` (output) values, row-major: each byte
// holds two neighbouring columns' values (the even column in its low
// nibble), each its integer plus 8; each group of 128 rows has one FP16
// scale per column. A value is its integer times its group's scale,
// rounded once to FP16: the integer and the scale's 11 bits multiply
// exactly in FP32, so the one rounding is the CPU's.
//
// Each thread turns 8 values of a row (one 32-bit word of nibbles, `cols`
// a multiple of 8) into two 64-bit words of halves. The halves are handled
// as bits and converted by PTX's cvt, so no CUDA header is needed.

__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned long long float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return (unsigned long long)h;
}

extern "C" __global__ void dequant_int4(const unsigned int* __restrict__ packed, const unsigned short* __restrict__ scales,
                                        unsigned long long* __restrict__ out, unsigned long long rows, unsigned long long cols) {
    const unsigned long long words = rows * cols / 8;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const unsigned long long row = (8 * i) / cols;
        const unsigned long long col = (8 * i) % cols;
        const unsigned int nibbles = __ldg(packed + i);
        const unsigned short* scale = scales + (row / 128) * cols + col;
        unsigned long long halves[2] = {0, 0};
        for (int t = 0; t < 8; t++) {
            const int level = (int)((nibbles >> (4 * t)) & 0xF) - 8;
            const float value = (float)level * half_to_float(__ldg(scale + t));
            halves[t / 4] |= float_to_half(value) << (16 * (t % 4));
        }
        out[2 * i] = halves[0];
        out[2 * i + 1] = halves[1];
    }
}
