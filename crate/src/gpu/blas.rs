//! cuBLAS on a stream: a handle with its own workspace ([`Blas`]) and the
//! calls the labs make of it, a half-precision matrix product of
//! row-major matrices ([`Blas::matmul_f16`]) and the same with a ReLU in
//! cuBLASLt's epilogue ([`Blas::matmul_f16_relu`]). cuBLAS is loaded at run time
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
    /// ([`Blas::matmul_f16_relu`]); `None` where libcublasLt cannot be loaded.
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
        let fits =
            self.rows.checked_mul(self.cols).and_then(|n| n.checked_mul(2)).and_then(|b| b.checked_add(self.at)).is_some_and(|end| {
                end <= self.span.bytes() && self.rows > 0 && self.cols > 0 && self.rows <= i32::MAX as usize && self.cols <= i32::MAX as usize
            });
        if !fits {
            return Err(LabError::config(format!(
                "{what}: a {} x {} FP16 matrix at byte {} does not fit its buffer of {} bytes",
                self.rows,
                self.cols,
                self.at,
                self.span.bytes()
            )));
        }
        Ok(())
    }
    fn addr(&self) -> u64 {
        self.span.ptr + self.at as u64
    }
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
        if x.cols != w.rows || out.rows != x.rows || out.cols != w.cols {
            return Err(LabError::config(format!(
                "a product of {} x {} by {} x {} into {} x {}: the shapes disagree",
                x.rows, x.cols, w.rows, w.cols, out.rows, out.cols
            )));
        }
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
        let lt = self.lt.lock().map_err(|_| LabError::config("cuBLASLt's handle was poisoned by a panic"))?;
        let Some(handle) = *lt else {
            return Err(LabError::config(
                "cuBLASLt (libcublasLt.so) could not be loaded or give a handle: install the CUDA toolkit's cuBLAS or put its lib directory on LD_LIBRARY_PATH",
            ));
        };
        // Row-major out (n x m) is column-major outᵀ (m x n) = wᵀ (m x k) · xᵀ (k x n).
        let (n, k, m) = (x.rows as u64, x.cols as u64, w.cols as u64);
        // SAFETY: the handle is live (owned by `self`, used under its lock),
        // the stream is borrowed, every matrix fits its buffer (checked
        // above) and the caller keeps them allocated until the stream ran
        // the product (# Safety); the workspace is owned by `self`, whose
        // drop waits for the GPU before freeing it.
        unsafe {
            driver::blas_lt_gemm_f16_relu(
                handle,
                (m, n, k),
                w.addr(),
                m as i64,
                x.addr(),
                k as i64,
                out.addr(),
                m as i64,
                self.workspace.ptr(),
                self.workspace.bytes(),
                stream.raw(),
            )
        }
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
