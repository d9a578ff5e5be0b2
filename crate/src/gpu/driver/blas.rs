//! cuBLAS's raw calls, through cudarc's `cublas` feature: the library is
//! loaded at run time like the driver (`libcublas.so.<major>`), so the crate
//! builds and its tests run where no CUDA is installed. Only the calls a
//! half-precision GEMM on a stream needs (a handle, its stream, its
//! workspace, `cublasGemmEx`), and cuBLASLt's (`libcublasLt.so`, cudarc's
//! `cublaslt` feature) for the products whose epilogue does more than
//! store: a ReLU, or FP8's scaling, rounding and amax.

use crate::error::{LabError, Result};
use cudarc::cublas::sys::{self, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cublasStatus_t, cudaDataType};
use std::ffi::c_void;

pub use sys::cublasHandle_t;

/// `Ok` where `status` is `success`, else the call's error naming it
/// (cuBLAS and cuBLASLt each have their own status type, alike).
fn check_status<S: PartialEq + std::fmt::Debug>(call: &'static str, status: S, success: S) -> Result<()> {
    if status == success {
        Ok(())
    } else {
        Err(LabError::Driver { call, message: format!("{status:?}") })
    }
}

fn check(call: &'static str, status: cublasStatus_t) -> Result<()> {
    check_status(call, status, cublasStatus_t::CUBLAS_STATUS_SUCCESS)
}

/// Whether libcublas can be loaded (cudarc panics on first use where it
/// cannot, so this is asked first).
pub fn blas_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// cublasCreate: a handle on the current context's device.
pub fn blas_create() -> Result<cublasHandle_t> {
    let mut handle = std::ptr::null_mut();
    // SAFETY: writes one handle into `handle`.
    check("cublasCreate", unsafe { sys::cublasCreate_v2(&mut handle) })?;
    Ok(handle)
}

/// cublasDestroy.
///
/// # Safety
/// `handle` is live and used by nothing after this.
pub unsafe fn blas_destroy(handle: cublasHandle_t) -> Result<()> {
    // SAFETY: a live handle, destroyed once and used by nothing after (# Safety).
    check("cublasDestroy", unsafe { sys::cublasDestroy_v2(handle) })
}

/// cublasSetStream: later calls on `handle` go to `stream`. It also puts
/// the handle back on cuBLAS's default workspace pool (cuBLAS's docs):
/// give it its workspace again after ([`blas_set_workspace`]).
///
/// # Safety
/// Both handles are live.
pub unsafe fn blas_set_stream(handle: cublasHandle_t, stream: super::CUstream) -> Result<()> {
    // SAFETY: both handles are live (# Safety); cuBLAS's stream type is the
    // driver's, so the handle value passes as it is.
    check("cublasSetStream", unsafe { sys::cublasSetStream_v2(handle, stream as sys::cudaStream_t) })
}

/// cublasSetWorkspace: `handle` uses `bytes` at `ptr` as its scratch
/// instead of memory from cuBLAS's default workspace pool (allocations a
/// CUDA graph that captures a product would hold as nodes of its own),
/// until the next [`blas_set_stream`].
///
/// # Safety
/// `handle` is live; `ptr .. ptr + bytes` is device memory of the handle's
/// GPU, 256-byte aligned, that stays allocated while `handle` may use it.
pub unsafe fn blas_set_workspace(handle: cublasHandle_t, ptr: super::CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: the caller's promise on the handle and the memory (# Safety).
    check("cublasSetWorkspace", unsafe { sys::cublasSetWorkspace_v2(handle, ptr as *mut c_void, bytes) })
}

/// cublasGemmEx, column-major, no transposes: C (m x n, ldc) = A (m x k,
/// lda) · B (k x n, ldb), every matrix FP16, accumulated in FP32, on the
/// handle's stream.
///
/// # Safety
/// `handle` is live; each pointer addresses a device matrix of its shape
/// and leading dimension that stays allocated until the stream ran it.
#[allow(clippy::too_many_arguments)]
pub unsafe fn blas_gemm_f16(
    handle: cublasHandle_t,
    (m, n, k): (i32, i32, i32),
    a: super::CUdeviceptr,
    lda: i32,
    b: super::CUdeviceptr,
    ldb: i32,
    c: super::CUdeviceptr,
    ldc: i32,
) -> Result<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the handle and the matrices are the caller's promise
    // (# Safety); alpha and beta are host f32 (the compute type's), read
    // during the call.
    check("cublasGemmEx", unsafe {
        sys::cublasGemmEx(
            handle,
            cublasOperation_t::CUBLAS_OP_N,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            &alpha as *const f32 as *const c_void,
            a as *const c_void,
            cudaDataType::CUDA_R_16F,
            lda,
            b as *const c_void,
            cudaDataType::CUDA_R_16F,
            ldb,
            &beta as *const f32 as *const c_void,
            c as *mut c_void,
            cudaDataType::CUDA_R_16F,
            ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    })
}

