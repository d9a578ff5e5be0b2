// Lab 9's activation: ReLU in place on FP16 values, four at a time.
//
// The values are handled as their bits, so no CUDA header is needed: a
// half whose sign bit is set is negative (or -0), and ReLU makes it +0.
// Each 64-bit word holds four halves; a mask built from their sign bits
// clears the negative ones without a branch.
extern "C" __global__ void relu_f16(unsigned long long* x, unsigned long long words) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        unsigned long long v = x[i];
        // 1 in the lowest bit of each negative half, then 0xFFFF there.
        unsigned long long negative = (v >> 15) & 0x0001000100010001ULL;
        x[i] = v & ~(negative * 0xFFFFULL);
    }
}
