//! The one module that makes raw calls: the CUDA driver's (cudarc's
//! `sys`/`result` layers), CUPTI's activity records ([`activity`]), the few
//! cuBLAS calls lab 9's GEMMs need (`blas_*`) and NCCL's, with the loading
//! of its library (`nccl_*`, lab 8's all-reduce). Each call on a raw handle
//! is an `unsafe fn` whose `# Safety` says what its caller keeps (handles
//! live, memory allocated until the GPU ran the work); a call that is sound
//! whatever its arguments (a query, a creation) is a plain `fn`.
//! Everything else in the crate speaks in the safe types of [`crate::gpu`].
//! Keeping the calls here means a reader can see exactly which driver calls
//! a lab issues: no hidden event records, no implicit syncs (cudarc's
//! event tracking, on by default, would add an event record and a wait
//! around every buffer a call uses once a second stream exists:
//! [`open_context`] turns it off).

use crate::error::{LabError, Result};
use crate::units::Bytes;
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice_attribute as Attr, CUresult};
use cudarc::driver::{CudaContext, DriverError};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

pub use sys::{CUdevice, CUdeviceptr, CUevent, CUstream};

fn check(call: &'static str, r: CUresult) -> Result<()> {
    r.result().map_err(|e| driver_error(call, e))
}

pub(crate) fn driver_error(call: &'static str, e: DriverError) -> LabError {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    LabError::Driver { call, message: format!("{name}: {text}") }
}

fn alloc_error(call: &'static str, what: &'static str, bytes: usize, e: DriverError) -> LabError {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        LabError::OutOfMemory { what, call, bytes: Bytes(bytes as u64) }
    } else {
        driver_error(call, e)
    }
}

/// Whether libcuda can be loaded at all. cudarc panics on first use when it
/// cannot, so this must be asked before anything else.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

