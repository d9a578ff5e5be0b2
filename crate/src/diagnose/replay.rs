//! A trace as a schedule of the pipeline vocabulary, for the queue model
//! to replay: the ground of the what-if (lab 10's next part).
//!
//! Each GPU op becomes an op of a [`Schedule`] on its stream, issued where
//! its launching call (found by correlation id) sits among its issuing
//! thread's calls (each issuing thread on a host lane of its own, joined to
//! the one whose call came before wherever the calls pass between them:
//! autograd's backward thread), with its measured duration; the CPU's time between
//! calls, and inside calls that do not wait for the GPU, becomes host work
//! of the duration measured; a call that waited for the GPU (a sync, a
//! copy from pageable memory that holds the CPU until it is done) becomes
//! a host wait for the op it waited on. What each GPU op waited for is
//! kept ([`Waited`]): the op before it on its stream, its own launch, or an
//! op of another stream (a `cudaStreamWaitEvent`, which the trace does not
//! tie to its event: inferred as the op of another stream that ended just
//! before it started, when neither of the others explains its start).
//! [`predict`] replays it on the queue model, as traced or with the
//! [`Change`]s a diagnosis suggests (pinned copies, a copy stream each
//! way, results read a step late, the syncs removed, CUDA graphs), priced
//! by what the machine's recordings say ([`Pricing`]).
//!
//! May use: `measure` (a median), `pipeline` (the schedule and the queue
//! model), `events`, `host_work` (the host's own work a batch prepared
//! ahead moves), `queries` (launching calls, syncs, enclosing CPU ops,
//! the legacy default stream), `link` (the recorded rates a fix is priced
//! by), `waits` (what each op waited for), `side_streams` (what a copy stream moves), `event_joins` (a
//! program's event waits, a graph's fork and join), `fixes` (the changes and their prices), `traced_schedule` (the
//! schedule it builds, its replay), `prepared_ahead` (a batch prepared
//! ahead, laid out on it).

use super::event_joins::{event_joins, graph_launch_joins, Join};
use super::events::{Direction, GpuOpKind, HostMemory, Trace};
pub use super::fixes::{BatchHandover, Change, GraphPrice, Pricing, DEFAULT_WORKERS, PREPARED_AHEAD, PREPARED_AHEAD_MIN_US};
use super::host_work::{own_work_before_calls, OwnWork, RecordedOps};
use super::prepared_ahead::PreparedAhead;
use super::queries::{enclosing_ops, kernels_side_by_side, launch_calls, launches_graph, legacy_default_stream, run_start, synchronizes};
pub use super::side_streams::stream_label;
use super::side_streams::{side_stream_of, MovedCopies};
pub use super::traced_schedule::{predict, predicted_times, window_us, TracedSchedule};
use super::waits::{queued_gap_us, waits, Waited, WAIT_SLACK_US};
use crate::measure::stats::upper_median;
use crate::pipeline::op::{Link, OpKind, StreamDecl, StreamKind};
use crate::pipeline::schedule::Schedule;
use std::collections::{HashMap, HashSet};

/// The share of the kernels' busy time with kernels of two or more streams
/// running at once ([`kernels_side_by_side`])
/// from which a trace's kernels are replayed side by side: a program that
/// computes on several streams at once (chunks over streams, each kernel
/// on part of the SMs). One compute stream with a copy stream beside it
/// shows none.
pub const SIDE_BY_SIDE_SHARE: f64 = 0.25;

/// The pipeline vocabulary's kind of a traced op: what the replay
/// schedules it as, and what lab 10's charts colour it by. A memset is a
/// kernel (the SMs' or the copy engine's few µs, drawn so they show);
/// every copy but an upload or a download (D2D, peer, host to host), a
/// copy within its GPU.
pub fn op_kind(kind: GpuOpKind, gpu: u32) -> OpKind {
    match kind {
        GpuOpKind::Kernel | GpuOpKind::Memset => OpKind::Kernel,
        GpuOpKind::Copy { direction: Direction::H2d, .. } => OpKind::H2d,
        GpuOpKind::Copy { direction: Direction::D2h, .. } => OpKind::D2h,
        GpuOpKind::Copy { .. } => OpKind::D2d(Link::between(gpu as usize, gpu as usize).unwrap_or(Link { from: 0, to: 0 })),
    }
}

