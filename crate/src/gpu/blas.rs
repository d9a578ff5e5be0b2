//! cuBLAS on a stream: a handle with its own workspace ([`Blas`]) and the
//! calls the labs make of it, a half-precision matrix product of
//! row-major matrices ([`Blas::matmul_f16`]), the same with a ReLU in
//! cuBLASLt's epilogue ([`Blas::matmul_f16_relu`]), and FP8 (E4M3)
//! products whose epilogue also scales, rounds to FP8 and finds the
//! output's largest magnitude ([`Blas::matmul_e4m3`]). cuBLAS is loaded at run time
//! like the driver (cudarc's `cublas` feature); a machine without it gets
//! an error that says so, never a panic.
//!
//! The workspace is the lab's, and stays so: `cublasSetStream` puts a
//! handle back on cuBLAS's default workspace pool (memory cuBLAS takes
//! from the stream-ordered pool as it goes, which a CUDA graph would then
//! hold as allocations), so every product sets the stream and then the
//! workspace again, as PyTorch does per handle and stream.

use super::{driver, DeviceBuffer, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};
use std::sync::Mutex;

/// What cuBLAS keeps as scratch for its GEMMs (cuBLAS's recommended size on
/// Hopper): given to it up front and kept, so a product never asks for
/// memory (nor does a graph that captured one), and a GPU budget can count
/// it.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle on one GPU, with its workspace.
pub struct Blas {
    /// The handle; the lock makes its "set the stream, give it back its
    /// workspace, then call" one step (a cuBLAS handle is not meant for two
    /// threads at once).
    handle: Mutex<driver::cublasHandle_t>,
    /// cuBLASLt's handle, for the products with an epilogue
    /// ([`Blas::matmul_f16_relu`], [`Blas::matmul_e4m3`]); `None` where
    /// libcublasLt cannot be loaded.
    lt: Mutex<Option<driver::cublasLtHandle_t>>,
    /// The scratch every product uses ([`WORKSPACE_BYTES`]), cuBLASLt's too.
    workspace: DeviceBuffer,
    gpu: Gpu,
    version: i32,
}

// SAFETY: cuBLAS lets a handle move between threads; every call on it is
// made under its lock, so one thread at a time uses it (what makes sharing
// `&Blas` across threads sound too).
unsafe impl Send for Blas {}
// SAFETY: as for Send: `&Blas` reaches the handle only through its lock.
unsafe impl Sync for Blas {}

/// A row-major FP16 matrix in device memory: `rows` x `cols` from byte `at`
/// of `span`, rows `cols` apart.
#[derive(Clone, Copy, Debug)]
pub struct MatrixF16 {
    pub span: DeviceSpan,
    pub at: usize,
    pub rows: usize,
    pub cols: usize,
}

impl MatrixF16 {
    fn check(&self, what: &str) -> Result<()> {
        fits(self.span, self.at, self.rows, self.cols, 2, "FP16", what)
    }
    fn addr(&self) -> u64 {
        self.span.ptr + self.at as u64
    }
}

/// Whether a row-major `rows` x `cols` matrix of `bytes`-byte elements
/// from byte `at` fits `span` (and cuBLAS's 32-bit sizes); else the error
/// naming it as `what`.
fn fits(span: DeviceSpan, at: usize, rows: usize, cols: usize, bytes: usize, ty: &str, what: &str) -> Result<()> {
    let ok = rows
        .checked_mul(cols)
        .and_then(|n| n.checked_mul(bytes))
        .and_then(|b| b.checked_add(at))
        .is_some_and(|end| end <= span.bytes() && rows > 0 && cols > 0 && rows <= i32::MAX as usize && cols <= i32::MAX as usize);
    if !ok {
        return Err(LabError::config(format!("{what}: a {rows} x {cols} {ty} matrix at byte {at} does not fit its buffer of {} bytes", span.bytes())));
    }
    Ok(())
}

/// Whether `x` · `w` (· `wᵀ` where `transposed`) is an `out`, each
/// (rows, cols); else the error naming the three shapes.
fn shapes_agree(x: (usize, usize), w: (usize, usize), out: (usize, usize), transposed: bool) -> Result<()> {
    let (w_in, w_out, t) = if transposed { (w.1, w.0, "ᵀ") } else { (w.0, w.1, "") };
    if x.1 != w_in || out.0 != x.0 || out.1 != w_out {
        return Err(LabError::config(format!("a product of {} x {} by ({} x {}){t} into {} x {}: the shapes disagree", x.0, x.1, w.0, w.1, out.0, out.1)));
    }
    Ok(())
}