pub fn device_count() -> Result<usize> {
    result::init().map_err(|e| driver_error("cuInit", e))?;
    let n = result::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// Retains the device's primary context and turns cudarc's event tracking off:
/// this crate owns every synchronization itself.
pub fn open_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
    // SAFETY: no CudaSlice is ever created through this context; buffers are ours.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

thread_local! {
    /// Set while this thread runs a host function (see [`host_function_scope`]).
    static IN_HOST_FUNCTION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is inside a host function.
pub fn in_host_function() -> bool {
    IN_HOST_FUNCTION.with(|f| f.get())
}

/// Marks the calling thread as running a host function until the returned
/// guard drops. CUDA forbids CUDA calls from a host function (the driver's
/// callback thread would wait on itself), so the calls below that labs make
/// in loops refuse to run there: a mistake is an error, not a hang.
pub fn host_function_scope() -> impl Drop {
    struct Scope;
    impl Drop for Scope {
        fn drop(&mut self) {
            IN_HOST_FUNCTION.with(|f| f.set(false));
        }
    }
    IN_HOST_FUNCTION.with(|f| f.set(true));
    Scope
}

fn refuse_in_host_function(call: &'static str) -> Result<()> {
    if in_host_function() {
        return Err(LabError::Driver {
            call,
            message: "called from inside a host function, where CUDA calls are not allowed (it can deadlock the driver's callback thread)".into(),
        });
    }
    Ok(())
}

pub fn bind(ctx: &CudaContext) -> Result<()> {
    refuse_in_host_function("cuCtxSetCurrent")?;
    ctx.bind_to_thread().map_err(|e| driver_error("cuCtxSetCurrent", e))
}

/// The calling thread's current context, set back when dropped: around a
/// library (NCCL) that switches devices through the CUDA runtime.
pub struct KeepCurrent(sys::CUcontext);

impl KeepCurrent {
    pub fn save() -> Result<KeepCurrent> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one handle (null when none is current).
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        Ok(KeepCurrent(ctx))
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        // SAFETY: the context was current (so live) when saved, and the
        // crate's contexts are primary ones it keeps retained.
        let _ = unsafe { sys::cuCtxSetCurrent(self.0) };
    }
}

pub fn attribute(dev: CUdevice, attr: Attr) -> Result<i32> {
    // SAFETY: a query that writes one int cudarc owns; a handle that is not
    // a device is an error (CUDA_ERROR_INVALID_DEVICE), not undefined behaviour.
    unsafe { result::device::get_attribute(dev, attr) }.map_err(|e| driver_error("cuDeviceGetAttribute", e))
}

pub fn device_name(dev: CUdevice) -> Result<String> {
    result::device::get_name(dev).map_err(|e| driver_error("cuDeviceGetName", e))
}

pub fn device_uuid(dev: CUdevice) -> Result<String> {
    let u = result::device::get_uuid(dev).map_err(|e| driver_error("cuDeviceGetUuid", e))?;
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    Ok(format!("GPU-{}-{}-{}-{}-{}", hex(&b[0..4]), hex(&b[4..6]), hex(&b[6..8]), hex(&b[8..10]), hex(&b[10..16])))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn total_memory(dev: CUdevice) -> Result<u64> {
    // SAFETY: as for `attribute`: a query on a device handle, into cudarc's own int.
    unsafe { result::device::total_mem(dev) }.map(|b| b as u64).map_err(|e| driver_error("cuDeviceTotalMem", e))
}

/// (free, total) bytes of the current context's device.
pub fn memory_info() -> Result<(u64, u64)> {
    result::mem_get_info().map(|(f, t)| (f as u64, t as u64)).map_err(|e| driver_error("cuMemGetInfo", e))
}

/// The CUDA version the driver supports, e.g. 13000 for 13.0.
pub fn driver_cuda_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

pub fn pci_bus_id(dev: CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer is large enough for "dddd:bb:dd.f" and NUL.
    check("cuDeviceGetPCIBusId", unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) })?;
    // SAFETY: the driver NUL-terminated it.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

// ---- several GPUs ----------------------------------------------------------

/// The device handle of GPU `ordinal`.
pub fn device(ordinal: usize) -> Result<CUdevice> {
    let mut dev = 0;
    let ordinal = i32::try_from(ordinal).map_err(|_| LabError::config(format!("GPU {ordinal} does not exist")))?;
    // SAFETY: writes one handle into `dev`, which outlives the call; a bad
    // ordinal is an error.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
    Ok(dev)
}

/// Whether GPU `dev` can map GPU `peer`'s memory (cuDeviceCanAccessPeer).
pub fn can_access_peer(dev: CUdevice, peer: CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: writes one int; plain query on device handles.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) })?;
    Ok(can != 0)
}

/// One attribute of the path from GPU `src` to GPU `dst`
/// (cuDeviceGetP2PAttribute).
pub fn p2p_attribute(src: CUdevice, dst: CUdevice, attr: sys::CUdevice_P2PAttribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int; plain query on device handles.
    check("cuDeviceGetP2PAttribute", unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, src, dst) })?;
    Ok(v)
}

pub use sys::CUdevice_P2PAttribute as P2pAttr;

/// Lets the current context map `peer`'s memory (cuCtxEnablePeerAccess);
/// already enabled is not an error.
///
/// # Safety
/// `peer` is a live context of another device than the current one.
pub unsafe fn enable_peer_access(peer: sys::CUcontext) -> Result<()> {
    // SAFETY: `peer` is a live context of another device (# Safety); the
    // call reads nothing else of ours.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        r => check("cuCtxEnablePeerAccess", r),
    }
}

/// Copies `bytes` from `src` in context `src_ctx` to `dst` in `dst_ctx` on
/// `s` (cuMemcpyPeerAsync): over the link between the GPUs where peer
/// access is enabled, else staged by the driver through host memory.
///
/// # Safety
/// Both ranges lie inside live allocations of their contexts that outlive
/// the queued copy; `s` is a live stream of either context.
pub unsafe fn memcpy_peer_async(dst: CUdeviceptr, dst_ctx: sys::CUcontext, src: CUdeviceptr, src_ctx: sys::CUcontext, bytes: usize, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuMemcpyPeerAsync")?;
    // SAFETY: the caller's promise on both ranges, both contexts and the
    // stream (# Safety).
    check("cuMemcpyPeerAsync", unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, s) })
}