/// A trace made ready to replay: which call launched each GPU op, from
/// which CPU thread, and what each op waited for. Built once a trace; each
/// set of changes is scheduled from it ([`Replay::schedule`]).
pub struct Replay<'t> {
    trace: &'t Trace,
    /// The GPU ops each launching call issued (indices into the trace).
    ops_of_call: HashMap<usize, Vec<usize>>,
    /// The issuing threads' calls, in the order they started.
    calls: Vec<usize>,
    /// Each issuing thread's host lane in the schedule (a trace thread ->
    /// lane): 0 for the one that launched first, then 1, 2, ...
    lane_of: HashMap<usize, usize>,
    waited: Vec<Waited>,
    /// The thread's median kernel launch, µs: what a launch that no longer
    /// holds the CPU costs it.
    launch_cost: f64,
    /// The GPU's gap between two ops of one stream where the second was
    /// queued already (launched before the first ended), µs: the median
    /// the trace shows ([`queued_gap_us`]). A replayed op that an op queued
    /// behind it followed in the trace is followed by it (in a CUDA graph
    /// the what-if makes, by the graph's own gap instead); one the next
    /// op's launch came after is not (that op's start is its launch's).
    queued_gap_us: f64,
    /// For each GPU op whose stream's next op was queued behind it in the
    /// trace (waited for it, not for its launch), the gap the replay puts
    /// between them: `queued_gap_us`, or where the next op is a traced
    /// graph's, that graph stream's own median gap in the trace (a graph
    /// launches its ops for the CPU, each branch at its own spacing, wider
    /// under the profiler than between eager kernels: the replay of a
    /// traced graph keeps it).
    gap_behind: Vec<Option<f64>>,
    /// The joins the trace's graph launches make ([`graph_launch_joins`]),
    /// the same under every fix (found once).
    graph_joins: Vec<Join>,
    /// Each thread's recorded CPU ops, counted in a stretch of its time to
    /// take the profiler's cost out (found once, for every fix).
    recorded: RecordedOps,
    /// The host's own work before each of the first issuing thread's
    /// (lane 0's) calls, from the run's start: found once, for every fix;
    /// each prices its profiler's cost out.
    own_work: HashMap<usize, OwnWork>,
    /// Where lane 0's time starts: the run's start, else its first call's, µs.
    run_from_us: f64,
    /// Whether the trace's kernels ran on several streams at once for at
    /// least [`SIDE_BY_SIDE_SHARE`] of their time: then they are replayed
    /// side by side (each with its measured, shared-SMs time), not one at
    /// a time (found once, for every fix).
    kernels_side_by_side: bool,
    /// Where the run starts where that is before the window: at the
    /// host's own work before the first issuing thread's first call (a
    /// first batch built), inside the annotation that holds that call
    /// ([`run_start`]), as (µs, the annotation's name). None where no
    /// annotation holds it or the CPU did none of its own work there.
    pub run_start: Option<(f64, String)>,
}

impl<'t> Replay<'t> {
    /// Needs the CUDA calls that issued the GPU work (a torch.profiler
    /// trace; the course's own traces have no calls); says why not, where
    /// not. Several issuing threads (autograd's backward thread) are each
    /// replayed in their own order, joined where the calls pass from one
    /// thread to another: inferred from the calls' order, as the trace
    /// names no handover between threads.
    pub fn new(trace: &'t Trace) -> Result<Replay<'t>, String> {
        let launch_of = launch_calls(trace);
        let mut ops_of_call: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, o) in trace.gpu_ops.iter().enumerate() {
            match o.correlation.and_then(|k| launch_of.get(&k)) {
                Some(&c) => ops_of_call.entry(c).or_default().push(i),
                None => return Err(format!("GPU op '{}' at ts {} has no launching call in the trace: its issue cannot be replayed", o.name, o.start_us)),
            }
        }
        // The issuing threads, the first to launch first.
        let mut first_launch: Vec<(usize, usize)> = ops_of_call.keys().map(|&c| (c, trace.calls[c].thread)).collect();
        first_launch.sort_unstable();
        let mut lane_of: HashMap<usize, usize> = HashMap::new();
        for (_, thread) in first_launch {
            let lanes = lane_of.len();
            lane_of.entry(thread).or_insert(lanes);
        }
        if lane_of.is_empty() {
            return Err("no GPU work launched in the trace: nothing to replay".into());
        }
        let launch_cost = upper_median(
            &trace
                .calls
                .iter()
                .filter(|c| lane_of.contains_key(&c.thread) && (c.name.starts_with("cudaLaunchKernel") || c.name.starts_with("cuLaunchKernel")))
                .map(|c| c.end_us - c.start_us)
                .collect::<Vec<f64>>(),
        )
        .unwrap_or(5.0);
        let waited = waits(trace, &launch_of);
        let queued_gap_us = queued_gap_us(trace, &waited);
        let launched_by_graph = |i: usize| trace.gpu_ops[i].correlation.and_then(|k| launch_of.get(&k)).is_some_and(|&c| launches_graph(&trace.calls[c].name));
        // A traced graph's gap on each of its streams: the median of its
        // queued ops' gaps there (a few gaps are the GPU running another
        // branch meanwhile, not the stream's own spacing).
        let mut graph_gaps: HashMap<(u32, u64), Vec<f64>> = HashMap::new();
        for (i, w) in waited.iter().enumerate() {
            if let (Waited::StreamOrder { op }, true) = (*w, launched_by_graph(i)) {
                let o = &trace.gpu_ops[i];
                graph_gaps.entry((o.gpu, o.stream)).or_default().push((o.start_us - trace.gpu_ops[op].end_us).max(0.0));
            }
        }
        let graph_gap: HashMap<(u32, u64), f64> = graph_gaps.into_iter().filter_map(|(s, gaps)| Some((s, upper_median(&gaps)?))).collect();
        let mut gap_behind = vec![None; trace.gpu_ops.len()];
        for (i, w) in waited.iter().enumerate() {
            if let Waited::StreamOrder { op } = *w {
                let o = &trace.gpu_ops[i];
                let graphs = graph_gap.get(&(o.gpu, o.stream)).filter(|_| launched_by_graph(i));
                gap_behind[op] = Some(graphs.copied().unwrap_or(queued_gap_us));
            }
        }
        let calls: Vec<usize> = (0..trace.calls.len()).filter(|&i| lane_of.contains_key(&trace.calls[i].thread)).collect();
        let main_calls: Vec<usize> = calls.iter().copied().filter(|&c| lane_of[&trace.calls[c].thread] == 0).collect();
        // The annotation holding the first call, if any: own work from its
        // start counts, and where there is some before the first call, the
        // run starts with it.
        let first_main = main_calls.first().copied();
        let annotation = first_main.and_then(|c| run_start(trace, c));
        let first_start = first_main.map_or(0.0, |c| trace.calls[c].start_us);
        let own_work = own_work_before_calls(trace, &main_calls, annotation.as_ref().map_or(first_start, |a| a.0));
        let run_start = annotation.and_then(|(_, name)| Some((own_work.get(&first_main?)?.from_us.min(first_start), name)));
        let graph_joins = graph_launch_joins(trace, &calls, &ops_of_call);
        Ok(Replay {
            trace,
            kernels_side_by_side: kernels_side_by_side(trace) >= SIDE_BY_SIDE_SHARE,
            run_from_us: run_start.as_ref().map_or(first_start, |r| r.0),
            run_start,
            own_work,
            calls,
            lane_of,
            waited,
            queued_gap_us,
            gap_behind,
            graph_joins,
            ops_of_call,
            launch_cost,
            recorded: RecordedOps::of(trace),
        })
    }

