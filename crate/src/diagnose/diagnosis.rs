//! What a diagnosis says, as data: the traced window ([`Window`]), each
//! GPU's busy and idle time with its streams ([`GpuSummary`],
//! [`StreamSummary`]) and its copies by kind ([`CopyGroup`]), the CPU's
//! synchronizing calls ([`SyncSummary`]), and the findings ([`Finding`]):
//! each a [`Cause`], the call behind it ([`CallRef`]) and what it costs.
//! [`Diagnosis`] holds them all, and the what-if where one was predicted;
//! it serializes for `--json` and prints as text (`render`).
//!
//! May use: `events`, `fixes` (the program's API), `link` (a recorded rate), `prediction` (the what-if
//! table a diagnosis carries). The types only: the analysis that fills
//! them in sits above.

use super::events::{Direction, GpuOpKind, HostMemory, TraceFormat};
use super::fixes::ProgramApi;
use super::link::RecordedRate;
use super::prediction::WhatIf;
use serde::Serialize;

/// Findings worth less than this are left out (µs): noise, not a cause.
pub const FINDING_MIN_US: f64 = 1.0;

/// A gap between two ops of one stream shorter than this, the next op
/// launched before the first ended, is the delay between back-to-back ops
/// (µs): HTA's `consecutive_kernel_delay`, 30 by default (its docstring
/// says ns; it compares it with the trace's µs).
pub const KERNEL_WAIT_MAX_US: f64 = 30.0;

/// A call as a finding names it: its name (with the CPU ops around it), its
/// CPU timestamp as the trace gives it, and its correlation id.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallRef {
    /// "aten::item > aten::_local_scalar_dense > cudaStreamSynchronize".
    pub name: String,
    /// The call's start on the CPU, µs, as the trace writes it (`ts`).
    pub ts_us: f64,
    pub correlation: Option<u64>,
    /// The CPU thread that made it.
    pub thread: String,
}

/// The traced window: the first GPU op's start to the last one's end, µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Window {
    pub start_us: f64,
    pub end_us: f64,
}

impl Window {
    pub fn duration_us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// One stream's work in the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StreamSummary {
    pub stream: u64,
    /// The legacy default (NULL) stream (see [`super::queries::LEGACY_DEFAULT_STREAM`]).
    pub legacy_default: bool,
    pub kernels: usize,
    pub copies: usize,
    pub memsets: usize,
    /// The union of its ops, µs.
    pub busy_us: f64,
    /// The window less its busy time, µs.
    pub idle_us: f64,
    /// Its idle time between its ops, split the way HTA splits it.
    pub idle_kinds: StreamIdleKinds,
}

/// One stream's idle time between one op's end and its next op's start,
/// split the way Meta's HolisticTraceAnalysis does
/// (`TraceAnalysis.get_idle_time_breakdown`), so the two can be set side
/// by side: each gap is host wait where the next op's launching call began
/// after the op before it ended (the CPU was late), else kernel wait where
/// the gap is under [`KERNEL_WAIT_MAX_US`] (the delay between back-to-back
/// ops), else other. The time before the stream's first op
/// and after its last is in none of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StreamIdleKinds {
    pub host_wait_us: f64,
    pub kernel_wait_us: f64,
    pub other_us: f64,
}

impl StreamIdleKinds {
    /// The three added up: the stream's idle time between its first op and its last.
    pub fn total_us(&self) -> f64 {
        self.host_wait_us + self.kernel_wait_us + self.other_us
    }
}

/// Why a GPU had nothing to run in one idle stretch: each stretch is put
/// down to exactly one of these (`idle`'s rules, in its module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleCause {
    /// The CPU was launching GPU work (in CUDA calls, or in the ops that
    /// make them) and had not yet launched the op that ended the stretch.
    WaitingForLaunches,
    /// The CPU was blocked in a synchronizing call while the GPU drained.
    Sync,
    /// The CPU was in a copy call (staging pageable memory) while the GPU idled.
    Copy,
    /// The next op was queued but waited on an event of another stream.
    OtherStream,
    /// The next op was queued, and the gap is the short delay between
    /// back-to-back ops.
    KernelGaps,
    /// The CPU was busy with the program's own work (CPU ops that launch
    /// nothing, or code between CUDA calls), not launching.
    HostWork,
    /// None of the above could be shown from the trace.
    Unattributed,
}

/// A call or CPU op behind some of a cause's idle time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IdleBehind {
    /// "aten::randn", "aten::item > aten::_local_scalar_dense > cudaStreamSynchronize".
    pub name: String,
    /// The CPU's time in it during the stretches put down to the cause
    /// (for the one call that held the GPU back, a sync, a launch under
    /// way, the whole stretch), µs.
    pub idle_us: f64,
}