// ---- streams -------------------------------------------------------------

pub fn stream_create_non_blocking() -> Result<CUstream> {
    result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| driver_error("cuStreamCreate", e))
}

/// A new stream of the current context: non-blocking (CU_STREAM_NON_BLOCKING)
/// or blocking (ordered against the legacy default stream), with
/// `priority` (lower runs first; see [`stream_priority_range`]).
pub fn stream_create_with_priority(non_blocking: bool, priority: i32) -> Result<CUstream> {
    let flags = if non_blocking { sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32 } else { sys::CUstream_flags::CU_STREAM_DEFAULT as u32 };
    let mut s = std::mem::MaybeUninit::<CUstream>::uninit();
    // SAFETY: `s` is written by the driver on success.
    check("cuStreamCreateWithPriority", unsafe { sys::cuStreamCreateWithPriority(s.as_mut_ptr(), flags, priority) })?;
    // SAFETY: initialized on success (checked above).
    Ok(unsafe { s.assume_init() })
}

/// The current context's stream priorities: (least, greatest). CUDA counts
/// down: greatest is the most negative, the default 0 is the least.
pub fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: two out-parameters that outlive the call.
    check("cuCtxGetStreamPriorityRange", unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
    Ok((least, greatest))
}

/// The legacy default stream (the "NULL stream"): a handle the driver owns,
/// never created or destroyed.
pub const STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// The calling host thread's per-thread default stream (never destroyed).
pub const STREAM_PER_THREAD: CUstream = 0x2 as CUstream;

/// # Safety
/// `s` is a live stream of the current context, destroyed once (work
/// already queued on it still completes: the driver defers the release).
pub unsafe fn stream_destroy(s: CUstream) -> Result<()> {
    // SAFETY: the caller owns the live handle and destroys it once (# Safety).
    unsafe { result::stream::destroy(s) }.map_err(|e| driver_error("cuStreamDestroy", e))
}

/// # Safety
/// `s` is a live stream of the current context.
pub unsafe fn stream_synchronize(s: CUstream) -> Result<()> {
    refuse_in_host_function("cuStreamSynchronize")?;
    // SAFETY: `s` is a live stream of the current context (# Safety).
    unsafe { result::stream::synchronize(s) }.map_err(|e| driver_error("cuStreamSynchronize", e))
}

/// Blocks `s` until the 32-bit word at device address `addr` is >= `value`.
///
/// # Safety
/// `s` is a live stream and `addr` the device alias of a mapped page-locked word that stays allocated until the wait has completed.
pub unsafe fn stream_wait_value_geq(s: CUstream, addr: CUdeviceptr, value: u32) -> Result<()> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: `addr` is the device alias of a mapped word that stays
    // allocated until the wait completed, and `s` is live (# Safety).
    check("cuStreamWaitValue32", unsafe { sys::cuStreamWaitValue32_v2(s, addr, value, flags) })
}

// ---- events --------------------------------------------------------------

pub fn event_create_timing() -> Result<CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(|e| driver_error("cuEventCreate", e))
}

/// An event for ordering only: recording it writes no timestamp, which
/// costs a flush on the engine that reaches it.
pub fn event_create_sync_only() -> Result<CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| driver_error("cuEventCreate", e))
}

/// # Safety
/// `e` is a live event of the current context, destroyed once.
pub unsafe fn event_destroy(e: CUevent) -> Result<()> {
    // SAFETY: the caller owns the live event and destroys it once (# Safety).
    unsafe { result::event::destroy(e) }.map_err(|e| driver_error("cuEventDestroy", e))
}