    /// The GPU's gap between two queued ops of one stream that a replayed
    /// op an op was queued behind in the trace is followed by, µs: the
    /// median the trace shows between an op and the one queued behind it.
    pub fn queued_gap_us(&self) -> f64 {
        self.queued_gap_us
    }

    /// The schedule of the trace with `changes` applied (none: the program
    /// as traced), priced by `pricing`.
    pub fn schedule(&self, changes: &[Change], pricing: &Pricing) -> Result<TracedSchedule, String> {
        let Replay {
            trace,
            ops_of_call,
            calls,
            waited,
            launch_cost,
            lane_of,
            recorded,
            run_start,
            queued_gap_us: _,
            gap_behind,
            graph_joins,
            own_work,
            run_from_us,
            kernels_side_by_side,
        } = self;
        let (trace, launch_cost) = (*trace, *launch_cost);
        let has = |c: Change| changes.contains(&c);

        // What a change does to each traced op's duration, and which launches hold the CPU.
        let mut duration: Vec<f64> = trace.gpu_ops.iter().map(|o| o.duration_us()).collect();
        let mut made_pinned = vec![false; trace.gpu_ops.len()];
        if has(Change::Pinned) {
            let pinned_rate = |direction: Direction, bytes: u64| -> Option<f64> {
                pricing.rates.as_ref().and_then(|r| r.rate(HostMemory::Pinned, direction, bytes)).map(|r| r.gbps).or_else(|| {
                    let (b, t) = trace
                        .gpu_ops
                        .iter()
                        .filter(|o| o.kind == GpuOpKind::Copy { direction, host: Some(HostMemory::Pinned) })
                        .fold((0u64, 0.0), |(b, t), o| (b + o.bytes.unwrap_or(0), t + o.duration_us()));
                    (b > 0 && t > 0.0).then(|| b as f64 / t / 1e3)
                })
            };
            for (i, o) in trace.gpu_ops.iter().enumerate() {
                if let GpuOpKind::Copy { direction, host: Some(HostMemory::Pageable) } = o.kind {
                    let bytes = o.bytes.ok_or_else(|| format!("copy '{}' at ts {} gives no bytes: its pinned time cannot be priced", o.name, o.start_us))?;
                    let rate = pinned_rate(direction, bytes).ok_or_else(|| {
                        format!(
                            "no pinned {direction} rate to price '{}' by: no lab 1 recording of this GPU, and no pinned {direction} copy in the trace",
                            o.name
                        )
                    })?;
                    duration[i] = bytes as f64 / rate / 1e3;
                    made_pinned[i] = true;
                }
            }
        }
        let graph = has(Change::CudaGraph);
        if graph {
            // Each op followed by the graph's gap, each kernel priced as the
            // calibration timed a graph's (`GraphPrice::in_graph`). Without a
            // calibration: no gap, the eager times (a lower bound).
            if let Some(price) = &pricing.graph {
                price.in_graph(trace, &mut duration);
            }
        } else {
            for (d, gap) in duration.iter_mut().zip(gap_behind) {
                *d += gap.unwrap_or(0.0);
            }
        }
        // The copies a copy stream moves, each way.
        let moved_way = |change: Change, direction: Direction| {
            if has(change) {
                MovedCopies::of(trace, direction)
            } else {
                MovedCopies::none(trace.gpu_ops.len())
            }
        };
        let moved = moved_way(Change::CopyStream, Direction::H2d).merged(moved_way(Change::DownloadStream, Direction::D2h));
        let is_download = |op: usize| matches!(trace.gpu_ops[op].kind, GpuOpKind::Copy { direction: Direction::D2h, .. });

        // The calls a change takes out: PyTorch's wait after an upload made
        // pinned (in the same CPU op as the copy); the wait after a download
        // from pinned memory, read a step late (the CPU waits for it after
        // issuing the next download instead: `read_late_after`); and, with
        // the syncs removed, every wait but those after which the CPU
        // issues no more GPU work.
        let mut dropped = vec![false; trace.calls.len()];
        let mut read_late_after: HashMap<usize, usize> = HashMap::new();
        let last_issue = calls.iter().rposition(|c| ops_of_call.contains_key(c));
        if has(Change::Pinned) || has(Change::ReadLate) {
            let pinned_now = |op: usize| made_pinned[op] || matches!(trace.gpu_ops[op].kind, GpuOpKind::Copy { host: Some(HostMemory::Pinned), .. });
            let mut late_downloads: Vec<(usize, usize, usize)> = Vec::new();
            for (copy_call, op, wait) in self.waits_after_copies() {
                if made_pinned[op] && !is_download(op) {
                    dropped[wait] = true;
                } else if has(Change::ReadLate) && is_download(op) && pinned_now(op) {
                    late_downloads.push((copy_call, op, wait));
                }
            }
            for w in late_downloads.windows(2) {
                let ((_, op, wait), (next_copy_call, _, _)) = (w[0], w[1]);
                dropped[wait] = true;
                read_late_after.insert(next_copy_call, op);
            }
        }
        if has(Change::SyncRemoved) {
            for (p, &ci) in calls.iter().enumerate() {
                if synchronizes(&trace.calls[ci].name) && !ops_of_call.contains_key(&ci) && last_issue.is_some_and(|l| p < l) {
                    dropped[ci] = true;
                }
            }
        }
        // Cross-stream waits: those the trace's times show; and those the
        // program's events made, in a graph (which has no launches to order
        // it) and wherever the trace carries CUDA sync events (read where
        // they name the wait, inferred from the calls' order helped by what
        // they say where not). The times alone miss a wait the GPU took
        // longer than their slack to pass: a double-buffered loop's first
        // step starts ~10 µs past its upload's end.
        let mut joins: HashMap<usize, Vec<usize>> = HashMap::new();
        for (op, w) in waited.iter().enumerate() {
            if let Waited::OtherStream { op: after } = w {
                joins.entry(op).or_default().push(*after);
            }
        }
        let named = if graph || trace.carries_sync_events() { event_joins(trace, calls, ops_of_call) } else { Vec::new() };
        for j in named.iter().chain(graph_joins) {
            joins.entry(j.op).or_default().push(j.after);
        }

        let mut sched_id = vec![usize::MAX; trace.gpu_ops.len()];
        let legacy = legacy_default_stream(trace);
        // Events, by number: the event recorded right after op i is i (what
        // another stream waits for); after a moved copy i, n + i.
        let n = trace.gpu_ops.len();
        let copied_event = |op: usize| n + op;
        let mut awaited: HashSet<usize> = joins.values().flatten().copied().collect();
        awaited.extend(moved.after.iter().flatten().copied());
        // For an op that stays: the moved copies it must follow.
        let mut follows_copies: HashMap<usize, Vec<usize>> = HashMap::new();
        for (copy, b) in moved.before.iter().enumerate() {
            if let Some(b) = b {
                follows_copies.entry(*b).or_default().push(copy);
            }
        }
        let mut ts = TracedSchedule {
            schedule: Schedule::new(),
            durations_us: Vec::new(),
            traced_op: Vec::new(),
            streams: Vec::new(),
            waited: waited.clone(),
            kernels_side_by_side: graph || *kernels_side_by_side,
            from_run_start: run_start.is_some(),
        };
        ts.schedule.issued_live = true;
        // Each issuing thread's time so far, and the lane and end of the call before.
        let mut cpus: HashMap<usize, f64> = HashMap::new();
        let mut before: Option<(usize, f64)> = None;
        // The profiler's cost per recorded CPU op, taken out of the CPU's
        // time between calls where known; the host's own work, which a
        // batch prepared ahead moves and a CUDA graph keeps.
        let per_op = pricing.profiler_us_per_cpu_op.as_ref().map_or(0.0, |p| p.0);
        let ahead = has(Change::PrepareAhead);
        let mut prepared = PreparedAhead::new(pricing, lane_of.len());
        for &ci in calls {
            let c = &trace.calls[ci];
            let lane = lane_of[&c.thread];
            // A thread's first call: its time counts from the call before it
            // (the first thread's, from the run's start).
            let cpu = cpus.entry(lane).or_insert(before.map_or(run_from_us.min(c.start_us), |b| b.1.min(c.start_us)));
            if let Some((other, end)) = before.filter(|&(l, _)| l != lane) {
                // Handed over from another thread: it goes on once that one's call is done.
                ts.schedule.host_joins(lane, other);
                *cpu = cpu.max(end);
            }
            before = Some((lane, c.end_us));
            let own = own_work.get(&ci).copied().unwrap_or_default();
            let own_untraced = own.untraced_us(per_op);
            let profiler_us = per_op * recorded.between(c.thread, *cpu, c.start_us) as f64;
            // The CPU's time before the call that is not its own work, the
            // profiler's cost out (its own work's is out already).
            let other = (c.start_us - *cpu - own.traced_us - (profiler_us - (own.traced_us - own_untraced)).max(0.0)).max(0.0);
            // A batch a worker prepares ahead: the own work before this
            // call, and the interpreter's time around it (the loader's
            // fetching and collating, untraced), which a worker runs too.
            let batch = ahead && own_untraced >= PREPARED_AHEAD_MIN_US;
            match (graph, batch) {
                (false, false) => ts.host(lane, "CPU work", other + own_untraced),
                (false, true) => {}
                // A graph launches for the CPU; its own work stays.
                (true, false) => ts.host(lane, "CPU work", own_untraced),
                (true, true) => {}
            }
            if batch {
                prepared.batch(&mut ts, other + own_untraced);
            }
            *cpu = cpu.max(c.start_us);
            if dropped[ci] {
                *cpu = cpu.max(c.end_us);
                continue;
            }
            let issued: &[usize] = ops_of_call.get(&ci).map_or(&[], |v| v.as_slice());
            let mut held_until: Option<(usize, f64)> = None;
            for &oi in issued {
                let o = &trace.gpu_ops[oi];
                let stream = if moved.moved[oi] { side_stream_of(o.stream, if is_download(oi) { Direction::D2h } else { Direction::H2d }) } else { o.stream };
                let key = (o.gpu, stream);
                let index = ts.streams.iter().position(|&k| k == key).unwrap_or_else(|| {
                    ts.streams.push(key);
                    let kind = if legacy == Some(key.1) { StreamKind::Legacy } else { StreamKind::NonBlocking };
                    ts.schedule.declare_stream(ts.streams.len() - 1, StreamDecl::new(kind, 0, o.gpu as usize));
                    ts.streams.len() - 1
                });
                // What it waits for on other streams, where already issued
                // (an event recorded later is never waited for).
                let events = joins.get(&oi).into_iter().flatten().copied().chain(moved.after[oi]).filter(|&e| sched_id[e] != usize::MAX);
                let copies = follows_copies.get(&oi).into_iter().flatten().copied().filter(|&c| sched_id[c] != usize::MAX).map(copied_event);
                for event in events.chain(copies).collect::<Vec<_>>() {
                    ts.schedule.stream_wait_event(index, event);
                }
                let id = ts.schedule.gpu_op(lane, index, op_kind(o.kind, o.gpu), &o.name, vec![]);
                ts.durations_us.push(duration[oi]);
                ts.traced_op.push(Some(oi));
                sched_id[oi] = id;
                if awaited.contains(&oi) {
                    ts.schedule.record_event(oi, index);
                }
                if moved.moved[oi] {
                    ts.schedule.record_event(copied_event(oi), index);
                }
                // A launch whose op started before it returned and ended about
                // when it returned held the CPU for it (a copy from pageable
                // memory, a synchronous copy). Not in a graph, which launches
                // its ops for the CPU all at once: a tiny kernel that ran
                // within its own eager launch held nothing there.
                if !graph && o.start_us < c.end_us && o.end_us <= c.end_us + WAIT_SLACK_US && !made_pinned[oi] {
                    held_until = Some((id, o.end_us));
                }
            }
            let call_time = c.end_us - c.start_us;
            if let Some((id, end)) = held_until {
                ts.schedule.host_learns(lane, id);
                ts.host(lane, &c.name, c.end_us - end);
            } else if synchronizes(&c.name) {
                // The op it waited for: the one issued before it that ended
                // last before it returned (a device sync waits for all).
                let waited_on = (0..trace.gpu_ops.len())
                    .filter(|&i| sched_id[i] != usize::MAX && trace.gpu_ops[i].end_us <= c.end_us + 1e-9)
                    .max_by(|&a, &b| trace.gpu_ops[a].end_us.total_cmp(&trace.gpu_ops[b].end_us));
                if c.name.starts_with("cudaDeviceSynchronize") || c.name.starts_with("cuCtxSynchronize") {
                    ts.schedule.host_wait_all(lane);
                } else if let Some(w) = waited_on {
                    ts.schedule.host_learns(lane, sched_id[w]);
                }
                let woke = waited_on.map_or(0.0, |w| (c.end_us - trace.gpu_ops[w].end_us).clamp(0.0, call_time));
                ts.host(lane, &c.name, woke);
            } else if graph {
                // Launched by the graph: no CPU time of its own.
            } else if issued.iter().any(|&oi| made_pinned[oi]) {
                ts.host(lane, &c.name, launch_cost.min(call_time));
            } else {
                ts.host(lane, &c.name, call_time);
            }
            if let Some(&previous) = read_late_after.get(&ci) {
                // Read a step late: the CPU waits for the previous download now.
                ts.schedule.host_learns(lane, sched_id[previous]);
            }
            *cpu = cpu.max(c.end_us);
        }
        prepared.finish(&mut ts);
        Ok(ts)
    }