/// The idle time of one GPU put down to one cause.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IdleShare {
    pub cause: IdleCause,
    /// µs.
    pub idle_us: f64,
    /// How many idle stretches.
    pub stretches: usize,
    /// The calls or CPU ops behind it, most idle first (the top few).
    pub behind: Vec<IdleBehind>,
    /// Each stretch put down to it: (start, end) on the trace's clock, µs,
    /// in order (what a timeline draws; not in `--json`, which counts them).
    #[serde(skip)]
    pub spans_us: Vec<(f64, f64)>,
    /// Its longest stretch, µs.
    pub longest_us: f64,
    /// The call that launched the op that ended its longest stretch (or
    /// that op, where no call did); none where it has no stretch.
    pub longest_ended_by: Option<CallRef>,
}

/// Every copy of one kind on one GPU: direction and host memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CopyGroup {
    pub direction: Direction,
    pub host: Option<HostMemory>,
    pub count: usize,
    /// Bytes moved, where the trace says for every copy.
    pub bytes: Option<u64>,
    /// The copies' durations added up, µs.
    pub time_us: f64,
    /// Bytes over time, GB/s (1e9 bytes/s).
    pub gbps: Option<f64>,
    /// This machine's lab 1 rate for copies like these (same host memory
    /// and direction, the recorded size nearest their median).
    pub recorded: Option<RecordedRate>,
    /// For pageable copies: the recorded rate of pinned ones.
    pub recorded_pinned: Option<RecordedRate>,
    /// Time the copies ran while a kernel ran on the same GPU, µs.
    pub hidden_us: f64,
    /// Time they ran with no kernel beside them, µs.
    pub exposed_us: f64,
}

impl CopyGroup {
    /// "H2D pageable", "D2D".
    pub fn label(&self) -> String {
        GpuOpKind::Copy { direction: self.direction, host: self.host }.label()
    }
}

/// One GPU's work in the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuSummary {
    pub gpu: u32,
    pub name: Option<String>,
    /// The union of all its ops (kernels, copies, memsets), µs.
    pub busy_us: f64,
    /// The window less its busy time, µs.
    pub idle_us: f64,
    pub streams: Vec<StreamSummary>,
    pub copies: Vec<CopyGroup>,
    /// The recording its copies are set beside, if one matched its name.
    pub link_source: Option<String>,
    /// Its idle time, every stretch put down to one cause, most idle
    /// first; the unattributed share always there, last. The shares add
    /// up to `idle_us`.
    pub idle_causes: Vec<IdleShare>,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// Copies from pageable memory: staged by the driver while the CPU waits.
    PageableCopies,
    /// Page-locked copies on a stream that also runs kernels: they cannot
    /// overlap the kernels around them.
    CopiesShareStreamWithKernels,
    /// Page-locked copies on a stream of their own that still ran with no
    /// kernel beside them.
    ExposedCopies,
    /// A call that made the CPU wait while the GPU drained.
    Sync,
    /// The GPU waiting, op after op, for the CPU to launch the next.
    IssueBound,
    /// The GPU idle while the CPU ran the program's own work (CPU ops that
    /// launch nothing, code between the CUDA calls), not launching.
    HostWork,
}

/// One cause of lost overlap, the call behind it and what it costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub cause: Cause,
    pub gpu: u32,
    /// The call that issued the first (or, for syncs, the costliest) op or
    /// wait behind it.
    pub call: CallRef,
    /// How many ops or calls it covers.
    pub count: usize,
    /// GPU time it costs, µs: the copy time exposed, or the GPU idle caused.
    pub cost_us: f64,
    /// What happened, in one or two sentences.
    pub text: String,
}

/// The CPU's synchronizing calls, and what they cost in all.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SyncSummary {
    pub calls: usize,
    /// Those that left a GPU idle until the CPU issued more work.
    pub costly: usize,
    /// The GPU idle they caused, µs.
    pub cost_us: f64,
}

/// The version of `--json`'s layout, its first field: a script checks it
/// before it reads the rest. Every field is listed in MAINTAINERS.md
/// ("`diagnose --json`"), which a test holds to this struct; a field
/// renamed, removed or changed in meaning bumps the number (a field added
/// does not).
pub const DIAGNOSIS_SCHEMA: &str = "overlap-lab.diagnosis/3";

/// Everything `overlap-lab diagnose` reports about one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    /// [`DIAGNOSIS_SCHEMA`].
    pub schema: &'static str,
    /// The file, as outputs name files.
    pub file: String,
    pub format: TraceFormat,
    /// The API the program is written against: the words each fix is said in.
    pub api: ProgramApi,
    pub window: Window,
    pub gpus: Vec<GpuSummary>,
    pub syncs: SyncSummary,
    /// Largest cost first. Costs may overlap: one idle gap can have more
    /// than one cause.
    pub findings: Vec<Finding>,
    /// The fixes the findings suggest, predicted on the queue model
    /// (the fixes chosen by `whatif`, each priced in `prediction`); set by
    /// whoever holds the machine's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if: Option<WhatIf>,
    /// Why the trace could not be replayed for the what-if, where it was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if_error: Option<String>,
}
