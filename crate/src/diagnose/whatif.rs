//! What-if: the fixes a diagnosis suggests, each predicted by the queue
//! model on the trace's schedule ([`super::replay`], priced in
//! [`super::prediction`]).
//!
//! Each finding suggests a change: pageable copies, pinned memory (and, where
//! the copies share the kernels' stream, pinned memory on a copy stream of
//! their own; for results brought back each step, pinned memory with a
//! download stream, with the results read a step late, and both);
//! page-locked copies on the kernels' stream, a copy stream (each way); a
//! sync that left the GPU idle, the syncs removed; an issue-bound stretch,
//! CUDA graphs; the host's own work (the GPU idle while the CPU built its
//! batches), the next batch prepared ahead on workers (and, where its
//! copies are pageable, in pinned memory too: a DataLoader's
//! `pin_memory`), with which side then bounds the loop said plainly
//! ([`HostBound`]). [`what_if`] picks them from a [`Diagnosis`] and predicts
//! each; whoever holds the machine's figures attaches the table to the
//! diagnosis.
//!
//! May use: `events`, `diagnosis` (the findings read), `queries` (the
//! launching calls), `side_streams` (what a copy stream moves), `replay`
//! (the changes, and the waits after copies), `text`, `pipeline` (a schedule's lanes), `prediction` (the pricing, and the table's types, which are
//! named from here too). The top of the stack: nothing here is used below.

use super::diagnosis::{Cause, Diagnosis};
use super::events::{Direction, GpuOpKind, HostMemory, Trace, TraceFormat};
pub use super::prediction::{fix_label, predict_fixes, Prediction, WhatIf};
use super::queries::launch_calls;
use super::replay::{self, Change, Pricing, Replay, TracedSchedule};
use super::side_streams::MovedCopies;
use super::text::{counted, us};
use crate::pipeline::op::{Lane, OpKind};
use std::fmt;

/// How many host-to-device copies share a stream with kernels: what
/// [`Change::CopyStream`] moves.
pub fn uploads_on_kernel_streams(trace: &Trace) -> usize {
    MovedCopies::of(trace, Direction::H2d).count()
}

/// The least a download must move to count as results brought back
/// (`.cpu()` of a tensor): a scalar read (`.item()`, 4 bytes) costs its
/// sync, not its copy, and removing the sync is its fix.
pub const RESULTS_MIN_BYTES: u64 = 64 << 10;

/// How many downloads of results (at least [`RESULTS_MIN_BYTES`]) the CPU
/// waits for at once (PyTorch's wait in the same CPU op as the copy,
/// `.cpu()`): what [`Change::ReadLate`] defers. None where the trace
/// cannot be replayed.
pub fn results_waited_at_once(trace: &Trace) -> usize {
    let is_results = |op: usize| {
        let o = &trace.gpu_ops[op];
        matches!(o.kind, GpuOpKind::Copy { direction: Direction::D2h, .. }) && o.bytes.is_some_and(|b| b >= RESULTS_MIN_BYTES)
    };
    // Most traces bring no results back: no replay to build for them.
    if !(0..trace.gpu_ops.len()).any(is_results) {
        return 0;
    }
    let Ok(replay) = Replay::new(trace) else { return 0 };
    replay.waits_after_copies().iter().filter(|&&(_, op, _)| is_results(op)).count()
}

/// How many CPU threads launched the trace's GPU work.
pub fn issuing_threads(trace: &Trace) -> usize {
    let threads: std::collections::HashSet<usize> = launch_calls(trace).values().map(|&c| trace.calls[c].thread).collect();
    threads.len()
}

