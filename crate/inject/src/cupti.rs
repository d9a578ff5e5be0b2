//! The thin module of raw CUPTI calls (cudarc's bindings, libcupti loaded
//! the way the overlap-lab crate loads it). Calls that take no pointer of
//! ours are safe functions here; the buffer callbacks' contract is CUPTI's.

use cudarc::cupti::sys::{self, CUptiResult, CUpti_ActivityKind as Kind};
use overlap_lab_tracefile::records::Api;
use std::ffi::{c_char, CStr};

/// A CUPTI error, as text: the call and CUPTI's result.
pub fn failed(call: &str, r: CUptiResult) -> String {
    format!("{call}: {r:?}")
}

fn check(call: &str, r: CUptiResult) -> Result<(), String> {
    if r == CUptiResult::CUPTI_SUCCESS {
        Ok(())
    } else {
        Err(failed(call, r))
    }
}

/// Whether a libcupti can be loaded (without panicking where none can).
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// The buffer callbacks CUPTI calls.
pub type Requested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type Completed = unsafe extern "C" fn(cudarc::driver::sys::CUcontext, u32, *mut u8, usize, usize);

/// Hands CUPTI the two buffer callbacks: fails where another tool
/// (compute-sanitizer, Nsight) already holds CUPTI in this process.
pub fn register(requested: Requested, completed: Completed) -> Result<(), String> {
    // SAFETY: registers two functions that keep CUPTI's buffer contract.
    check("cuptiActivityRegisterCallbacks", unsafe { sys::cuptiActivityRegisterCallbacks(Some(requested), Some(completed)) })
}

/// Thread ids in records as the OS gives them (`gettid`), not pthread's.
pub fn system_thread_ids() -> Result<(), String> {
    // SAFETY: a CUPTI call with no pointer argument.
    check("cuptiSetThreadIdType", unsafe { sys::cuptiSetThreadIdType(sys::CUpti_ActivityThreadIdType::CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) })
}

/// Turns one kind of record on.
pub fn enable(kind: Kind) -> Result<(), String> {
    // SAFETY: a CUPTI call with no pointer argument.
    check(&format!("cuptiActivityEnable({kind:?})"), unsafe { sys::cuptiActivityEnable(kind) })
}

/// Turns one kind of record off again.
pub fn disable(kind: Kind) {
    // SAFETY: a CUPTI call with no pointer argument; an error changes nothing.
    let _ = unsafe { sys::cuptiActivityDisable(kind) };
}

/// Stops recording one runtime or driver function (by callback id): a
/// query called so often that recording it would cost more than it runs.
pub fn leave_out(api: Api, cbid: u32) -> Result<(), String> {
    // SAFETY: CUPTI calls with no pointer argument.
    let r = unsafe {
        match api {
            Api::Runtime => sys::cuptiActivityEnableRuntimeApi(cbid, 0),
            Api::Driver => sys::cuptiActivityEnableDriverApi(cbid, 0),
        }
    };
    check("cuptiActivityEnable*Api(cbid, 0)", r)
}

/// CUPTI hands completed buffers over every `ms` milliseconds.
pub fn flush_every(ms: u32) -> Result<(), String> {
    // SAFETY: a CUPTI call with no pointer argument.
    check("cuptiActivityFlushPeriod", unsafe { sys::cuptiActivityFlushPeriod(ms) })
}

/// Hands every buffer over, records not yet complete included (`forced`).
pub fn flush_all(forced: bool) -> Result<(), String> {
    // SAFETY: a CUPTI call with no pointer argument.
    check("cuptiActivityFlushAll", unsafe { sys::cuptiActivityFlushAll(u32::from(forced)) })
}

/// The CUPTI API version of the libcupti loaded.
pub fn version() -> u32 {
    let mut v = 0u32;
    // SAFETY: writes one u32 into `v`, which outlives the call.
    let _ = unsafe { sys::cuptiGetVersion(&mut v) };
    v
}

/// Records CUPTI dropped for a context and stream (a full buffer).
///
/// # Safety
/// `ctx` is the context CUPTI passed to the completed-buffer callback.
pub unsafe fn dropped(ctx: cudarc::driver::sys::CUcontext, stream: u32) -> usize {
    let mut n = 0usize;
    // SAFETY: `ctx` as CUPTI gave it (# Safety); writes one usize into `n`.
    let _ = unsafe { sys::cuptiActivityGetNumDroppedRecords(ctx, stream, &mut n) };
    n
}

/// The next record of a completed buffer, or None at its end.
///
/// # Safety
/// `buffer` holds `valid` bytes of records CUPTI completed; `at` is null
/// or the record this returned last for the same buffer.
pub unsafe fn next_record(buffer: *mut u8, valid: usize, at: *mut sys::CUpti_Activity) -> Option<*mut sys::CUpti_Activity> {
    let mut record = at;
    // SAFETY: the buffer and the cursor keep CUPTI's contract (# Safety).
    let r = unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) };
    (r == CUptiResult::CUPTI_SUCCESS).then_some(record)
}

/// A runtime or driver function's name by its callback id
/// (`cudaLaunchKernel_v7000`), or `cbid N` where CUPTI has none.
pub fn callback_name(api: Api, cbid: u32) -> String {
    let domain = match api {
        Api::Runtime => sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RUNTIME_API,
        Api::Driver => sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
    };
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: writes a pointer to a static string CUPTI owns into `name`.
    let r = unsafe { sys::cuptiGetCallbackName(domain, cbid, &mut name) };
    if r != CUptiResult::CUPTI_SUCCESS || name.is_null() {
        return format!("cbid {cbid}");
    }
    // SAFETY: CUPTI returned a NUL-terminated static string.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}