/// # Safety
/// `e` and `s` are live handles of the current context.
pub unsafe fn event_record(e: CUevent, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuEventRecord")?;
    // SAFETY: both handles are live in the current context (# Safety).
    unsafe { result::event::record(e, s) }.map_err(|e| driver_error("cuEventRecord", e))
}

/// # Safety
/// `e` is a live event of the current context.
pub unsafe fn event_synchronize(e: CUevent) -> Result<()> {
    refuse_in_host_function("cuEventSynchronize")?;
    // SAFETY: `e` is a live event of the current context (# Safety).
    unsafe { result::event::synchronize(e) }.map_err(|e| driver_error("cuEventSynchronize", e))
}

/// Milliseconds between two completed events.
///
/// # Safety
/// `start` and `end` are live timing events of the current context, both recorded and completed.
pub unsafe fn event_elapsed_ms(start: CUevent, end: CUevent) -> Result<f32> {
    // SAFETY: both events belong to this context and have completed.
    unsafe { result::event::elapsed(start, end) }.map_err(|e| driver_error("cuEventElapsedTime", e))
}

// ---- device memory -------------------------------------------------------

pub fn device_alloc(bytes: usize) -> Result<CUdeviceptr> {
    // SAFETY: cuMemAlloc returns a fresh allocation or an error; it touches
    // no memory of ours.
    unsafe { result::malloc_sync(bytes) }.map_err(|e| alloc_error("cuMemAlloc", "device", bytes, e))
}

/// # Safety
/// `p` came from [`device_alloc`] and is freed once, and no queued work
/// still uses it (cuMemFree does not wait for other streams' work).
pub unsafe fn device_free(p: CUdeviceptr) -> Result<()> {
    // SAFETY: `p` came from device_alloc, is freed once, and no queued
    // work still uses it (# Safety).
    unsafe { result::free_sync(p) }.map_err(|e| driver_error("cuMemFree", e))
}

/// cuMemAllocAsync: `bytes` from the device's default pool, usable in
/// stream order on `s`.
///
/// # Safety
/// `s` is a live stream of the current context.
pub unsafe fn mem_alloc_async(bytes: usize, s: CUstream) -> Result<CUdeviceptr> {
    refuse_in_host_function("cuMemAllocAsync")?;
    // SAFETY: `s` is a live stream of the current context (# Safety); the
    // allocation is new.
    unsafe { result::malloc_async(s, bytes) }.map_err(|e| alloc_error("cuMemAllocAsync", "device", bytes, e))
}

/// cuMemFreeAsync: `p` goes back to its pool when `s` reaches this point.
///
/// # Safety
/// `p` came from [`mem_alloc_async`] and is freed once; work on other
/// streams that uses it is ordered before this point of `s`.
pub unsafe fn mem_free_async(p: CUdeviceptr, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuMemFreeAsync")?;
    // SAFETY: `p` came from mem_alloc_async and is freed once, after the
    // work that uses it in stream order (# Safety).
    unsafe { result::free_async(p, s) }.map_err(|e| driver_error("cuMemFreeAsync", e))
}

// ---- the stream-ordered pool ----------------------------------------------

pub use sys::CUmemPool_attribute as PoolAttr;
pub use sys::CUmemoryPool;

/// The device's default pool: the one cuMemAllocAsync draws from. The
/// driver owns it (never destroyed).
pub fn default_mem_pool(dev: CUdevice) -> Result<CUmemoryPool> {
    // SAFETY: a query on a device handle; a handle that is not a device is
    // an error, not undefined behaviour.
    unsafe { result::device::get_default_mem_pool(dev) }.map_err(|e| driver_error("cuDeviceGetDefaultMemPool", e))
}

/// # Safety
/// `pool` is a live pool and `attr` one of its 64-bit attributes
/// (release threshold, reserved or used memory, current or high).
pub unsafe fn mem_pool_get_u64(pool: CUmemoryPool, attr: PoolAttr) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the attribute is 64 bits wide (the caller's promise).
    unsafe { result::mem_pool::get_attribute(pool, attr, &mut v as *mut u64 as *mut c_void) }.map_err(|e| driver_error("cuMemPoolGetAttribute", e))?;
    Ok(v)
}

