//! CUPTI activity tracing: the driver reports each copy's and kernel's
//! start and end as the hardware saw them, with no events in the streams.

use crate::error::{LabError, Result};
use cudarc::cupti::sys::{self, CUptiResult, CUpti_ActivityKind as Kind};
use std::alloc::{alloc, dealloc, Layout};
use std::sync::Mutex;

/// Timestamps the GPU itself recorded for one copy or kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivityRecord {
    /// 1 = H2D, 2 = D2H (CUPTI memcpy kinds), 0 = kernel.
    pub copy_kind: u8,
    pub stream_id: u32,
    pub correlation: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

const BUFFER: usize = 8 << 20;
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RECORDS: Mutex<Vec<ActivityRecord>> = Mutex::new(Vec::new());
static FAILED: Mutex<Option<String>> = Mutex::new(None);

fn check(call: &str, r: CUptiResult) -> Result<()> {
    if r == CUptiResult::CUPTI_SUCCESS {
        Ok(())
    } else {
        Err(LabError::Driver { call: "CUPTI", message: format!("{call}: {r:?}") })
    }
}

/// Whether libcupti can be loaded.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// CUPTI asks for a buffer to fill with records.
///
/// # Safety
/// Called by CUPTI only (registered in [`start`]), with three valid
/// out-pointers.
unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let layout = Layout::from_size_align(BUFFER, 8).expect("static layout");
    // SAFETY: the out-pointers are valid (# Safety); the buffer allocated
    // here is freed in `completed`, when CUPTI hands it back.
    unsafe {
        *buffer = alloc(layout);
        *size = if (*buffer).is_null() { 0 } else { BUFFER };
        *max_records = 0;
    }
}

/// CUPTI hands back a buffer `requested` gave it, holding `valid` bytes of
/// records: they are kept, and the buffer freed.
///
/// # Safety
/// Called by CUPTI only (registered in [`start`]), with a buffer from
/// `requested`, once.
unsafe extern "C" fn completed(_ctx: cudarc::driver::sys::CUcontext, _stream: u32, buffer: *mut u8, _size: usize, valid: usize) {
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    let mut out = Vec::new();
    loop {
        // SAFETY: `buffer` holds `valid` bytes of records (# Safety); CUPTI
        // writes the next record's address into `record`.
        let r = unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) };
        if r != CUptiResult::CUPTI_SUCCESS {
            if r != CUptiResult::CUPTI_ERROR_MAX_LIMIT_REACHED {
                *FAILED.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("cuptiActivityGetNextRecord: {r:?}"));
            }
            break;
        }
        // A copy's or kernel's record as `$t`: the fields read here have
        // the same names in each record struct.
        macro_rules! record_as {
            ($t:ty, $copy_kind:expr) => {{
                // SAFETY: CUPTI returned a valid record whose kind says it is a `$t`.
                let r = unsafe { &*(record as *const $t) };
                out.push(ActivityRecord { copy_kind: $copy_kind(r), stream_id: r.streamId, correlation: r.correlationId, start_ns: r.start, end_ns: r.end });
            }};
        }
        // SAFETY: CUPTI returned a valid record; its kind says which struct it is.
        // The fields read here sit at the same offsets in every version.
        match unsafe { (*record).kind } {
            Kind::CUPTI_ACTIVITY_KIND_MEMCPY => record_as!(sys::CUpti_ActivityMemcpy6, |m: &sys::CUpti_ActivityMemcpy6| m.copyKind),
            // A copy between two GPUs (copy kind PTOP, 10).
            Kind::CUPTI_ACTIVITY_KIND_MEMCPY2 => record_as!(sys::CUpti_ActivityMemcpyPtoP4, |m: &sys::CUpti_ActivityMemcpyPtoP4| m.copyKind),
            Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => record_as!(sys::CUpti_ActivityKernel9, |_| 0),
            _ => {}
        }
    }
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).extend(out);
    // SAFETY: allocated in `requested` with this layout, handed back once
    // (# Safety), and no record of it is read after this.
    unsafe { dealloc(buffer, Layout::from_size_align(BUFFER, 8).expect("static layout")) };
}

