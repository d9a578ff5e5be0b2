//! What the injection library writes for each CUDA process: one JSON
//! record a line, in the order CUPTI hands them over, so a file cut short
//! by a crash still reads up to its last whole line.
//!
//! The fields are CUPTI's own (nanoseconds on CUPTI's clock, its ids and
//! kinds as numbers); naming them for a reader is [`crate::kineto`]'s job.

use serde::{Deserialize, Serialize};

/// CUPTI's "no stream" (a context-wide sync), `u32::MAX`.
pub const NO_STREAM: u32 = u32::MAX;

/// One line of a raw trace file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    /// The first line: which process this is.
    Process(Process),
    /// A CUDA runtime or driver call on a CPU thread.
    Call(Call),
    /// A kernel on a GPU stream.
    Kernel(Kernel),
    /// A copy (host and device, within a device, or between two devices).
    Copy(Copy),
    /// A memset.
    Memset(Memset),
    /// A synchronization the CPU or a stream waited in.
    Sync(Sync),
    /// A CUDA event recorded into a stream.
    EventRecord(EventRecord),
    /// An NVTX range's start or end, or an NVTX mark.
    Marker(Marker),
    /// A GPU's name and size.
    Device(Device),
    /// Records CUPTI could not deliver.
    Lost(Lost),
    /// The last line of a process that flushed everything at its exit.
    End(End),
}

/// The process a raw trace file belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Process {
    pub pid: u32,
    pub parent_pid: u32,
    /// The executable's path, as `/proc/self/exe` names it.
    pub exe: String,
    pub argv: Vec<String>,
    /// `cuptiGetVersion` (the CUPTI API version of the libcupti loaded).
    pub cupti_version: u32,
    /// The activity kinds CUPTI refused (their records are missing), with why.
    #[serde(default)]
    pub refused_kinds: Vec<String>,
    /// The kinds recorded only on request that were not asked for
    /// ([`SYNCS`], [`EVENTS`], [`PEER_COPIES`]), by the library's name for
    /// each.
    #[serde(default)]
    pub kinds_not_asked: Vec<String>,
}

/// Which API a call belongs to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    Runtime,
    Driver,
}

/// A runtime or driver call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Call {
    pub api: Api,
    /// CUPTI's callback id for the function.
    pub cbid: u32,
    /// The function's name as CUPTI gives it (`cudaLaunchKernel_v7000`).
    pub name: String,
    pub pid: u32,
    /// The OS thread id.
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub correlation: u32,
    /// The call's return code (0: success).
    pub returned: u32,
}

/// Where and when a GPU op ran, and the call that issued it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GpuSpan {
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    /// The issuing call's correlation id.
    pub correlation: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A kernel.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    #[serde(flatten)]
    pub at: GpuSpan,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub registers_per_thread: u16,
    /// Static plus dynamic shared memory per block, bytes.
    pub shared_bytes: i64,
}

/// The names of the record kinds taken only on request, as
/// `OVERLAP_LAB_TRACE_ADD` names them and a process's `kinds_not_asked`
/// lists them: copies between two GPUs with both GPUs named (CUPTI's
/// `MEMCPY2`), ...
pub const PEER_COPIES: &str = "peer";
/// ... synchronizations (CUPTI's `SYNCHRONIZATION`: which stream each
/// `cudaStreamWaitEvent` joins to which event), ...
pub const SYNCS: &str = "sync";
/// ... and each event record's stream (`CUDA_EVENT`).
pub const EVENTS: &str = "event";

/// A copy. `kind` is CUPTI's copy kind (1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, ...);
/// `src` and `dst` its memory kinds (1 pageable, 2 pinned, 3 device, ...).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Copy {
    pub kind: u8,
    pub src: u8,
    pub dst: u8,
    pub bytes: u64,
    #[serde(flatten)]
    pub at: GpuSpan,
    /// Between two GPUs: the source and destination devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<[u32; 2]>,
}

/// A memset; `memory` is the memory kind it wrote.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Memset {
    pub value: u32,
    pub bytes: u64,
    pub memory: u16,
    #[serde(flatten)]
    pub at: GpuSpan,
}

/// A synchronization: `kind` is CUPTI's type (1 event sync, 2 stream wait
/// event, 3 stream sync, 4 context sync); `stream` is [`NO_STREAM`] for a
/// context-wide one; `event` the CUDA event waited for, where there is one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Sync {
    pub kind: u32,
    pub context: u32,
    pub stream: u32,
    pub event: u32,
    pub correlation: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A CUDA event recorded into a stream (`cudaEventRecord`'s correlation).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EventRecord {
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub event: u32,
    pub correlation: u32,
}

/// An NVTX marker: `flags` 1 an instant mark, 2 a range's start, 4 its
/// end (CUPTI's marker flags); a range's start and end share `id`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Marker {
    pub flags: u32,
    pub at_ns: u64,
    pub id: u32,
    pub pid: u32,
    pub tid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// A GPU as CUPTI describes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Device {
    pub id: u32,
    pub name: String,
    pub global_memory: u64,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub multiprocessors: u32,
}

/// Records lost: dropped by CUPTI (a buffer was full), or without timestamps.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Lost {
    pub dropped: u64,
    pub without_timestamps: u64,
}

/// The process flushed CUPTI as it ended: every record of work that ran
/// is in the file. `signal`: it was ending by this signal (a crash, abort,
/// or kill), not by `exit`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct End {
    pub at_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}