/// A row-major FP8 (E4M3) matrix in device memory: `rows` x `cols` bytes
/// from byte `at` of `span`, rows `cols` apart.
#[derive(Clone, Copy, Debug)]
pub struct MatrixE4M3 {
    pub span: DeviceSpan,
    pub at: usize,
    pub rows: usize,
    pub cols: usize,
}

impl MatrixE4M3 {
    fn check(&self, what: &str) -> Result<()> {
        fits(self.span, self.at, self.rows, self.cols, 1, "FP8", what)?;
        // Hopper's FP8 kernels read 16-byte rows and start.
        if self.cols % 16 != 0 || (self.span.ptr + self.at as u64) % 16 != 0 {
            return Err(LabError::config(format!(
                "{what}: an FP8 matrix's rows must be a multiple of 16 bytes and start 16-byte aligned ({} x {} at byte {})",
                self.rows, self.cols, self.at
            )));
        }
        Ok(())
    }
    fn addr(&self) -> u64 {
        self.span.ptr + self.at as u64
    }
}

/// One f32 in device memory: float `index` of `span`, 16-byte aligned
/// (cuBLASLt refuses a scale that is not: measured on an H200).
#[derive(Clone, Copy, Debug)]
pub struct ScalarF32 {
    pub span: DeviceSpan,
    pub index: usize,
}

impl ScalarF32 {
    fn addr(&self, what: &str) -> Result<u64> {
        if (self.index + 1) * 4 > self.span.bytes() {
            return Err(LabError::config(format!("{what}: float {} is past its buffer of {} bytes", self.index, self.span.bytes())));
        }
        let addr = self.span.ptr + 4 * self.index as u64;
        if addr % 16 != 0 {
            return Err(LabError::config(format!("{what}: float {} is not 16-byte aligned, as cuBLASLt's scales must be", self.index)));
        }
        Ok(addr)
    }
}

/// The scales of an FP8 product `out = x · wᵀ` ([`Blas::matmul_e4m3`]),
/// each one f32 on the GPU: a stored `x` or `w` value times its scale is
/// the value it stands for; the product is multiplied by `out` before it
/// is rounded to FP8 (1 / the output's own scale), and `amax` receives the
/// product's largest magnitude before that.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Scales {
    pub x: ScalarF32,
    pub w: ScalarF32,
    pub out: ScalarF32,
    pub amax: ScalarF32,
}

impl Blas {
    /// A handle on `gpu` with its workspace.
    pub fn new(gpu: &Gpu) -> Result<Blas> {
        if !driver::blas_present() {
            return Err(LabError::config(
                "cuBLAS (libcublas.so) could not be loaded: install the CUDA toolkit's cuBLAS or put its lib directory on LD_LIBRARY_PATH",
            ));
        }
        gpu.bind()?;
        let workspace = gpu.alloc(WORKSPACE_BYTES)?;
        let handle = driver::blas_create()?;
        // SAFETY: the handle was just made and nothing else has it.
        match unsafe { driver::blas_version(handle) } {
            Ok(version) => {
                // Without cuBLASLt (not loadable, or no handle) only the fused products are refused.
                let lt = if driver::blas_lt_present() { driver::blas_lt_create().ok() } else { None };
                Ok(Blas { handle: Mutex::new(handle), lt: Mutex::new(lt), workspace, gpu: gpu.clone(), version })
            }
            Err(e) => {
                // SAFETY: made above, used by nothing else, destroyed once.
                let _ = unsafe { driver::blas_destroy(handle) };
                Err(e)
            }
        }
    }

