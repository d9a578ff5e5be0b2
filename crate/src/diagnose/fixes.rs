//! The fixes a what-if prices, as changes to a traced program
//! ([`Change`]), and what they are priced by on a machine ([`Pricing`]):
//! the vocabulary [`super::replay`] applies to a trace's schedule.
//!
//! May use: `events` (what a trace's kernels say of the program's API),
//! `link` (the recorded rates a pinned copy is priced by), `busy_clock`
//! (how a GPU's kernels slow kept busy), `measure` (a measured curve
//! read).

use super::busy_clock::BusyClock;
use super::events::{GpuOpKind, Trace, TraceFormat};
use super::link::LinkRates;
use crate::measure::stats::on_the_line;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// One change to the traced program whose effect the queue model predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Every copy from pageable memory made from pinned memory, without
    /// waiting (`pin_memory()` and `non_blocking=True`): at the link's
    /// pinned rate (lab 1's recording at the nearest size; else the rate
    /// the trace's own pinned copies that way achieved); its launch no
    /// longer holds the CPU (it takes as long as the trace's median kernel
    /// launch). After an upload, the wait for it inside the same CPU op
    /// (PyTorch's `cudaStreamSynchronize` after a blocking `.to()`) goes;
    /// after a download it stays: the program reads what came back (into
    /// pinned memory, it must wait for the copy before it does), unless the
    /// results are read a step late ([`Change::ReadLate`]).
    Pinned,
    /// Host-to-device copies that share a stream with kernels moved to a
    /// stream of their own, double-buffered: each copy waits for the kernels
    /// that read the buffer two copies back (the ops before the previous
    /// copy, in the stream's order), and the ops after it on its old stream
    /// wait for it (an event each way; [`super::side_streams`]).
    CopyStream,
    /// The same for device-to-host copies: each waits for the op that made
    /// what it reads (the op before it on its old stream), and the first op
    /// after the next download there waits for it (its buffer is written
    /// again), so the next step's kernels run while results come back.
    DownloadStream,
    /// Each step's results read a step late: the CPU's wait for a download
    /// from pinned memory (PyTorch's wait in the same CPU op as the copy)
    /// moves to just after the next download is issued, so the CPU issues
    /// the next step before it reads this one's results; the last
    /// download's wait stays where it was.
    ReadLate,
    /// The CPU's waits for the GPU removed, but for the last ones, after
    /// which the CPU issues no more GPU work (they wait for the end).
    SyncRemoved,
    /// The window's GPU work issued as CUDA graphs: the CPU's time between
    /// launches goes (the host's own work, [`super::host_work`], and the
    /// waits stay), and each GPU op is followed by the
    /// GPU's gap between two nodes of a graph (`Pricing::graph_gap_us`).
    /// The captured streams keep their concurrency: each stream's ops run
    /// in its order, joined where the program's events joined them
    /// ([`super::event_joins`]) or where the trace's times show a wait for
    /// another stream, and kernels of different streams run side by side
    /// (a graph's branches of small kernels share the SMs).
    CudaGraph,
    /// The next batch prepared ahead: the host's own work on the issuing
    /// thread (CPU ops that launch nothing, [`super::host_work`]) and the
    /// interpreter's time around it up to the call after it (the loader's
    /// fetching and collating, which the trace does not record), with the
    /// profiler's cost per recorded op taken out where handed in
    /// ([`Pricing::profiler_us_per_cpu_op`]), runs on workers of its own
    /// (`Pricing::workers`, the batches dealt out in turn, each worker's
    /// back to back from the run's start), and the issuing thread, where it
    /// did that work, waits for the batch instead, then takes it over
    /// (`Pricing::batch_handover`: the worker's share of handing a batch
    /// over is added to its batch, the rest runs on a thread of the
    /// loader's own, one batch at a time, beside the loop: PyTorch's
    /// pinning thread, whose first batch waits for the loader's start;
    /// the loop's own share runs on the issuing thread, in proportion to
    /// the thread's own work since the batch before: `BatchHandover::
    /// lost_over`; waiting, for its batch or for autograd's backward pass,
    /// it loses nothing). A stretch of own work shorter than
    /// [`PREPARED_AHEAD_MIN_US`] stays put, with the time around it.
    PrepareAhead,
}