/// The changes the findings of `d` on `trace` suggest, each fix once. A
/// copy stream is suggested where uploads share a stream with kernels; for
/// results the CPU waits for as they come back (`.cpu()` each step: two or
/// more), a stream of their own and reading them a step late, alone and
/// together.
pub fn suggested(trace: &Trace, d: &Diagnosis) -> Vec<Vec<Change>> {
    let has = |c: Cause| d.findings.iter().any(|f| f.cause == c);
    let uploads_beside_kernels = uploads_on_kernel_streams(trace) > 0;
    let downloads_each_step = results_waited_at_once(trace) >= 2;
    let pageable_downloads = trace.gpu_ops.iter().any(|o| o.kind == GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pageable) });
    let download_fixes = [vec![Change::ReadLate], vec![Change::DownloadStream], vec![Change::DownloadStream, Change::ReadLate]];
    let mut fixes = Vec::new();
    if has(Cause::PageableCopies) {
        fixes.push(vec![Change::Pinned]);
        if uploads_beside_kernels {
            fixes.push(vec![Change::Pinned, Change::CopyStream]);
        }
        if downloads_each_step && pageable_downloads {
            fixes.extend(download_fixes.iter().map(|f| [&[Change::Pinned][..], f].concat()));
            if uploads_beside_kernels {
                fixes.push(vec![Change::Pinned, Change::CopyStream, Change::DownloadStream, Change::ReadLate]);
            }
        }
    } else if has(Cause::CopiesShareStreamWithKernels) {
        if uploads_beside_kernels {
            fixes.push(vec![Change::CopyStream]);
        }
        if downloads_each_step {
            fixes.extend(download_fixes);
        }
    }
    if has(Cause::Sync) {
        fixes.push(vec![Change::SyncRemoved]);
    }
    // Issue-bound between launches that are graphs already: no graph to
    // add; issue-bound a sliver of the window: not worth one.
    let window = trace.window_us().1 - trace.window_us().0;
    let issue_bound: f64 = d.findings.iter().filter(|f| f.cause == Cause::IssueBound && !f.call.name.ends_with("cudaGraphLaunch")).map(|f| f.cost_us).sum();
    if issue_bound > 0.0 && issue_bound >= FINDING_MIN_SHARE * window {
        fixes.push(vec![Change::CudaGraph]);
    }
    // The GPU idled a tenth of the window or more while the CPU built its
    // work, in CPU operators the trace records (which the model hands to
    // workers: untraced code between CUDA calls it cannot move).
    if host_work_bound(trace, d) && records_cpu_operators(trace) {
        fixes.push(vec![Change::PrepareAhead]);
        // A DataLoader with workers and `pin_memory=True` does both at once.
        if has(Cause::PageableCopies) {
            fixes.push(vec![Change::Pinned, Change::PrepareAhead]);
        }
    }
    fixes
}

/// The least share of the window the GPU must idle on the host's own work
/// for preparing the next batch ahead to be suggested, or waiting for
/// launches for a CUDA graph to be.
pub const FINDING_MIN_SHARE: f64 = 0.1;

/// Whether the GPU idled a tenth of the window or more while the CPU ran
/// the program's own work.
fn host_work_bound(trace: &Trace, d: &Diagnosis) -> bool {
    let window = trace.window_us().1 - trace.window_us().0;
    d.findings.iter().any(|f| f.cause == Cause::HostWork && f.cost_us >= FINDING_MIN_SHARE * window)
}

/// Whether the trace records the program's CPU operators (torch.profiler's
/// `aten::` ops), not only its CUDA calls and annotations.
fn records_cpu_operators(trace: &Trace) -> bool {
    trace.cpu_ops.iter().any(|o| !o.annotation)
}

/// The what-if of the fixes `d`'s findings suggest.
pub fn what_if(trace: &Trace, d: &Diagnosis, pricing: &Pricing) -> Result<WhatIf, String> {
    let pricing = &pricing.for_trace(trace);
    let mut w = predict_fixes(trace, &suggested(trace, d), pricing)?;
    if host_work_bound(trace, d) && !records_cpu_operators(trace) {
        let record_them = match trace.format {
            None | Some(TraceFormat::Kineto) => " (record with `ProfilerActivity.CPU` to have them)",
            Some(_) => "",
        };
        w.not_priced.push(format!(
            "{}: the trace records no CPU operators{record_them}: the program's own work is untraced code between its CUDA calls, which the model cannot hand to workers",
            Change::PrepareAhead.label()
        ));
    }
    for p in w.predictions.iter_mut().filter(|p| p.changes.contains(&Change::PrepareAhead)) {
        let workers = pricing.workers();
        p.fix = format!("{} ({})", p.fix, counted(workers, "worker", "workers"));
        p.as_written =
            p.as_written.replace("num_workers=N", &format!("num_workers={workers}")).replace("on N CPU threads", &format!("on {workers} CPU threads"));
        let bound = HostBound::of(&p.replayed.schedule, workers);
        p.priced_by = Some(format!("{}; {}; {bound}", profiler_note(pricing), handover_note(pricing)));
    }
    let threads = issuing_threads(trace);
    if threads > 1 {
        let note = format!("GPU work launched from {threads} CPU threads, each replayed in its own order, joined where the calls pass from one thread to another (inferred from the calls' order: the trace names no handover)");
        for p in &mut w.predictions {
            p.priced_by = Some(p.priced_by.take().map_or_else(|| note.clone(), |by| format!("{by}; {note}")));
        }
    }
    Ok(w)
}

