//! overlap-lab's CUPTI injection library. The CUDA driver loads the library
//! `CUDA_INJECTION64_PATH` names into every process that initializes CUDA
//! and calls its `InitializeInjection` before any CUDA work; from there
//! CUPTI's activity API records every kernel (`CONCURRENT_KERNEL`, which
//! keeps kernels overlapping as they ran), copy (with its memory kinds),
//! memset, runtime and driver call and NVTX range, of every context,
//! device and thread, for the life of the process; and, where
//! `OVERLAP_LAB_TRACE_ADD` asks (`ON_REQUEST` says why not always), each
//! synchronization and event record, and the GPUs of each copy between
//! two.
//! That is how Nsight Systems and PyTorch's Kineto trace; this library is
//! what `overlap-lab trace -- COMMAND` injects.
//!
//! Each CUDA process writes its own files, named by its process id, in
//! `$OVERLAP_LAB_TRACE_DIR` (else the working directory):
//! `overlap-lab-trace.<pid>.jsonl`, CUPTI's records as they are handed over
//! (decoded by a writer thread of the library's own, not in CUPTI's
//! callback; every 200 ms, at exit, and on a fatal signal the program
//! leaves at its default: abort, a segfault, SIGTERM, Ctrl-C; so a process
//! that crashes leaves what ran; SIGKILL and `_exit` lose the last 200 ms,
//! or the period `OVERLAP_LAB_TRACE_FLUSH_MS` sets, and what the writer had
//! not yet written, at most `sink::MAX_PENDING` buffers), then at exit `overlap-lab-trace.<pid>.json.gz`, the Chrome trace
//! in Kineto's schema (not when `OVERLAP_LAB_TRACE_RAW=1`: `overlap-lab
//! trace` converts the files itself, after the program, so the conversion
//! is not part of the program's time). A forked child that did not
//! initialize CUDA itself writes nothing (its parent's state is not its
//! own); one that does gets its own `InitializeInjection` and its own files.
//!
//! CUPTI takes one subscriber per process: where another tool holds it
//! (compute-sanitizer, Nsight), the library writes
//! `overlap-lab-trace.<pid>.refused` with why, says so in one line on
//! stderr, and the program runs untraced. With `NVTX_INJECTION64_PATH` set
//! to this library too, NVTX ranges are handed to CUPTI (its own NVTX
//! injection) and recorded on their CPU threads.
//!
//! Nothing here may unwind into the program: every entry point catches
//! panics, and a failure leaves the program running untraced.

mod cupti;
mod decode;
mod demangle;
mod sink;

use cudarc::cupti::sys::{CUpti_ActivityKind as Kind, CUpti_driver_api_trace_cbid_enum as Dr, CUpti_runtime_api_trace_cbid_enum as Rt};
use overlap_lab_tracefile::records::{Api, EVENTS, PEER_COPIES, SYNCS};
use std::ffi::{c_int, c_void};

/// The kinds without which there is no trace to read.
const REQUIRED: [Kind; 4] =
    [Kind::CUPTI_ACTIVITY_KIND_RUNTIME, Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, Kind::CUPTI_ACTIVITY_KIND_MEMCPY, Kind::CUPTI_ACTIVITY_KIND_MEMSET];

/// Kinds that add to a trace, by the name `OVERLAP_LAB_TRACE_SKIP`
/// (comma-separated) leaves one out with; one CUPTI refuses is named in
/// the trace. The driver's calls are the only calls of a program on the
/// driver API (cudarc, the course's labs).
const OPTIONAL: [(&str, Kind); 3] =
    [("driver", Kind::CUPTI_ACTIVITY_KIND_DRIVER), ("nvtx", Kind::CUPTI_ACTIVITY_KIND_MARKER), ("device", Kind::CUPTI_ACTIVITY_KIND_DEVICE)];

/// Kinds recorded only where `OVERLAP_LAB_TRACE_ADD` (comma-separated)
/// names them; torch.profiler takes none of them unless asked either.
/// - `sync` and `event` (`overlap-lab trace --sync-events`, as
///   torch.profiler's `enable_cuda_sync_events`): each synchronization
///   (which stream a `cudaStreamWaitEvent` joins, and to which event) and
///   each event record's stream. With every kind on, a loop of thousands
///   of tiny PyTorch ops on an H200 ran its steps about 8% slower than
///   under torch.profiler, and level with it without the sync, event,
///   NVTX and device records; NVTX and device records are made only where
///   a program has ranges and once a GPU, so these two went
///   (`data/nvidia-h200/README.md` has the runs, and one after, with them
///   off, where the loop's wall time stayed above torch.profiler's by the
///   host's noise). Without them the diagnosis infers which stream each
///   wait joins from the calls' order, and says so.
/// - `peer` (`overlap-lab trace --peer-copies`): copies between two GPUs
///   as CUPTI's peer-copy records (`MEMCPY2`), which name both GPUs.
///   Without them CUPTI 13 still records each such copy, as a plain copy
///   of kind PtoP on the GPU that ran it (all ten of a program's copies
///   between two H200s, `cudaMemcpyPeerAsync` and `cudaMemcpyAsync` by
///   address alike); with them on, it timed the device-to-device copies
///   within one GPU of the program measured a third longer (30 copies of
///   16 MiB: 343 µs against 252 µs without, and 252 µs in torch.profiler's
///   trace of the same program).
const ON_REQUEST: [(&str, Kind); 3] =
    [(SYNCS, Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), (EVENTS, Kind::CUPTI_ACTIVITY_KIND_CUDA_EVENT), (PEER_COPIES, Kind::CUPTI_ACTIVITY_KIND_MEMCPY2)];