/// How many workers prepare the batches ahead where none is said: a
/// DataLoader's `num_workers=4`.
pub const DEFAULT_WORKERS: usize = 4;

/// What a worker's batch is called in the schedule.
pub const PREPARED_AHEAD: &str = "batch prepared ahead";

/// The least own work before one call that a worker takes over: the
/// CPU's short stretches of its own between launches (an optimizer's step
/// counters) stay where they are, as they do when a DataLoader builds the
/// batches.
pub const PREPARED_AHEAD_MIN_US: f64 = 100.0;

impl Change {
    /// The change as a what-if table names it.
    pub fn label(self) -> &'static str {
        match self {
            Change::Pinned => "pinned",
            Change::CopyStream => "copy stream",
            Change::DownloadStream => "download stream",
            Change::ReadLate => "read a step late",
            Change::SyncRemoved => "sync removed",
            Change::CudaGraph => "CUDA graph",
            Change::PrepareAhead => "prepare the next batch ahead",
        }
    }

    /// The change as the program makes it, in the words of the API it is
    /// written against.
    pub fn as_written(self, api: ProgramApi) -> &'static str {
        match api {
            ProgramApi::PyTorch => self.in_pytorch(),
            ProgramApi::Cuda => self.in_cuda(),
        }
    }

    /// The change in CUDA's runtime API: what a CUDA C++ program calls,
    /// and what cudarc, CuPy or Numba wrap under their own names.
    fn in_cuda(self) -> &'static str {
        match self {
            Change::Pinned => "host buffers in page-locked memory (`cudaMallocHost`, `cudaHostAlloc`, or `cudaHostRegister` on memory you have) copied with `cudaMemcpyAsync`",
            Change::CopyStream => "uploads on a stream of their own (`cudaStreamCreateWithFlags(..., cudaStreamNonBlocking)`), joined to the compute stream by events (`cudaEventRecord`, `cudaStreamWaitEvent`), two device buffers used in turn",
            Change::DownloadStream => "downloads on a stream of their own that waits for the compute stream's event (`cudaStreamWaitEvent`), into two page-locked buffers used in turn",
            Change::ReadLate => "each step's results read a step late (`cudaEventSynchronize` on the previous step's download, not on this one's)",
            Change::SyncRemoved => "no `cudaStreamSynchronize`, `cudaDeviceSynchronize` or blocking `cudaMemcpy` inside the loop (wait once, after it)",
            Change::CudaGraph => "the step captured once (`cudaStreamBeginCapture` ... `cudaStreamEndCapture`, `cudaGraphInstantiate`) and replayed with `cudaGraphLaunch`",
            Change::PrepareAhead => "the batches built ahead on N CPU threads of their own, into page-locked buffers, the loop only uploading and launching",
        }
    }

    /// The change in PyTorch's words.
    fn in_pytorch(self) -> &'static str {
        match self {
            Change::Pinned => "host tensors in pinned memory (`pin_memory()`, or a `torch.empty(..., pin_memory=True)` destination) copied with `non_blocking=True`",
            Change::CopyStream => "uploads on a side `torch.cuda.Stream`, joined to the compute stream by events (`event.record()`, `stream.wait_event()`), two buffers used in turn",
            Change::DownloadStream => "downloads on a side `torch.cuda.Stream` that waits for the compute stream's event, two pinned buffers used in turn",
            Change::ReadLate => "each step's results read a step late (`event.synchronize()` on the previous step's download, not on this one's)",
            Change::SyncRemoved => "no `.item()`, `.cpu()` or `torch.cuda.synchronize()` inside the loop (read results once, after it)",
            Change::CudaGraph => "the step captured once and replayed with `torch.cuda.graphs` (`torch.cuda.CUDAGraph`, `torch.cuda.graph(g)`, `g.replay()`)",
            Change::PrepareAhead => "the batches built by a `torch.utils.data.DataLoader(..., num_workers=N, pin_memory=True)` (or a thread of its own), the loop only uploading and launching",
        }
    }
}