/// # Safety
/// As [`mem_pool_get_u64`]; the high-water attributes take only 0 (a reset).
pub unsafe fn mem_pool_set_u64(pool: CUmemoryPool, attr: PoolAttr, mut v: u64) -> Result<()> {
    // SAFETY: the attribute is 64 bits wide (the caller's promise).
    unsafe { result::mem_pool::set_attribute(pool, attr, &mut v as *mut u64 as *mut c_void) }.map_err(|e| driver_error("cuMemPoolSetAttribute", e))
}

/// # Safety
/// `pool` is a live pool.
pub unsafe fn mem_pool_trim_to(pool: CUmemoryPool, keep: usize) -> Result<()> {
    // SAFETY: `pool` is live (# Safety); trimming frees only memory no
    // allocation holds.
    unsafe { result::mem_pool::trim_to(pool, keep) }.map_err(|e| driver_error("cuMemPoolTrimTo", e))
}

/// # Safety
/// `s` is a live stream and `p .. p + 4·words` lies inside one device allocation that outlives the queued write.
pub unsafe fn memset_d32_async(p: CUdeviceptr, value: u32, words: usize, s: CUstream) -> Result<()> {
    // SAFETY: `p .. p + 4·words` lies inside one allocation that outlives
    // the queued write, and `s` is live (# Safety).
    check("cuMemsetD32Async", unsafe { sys::cuMemsetD32Async(p, value, words, s) })
}

/// # Safety
/// `src` must stay valid and unmodified until the copy completes on `s`
/// (for pageable memory the driver has staged it when this returns).
pub unsafe fn memcpy_htod_async(dst: CUdeviceptr, src: *const c_void, bytes: usize, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuMemcpyHtoDAsync")?;
    // SAFETY: the caller's promise (# Safety) on both ranges and the stream.
    check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, s) })
}

/// # Safety
/// `dst` must stay valid and must not be read until the copy completes on `s`.
pub unsafe fn memcpy_dtoh_async(dst: *mut c_void, src: CUdeviceptr, bytes: usize, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuMemcpyDtoHAsync")?;
    // SAFETY: the caller's promise (# Safety) on both ranges and the stream.
    check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, s) })
}

// ---- host memory ---------------------------------------------------------

pub const HOST_ALLOC_PINNED: u32 = 0;
pub const HOST_ALLOC_WRITE_COMBINED: u32 = sys::CU_MEMHOSTALLOC_WRITECOMBINED;
pub const HOST_ALLOC_MAPPED: u32 = sys::CU_MEMHOSTALLOC_DEVICEMAP;

pub fn host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    // SAFETY: returns fresh page-locked memory or an error.
    unsafe { result::malloc_host(bytes, flags) }.map_err(|e| alloc_error("cuMemHostAlloc", "pinned host", bytes, e))
}

/// # Safety
/// `p` came from [`host_alloc`] and no copy still uses it.
pub unsafe fn host_free(p: *mut c_void) -> Result<()> {
    // SAFETY: the caller's promise: `p` came from cuMemHostAlloc, is freed
    // once, and no copy still uses it.
    unsafe { result::free_host(p) }.map_err(|e| driver_error("cuMemFreeHost", e))
}

/// # Safety
/// `p..p+bytes` is a live, page-aligned allocation that outlives the registration.
pub unsafe fn host_register(p: *mut c_void, bytes: usize) -> Result<()> {
    // SAFETY: the caller's promise on the range (# Safety).
    unsafe { sys::cuMemHostRegister_v2(p, bytes, 0) }.result().map_err(|e| alloc_error("cuMemHostRegister", "pinned host", bytes, e))
}

/// # Safety
/// `p` was registered with [`host_register`] and no copy still uses it.
pub unsafe fn host_unregister(p: *mut c_void) -> Result<()> {
    // SAFETY: the caller's promise: registered, and no copy still uses it.
    check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(p) })
}