/// Queries a program calls around every launch (PyTorch: cudaGetDevice 5
/// times a kernel) that neither issue GPU work nor wait for it: not
/// recorded, as Kineto does not record them (its `CuptiActivityApi`), so
/// tracing costs what torch.profiler's does; their time reads as the
/// host's own.
const QUERIES: [(Api, u32); 8] = [
    (Api::Runtime, Rt::CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020 as u32),
    (Api::Runtime, Rt::CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020 as u32),
    (Api::Runtime, Rt::CUPTI_RUNTIME_TRACE_CBID_cudaSetDevice_v3020 as u32),
    (Api::Runtime, Rt::CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020 as u32),
    (Api::Driver, Dr::CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent as u32),
    (Api::Driver, Dr::CUPTI_DRIVER_TRACE_CBID_cuDevicePrimaryCtxGetState as u32),
    (Api::Driver, Dr::CUPTI_DRIVER_TRACE_CBID_cuKernelGetAttribute as u32),
    (Api::Driver, Dr::CUPTI_DRIVER_TRACE_CBID_cuKernelGetName as u32),
];

/// How often CUPTI hands completed buffers over, ms, unless
/// `OVERLAP_LAB_TRACE_FLUSH_MS` says otherwise (0: only when a buffer
/// fills and at exit, as Kineto does).
const FLUSH_PERIOD_MS: u32 = 200;

/// Called by the CUDA driver once per process, during `cuInit`. Returns 1
/// whatever happens: the program must run on, traced or not.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    if let Ok(Err(why)) = std::panic::catch_unwind(start) {
        sink::refuse(&why);
    }
    1
}

/// Called by NVTX where `NVTX_INJECTION64_PATH` names this library: hands
/// NVTX to CUPTI's own injection (in the libcupti loaded), whose ranges
/// then arrive as marker records. Returns 0 (NVTX stays off) where there is
/// no libcupti.
///
/// # Safety
/// Called by NVTX only, with its export-table function.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get_export_table: *const c_void) -> c_int {
    type Init = unsafe extern "C" fn(*const c_void) -> c_int;
    std::panic::catch_unwind(|| {
        if !cupti::present() {
            return 0;
        }
        // SAFETY: libcupti loads (checked above); the symbol has NVTX's
        // injection signature, and NVTX's argument is passed on as given.
        unsafe {
            match cudarc::cupti::sys::culib().get::<Init>(b"InitializeInjectionNvtx2\0") {
                Ok(init) => init(get_export_table),
                Err(_) => 0,
            }
        }
    })
    .unwrap_or(0)
}

/// Attaches to CUPTI and opens this process's file; Err(why) where it cannot.
fn start() -> Result<(), String> {
    if !cupti::present() {
        return Err("no libcupti could be loaded (put the CUDA toolkit's lib64, or CUPTI's, on LD_LIBRARY_PATH)".into());
    }
    let mut file = sink::open()?;
    attach(&mut file).inspect_err(|_| file.discard())?;
    sink::install(file);
    sink::start_writer();
    // SAFETY: registers a function with no arguments that catches its own panics.
    unsafe { libc::atexit(at_exit) };
    sink::catch_fatal_signals();
    Ok(())
}

/// Registers the buffers, turns the kinds on, writes the process line.
fn attach(file: &mut sink::Sink) -> Result<(), String> {
    // Thread ids as the OS gives them, set before any record is made.
    let _ = cupti::system_thread_ids();
    cupti::register(sink::requested, sink::completed)
        .map_err(|e| format!("CUPTI is held by another tool in this process (compute-sanitizer, Nsight, a profiler): {e}"))?;
    for (i, kind) in REQUIRED.iter().enumerate() {
        if let Err(e) = cupti::enable(*kind) {
            REQUIRED[..i].iter().for_each(|k| cupti::disable(*k));
            return Err(format!("CUPTI is held by another tool in this process, or refuses to trace: {e}"));
        }
    }
    let skip = std::env::var("OVERLAP_LAB_TRACE_SKIP").unwrap_or_default();
    let skip: Vec<&str> = skip.split(',').map(str::trim).collect();
    let add = std::env::var("OVERLAP_LAB_TRACE_ADD").unwrap_or_default();
    let add: Vec<&str> = add.split(',').map(str::trim).collect();
    let wanted = OPTIONAL.iter().filter(|(name, _)| !skip.contains(name)).chain(ON_REQUEST.iter().filter(|(name, _)| add.contains(name)));
    let refused: Vec<String> = wanted.filter_map(|(_, k)| cupti::enable(*k).err()).collect();
    let not_asked: Vec<String> = ON_REQUEST.iter().filter(|(name, _)| !add.contains(name)).map(|(name, _)| name.to_string()).collect();
    for (api, cbid) in QUERIES {
        let _ = cupti::leave_out(api, cbid);
    }
    let flush_ms = std::env::var("OVERLAP_LAB_TRACE_FLUSH_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(FLUSH_PERIOD_MS);
    if flush_ms > 0 {
        let _ = cupti::flush_every(flush_ms);
    }
    file.begin(cupti::version(), refused, not_asked)
}

/// At the process's exit: every record flushed into the file, then the
/// Chrome trace written (unless `overlap-lab trace` converts it). Nothing
/// in a forked child that inherited this from its parent.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if !sink::is_owner() {
            return;
        }
        let _ = cupti::flush_all(true);
        sink::finish(None);
    });
}