    /// The bytes of device memory cuBLAS uses as scratch: the workspace
    /// it is given, and keeps ([`WORKSPACE_BYTES`]).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.bytes()
    }

    /// cuBLAS's version as "13.0.1".
    pub fn version(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }

    /// Enqueues `out = x · w` on `stream`: `x` is n x k, `w` k x m, `out`
    /// n x m, all row-major FP16, summed in FP32 (cublasGemmEx). Shapes
    /// that disagree or do not fit their buffers are refused. Its scratch
    /// is the handle's one workspace: products on two streams must not run
    /// at once (order them with an event), or their scratch collides.
    ///
    /// # Safety
    /// The three buffers stay allocated until the stream has run the
    /// product, and nothing writes `x` or `w`, or touches `out`, meanwhile.
    pub unsafe fn matmul_f16(&self, stream: &Stream, out: MatrixF16, x: MatrixF16, w: MatrixF16) -> Result<()> {
        self.check_product(stream, out, x, w)?;
        let handle = self.handle.lock().map_err(|_| LabError::config("cuBLAS's handle was poisoned by a panic"))?;
        // Row-major out (n x m) is column-major outᵀ (m x n) = wᵀ (m x k) · xᵀ (k x n).
        let (n, k, m) = (x.rows as i32, x.cols as i32, w.cols as i32);
        // SAFETY: the handle is live (owned by `self`, used under its lock)
        // and so is the stream (borrowed).
        unsafe { driver::blas_set_stream(*handle, stream.raw()) }?;
        // Setting the stream put the handle back on cuBLAS's default
        // workspace pool: ours again, before the product.
        // SAFETY: the handle is live and locked; the workspace is owned by
        // `self`, which outlives every product (its drop waits for the GPU
        // before freeing it).
        unsafe { driver::blas_set_workspace(*handle, self.workspace.ptr(), self.workspace.bytes()) }?;
        // SAFETY: the handle is live and locked, on a live stream; every
        // matrix fits its buffer (checked above), and the caller keeps them
        // allocated until the stream ran the product (# Safety).
        unsafe { driver::blas_gemm_f16(*handle, (m, n, k), w.addr(), m, x.addr(), k, out.addr(), m) }
    }
}

impl Blas {
    /// A product's operands fit their buffers and agree, on this GPU's stream.
    fn check_product(&self, stream: &Stream, out: MatrixF16, x: MatrixF16, w: MatrixF16) -> Result<()> {
        x.check("the left operand")?;
        w.check("the right operand")?;
        out.check("the product")?;
        shapes_agree((x.rows, x.cols), (w.rows, w.cols), (out.rows, out.cols), false)?;
        self.check_stream(stream)
    }