/// # Safety
/// `p` is mapped pinned memory (allocated with [`HOST_ALLOC_MAPPED`]).
pub unsafe fn host_device_pointer(p: *mut c_void) -> Result<CUdeviceptr> {
    let mut d: CUdeviceptr = 0;
    // SAFETY: `p` is mapped pinned memory (the caller's promise); writes one
    // address into `d`.
    check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) })?;
    Ok(d)
}

// ---- modules and launches -------------------------------------------------

pub use sys::{CUfunction, CUmodule};

pub fn module_load_ptx(ptx: &str) -> Result<CUmodule> {
    let image = std::ffi::CString::new(ptx).map_err(|_| LabError::Kernel("PTX contains a NUL byte".into()))?;
    // SAFETY: a NUL-terminated PTX image; the driver copies what it needs.
    unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| driver_error("cuModuleLoadData", e))
}

/// # Safety
/// `m` is a live module of the current context.
pub unsafe fn module_function(m: CUmodule, name: &str) -> Result<CUfunction> {
    let c = std::ffi::CString::new(name).map_err(|_| LabError::Kernel(format!("bad kernel name {name:?}")))?;
    // SAFETY: `m` is a live module (# Safety); `c` is NUL-terminated and
    // outlives the call.
    unsafe { result::module::get_function(m, c) }.map_err(|e| driver_error("cuModuleGetFunction", e))
}

/// Where a module's `__device__` variable `name` lives, and its size in bytes.
///
/// # Safety
/// `m` is a live module of the current context.
pub unsafe fn module_global(m: CUmodule, name: &str) -> Result<(CUdeviceptr, usize)> {
    let c = std::ffi::CString::new(name).map_err(|_| LabError::Kernel(format!("bad variable name {name:?}")))?;
    // SAFETY: `m` is a live module (# Safety); `c` is NUL-terminated and
    // outlives the call.
    unsafe { result::module::get_global(m, c) }.map_err(|e| driver_error("cuModuleGetGlobal", e))
}

/// # Safety
/// `m` is a live module, unloaded once, with no launch of its functions still queued.
pub unsafe fn module_unload(m: CUmodule) -> Result<()> {
    // SAFETY: the caller owns the module, unloads it once, and no launch of
    // it is pending (# Safety).
    unsafe { result::module::unload(m) }.map_err(|e| driver_error("cuModuleUnload", e))
}

/// # Safety
/// `params` must point at values matching the kernel's signature, and the
/// memory they reference must stay valid until the launch completes on `s`;
/// `smem` bytes of dynamic shared memory must be within what the function
/// was allowed ([`func_set_max_dynamic_smem`]).
pub unsafe fn launch(f: CUfunction, grid: u32, block: u32, smem: u32, s: CUstream, params: &mut [*mut c_void]) -> Result<()> {
    refuse_in_host_function("cuLaunchKernel")?;
    // SAFETY: the caller's promise on the arguments, the memory they name
    // and the shared memory asked for (# Safety).
    unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), smem, s, params) }.map_err(|e| driver_error("cuLaunchKernel", e))
}

/// What the driver says of a loaded kernel: registers per thread, static
/// shared memory per block (bytes), local memory per thread (bytes: spilled
/// registers), the most threads per block it can be launched with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuncResources {
    pub registers: i32,
    pub static_smem: i32,
    pub local_bytes: i32,
    pub max_threads: i32,
}

/// # Safety
/// `f` is a function of a live module of the current context.
pub unsafe fn func_resources(f: CUfunction) -> Result<FuncResources> {
    use sys::CUfunction_attribute as A;
    let get = |attr| {
        let mut v = 0i32;
        // SAFETY: f is live (caller); v is a valid out-pointer.
        check("cuFuncGetAttribute", unsafe { sys::cuFuncGetAttribute(&mut v, attr, f) }).map(|_| v)
    };
    Ok(FuncResources {
        registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        static_smem: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        max_threads: get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
    })
}

