//! Lab 4's kernel (`kernels/row_dot.cu`): one query's dot product with
//! every key row, and a stamp word after the scores that says which
//! iteration wrote them. Built on `gpu::Module`'s launch.

use crate::error::{LabError, Result};
use crate::gpu::kernels::KernelSource;
use crate::gpu::{DeviceBuffer, Gpu, KernelArg, Module, Stream};

/// `kernels/row_dot.cu`, for NVRTC.
pub const ROW_DOT: KernelSource = KernelSource {
    file: "row_dot.cu",
    entry: "row_dot",
    source: include_str!("../../../../kernels/row_dot.cu"),
    // v4 loads through the read-only path, a warp-shuffle reduction, explicit FMAs.
    expect_in_ptx: &["ld.global.nc.v4.f32", "shfl.sync.bfly.b32", "fma.rn.f32", ".visible .entry row_dot"],
    purpose: "one query's dot product with every key row (a warp per row), plus a stamp word naming the iteration",
    ..KernelSource::PLAIN
};

/// CPU reference of `row_dot` followed by an argmin: the first key row whose
/// dot product with `query` is smallest, and that product. Integer
/// arithmetic, so it is exact and independent of the GPU's summation order.
pub fn row_dot_argmin_reference(keys: &[i8], query: &[i8]) -> (u32, i32) {
    let dim = query.len();
    let mut best = (0u32, i32::MAX);
    for (r, row) in keys.chunks_exact(dim).enumerate() {
        let s: i32 = row.iter().zip(query).map(|(&k, &q)| k as i32 * q as i32).sum();
        if s < best.1 {
            best = (r as u32, s);
        }
    }
    best
}

/// `kernels/row_dot.cu`: one query's dot product with every key row, and
/// a stamp word after the scores.
pub struct RowDotKernel {
    module: Module,
    grid: u32,
    block: u32,
}

/// Where a `row_dot` launch reads and writes.
pub struct RowDotArgs<'b> {
    /// rows x dim f32, row-major.
    pub keys: &'b DeviceBuffer,
    /// queries x dim f32.
    pub queries: &'b DeviceBuffer,
    pub query: usize,
    pub rows: usize,
    pub dim: usize,
    /// rows scores, then one u32 stamp.
    pub scores: &'b DeviceBuffer,
    pub stamp: u32,
}

impl RowDotKernel {
    pub fn load(gpu: &Gpu) -> Result<RowDotKernel> {
        let sms = gpu.fingerprint()?.sm_count;
        // 8 warps a block (a warp per row), enough blocks to fill every SM.
        Ok(RowDotKernel { module: Module::load(gpu, &ROW_DOT)?, grid: sms * 16, block: 256 })
    }

    /// Enqueues the scores of query `a.query` against every key row
    /// (refused where they do not fit the buffers).
    ///
    /// # Safety
    /// The buffers stay allocated until the stream has run the kernel.
    pub unsafe fn enqueue(&self, stream: &Stream, a: &RowDotArgs<'_>) -> Result<()> {
        let fits = a.dim % 4 == 0
            && a.dim > 0
            && a.rows > 0
            && a.rows < u32::MAX as usize
            && a.rows * a.dim * 4 <= a.keys.bytes()
            && (a.query + 1) * a.dim * 4 <= a.queries.bytes()
            && (a.rows + 1) * 4 <= a.scores.bytes();
        if !fits {
            return Err(LabError::config(format!(
                "row_dot of {} rows x {} (query {}) does not fit keys {} B, queries {} B, scores {} B (dim must be a multiple of 4)",
                a.rows,
                a.dim,
                a.query,
                a.keys.bytes(),
                a.queries.bytes(),
                a.scores.bytes()
            )));
        }
        let args = [
            KernelArg::Span(a.keys.span()),
            KernelArg::Span(a.queries.span()),
            KernelArg::I32(a.query as i32),
            KernelArg::U32(a.rows as u32),
            KernelArg::I32(a.dim as i32),
            KernelArg::Span(a.scores.span()),
            KernelArg::U32(a.stamp),
        ];
        let warps_per_block = self.block as usize / 32;
        let grid = self.grid.min(a.rows.div_ceil(warps_per_block) as u32).max(1);
        // SAFETY: the arguments match `row_dot(const float*, const float*,
        // int, unsigned, int, float*, unsigned)`; bounds checked above; the
        // caller keeps the buffers alive until the stream has run it.
        unsafe { self.module.launch(stream, grid, self.block, 0, args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_ptx, nvrtc_or_skip};

    #[test]
    fn row_dot_compiles_to_the_expected_ptx() {
        if nvrtc_or_skip("row_dot_compiles_to_the_expected_ptx") {
            check_ptx(&ROW_DOT);
        }
    }

    #[test]
    fn row_dot_reference_finds_the_first_smallest_product() {
        // rows: [1,1] [-1,0] [0,-1] [2,2] against query [1,1]: sums 2, -1, -1, 4.
        let keys = [1i8, 1, -1, 0, 0, -1, 2, 2];
        assert_eq!(row_dot_argmin_reference(&keys, &[1, 1]), (1, -1), "ties go to the first row");
        assert_eq!(row_dot_argmin_reference(&keys, &[-1, -1]), (3, -4));
    }
}
