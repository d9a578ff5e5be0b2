// row_dot: scores[r] = dot(keys[r, :], queries[query, :]) for every key row r,
// then a stamp word after the scores says which iteration wrote them.
//
// One warp per row: each lane reads float4s of the row (coalesced, through
// the read-only path) and the warp reduces with shuffles. The lab fills keys
// and queries with small integers, so every partial sum is an exact integer
// in f32 and the CPU reference matches bit for bit in any summation order.
// The stamp lets the CPU prove the scores it reads are the ones its
// iteration's copy brought, not a later iteration's.
extern "C" __global__ void row_dot(const float* __restrict__ keys,
                                   const float* __restrict__ queries,
                                   int query,
                                   unsigned int rows,
                                   int dim,
                                   float* __restrict__ scores,
                                   unsigned int stamp)
{
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warps_per_block = blockDim.x >> 5;
    const unsigned int warp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const unsigned int warp_count = gridDim.x * warps_per_block;
    const float4* q = reinterpret_cast<const float4*>(queries + (size_t)query * dim);
    const int vecs = dim >> 2;
    for (unsigned int r = warp; r < rows; r += warp_count) {
        const float4* k = reinterpret_cast<const float4*>(keys + (size_t)r * dim);
        float acc = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            const float4 a = __ldg(k + v);
            const float4 b = __ldg(q + v);
            acc = fmaf(a.x, b.x, acc);
            acc = fmaf(a.y, b.y, acc);
            acc = fmaf(a.z, b.z, acc);
            acc = fmaf(a.w, b.w, acc);
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        }
        if (lane == 0) {
            scores[r] = acc;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        reinterpret_cast<unsigned int*>(scores)[rows] = stamp;
    }
}
