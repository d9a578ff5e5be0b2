// reread: out[i] = sum over passes p of w_p * f(in[i]), reading `in` once per
// pass, where f applies `iterations` dependent fused multiply-adds (the
// chain of kernels/compute.cu) and is computed again on every pass.
//
// Lab 6's zero-copy kernel: `in` may be device memory or mapped pinned host
// memory read in place over the host link. Each pass sweeps the whole input
// (a grid-stride loop), so with an input larger than L2 every pass reads it
// again from where it lives: zero-copy pays the host link once per pass,
// copy-then-compute pays it once. `iterations` is the compute per read
// (2 * iterations FLOPs per element per pass): enough of it hides the link
// inside the kernel. iterations = 0 is one FMA per element per pass.
// w_p = 0.5 + 0.25 p and c = -(1 - 2^-10) are exact in f32 (the chain
// contracts toward x / (1 - c), so it neither blows up nor vanishes) and
// only fmaf() is used, so a CPU reference with f32::mul_add matches every bit.
extern "C" __global__ void reread(const float* __restrict__ in,
                                  float* __restrict__ out,
                                  unsigned long long n,
                                  int passes,
                                  int iterations)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (int p = 0; p < passes; ++p) {
        const float w = 0.5f + 0.25f * (float)p;
        for (unsigned long long i = first; i < n; i += stride) {
            const float x = in[i];
            float a = x;
            for (int k = 0; k < iterations; ++k) {
                a = fmaf(a, -0.9990234375f, x);
            }
            const float before = p == 0 ? 0.0f : out[i];
            out[i] = fmaf(a, w, before);
        }
    }
}