/// The API a traced program is written against, in whose words its fixes
/// are said: PyTorch for torch.profiler's traces (and ours of a program
/// that runs PyTorch's kernels), CUDA's runtime API for any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgramApi {
    #[serde(rename = "pytorch")]
    PyTorch,
    Cuda,
}

impl ProgramApi {
    /// The API `trace`'s program is written against: PyTorch where
    /// torch.profiler wrote the trace, or where its kernels are PyTorch's
    /// (`at::native`, `at::cuda`, its CUB and flash-attention builds,
    /// `torch.compile`'s Triton kernels); CUDA for any other program.
    pub fn of(trace: &Trace) -> ProgramApi {
        // PyTorch's own kernels, its CUB and flash-attention builds, and
        // the Triton kernels `torch.compile` writes.
        const PYTORCH: [&str; 5] = ["at::native::", "at::cuda::", "at_cuda_detail::", "pytorch_flash::", "triton_"];
        let pytorch_kernels = || trace.gpu_ops.iter().any(|o| o.kind == GpuOpKind::Kernel && PYTORCH.iter().any(|p| o.name.contains(p)));
        match trace.format {
            None | Some(TraceFormat::Kineto) => ProgramApi::PyTorch,
            Some(TraceFormat::OverlapLabTrace) if pytorch_kernels() => ProgramApi::PyTorch,
            Some(TraceFormat::OverlapLabTrace | TraceFormat::Course) => ProgramApi::Cuda,
        }
    }

    /// As "fix in ..." says it.
    pub fn label(self) -> &'static str {
        match self {
            ProgramApi::PyTorch => "PyTorch",
            ProgramApi::Cuda => "CUDA",
        }
    }
}

/// What the changes are priced by: the machine's figures a trace does not hold.
#[derive(Clone, Debug, Default)]
pub struct Pricing {
    /// The link's recorded rates (lab 1), for [`Change::Pinned`].
    pub rates: Option<LinkRates>,
    /// What a CUDA graph's kernels take on this GPU (lab 10's recording of
    /// it), for [`Change::CudaGraph`]. Without it, a graph is priced with
    /// no gap and its kernels at their eager times: a lower bound on its time.
    pub graph: Option<GraphPrice>,
    /// How many workers prepare the batches ahead, for
    /// [`Change::PrepareAhead`]; none: [`DEFAULT_WORKERS`].
    pub workers: Option<usize>,
    /// What the profiler adds to each CPU op it records, µs, and where that
    /// comes from (lab 10's programs timed traced and untraced), taken out
    /// of the host's own work a [`Change::PrepareAhead`] moves. Without it
    /// the prediction keeps the profiler's slowdown.
    pub profiler_us_per_cpu_op: Option<(f64, String)>,
    /// What a DataLoader with workers costs per batch it hands over, for
    /// [`Change::PrepareAhead`]. Without it a batch is handed over for
    /// nothing: a lower bound.
    pub batch_handover: Option<BatchHandover>,
    /// How this GPU's kernels slow kept busy ([`BusyClock`]): each fix's
    /// kernels priced at the busy share its replay reaches, from the
    /// trace's. Without it a kernel takes its traced time in every fix.
    pub busy_clock: Option<BusyClock>,
}