/// What the host's own work was priced at, as the report says it.
fn profiler_note(pricing: &Pricing) -> String {
    match &pricing.profiler_us_per_cpu_op {
        Some((cost, from)) => format!("the host's own work less the profiler's {cost:.2} µs a recorded CPU op, from {from}"),
        None => "the host's own work as traced: no recording of this GPU says what the profiler adds to a CPU op, so the prediction includes the profiler's slowdown".into(),
    }
}

/// What a batch's handing over was priced at, as the report says it.
fn handover_note(pricing: &Pricing) -> String {
    match &pricing.batch_handover {
        Some(h) => format!(
            "a DataLoader's cost of handing each batch over added ({} a worker, {} its pinning thread, {}; its workers start building {} after the loop asks: its first batch of ready samples came {} after asking, less a worker's and the pinning thread's handing over), from {}",
            us(h.worker_us),
            us(h.loop_us),
            if let (Some(&(_, alone)), Some(&(work, most))) = (h.per_batch_by_loop_work.first(), h.per_batch_by_loop_work.last()) {
                format!(
                    "the loop's own thread gets a batch each {} beside building workers with no work of its own, each {} with {} of it (what it loses read from that by its own work between batches, less what it waits for its other threads)",
                    us(alone),
                    us(most),
                    us(work)
                )
            } else if h.busy_loop_us > 0.0 {
                format!("{} the loop's own thread loses over {} of its own work, in proportion to its own work between batches", us(h.taken_over_us), us(h.busy_loop_us))
            } else {
                format!("{} the loop's own thread loses a batch", us(h.taken_over_us))
            },
            us(h.workers_start_us()),
            us(h.first_batch_us),
            h.from
        ),
        None => "each batch handed over for nothing: no recording of this GPU's machine says what a DataLoader's handing over costs, so the prediction is a lower bound".into(),
    }
}

/// Which side bounds a loop whose batches are prepared ahead: the workers
/// (the batches' host work over their number) or the GPU (its busiest
/// engine's work: the SMs, or a copy engine each way).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostBound {
    pub workers: usize,
    /// The batches the workers prepare.
    pub batches: usize,
    /// The batches' host work, µs (the profiler's cost taken out where known, a worker's share of handing each over added).
    pub host_us: f64,
    /// The GPU's busiest engine's work, µs.
    pub gpu_us: f64,
}

impl HostBound {
    /// Of a schedule a [`Change::PrepareAhead`] made with `workers`.
    pub fn of(ts: &TracedSchedule, workers: usize) -> HostBound {
        let (mut host_us, mut batches, mut engines) = (0.0, 0, [0.0f64; 3]);
        for (op, &d) in ts.schedule.ops.iter().zip(&ts.durations_us) {
            match (op.lane, op.kind) {
                (Lane::HostThread(_), _) if op.label == replay::PREPARED_AHEAD => {
                    host_us += d;
                    batches += 1;
                }
                (Lane::Stream(_), OpKind::H2d) => engines[1] += d,
                (Lane::Stream(_), OpKind::D2h) => engines[2] += d,
                (Lane::Stream(_), _) => engines[0] += d,
                _ => {}
            }
        }
        HostBound { workers, batches, host_us, gpu_us: engines.into_iter().fold(0.0, f64::max) }
    }

    /// Whether the host is the bound: its workers, side by side, take
    /// longer over the batches than the GPU's busiest engine.
    pub fn host_bound(&self) -> bool {
        self.host_us / self.workers as f64 > self.gpu_us
    }
}

impl fmt::Display for HostBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let take = counted(self.workers, "worker takes", "workers take");
        let each = us(self.host_us / self.batches.max(1) as f64);
        let work =
            format!("{take} {} for {} of the host's own work ({each} each)", us(self.host_us / self.workers as f64), counted(self.batches, "batch", "batches"));
        let gpu = us(self.gpu_us);
        if self.host_bound() {
            write!(f, "the host is the bound: {work}, longer than the GPU's {gpu} of work (its busiest engine), so the GPU cannot go faster than the CPU feeds it and the predicted time is the host's; more workers would gain more")
        } else {
            write!(f, "the GPU is the bound: {work}, within the GPU's {gpu} of work (its busiest engine)")
        }
    }
}