    /// `stream` is on this handle's GPU.
    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.gpu().ordinal() != self.gpu.ordinal() {
            return Err(LabError::config(format!("cuBLAS of GPU {} called on a stream of GPU {}", self.gpu.ordinal(), stream.gpu().ordinal())));
        }
        Ok(())
    }

    /// Whether [`Blas::matmul_f16_relu`] can run here (libcublasLt loaded).
    pub fn has_fused_relu(&self) -> bool {
        self.lt.lock().is_ok_and(|lt| lt.is_some())
    }

    /// Enqueues `out = max(0, x · w)` on `stream`, the ReLU applied by
    /// cuBLASLt as the product is written (its epilogue): one kernel where
    /// [`Blas::matmul_f16`] and a ReLU kernel are two. Shapes as for
    /// `matmul_f16`; the same workspace, so the same rule: products on two
    /// streams must not run at once.
    ///
    /// # Safety
    /// As for [`Blas::matmul_f16`].
    pub unsafe fn matmul_f16_relu(&self, stream: &Stream, out: MatrixF16, x: MatrixF16, w: MatrixF16) -> Result<()> {
        self.check_product(stream, out, x, w)?;
        // Row-major out (n x m) is column-major outᵀ (m x n) = wᵀ (m x k) · xᵀ (k x n).
        let (n, k, m) = (x.rows as u64, x.cols as u64, w.cols as u64);
        let p =
            driver::LtProduct { dims: (m, n, k), a: w.addr(), lda: m as i64, b: x.addr(), ldb: k as i64, d: out.addr(), ldd: m as i64, relu: true, fp8: None };
        // SAFETY: every matrix fits its buffer (checked above) and the
        // caller keeps them allocated until the stream ran the product
        // (# Safety); the rest is `lt_product`'s.
        unsafe { self.lt_product(stream, &p) }
    }

    /// Whether [`Blas::matmul_e4m3`] can run here: cuBLASLt loaded, on a
    /// GPU with FP8 tensor cores (compute capability 8.9 and up).
    pub fn has_fp8(&self) -> bool {
        self.has_fused_relu() && self.gpu.compute_capability().is_ok_and(|cc| cc >= (8, 9))
    }

    /// Enqueues the FP8 product `out = q(f(x · wᵀ) · scales.out)` on
    /// `stream`, where f is the ReLU (`relu`) or nothing and q rounds to
    /// E4M3: `x` is n x k, `w` m x k (each row one output's weights, as
    /// Hopper's FP8 kernels read them), `out` n x m, all row-major E4M3,
    /// summed in FP32 with `x`'s and `w`'s scales applied, and the largest
    /// magnitude of f(x · wᵀ) written to `scales.amax`. One kernel: the
    /// quantization of the output is the product's epilogue, not a pass
    /// of its own. Shapes that disagree, rows that are not a multiple of
    /// 16 bytes, or a GPU without FP8 are refused. The workspace rule of
    /// [`Blas::matmul_f16`] holds.
    ///
    /// # Safety
    /// As for [`Blas::matmul_f16`], and the scales' buffers stay allocated
    /// and unwritten (but for the amax) until the stream ran the product.
    pub unsafe fn matmul_e4m3(&self, stream: &Stream, out: MatrixE4M3, x: MatrixE4M3, w: MatrixE4M3, scales: Fp8Scales, relu: bool) -> Result<()> {
        x.check("the left operand")?;
        w.check("the right operand")?;
        out.check("the product")?;
        shapes_agree((x.rows, x.cols), (w.rows, w.cols), (out.rows, out.cols), true)?;
        self.check_stream(stream)?;
        if !self.has_fp8() {
            return Err(LabError::Unsupported(format!("{} has no FP8 tensor cores cuBLASLt can use (compute capability 8.9 and up)", self.gpu.name())));
        }
        let fp8 = driver::LtFp8Scales {
            a: scales.w.addr("the weights' scale")?,
            b: scales.x.addr("the input's scale")?,
            d: scales.out.addr("the output's scale")?,
            amax_d: scales.amax.addr("the output's amax")?,
        };
        // Row-major out (n x m) is column-major outᵀ (m x n) = w (m x k, stored
        // column-major as k x m and read transposed) · xᵀ (k x n).
        let (n, k, m) = (x.rows as u64, x.cols as u64, w.rows as u64);
        let p =
            driver::LtProduct { dims: (m, n, k), a: w.addr(), lda: k as i64, b: x.addr(), ldb: k as i64, d: out.addr(), ldd: m as i64, relu, fp8: Some(fp8) };
        // SAFETY: every matrix and scale fits its buffer (checked above)
        // and the caller keeps them allocated until the stream ran the
        // product (# Safety); the rest is `lt_product`'s.
        unsafe { self.lt_product(stream, &p) }
    }

    /// Runs `p` through cuBLASLt's handle on `stream`, on the workspace.
    ///
    /// # Safety
    /// Every pointer of `p` addresses device memory as [`driver::blas_lt_gemm`]
    /// asks, allocated until the stream ran the product.
    unsafe fn lt_product(&self, stream: &Stream, p: &driver::LtProduct) -> Result<()> {
        let lt = self.lt.lock().map_err(|_| LabError::config("cuBLASLt's handle was poisoned by a panic"))?;
        let Some(handle) = *lt else {
            return Err(LabError::config(
                "cuBLASLt (libcublasLt.so) could not be loaded or give a handle: install the CUDA toolkit's cuBLAS or put its lib directory on LD_LIBRARY_PATH",
            ));
        };
        // SAFETY: the handle is live (owned by `self`, used under its
        // lock), the stream is borrowed, the operands are the caller's
        // promise (# Safety); the workspace is owned by `self`, whose drop
        // waits for the GPU before freeing it.
        unsafe { driver::blas_lt_gemm(handle, p, self.workspace.ptr(), self.workspace.bytes(), stream.raw()) }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // A product still running uses the workspace, freed right after
        // this: wait for every stream of the GPU first.
        let _ = driver::context_synchronize();
        let h = self.handle.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: owned by `self` and destroyed only here, once; nothing
        // else can be calling it (`self` is being dropped).
        let _ = unsafe { driver::blas_destroy(*h) };
        if let Some(lt) = self.lt.get_mut().ok().and_then(|l| l.take()) {
            // SAFETY: as for the cuBLAS handle: owned by `self`, destroyed once, here.
            let _ = unsafe { driver::blas_lt_destroy(lt) };
        }
    }
}
