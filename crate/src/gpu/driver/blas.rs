//! cuBLAS's raw calls, through cudarc's `cublas` feature: the library is
//! loaded at run time like the driver (`libcublas.so.<major>`), so the crate
//! builds and its tests run where no CUDA is installed. Only the calls a
//! half-precision GEMM on a stream needs: a handle, its stream, its
//! workspace, `cublasGemmEx`.

use crate::error::{LabError, Result};
use cudarc::cublas::sys::{self, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cublasStatus_t, cudaDataType};
use std::ffi::c_void;

pub use sys::cublasHandle_t;

fn check(call: &'static str, status: cublasStatus_t) -> Result<()> {
    match status {
        cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        other => Err(LabError::Driver { call, message: format!("{other:?}") }),
    }
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