/// A CUDA graph's kernels on a GPU, as one calibration measured them.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphPrice {
    /// The gap between two kernels of one graph, µs.
    pub gap_us: f64,
    /// The least time a kernel of a graph takes, µs (the calibration's
    /// small kernels in their graph, where it has them): a kernel shorter
    /// than that in the trace takes that long in a graph.
    pub least_kernel_us: Option<f64>,
    /// How far apart one branch starts its small kernels with so many
    /// branches side by side, µs, by branch count, in rising order, timed
    /// untraced (empty where the calibration did not time it). Branches
    /// share the GPU's rate of starting a graph's kernels: with several, a
    /// branch's small kernels run further apart than with one.
    pub branch_spacing_us: Vec<(usize, f64)>,
    /// Where it comes from.
    pub from: String,
}

impl GraphPrice {
    /// What the what-if says a graph was priced by.
    pub fn says(&self) -> String {
        // With branches timed, a kernel is priced by their spacing (its
        // least), not by the least kernel (`kernel_us`).
        let least = match (self.branch_spacing_us.as_slice(), self.least_kernel_us) {
            ([], Some(least)) => format!(", each at least {least:.2} µs"),
            ([(few, least), .., (most, spacing)], _) => {
                format!(", a branch's kernels at least {least:.2} µs apart with {few} branch(es) side by side, {spacing:.2} µs with {most}")
            }
            ([(n, spacing)], _) => format!(", a branch's kernels at least {spacing:.2} µs apart with {n} branch(es) side by side"),
            ([], None) => String::new(),
        };
        format!("{:.2} µs between a graph's kernels{least}, from {}", self.gap_us, self.from)
    }

    /// The least time from one kernel's start to the next in one of
    /// `branches` branches side by side (one: a graph of one stream), µs:
    /// between two calibrated counts, on the line between them; below the
    /// fewest calibrated, the fewest's; past the most calibrated, the
    /// branches share its rate (the spacing grows with their count). None
    /// where the calibration did not time branches.
    pub fn branch_spacing(&self, branches: usize) -> Option<f64> {
        let b = branches.max(1) as f64;
        let mut below: Option<(usize, f64)> = None;
        for &(count, spacing) in &self.branch_spacing_us {
            if count as f64 == b {
                return Some(spacing);
            }
            if count as f64 > b {
                let Some((n0, s0)) = below else { return Some(spacing) };
                let t = (b - n0 as f64) / (count - n0) as f64;
                return Some(s0 + t * (spacing - s0));
            }
            below = Some((count, spacing));
        }
        let (most, spacing) = below?;
        Some(spacing * b / most as f64)
    }

    /// Each of `trace`'s GPU ops' time in a graph, from its eager time in
    /// `durations_us` (by `gpu_ops` index): a kernel's by [`Self::kernel_us`]
    /// with as many branches side by side as its GPU's kernels have streams
    /// in the trace (they share the GPU's rate of starting them), any other
    /// op's followed by the gap.
    pub fn in_graph(&self, trace: &Trace, durations_us: &mut [f64]) {
        let mut streams_of: HashMap<u32, HashSet<u64>> = HashMap::new();
        for o in trace.gpu_ops.iter().filter(|o| matches!(o.kind, GpuOpKind::Kernel)) {
            streams_of.entry(o.gpu).or_default().insert(o.stream);
        }
        for (d, o) in durations_us.iter_mut().zip(&trace.gpu_ops) {
            *d = match o.kind {
                GpuOpKind::Kernel => self.kernel_us(*d, streams_of.get(&o.gpu).map_or(1, HashSet::len)),
                _ => *d + self.gap_us,
            };
        }
    }

    /// A kernel's time in a graph of `branches` branches side by side
    /// (start to the next kernel's start on its stream), µs, from its
    /// eager time in the trace: where the calibration timed branches, no
    /// less than their spacing (untraced, by events), else no less than
    /// the graph's least kernel, then the gap.
    pub fn kernel_us(&self, eager_us: f64, branches: usize) -> f64 {
        match self.branch_spacing(branches) {
            Some(spacing) => (eager_us + self.gap_us).max(spacing),
            None => eager_us.max(self.least_kernel_us.unwrap_or(0.0)) + self.gap_us,
        }
    }
}