    /// PyTorch's wait after a copy: for each call that issued a copy, the
    /// synchronizing call right after it on the thread, inside the same CPU
    /// op (the `cudaStreamSynchronize` of a blocking `.to()` or `.cpu()`):
    /// (the copy's call, the copy, the wait), in the thread's order.
    pub(super) fn waits_after_copies(&self) -> Vec<(usize, usize, usize)> {
        let trace = self.trace;
        let inside = enclosing_ops(trace);
        let mut found = Vec::new();
        for w in self.calls.windows(2) {
            let (copy_call, wait) = (w[0], w[1]);
            if trace.calls[copy_call].thread != trace.calls[wait].thread {
                continue;
            }
            let copy = self.ops_of_call.get(&copy_call).and_then(|ops| ops.iter().copied().find(|&o| trace.gpu_ops[o].kind.is_copy()));
            if let Some(copy) = copy {
                if synchronizes(&trace.calls[wait].name) && inside[wait].last().is_some() && inside[wait].last() == inside[copy_call].last() {
                    found.push((copy_call, copy, wait));
                }
            }
        }
        found
    }
}

/// The schedule of `trace` with `changes` applied, priced by `pricing`
/// ([`Replay::new`], then [`Replay::schedule`]).
pub fn schedule(trace: &Trace, changes: &[Change], pricing: &Pricing) -> Result<TracedSchedule, String> {
    Replay::new(trace)?.schedule(changes, pricing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{Call, CpuOp, GpuOp, Thread, TraceFormat};
    use crate::diagnose::link::LinkRates;

    /// `iters` steps of PyTorch's blocking `.to()` from pageable memory
    /// (`cudaMemcpyAsync` holding the CPU for the copy, then
    /// `cudaStreamSynchronize`), then a 2000 µs kernel, on stream 7: the
    /// pageable program of lab 10 in small.
    fn pageable(iters: usize, copy_us: f64, bytes: u64) -> Trace {
        let mut t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
        let (mut cpu, mut kernel_end, mut k) = (0.0f64, 0.0f64, 0u64);
        let mut call = |t: &mut Trace, name: &str, s: f64, e: f64| {
            k += 1;
            t.calls.push(Call { name: name.into(), thread: 0, start_us: s, end_us: e, correlation: Some(k) });
            k
        };
        for _ in 0..iters {
            let copy_start = (cpu + 12.0).max(kernel_end + 2.0);
            let copy_end = copy_start + copy_us;
            t.cpu_ops.push(CpuOp { name: "aten::to".into(), thread: 0, start_us: cpu, end_us: copy_end + 8.0, annotation: false });
            let c = call(&mut t, "cudaMemcpyAsync", cpu + 10.0, copy_end - 5.0);
            let kind = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) };
            t.gpu_ops.push(GpuOp {
                gpu: 0,
                stream: 7,
                kind,
                name: "Memcpy HtoD (Pageable -> Device)".into(),
                start_us: copy_start,
                end_us: copy_end,
                correlation: Some(c),
                bytes: Some(bytes),
            });
            call(&mut t, "cudaStreamSynchronize", copy_end - 4.0, copy_end + 6.0);
            let c = call(&mut t, "cudaLaunchKernel", copy_end + 12.0, copy_end + 16.0);
            t.gpu_ops.push(GpuOp {
                gpu: 0,
                stream: 7,
                kind: GpuOpKind::Kernel,
                name: "gemm".into(),
                start_us: copy_end + 18.0,
                end_us: copy_end + 2018.0,
                correlation: Some(c),
                bytes: None,
            });
            kernel_end = copy_end + 2018.0;
            cpu = copy_end + 30.0;
        }
        t.sort();
        t
    }

    #[test]
    fn the_replay_of_a_trace_as_traced_gives_back_its_window() {
        let t = pageable(5, 3000.0, 60_000_000);
        let traced = t.window_us().1 - t.window_us().0;
        let ts = schedule(&t, &[], &Pricing::default()).unwrap();
        let predicted = predict(&ts);
        assert!((predicted / traced - 1.0).abs() < 0.01, "replayed {predicted} µs against {traced} traced");
        // Each kernel waited for its launch (after the sync); each copy after
        // the first, for the kernel before it on the stream.
        assert!(matches!(ts.waited[1], Waited::Launch { .. }), "{:?}", ts.waited);
        assert_eq!(ts.waited[2], Waited::StreamOrder { op: 1 });
        assert_eq!(ts.streams, [(0, 7)]);
    }

    #[test]
    fn pinned_instead_of_pageable_is_priced_at_the_links_pinned_rate() {
        let t = pageable(5, 3000.0, 60_000_000);
        let rates = LinkRates {
            gpu_name: "Test GPU".into(),
            source: "data/test/bandwidth.json".into(),
            points: vec![crate::diagnose::link::LinkPoint { host: HostMemory::Pinned, direction: Direction::H2d, bytes: 64 << 20, gbps: 50.0 }],
        };
        let ts = schedule(&t, &[Change::Pinned], &Pricing { rates: Some(rates), ..Pricing::default() }).unwrap();
        // 60 MB at 50 GB/s: 1200 µs a copy, issued in a 4 µs launch (the
        // median kernel launch) that no longer holds the CPU, and PyTorch's
        // wait after it (in the same `aten::to`) gone: the CPU runs ahead,
        // each kernel waits for its copy on the stream and each copy for
        // the kernel before it. So the GPU runs 1200 + 2000 µs a step,
        // back to back, with the trace's gap between queued ops after each
        // kernel a copy was queued behind (the first four).
        let predicted = predict(&ts);
        let gap = Replay::new(&t).unwrap().queued_gap_us();
        let want = 5.0 * (1200.0 + 2000.0) + 4.0 * gap;
        assert!((predicted - want).abs() < 1e-6 * want, "predicted {predicted} µs, expected {want}");
        assert!(predicted < 0.75 * (t.window_us().1 - t.window_us().0), "pinned copies are faster");
        // With no recording, the trace must have pinned copies to price by.
        let e = schedule(&t, &[Change::Pinned], &Pricing::default()).unwrap_err();
        assert!(e.contains("no pinned H2D rate"), "{e}");
    }

    /// `iters` steps of a 100 µs kernel, then its result copied into pinned
    /// memory with a blocking `copy_` (`cudaMemcpyAsync`, then
    /// `cudaStreamSynchronize` in the same `aten::copy_`): a 50 µs download
    /// on stream 7 that the CPU waits for before the next step; the GPU
    /// idles 11 µs between a download and the next kernel.
    fn pinned_downloads(iters: usize) -> Trace {
        let mut t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
        let (mut c, mut gpu_free, mut k) = (0.0f64, 0.0f64, 0u64);
        let down = GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pinned) };
        for _ in 0..iters {
            let s = (c + 5.0).max(gpu_free);
            for (name, call, kind, (from, to), (gpu_from, gpu_to)) in [
                ("k", "cudaLaunchKernel", GpuOpKind::Kernel, (c, c + 4.0), (s, s + 100.0)),
                ("d", "cudaMemcpyAsync", down, (c + 7.0, c + 11.0), (s + 100.0, s + 150.0)),
            ] {
                k += 1;
                t.calls.push(Call { name: call.into(), thread: 0, start_us: from, end_us: to, correlation: Some(k) });
                let op = GpuOp { gpu: 0, stream: 7, kind, name: name.into(), start_us: gpu_from, end_us: gpu_to, correlation: Some(k), bytes: Some(1 << 20) };
                t.gpu_ops.push(op);
            }
            t.calls.push(Call { name: "cudaStreamSynchronize".into(), thread: 0, start_us: c + 12.0, end_us: s + 153.0, correlation: None });
            t.cpu_ops.push(CpuOp { name: "aten::copy_".into(), thread: 0, start_us: c + 6.0, end_us: s + 155.0, annotation: false });
            gpu_free = s + 150.0;
            c = s + 156.0;
        }
        t.sort();
        t
    }

    #[test]
    fn downloads_read_a_step_late_and_on_a_stream_of_their_own_let_the_kernels_run_on() {
        let t = pinned_downloads(3);
        let at = |changes: &[Change]| predict(&schedule(&t, changes, &Pricing::default()).unwrap());
        let traced = at(&[]);
        // As traced: 150 µs a step and the 11 µs gaps less the kernel's
        // launch latency (the replay starts a kernel as it is issued).
        assert!((traced - (3.0 * 150.0 + 2.0 * 6.0)).abs() < 1e-6, "{traced}");
        // Read a step late: the CPU runs on, and the stream runs kernel,
        // download, kernel, ... back to back.
        assert!((at(&[Change::ReadLate]) - 3.0 * 150.0).abs() < 1e-6);
        // Also on a stream of their own: each download under the next
        // kernel, the last one after the last kernel.
        assert!((at(&[Change::DownloadStream, Change::ReadLate]) - (3.0 * 100.0 + 50.0)).abs() < 1e-6);
        // A stream of their own while the CPU waits for each: nothing gained.
        assert!((at(&[Change::DownloadStream]) - traced).abs() < 1e-6);
        assert_eq!(super::super::whatif::results_waited_at_once(&t), 3);
    }

    /// `kernels` 1 µs kernels dealt out in turn over `streams` streams
    /// from stream 7, each launched eagerly 6 µs after the one before and
    /// run within its own launch (a tiny kernel ends before its launch
    /// returns: as traced, it held the CPU).
    fn tiny_kernels(kernels: u64, streams: u64) -> Trace {
        let mut t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
        for k in 0..kernels {
            let c = 6.0 * k as f64;
            t.calls.push(Call { name: "cudaLaunchKernel".into(), thread: 0, start_us: c, end_us: c + 4.0, correlation: Some(k + 1) });
            let stream = 7 + k % streams;
            let op = GpuOp {
                gpu: 0,
                stream,
                kind: GpuOpKind::Kernel,
                name: "tiny".into(),
                start_us: c + 2.0,
                end_us: c + 3.0,
                correlation: Some(k + 1),
                bytes: None,
            };
            t.gpu_ops.push(op);
        }
        t.sort();
        t
    }

    /// Two launches of a traced two-stream graph: stream 7 runs two 1 µs
    /// kernels 0.5 µs apart, then its branch on stream 8 one of 50 µs;
    /// the second launch (issued while the first runs) starts 9 µs after
    /// the first one's branch ends, later than the times' slack.
    fn two_graph_launches() -> Trace {
        let mut t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
        for (g, base) in [(0u64, 10.0), (1, 72.0)] {
            let launch = 6.0 * g as f64;
            t.calls.push(Call { name: "cudaGraphLaunch".into(), thread: 0, start_us: launch, end_us: launch + 5.0, correlation: Some(g + 1) });
            for (stream, start, end) in [(7, 0.0, 1.0), (7, 1.5, 2.5), (8, 3.0, 53.0)] {
                let op = GpuOp {
                    gpu: 0,
                    stream,
                    kind: GpuOpKind::Kernel,
                    name: "branch".into(),
                    start_us: base + start,
                    end_us: base + end,
                    correlation: Some(g + 1),
                    bytes: None,
                };
                t.gpu_ops.push(op);
            }
        }
        t.sort();
        t
    }

    #[test]
    fn a_traced_graph_launch_waits_for_every_branch_of_the_graph_before_it() {
        let t = two_graph_launches();
        let r = Replay::new(&t).unwrap();
        // The second graph's first op (stream 7) follows the first graph's
        // branch (stream 8); its stream-8 op follows it in stream order.
        let joins = graph_launch_joins(&t, &r.calls, &r.ops_of_call);
        assert_eq!(joins, vec![crate::diagnose::event_joins::Join { op: 3, after: 2 }]);
        // Replayed as traced: off only by the 9 µs the GPU took to pass
        // from one graph to the next and the 0.5 µs its branch took to
        // start after the fork (stream order alone would start the second
        // graph 50 µs early, under the first one's branch).
        let traced = t.gpu_ops[5].end_us - t.gpu_ops[0].start_us;
        let replayed = predict(&schedule(&t, &[], &Pricing::default()).unwrap());
        assert!((traced - replayed - 9.5).abs() < 1e-6, "replayed {replayed} µs against {traced} traced");
    }

    /// The replay of `t` as one CUDA graph, priced by `graph`.
    fn in_a_graph(t: &Trace, graph: GraphPrice) -> f64 {
        predict(&schedule(t, &[Change::CudaGraph], &Pricing { graph: Some(graph), ..Pricing::default() }).unwrap())
    }

    #[test]
    fn a_graph_runs_its_kernels_back_to_back_each_at_least_the_graphs_least_kernel() {
        // Eight kernels on one stream.
        let t = tiny_kernels(8, 1);
        let graph = |least: Option<f64>| {
            in_a_graph(&t, GraphPrice { gap_us: 0.5, least_kernel_us: least, branch_spacing_us: Vec::new(), from: "(a synthetic gap)".into() })
        };
        // In a graph nothing holds the CPU: the kernels run back to back,
        // each followed by the gap; one shorter than the graph's least
        // kernel takes that long.
        assert!((graph(None) - 8.0 * 1.5).abs() < 1e-6, "{}", graph(None));
        assert!((graph(Some(2.0)) - 8.0 * 2.5).abs() < 1e-6, "{}", graph(Some(2.0)));
        assert!((graph(Some(0.5)) - 8.0 * 1.5).abs() < 1e-6, "a kernel longer than the least keeps its time");
        // Timed untraced, one branch's small kernels 2 µs apart: each takes that.
        let at = in_a_graph(
            &t,
            GraphPrice { gap_us: 0.5, least_kernel_us: Some(4.0), branch_spacing_us: vec![(1, 2.0), (4, 3.0)], from: "(a synthetic gap)".into() },
        );
        assert!((at - 8.0 * 2.0).abs() < 1e-6, "{at}");
    }

    #[test]
    fn a_graphs_branches_side_by_side_start_their_kernels_no_closer_than_the_calibrated_spacing() {
        // Four streams of eight kernels each (issue-bound eagerly: 6 µs a launch).
        let t = tiny_kernels(32, 4);
        let graph = |branch_spacing_us: Vec<(usize, f64)>| {
            in_a_graph(&t, GraphPrice { gap_us: 0.5, least_kernel_us: None, branch_spacing_us, from: "(a synthetic gap)".into() })
        };
        // No spacing calibrated: the branches run side by side, each
        // kernel a kernel and the gap after the one before on its stream.
        assert!((graph(Vec::new()) - 8.0 * 1.5).abs() < 1e-6, "{}", graph(Vec::new()));
        // Four branches 3 µs apart each: 8 kernels a branch, 24 µs.
        let calibrated = vec![(1, 1.5), (2, 2.0), (4, 3.0), (8, 6.0)];
        assert!((graph(calibrated.clone()) - 8.0 * 3.0).abs() < 1e-6, "{}", graph(calibrated));
        // A spacing under a kernel and the gap changes nothing.
        assert!((graph(vec![(1, 1.5), (4, 1.2)]) - 8.0 * 1.5).abs() < 1e-6);
    }
}