/// cublasGetVersion (e.g. 130001 for 13.0.1).
///
/// # Safety
/// `handle` is live.
pub unsafe fn blas_version(handle: cublasHandle_t) -> Result<i32> {
    let mut v = 0;
    // SAFETY: a live handle (# Safety); writes one int into `v`.
    check("cublasGetVersion", unsafe { sys::cublasGetVersion_v2(handle, &mut v) })?;
    Ok(v)
}

// cuBLASLt: the matrix products whose epilogue does more than store (a
// ReLU applied as the product is written; FP8's scale, rounding and amax),
// through cudarc's `cublaslt` feature, loaded at run time like cuBLAS.

use cudarc::cublaslt::sys as lt;

pub use lt::cublasLtHandle_t;

fn check_lt(call: &'static str, status: lt::cublasStatus_t) -> Result<()> {
    check_status(call, status, lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
}

/// Whether libcublasLt can be loaded (cudarc panics on first use where it
/// cannot, so this is asked first).
pub fn blas_lt_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { lt::is_culib_present() }
}

/// cublasLtCreate: a cuBLASLt handle (it holds no device or stream: each
/// product names its own).
pub fn blas_lt_create() -> Result<cublasLtHandle_t> {
    let mut handle = std::ptr::null_mut();
    // SAFETY: writes one handle into `handle`.
    check_lt("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut handle) })?;
    Ok(handle)
}

/// cublasLtDestroy.
///
/// # Safety
/// `handle` is live and used by nothing after this.
pub unsafe fn blas_lt_destroy(handle: cublasLtHandle_t) -> Result<()> {
    // SAFETY: a live handle, destroyed once and used by nothing after (# Safety).
    check_lt("cublasLtDestroy", unsafe { lt::cublasLtDestroy(handle) })
}

/// The descriptors of one cuBLASLt product, destroyed together however
/// the product ends.
struct LtDescriptors {
    op: lt::cublasLtMatmulDesc_t,
    layouts: Vec<lt::cublasLtMatrixLayout_t>,
    preference: lt::cublasLtMatmulPreference_t,
}

impl Drop for LtDescriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was made by cuBLASLt for this product
        // (or is still null) and is destroyed once, here.
        unsafe {
            for &l in &self.layouts {
                let _ = lt::cublasLtMatrixLayoutDestroy(l);
            }
            if !self.preference.is_null() {
                let _ = lt::cublasLtMatmulPreferenceDestroy(self.preference);
            }
            if !self.op.is_null() {
                let _ = lt::cublasLtMatmulDescDestroy(self.op);
            }
        }
    }
}

/// What a cuBLASLt product's FP8 operands are scaled by: device pointers,
/// each to one f32. A stored value times its scale is the value it
/// stands for (A's and B's); the product is multiplied by `d` before it
/// is rounded to FP8 and stored, and `amax_d` receives the largest
/// magnitude of the product before that scaling (what the next scale is
/// chosen from).
#[derive(Clone, Copy, Debug)]
pub struct LtFp8Scales {
    pub a: super::CUdeviceptr,
    pub b: super::CUdeviceptr,
    pub d: super::CUdeviceptr,
    pub amax_d: super::CUdeviceptr,
}

/// One cuBLASLt product, column-major: D (m x n, ldd) = epilogue(op(A) ·
/// B), summed in FP32. FP16 (`fp8: None`): A is m x k (lda), B k x n
/// (ldb), D FP16. FP8 (E4M3, as Hopper's FP8 kernels take them): A is
/// stored k x m (lda) and read transposed, B k x n (ldb), D E4M3, each
/// scaled by `fp8`'s scales; C, unread with beta 0, is named by its FP16
/// layout and no memory (as PyTorch's scaled GEMM does: cuBLASLt refuses
/// a C at D's address in another type).
#[derive(Clone, Copy, Debug)]
pub struct LtProduct {
    pub dims: (u64, u64, u64),
    pub a: super::CUdeviceptr,
    pub lda: i64,
    pub b: super::CUdeviceptr,
    pub ldb: i64,
    pub d: super::CUdeviceptr,
    pub ldd: i64,
    /// The ReLU applied as D is written (cuBLASLt's epilogue).
    pub relu: bool,
    pub fp8: Option<LtFp8Scales>,
}

/// Sets one attribute of a product's descriptor to `value`.
///
/// # Safety
/// `op` is a live descriptor and `T` is the attribute's type.
unsafe fn set_op_attribute<T>(op: lt::cublasLtMatmulDesc_t, attribute: lt::cublasLtMatmulDescAttributes_t, value: &T) -> Result<()> {
    // SAFETY: a live descriptor and the attribute's own type (# Safety);
    // cuBLASLt copies the value during the call.
    check_lt("cublasLtMatmulDescSetAttribute", unsafe {
        lt::cublasLtMatmulDescSetAttribute(op, attribute, value as *const T as *const c_void, std::mem::size_of::<T>())
    })
}