/// What a DataLoader costs per batch beyond building it: a worker's
/// stacking and handing over through shared memory, the loader's taking
/// it over in the loop's process (the pinning thread's copy), what the
/// loop's own thread loses to it, and the wait for its first batch while
/// its workers start, as lab 10's recording of the machine measured it (the default:
/// nothing, a lower bound).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchHandover {
    /// A worker's time per batch, µs.
    pub worker_us: f64,
    /// The loader's time per batch in the loop's process, one batch at a
    /// time (its pinning thread), µs.
    pub loop_us: f64,
    /// What the loop's own thread loses a batch while it is busy with its
    /// own work between batches (launching a step): asking for the batch
    /// (`next()` on the loader) and the interpreter the pinning thread
    /// holds meanwhile, µs, over `busy_loop_us` of that work.
    pub taken_over_us: f64,
    /// The loop's own work between two batches over which it lost
    /// `taken_over_us`, µs: the loop's thread runs its own work that much
    /// slower beside the loader (`taken_over_us / busy_loop_us` more per
    /// µs), and loses nothing while it waits (for its batch, or in
    /// `backward()` for autograd's thread, which lets the interpreter go).
    /// Zero where not measured: the whole `taken_over_us` each batch.
    pub busy_loop_us: f64,
    /// The loop's time a batch beside workers that build batches, by its
    /// own work between batches (µs of work, µs a batch; by work, the
    /// least first, each time a batch no less than the one before: more
    /// work never brings batches sooner, so a dip is the machine's noise):
    /// where measured, what the loop loses at a batch is
    /// read from it, not from `taken_over_us`. A loop with little work of
    /// its own still loses the interpreter to the pinning thread, and its
    /// batches come no faster than the loader hands them over beside
    /// building workers.
    pub per_batch_by_loop_work: Vec<(f64, f64)>,
    /// The wait for the first batch of samples that cost nothing to build,
    /// from asking for the loader's iterator (its workers told to start),
    /// µs: no batch is handed over sooner.
    pub first_batch_us: f64,
    /// Where it comes from.
    pub from: String,
}

impl BatchHandover {
    /// When the workers start building, µs after the loop asks for the
    /// loader's iterator: its first batch of ready samples came
    /// `first_batch_us` after asking, less a worker's and the pinning
    /// thread's handing over of it.
    pub fn workers_start_us(&self) -> f64 {
        (self.first_batch_us - self.loop_us - self.worker_us).max(0.0)
    }

    /// Whether the loop's time a batch was measured by its own work
    /// ([`BatchHandover::per_batch_by_loop_work`]).
    pub fn measured_by_loop_work(&self) -> bool {
        !self.per_batch_by_loop_work.is_empty()
    }

    /// What the loop's own thread loses at a batch after `busy_us` of its
    /// own work since the batch before: where the loop's time a batch was
    /// measured by its work, that time less the work (read between the
    /// two nearest lengths measured; past the longest, its loss); else
    /// that work slowed by the calibrated loss per µs, at most the whole
    /// loss the calibration's loop had (all of it where the loop's work
    /// was not measured).
    pub fn lost_over(&self, busy_us: f64) -> f64 {
        let curve = &self.per_batch_by_loop_work;
        if let (Some(&first), Some(&last)) = (curve.first(), curve.last()) {
            if busy_us.is_nan() {
                return 0.0;
            }
            // Past the longest length measured: its loss on top of the work.
            let per_batch = if busy_us <= first.0 { first.1.max(busy_us) } else { on_the_line(curve, busy_us).unwrap_or(busy_us + (last.1 - last.0)) };
            return (per_batch - busy_us).max(0.0);
        }
        if self.busy_loop_us > 0.0 {
            (busy_us * self.taken_over_us / self.busy_loop_us).min(self.taken_over_us)
        } else {
            self.taken_over_us
        }
    }
}

