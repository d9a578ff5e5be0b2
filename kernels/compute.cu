// compute: out[i] = f(in[i]) where f applies `iterations` fused multiply-adds.
//
// The arithmetic per byte is the lab's knob: each element is read once (4 B)
// and written once (4 B) and costs 2 * iterations FLOPs, so `iterations`
// moves a pipeline from copy-bound (few) to compute-bound (many). Only
// explicit fmaf() is used, so a CPU reference with f32::mul_add reproduces
// every bit. Grid-stride loop: any grid size covers any n.
extern "C" __global__ void compute(const float* __restrict__ in,
                                   float* __restrict__ out,
                                   unsigned long long n,
                                   int iterations)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = in[i];
        float a = x;
        for (int k = 0; k < iterations; ++k) {
            // Contracting but never reaching x: a -> x / 1.999 + (-0.999)^k (...),
            // so the result depends on both x and the iteration count.
            a = fmaf(a, -0.9990234375f, x);
        }
        out[i] = a;
    }
}