/// cublasLtMatmul of `p` (see [`LtProduct`]), the algorithm cuBLASLt's
/// heuristic ranks first within `workspace_bytes`, run on `stream`.
///
/// # Safety
/// `handle` and `stream` are live; each pointer of `p` addresses a device
/// matrix of its shape, type and leading dimension, each scale pointer
/// one device f32, and `workspace .. + workspace_bytes` device
/// memory (256-byte aligned), all of which stay allocated until the stream
/// ran the product.
pub unsafe fn blas_lt_gemm(
    handle: cublasLtHandle_t,
    p: &LtProduct,
    workspace: super::CUdeviceptr,
    workspace_bytes: usize,
    stream: super::CUstream,
) -> Result<()> {
    use lt::cublasLtMatmulDescAttributes_t as Attr;
    use lt::cudaDataType_t::{CUDA_R_16F, CUDA_R_8F_E4M3};
    let (m, n, k) = p.dims;
    let mut descs = LtDescriptors { op: std::ptr::null_mut(), layouts: Vec::new(), preference: std::ptr::null_mut() };
    // SAFETY: each call writes one descriptor into its out-pointer, or
    // reads the host values it is given for the size of their type; the
    // descriptors are destroyed by `descs` on every path.
    unsafe {
        check_lt(
            "cublasLtMatmulDescCreate",
            lt::cublasLtMatmulDescCreate(&mut descs.op, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType_t::CUDA_R_32F),
        )?;
        let epilogue = if p.relu { lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU } else { lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT };
        set_op_attribute(descs.op, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
        // (rows, cols, leading dimension, type) of A, B, C and D.
        let layouts = match p.fp8 {
            None => [(m, k, p.lda, CUDA_R_16F), (k, n, p.ldb, CUDA_R_16F), (m, n, p.ldd, CUDA_R_16F), (m, n, p.ldd, CUDA_R_16F)],
            Some(s) => {
                set_op_attribute(descs.op, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &cublasOperation_t::CUBLAS_OP_T)?;
                for (attribute, ptr) in [
                    (Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s.a),
                    (Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s.b),
                    (Attr::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, s.d),
                    (Attr::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, s.amax_d),
                ] {
                    set_op_attribute(descs.op, attribute, &(ptr as *const c_void))?;
                }
                // Hopper's FP8 kernels take C in FP16 (or BF16) beside an FP8 D.
                [(k, m, p.lda, CUDA_R_8F_E4M3), (k, n, p.ldb, CUDA_R_8F_E4M3), (m, n, p.ldd, CUDA_R_16F), (m, n, p.ldd, CUDA_R_8F_E4M3)]
            }
        };
        for (rows, cols, ld, ty) in layouts {
            let mut layout = std::ptr::null_mut();
            check_lt("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut layout, ty, rows, cols, ld))?;
            descs.layouts.push(layout);
        }
        check_lt("cublasLtMatmulPreferenceCreate", lt::cublasLtMatmulPreferenceCreate(&mut descs.preference))?;
        let max_workspace = workspace_bytes as u64;
        check_lt(
            "cublasLtMatmulPreferenceSetAttribute",
            lt::cublasLtMatmulPreferenceSetAttribute(
                descs.preference,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &max_workspace as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            ),
        )?;
    }
    let (la, lb, lc, ld) = (descs.layouts[0], descs.layouts[1], descs.layouts[2], descs.layouts[3]);
    // SAFETY: a zeroed result is what cuBLASLt's heuristic overwrites (a
    // plain C struct of integers and floats).
    let mut best: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    let mut found = 0;
    // SAFETY: live handle and descriptors; room for the one result asked for.
    check_lt("cublasLtMatmulAlgoGetHeuristic", unsafe {
        lt::cublasLtMatmulAlgoGetHeuristic(handle, descs.op, la, lb, lc, ld, descs.preference, 1, &mut best, &mut found)
    })?;
    if found == 0 {
        return Err(LabError::Driver { call: "cublasLtMatmulAlgoGetHeuristic", message: "no algorithm for this product".into() });
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    // C: D's memory for FP16 (in place, one type), none for FP8; with
    // beta 0 it is read as nothing either way.
    let c = if p.fp8.is_some() { std::ptr::null() } else { p.d as *const c_void };
    // SAFETY: the handle, stream, matrices, scales and workspace are the
    // caller's promise (# Safety); alpha and beta are host f32 (the scale
    // type), read during the call.
    check_lt("cublasLtMatmul", unsafe {
        lt::cublasLtMatmul(
            handle,
            descs.op,
            &alpha as *const f32 as *const c_void,
            p.a as *const c_void,
            la,
            p.b as *const c_void,
            lb,
            &beta as *const f32 as *const c_void,
            c,
            lc,
            p.d as *mut c_void,
            ld,
            &best.algo,
            workspace as *mut c_void,
            workspace_bytes,
            stream as lt::cudaStream_t,
        )
    })
}