/// Allows `f` up to `bytes` of dynamic shared memory per block (launches
/// asking more than 48 KiB fail without it).
/// # Safety
/// `f` is a function of a live module of the current context.
pub unsafe fn func_set_max_dynamic_smem(f: CUfunction, bytes: u32) -> Result<()> {
    use sys::CUfunction_attribute as A;
    // SAFETY: f is live (caller).
    check("cuFuncSetAttribute", unsafe { sys::cuFuncSetAttribute(f, A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32) })
}

/// How many blocks of `block` threads with `smem` bytes of dynamic shared
/// memory fit on one SM at once (the occupancy calculator).
/// # Safety
/// `f` is a function of a live module of the current context.
pub unsafe fn occupancy_blocks_per_sm(f: CUfunction, block: u32, smem: u32) -> Result<u32> {
    // SAFETY: f is live (caller).
    unsafe { result::occupancy::max_active_block_per_multiprocessor(f, block as i32, smem as usize) }
        .map(|n| n.max(0) as u32)
        .map_err(|e| driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))
}

/// # Safety
/// `src .. src + bytes` and `dst .. dst + bytes` lie inside live device
/// allocations that outlive the queued copy on `s`, and do not overlap.
pub unsafe fn memcpy_dtod_async(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuMemcpyDtoDAsync")?;
    // SAFETY: the caller's promise on both ranges and the stream (# Safety).
    check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s) })
}

/// # Safety
/// `s` and `e` are live handles of the current context.
pub unsafe fn stream_wait_event(s: CUstream, e: CUevent) -> Result<()> {
    refuse_in_host_function("cuStreamWaitEvent")?;
    // SAFETY: `s` and `e` are live handles of the current context (# Safety).
    unsafe { result::stream::wait_event(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }.map_err(|e| driver_error("cuStreamWaitEvent", e))
}

/// Enqueues `f(arg)` on `s`: the driver's callback thread runs it once
/// everything before it on `s` is done, and later work on `s` waits for it.
///
/// # Safety
/// `f` must be safe to call once with `arg` from another thread, and must
/// make no CUDA call.
pub unsafe fn launch_host_function(s: CUstream, f: unsafe extern "C" fn(*mut c_void), arg: *mut c_void) -> Result<()> {
    refuse_in_host_function("cuLaunchHostFunc")?;
    // SAFETY: the caller's promise that `f(arg)` may run once on the
    // driver's thread and makes no CUDA call (# Safety).
    unsafe { result::stream::launch_host_function(s, f, arg) }.map_err(|e| driver_error("cuLaunchHostFunc", e))
}

// ---- CUDA graphs (stream capture) ------------------------------------------

pub use sys::{CUgraph, CUgraphExec};

/// cuStreamBeginCapture: from here until [`stream_end_capture`], work issued
/// to `s` (and to every stream that waits on an event recorded on it while
/// it captures) is recorded into a graph instead of run. Mode "thread
/// local": this thread may not make calls that would wait on the captured
/// work meanwhile (the driver refuses them, and the capture fails).
///
/// # Safety
/// `s` is a live stream created by this context (not a default stream).
pub unsafe fn stream_begin_capture(s: CUstream) -> Result<()> {
    // SAFETY: `s` is a live stream this context created (# Safety): the
    // default streams, which cannot be captured, are refused by the driver.
    unsafe { result::stream::begin_capture(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
        .map_err(|e| driver_error("cuStreamBeginCapture", e))
}

/// cuStreamEndCapture: the graph captured on `s` (the caller destroys it).
///
/// # Safety
/// `s` is capturing, begun by [`stream_begin_capture`] on this thread.
pub unsafe fn stream_end_capture(s: CUstream) -> Result<CUgraph> {
    // SAFETY: `s` is capturing, begun on this thread (# Safety).
    unsafe { result::stream::end_capture(s) }.map_err(|e| driver_error("cuStreamEndCapture", e))
}

/// A graph node's type as the driver numbers it (`CUgraphNodeType`), kept
/// as a number: a newer driver may report a type this binding does not name.
pub type GraphNodeType = u32;
/// A node that allocates memory from a pool when the graph runs (a
/// cuMemAllocAsync captured into the graph).
pub const GRAPH_NODE_MEM_ALLOC: GraphNodeType = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32;
/// A node that gives memory back to its pool when the graph runs.
pub const GRAPH_NODE_MEM_FREE: GraphNodeType = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32;

/// cuGraphGetNodes, then cuGraphNodeGetType on each: the type of every
/// node of graph `g`.
///
/// # Safety
/// `g` is a live graph.
pub unsafe fn graph_node_types(g: CUgraph) -> Result<Vec<GraphNodeType>> {
    let mut n = 0usize;
    // SAFETY: `g` is live (# Safety); a null node array asks for the count only.
    check("cuGraphGetNodes", unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) })?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for the `n` handles asked for; the driver
    // writes at most `n` and says how many.
    check("cuGraphGetNodes", unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) })?;
    nodes.truncate(n);
    nodes
        .iter()
        .map(|&node| {
            let mut t: u32 = u32::MAX;
            // SAFETY: `node` is a node of the live graph `g`; the driver
            // writes one 32-bit enum value into `t`, read back as a number
            // (so a type the binding does not name is no invalid enum).
            check("cuGraphNodeGetType", unsafe { sys::cuGraphNodeGetType(node, &mut t as *mut u32 as *mut sys::CUgraphNodeType) }).map(|()| t)
        })
        .collect()
}

