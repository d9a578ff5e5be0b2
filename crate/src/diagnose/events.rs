//! What a trace holds once read: the GPU's operations (kernels, copies,
//! memsets, each on its GPU and stream), the CPU's CUDA calls (each with the
//! correlation id that ties it to the GPU work it issued) and the CPU ops
//! around those calls (`aten::item`, a `record_function` range), and, where
//! the profiler recorded CUDA's synchronization events, which stream each
//! `cudaStreamWaitEvent` made wait for which ([`StreamWait`]). Times are
//! the trace's own, in µs.
//!
//! May use: nothing of the diagnosis: the bottom of the stack.

use serde::Serialize;
use std::fmt;

/// Which way a copy moved data, as CUPTI names it in a copy's name
/// ("Memcpy HtoD (Pageable -> Device)").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Host to device ("HtoD").
    H2d,
    /// Device to host ("DtoH").
    D2h,
    /// Within one GPU ("DtoD").
    D2d,
    /// From one GPU to another ("PtoP").
    Peer,
    /// Host to host ("HtoH").
    H2h,
    /// To or from a CUDA array, or a kind CUPTI did not name.
    Other,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Direction::H2d => "H2D",
            Direction::D2h => "D2H",
            Direction::D2d => "D2D",
            Direction::Peer => "peer",
            Direction::H2h => "H2H",
            Direction::Other => "other",
        }
    }
    /// Whether the copy crosses the host's link (what lab 1 measures).
    pub fn crosses_host_link(self) -> bool {
        matches!(self, Direction::H2d | Direction::D2h)
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The host side of a copy: ordinary (pageable) memory, which the driver
/// stages through a pinned bounce buffer while the CPU waits, or
/// page-locked (pinned) memory the copy engine reads directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostMemory {
    Pageable,
    Pinned,
}

impl HostMemory {
    pub fn label(self) -> &'static str {
        match self {
            HostMemory::Pageable => "pageable",
            HostMemory::Pinned => "pinned",
        }
    }
}

impl fmt::Display for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What a GPU operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum GpuOpKind {
    Kernel,
    /// A copy; `host` is the host side's memory where the copy has one and
    /// the trace says which.
    Copy {
        direction: Direction,
        host: Option<HostMemory>,
    },
    Memset,
}

impl GpuOpKind {
    pub fn is_copy(self) -> bool {
        matches!(self, GpuOpKind::Copy { .. })
    }
    /// "kernel", "H2D pageable", "D2D", "memset".
    pub fn label(self) -> String {
        match self {
            GpuOpKind::Kernel => "kernel".into(),
            GpuOpKind::Memset => "memset".into(),
            GpuOpKind::Copy { direction, host: Some(h) } => format!("{direction} {h}"),
            GpuOpKind::Copy { direction, host: None } => direction.label().into(),
        }
    }
}

/// One operation the GPU ran: a kernel, a copy or a memset, on one stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuOp {
    pub gpu: u32,
    /// The stream's number as the trace gives it (CUPTI's stream id in a
    /// torch.profiler trace).
    pub stream: u64,
    pub kind: GpuOpKind,
    pub name: String,
    pub start_us: f64,
    pub end_us: f64,
    /// The id shared with the CPU call that issued it (none in the course's
    /// own traces).
    pub correlation: Option<u64>,
    /// Bytes a copy or memset moved, or one rank's message of a collective
    /// (an NCCL kernel's `In msg nelems` times its `dtype`'s size), where
    /// the trace says.
    pub bytes: Option<u64>,
}

impl GpuOp {
    pub fn duration_us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// A CPU thread as the trace names it: its process and thread ids.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Thread {
    pub pid: String,
    pub tid: String,
}

impl fmt::Display for Thread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} tid {}", self.pid, self.tid)
    }
}

/// A CUDA runtime or driver call the CPU made (`cudaLaunchKernel`,
/// `cudaMemcpyAsync`, `cudaStreamSynchronize`, `cuLaunchKernel`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Call {
    pub name: String,
    /// Index into [`Trace::threads`].
    pub thread: usize,
    pub start_us: f64,
    pub end_us: f64,
    pub correlation: Option<u64>,
}