impl Pricing {
    /// The workers that prepare the batches ahead.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or(DEFAULT_WORKERS).max(1)
    }

    /// The pricing of `trace`: the profiler's cost per recorded CPU op is
    /// torch.profiler's, so a trace another tracer wrote (`overlap-lab
    /// trace`'s records no CPU ops; the course's timelines none either)
    /// carries none.
    pub fn for_trace(&self, trace: &Trace) -> Pricing {
        match trace.format {
            None | Some(TraceFormat::Kineto) => self.clone(),
            Some(TraceFormat::OverlapLabTrace | TraceFormat::Course) => Pricing { profiler_us_per_cpu_op: None, ..self.clone() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BatchHandover, GraphPrice};

    #[test]
    fn a_loops_loss_to_the_loader_is_read_from_its_time_a_batch_by_its_own_work() {
        let by_rate = BatchHandover { taken_over_us: 1000.0, busy_loop_us: 4000.0, ..BatchHandover::default() };
        assert_eq!(by_rate.lost_over(500.0), 125.0, "a quarter of a µs a µs of work");
        assert_eq!(by_rate.lost_over(8000.0), 1000.0, "no more than the calibration's loop lost");
        let measured = BatchHandover { per_batch_by_loop_work: vec![(0.0, 2300.0), (1000.0, 2500.0), (4000.0, 5500.0)], ..by_rate.clone() };
        // No work of its own: a batch each 2.3 ms, all of it lost to the loader.
        assert_eq!(measured.lost_over(0.0), 2300.0);
        // Between two lengths measured, the time a batch read on the line between them.
        assert!((measured.lost_over(500.0) - (2400.0 - 500.0)).abs() < 1e-9, "{}", measured.lost_over(500.0));
        assert!((measured.lost_over(2500.0) - (4000.0 - 2500.0)).abs() < 1e-9, "{}", measured.lost_over(2500.0));
        // Past the longest, its loss (1.5 ms) a batch.
        assert!((measured.lost_over(6000.0) - 1500.0).abs() < 1e-9);
        // Never less than nothing, even where a point says a batch came
        // sooner than the loop's own work took (no such point is read:
        // `prices::batch_handover` keeps the curve from falling).
        let below = BatchHandover { per_batch_by_loop_work: vec![(0.0, 2300.0), (1000.0, 900.0)], ..by_rate };
        assert_eq!(below.lost_over(1000.0), 0.0);
        assert_eq!(below.lost_over(f64::NAN), 0.0);
    }

    #[test]
    fn a_branch_spacing_is_read_between_calibrated_counts_and_shared_past_the_last() {
        let price = GraphPrice {
            gap_us: 0.25,
            least_kernel_us: Some(1.0),
            branch_spacing_us: vec![(1, 1.25), (2, 1.25), (4, 1.5), (8, 2.0)],
            from: "(synthetic)".into(),
        };
        assert_eq!(price.branch_spacing(1), Some(1.25));
        assert_eq!(price.branch_spacing(4), Some(1.5));
        assert_eq!(price.branch_spacing(6), Some(1.75), "halfway between 4 and 8");
        assert_eq!(price.branch_spacing(16), Some(4.0), "twice the branches of the last count share its rate");
        let uncalibrated = GraphPrice { branch_spacing_us: Vec::new(), ..price.clone() };
        assert_eq!(uncalibrated.branch_spacing(4), None);
        // A small kernel takes the spacing (its least, measured untraced);
        // a long one its own time and the gap; uncalibrated, the least and the gap.
        assert_eq!(price.kernel_us(0.5, 4), 1.5);
        assert_eq!(price.kernel_us(3.0, 4), 3.25);
        assert_eq!(uncalibrated.kernel_us(0.5, 4), 1.25);
        assert!(price.says().contains("1.25 µs apart with 1 branch(es) side by side, 2.00 µs with 8"), "{}", price.says());
        assert!(uncalibrated.says().contains("each at least 1.00 µs"), "{}", uncalibrated.says());
    }
}