/// cuGraphInstantiate: an executable graph of `g` (the caller destroys it).
///
/// # Safety
/// `g` is a live graph.
pub unsafe fn graph_instantiate(g: CUgraph) -> Result<CUgraphExec> {
    // SAFETY: `g` is a live graph (# Safety); the executable graph is new.
    unsafe { result::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) }.map_err(|e| driver_error("cuGraphInstantiate", e))
}

/// cuGraphLaunch: runs executable graph `g` on `s`.
///
/// # Safety
/// `g` and `s` are live; every buffer the graph's nodes touch outlives the
/// launch, and nothing else uses them until it completes on `s`.
pub unsafe fn graph_launch(g: CUgraphExec, s: CUstream) -> Result<()> {
    refuse_in_host_function("cuGraphLaunch")?;
    // SAFETY: `g` and `s` are live, and the memory the graph's nodes touch
    // outlives the launch (# Safety).
    unsafe { result::graph::launch(g, s) }.map_err(|e| driver_error("cuGraphLaunch", e))
}

/// cuGraphExecDestroy (a launch still running is not cut short: the driver
/// frees the graph once it completes).
///
/// # Safety
/// `g` is a live executable graph, destroyed once.
pub unsafe fn graph_exec_destroy(g: CUgraphExec) -> Result<()> {
    // SAFETY: the caller owns the live executable graph and destroys it
    // once (# Safety).
    unsafe { result::graph::exec_destroy(g) }.map_err(|e| driver_error("cuGraphExecDestroy", e))
}

/// # Safety
/// `g` is a live graph, destroyed once.
pub unsafe fn graph_destroy(g: CUgraph) -> Result<()> {
    // SAFETY: the caller owns the live graph and destroys it once (# Safety).
    unsafe { result::graph::destroy(g) }.map_err(|e| driver_error("cuGraphDestroy", e))
}

pub fn context_synchronize() -> Result<()> {
    refuse_in_host_function("cuCtxSynchronize")?;
    result::ctx::synchronize().map_err(|e| driver_error("cuCtxSynchronize", e))
}

pub mod activity;
// cuBLAS's raw calls, in the same thin layer (`blas_*`).
mod blas;
// NCCL's raw calls and its loading, in the same thin layer (`nccl_*`).
mod nccl;
pub use activity::ActivityRecord;
pub use blas::*;
pub use nccl::*;