/// A CPU op or annotation around CUDA calls: `aten::item`, `aten::to`, a
/// `record_function` range, `ProfilerStep#3`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuOp {
    pub name: String,
    /// Index into [`Trace::threads`].
    pub thread: usize,
    pub start_us: f64,
    pub end_us: f64,
    /// A user annotation (`record_function`, `ProfilerStep#N`) rather than
    /// an operator.
    pub annotation: bool,
}

/// A stream made to wait for an event, as the trace's CUDA sync event
/// ("Stream Wait Event", `"cat": "cuda_sync"`, recorded by torch.profiler
/// with `enable_cuda_sync_events=True`) says it: which call made the wait,
/// which stream waits, and which stream and record call the awaited event
/// came from. Not GPU work: it takes no time on the GPU's engines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamWait {
    pub gpu: u32,
    /// The stream that waits.
    pub stream: u64,
    /// The correlation id of the `cudaStreamWaitEvent` call that made the wait.
    pub call_correlation: u64,
    /// The stream the awaited event was recorded on (`wait_on_stream`), where known.
    pub recorded_stream: Option<u64>,
    /// The correlation id of the `cudaEventRecord` call that recorded the
    /// event (`wait_on_cuda_event_record_corr_id`), where known.
    pub record_correlation: Option<u64>,
    /// CUPTI's id of the awaited event (`wait_on_cuda_event_id`), where
    /// known: PyTorch 2.11's traces give it (and the waiting stream) but
    /// neither the recorded stream nor the record call.
    pub event_id: Option<u64>,
}

/// An event recorded on a stream, as some Kineto versions write each
/// record (`"cat": "cuda_event"`): which record call, on which stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    pub gpu: u32,
    pub stream: u64,
    /// The correlation id of the `cudaEventRecord` call.
    pub correlation: u64,
}

/// Which kind of file a trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// A Chrome trace exported by `torch.profiler` (Kineto's format).
    Kineto,
    /// A trace `overlap-lab trace` wrote of any CUDA program (CUPTI's
    /// records in Kineto's schema; its top-level `overlap_lab` summary
    /// tells it apart).
    OverlapLabTrace,
    /// A timeline the course wrote (`pipeline::timeline::Timeline::chrome_trace`):
    /// GPU spans on "stream N" lanes, no CPU calls.
    Course,
}

impl TraceFormat {
    /// Whether the file is in Kineto's schema (CPU calls tied to their GPU
    /// ops by correlation ids, CUDA's streams).
    pub fn is_kineto_schema(self) -> bool {
        matches!(self, TraceFormat::Kineto | TraceFormat::OverlapLabTrace)
    }

    pub fn label(self) -> &'static str {
        match self {
            TraceFormat::Kineto => "torch.profiler (Kineto) trace",
            TraceFormat::OverlapLabTrace => "overlap-lab trace (CUPTI's records in Kineto's schema)",
            TraceFormat::Course => "overlap-lab timeline",
        }
    }
}

/// A trace, read: every GPU op sorted by start, every CUDA call and CPU op
/// sorted by start, and what the file says about its GPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trace {
    pub format: Option<TraceFormat>,
    /// (GPU index, name) for each GPU the file describes.
    pub gpu_names: Vec<(u32, String)>,
    pub gpu_ops: Vec<GpuOp>,
    pub calls: Vec<Call>,
    pub cpu_ops: Vec<CpuOp>,
    pub threads: Vec<Thread>,
    /// How many CUDA sync events (`"cat": "cuda_sync"`) the trace holds:
    /// none unless torch.profiler ran with `enable_cuda_sync_events=True`.
    pub sync_events: usize,
    /// The streams made to wait for events, from the sync events whose
    /// values are whole ([`StreamWait`]), in the file's order.
    pub stream_waits: Vec<StreamWait>,
    /// The events recorded, where the trace writes them (`cuda_event`).
    pub event_records: Vec<EventRecord>,
    /// The process's rank in a distributed run, where the trace says
    /// (Kineto's `distributedInfo`).
    pub distributed: Option<Distributed>,
}

/// A traced process's place in a distributed run (Kineto's `distributedInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Distributed {
    pub rank: u32,
    pub world_size: u32,
}