/// Starts recording copies and kernels (enabling CUPTI if it is not
/// already on) and forgets older records.
pub fn start() -> Result<()> {
    if !available() {
        return Err(LabError::Driver { call: "CUPTI", message: "libcupti not found".into() });
    }
    if !ENABLED.load(std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: CUPTI calls that take no pointers of ours but the two
        // callbacks, which keep their contract (CUPTI's buffers only).
        let attached = unsafe {
            check("cuptiActivityRegisterCallbacks", sys::cuptiActivityRegisterCallbacks(Some(requested), Some(completed)))
                .and_then(|()| check("cuptiActivityEnable(MEMCPY)", sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY)))
                .and_then(|()| check("cuptiActivityEnable(CONCURRENT_KERNEL)", sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)))
                .and_then(|()| check("cuptiActivityEnable(MEMCPY2)", sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY2)))
        };
        if let Err(e) = attached {
            // Half attached (a sanitizer or profiler holds CUPTI, say):
            // let go of whatever did attach, so events time the run.
            // SAFETY: CUPTI calls with no pointer arguments; an error here
            // changes nothing.
            unsafe {
                let _ = sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY);
                let _ = sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
                let _ = sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY2);
            }
            return Err(e);
        }
        ENABLED.store(true, std::sync::atomic::Ordering::SeqCst);
    } else {
        // SAFETY: a CUPTI call with no pointer argument; it hands the
        // buffers to `completed`, whose records of earlier work are cleared below.
        check("cuptiActivityFlushAll", unsafe { sys::cuptiActivityFlushAll(1) })?;
    }
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    *FAILED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(())
}

/// Whether CUPTI can record this process's activity: `Err(why)` when
/// libcupti is missing or another subscriber (compute-sanitizer, Nsight
/// Systems, Nsight Compute) already holds it. Attaches and detaches once.
pub fn probe() -> std::result::Result<(), String> {
    start().and_then(|()| stop()).map_err(|e| match e {
        LabError::Driver { message, .. } => message,
        other => other.to_string(),
    })
}

/// Records only the kinds asked for from here until the next [`start`]:
/// copies (`memcpy`), kernels (`kernel`), or both. What a kind costs in
/// instrumentation, by itself (the `timeline_cost` example).
pub fn record_only(memcpy: bool, kernel: bool) -> Result<()> {
    if !memcpy {
        // SAFETY: a CUPTI call with no pointer argument.
        check("cuptiActivityDisable(MEMCPY)", unsafe { sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY) })?;
    }
    if !kernel {
        // SAFETY: a CUPTI call with no pointer argument.
        check("cuptiActivityDisable(CONCURRENT_KERNEL)", unsafe { sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) })?;
    }
    Ok(())
}

/// Turns CUPTI off (work issued afterwards is not instrumented).
pub fn stop() -> Result<()> {
    if ENABLED.swap(false, std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: CUPTI calls with no pointer arguments.
        unsafe {
            check("cuptiActivityFlushAll", sys::cuptiActivityFlushAll(1))?;
            check("cuptiActivityDisable(MEMCPY)", sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY))?;
            check("cuptiActivityDisable(CONCURRENT_KERNEL)", sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL))?;
            check("cuptiActivityDisable(MEMCPY2)", sys::cuptiActivityDisable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY2))?;
            // Detach entirely: untraced runs after a CUPTI session that
            // was only disabled run slower and vary; after cuptiFinalize
            // they run as before. The next `start` attaches again.
            check("cuptiFinalize", sys::cuptiFinalize())?;
        }
    }
    Ok(())
}

/// CUPTI's clock (ns), the one its records use.
pub fn now() -> Result<u64> {
    let mut t = 0u64;
    // SAFETY: writes one u64 into `t`, which outlives the call.
    check("cuptiGetTimestamp", unsafe { sys::cuptiGetTimestamp(&mut t) })?;
    Ok(t)
}

/// CUPTI's id for a stream (what its records carry).
///
/// # Safety
/// `ctx` and `stream` are live handles, the stream created in that context.
pub unsafe fn stream_id(ctx: cudarc::driver::sys::CUcontext, stream: super::CUstream) -> Result<u32> {
    let mut id = 0u32;
    // SAFETY: live context and stream handles (# Safety); writes one u32
    // into `id`.
    check("cuptiGetStreamId", unsafe { sys::cuptiGetStreamId(ctx, stream, &mut id) })?;
    Ok(id)
}

/// Flushes and turns CUPTI off (so untraced runs pay nothing); every
/// record since `start`.
pub fn finish() -> Result<Vec<ActivityRecord>> {
    stop()?;
    if let Some(why) = FAILED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(LabError::Driver { call: "CUPTI", message: why });
    }
    Ok(std::mem::take(&mut *RECORDS.lock().unwrap_or_else(|e| e.into_inner())))
}