impl Trace {
    /// The name the file gives GPU `gpu` ("NVIDIA H100 80GB HBM3").
    pub fn gpu_name(&self, gpu: u32) -> Option<&str> {
        self.gpu_names.iter().find(|(g, _)| *g == gpu).map(|(_, n)| n.as_str())
    }
    /// Whether the trace carries CUDA sync events: which streams waited for
    /// which is read from them, not inferred.
    pub fn carries_sync_events(&self) -> bool {
        self.sync_events > 0
    }
    /// The name of the first GPU with work in the trace, where the trace names it.
    pub fn first_gpu_name(&self) -> Option<&str> {
        self.gpus().first().and_then(|&g| self.gpu_name(g))
    }
    /// Every GPU with work in the trace, in order.
    pub fn gpus(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.gpu_ops.iter().map(|o| o.gpu).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
    /// The traced window: the first GPU op's start to the last one's end, µs.
    pub fn window_us(&self) -> (f64, f64) {
        let start = self.gpu_ops.iter().map(|o| o.start_us).fold(f64::INFINITY, f64::min);
        let end = self.gpu_ops.iter().map(|o| o.end_us).fold(f64::NEG_INFINITY, f64::max);
        (start, end)
    }
    /// Sorts what was read by start time (ties by end), as the analysis expects.
    pub fn sort(&mut self) {
        let by_time = |a: (f64, f64), b: (f64, f64)| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1));
        self.gpu_ops.sort_by(|a, b| by_time((a.start_us, a.end_us), (b.start_us, b.end_us)));
        self.calls.sort_by(|a, b| by_time((a.start_us, a.end_us), (b.start_us, b.end_us)));
        // Enclosing ops first: an op starting with its child sorts before it.
        self.cpu_ops.sort_by(|a, b| a.start_us.total_cmp(&b.start_us).then(b.end_us.total_cmp(&a.end_us)));
    }
}

/// What CUPTI's copy-kind word in a copy's name means ("HtoD" in
/// "Memcpy HtoD (Pageable -> Device)").
fn direction_from_cupti(word: &str) -> Direction {
    match word {
        "HtoD" => Direction::H2d,
        "DtoH" => Direction::D2h,
        "DtoD" => Direction::D2d,
        "PtoP" => Direction::Peer,
        "HtoH" => Direction::H2h,
        _ => Direction::Other,
    }
}

/// A copy's kind from its name as CUPTI (and so torch.profiler, and the
/// course's own traces) writes it: "Memcpy HtoD (Pageable -> Device)" is
/// an H2D copy from pageable memory. `None` when the name is not a copy's.
pub fn copy_kind_from_name(name: &str) -> Option<GpuOpKind> {
    let rest = name.strip_prefix("Memcpy ")?;
    let (word, sides) = rest.split_once(' ').unwrap_or((rest, ""));
    let direction = direction_from_cupti(word);
    // "(Pageable -> Device)": the host side is the source of an upload and
    // the destination of a download.
    let inner = sides.trim().trim_start_matches('(').trim_end_matches(')');
    let (src, dst) = inner.split_once("->").map(|(s, d)| (s.trim(), d.trim())).unwrap_or(("", ""));
    let host_side = match direction {
        Direction::H2d => src,
        Direction::D2h => dst,
        _ => "",
    };
    let host = match host_side {
        "Pageable" => Some(HostMemory::Pageable),
        "Pinned" => Some(HostMemory::Pinned),
        _ => None,
    };
    Some(GpuOpKind::Copy { direction, host })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_names_read_as_cupti_writes_them() {
        let up = copy_kind_from_name("Memcpy HtoD (Pageable -> Device)").unwrap();
        assert_eq!(up, GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) });
        assert_eq!(up.label(), "H2D pageable");
        let down = copy_kind_from_name("Memcpy DtoH (Device -> Pinned)").unwrap();
        assert_eq!(down, GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pinned) });
        assert_eq!(copy_kind_from_name("Memcpy PtoP (Device -> Device)").unwrap(), GpuOpKind::Copy { direction: Direction::Peer, host: None });
        assert_eq!(copy_kind_from_name("Memcpy DtoD (Device -> Device)").unwrap().label(), "D2D");
        assert_eq!(copy_kind_from_name("Memcpy HtoA (Pinned -> Array)").unwrap(), GpuOpKind::Copy { direction: Direction::Other, host: None });
        assert_eq!(copy_kind_from_name("Memcpy DtoH"), Some(GpuOpKind::Copy { direction: Direction::D2h, host: None }));
        assert_eq!(copy_kind_from_name("Memset (Device)"), None);
        assert_eq!(copy_kind_from_name("void gemm<float>()"), None);
    }
}
