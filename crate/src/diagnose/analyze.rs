//! What a trace says about overlap: for the traced window (the first GPU
//! op's start to the last one's end), each GPU's and each stream's busy and
//! idle time, each kind of copy (how many, how big, how fast, how much of
//! it hidden under kernels), the CPU's synchronizing calls and the GPU idle
//! each one caused, work on the legacy default stream, and stretches where
//! the GPU waited for the CPU to launch. Every finding names the call
//! behind it and the time it costs, largest first.

use super::events::{Call, Direction, GpuOpKind, HostMemory, Trace, TraceFormat};
use super::intervals::{covered, total, union};
use super::link::{LinkRates, RecordedRate};
use super::read::issues_gpu_work;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The legacy default (NULL) stream's number in a torch.profiler trace.
/// Kineto writes CUPTI's stream id as each GPU event's `args.stream` and
/// `tid` (`CuptiActivity.cpp`, `output_json.cpp`); CUPTI numbers the
/// streams of a context as it meets them, and the context's NULL stream
/// comes out as 7 in PyTorch's traces on CUDA 11 to 13 (every op PyTorch
/// issues on its default stream, which is the NULL stream, sits on "stream
/// 7"; HTA's critical-path analysis draws its stream syncs on "stream 7").
/// It is a convention of CUPTI's numbering, not a promise: where the trace
/// holds a synchronous `cudaMemcpy`, which always runs on the legacy
/// default stream, that copy's stream is taken instead
/// ([`legacy_default_stream`]).
pub const LEGACY_DEFAULT_STREAM: u64 = 7;

/// Idle gaps no longer than this between GPU ops the CPU issued late are
/// what launching costs (an eager PyTorch op takes some 5-30 µs of Python,
/// dispatch and `cudaLaunchKernel`); longer ones are the CPU doing other work.
pub const ISSUE_GAP_MAX_US: f64 = 50.0;

/// A run of at least this many such gaps in a row is an issue-bound stretch.
pub const ISSUE_BOUND_MIN_GAPS: usize = 16;

/// Findings worth less than this are left out (µs): noise, not a cause.
pub const FINDING_MIN_US: f64 = 1.0;

/// The legacy default stream of a torch.profiler trace: the stream of a
/// synchronous `cudaMemcpy`'s copy where there is one, else
/// [`LEGACY_DEFAULT_STREAM`]. `None` for the course's own traces, whose
/// streams are the lab's.
pub fn legacy_default_stream(trace: &Trace) -> Option<u64> {
    if trace.format != Some(TraceFormat::Kineto) {
        return None;
    }
    let sync_copies: HashSet<u64> = trace.calls.iter().filter(|c| c.name == "cudaMemcpy").filter_map(|c| c.correlation).collect();
    Some(trace.gpu_ops.iter().find(|o| o.correlation.is_some_and(|c| sync_copies.contains(&c))).map_or(LEGACY_DEFAULT_STREAM, |o| o.stream))
}

/// The call that launched the GPU work of each correlation id: the
/// runtime call that issues GPU work, where a driver call shares its id,
/// else the first call with it. Indices into `trace.calls`.
pub fn launch_calls(trace: &Trace) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    for (i, c) in trace.calls.iter().enumerate() {
        if let Some(k) = c.correlation {
            if issues_gpu_work(&c.name) || !m.contains_key(&k) {
                m.insert(k, i);
            }
        }
    }
    m
}

/// Whether a CUDA call makes the CPU wait for the GPU: the explicit
/// synchronizations, the synchronous copies, and the frees that
/// synchronize the device.
pub fn synchronizes(call: &str) -> bool {
    let explicit = [
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cudaFree",
        "cudaFreeHost",
        "cuMemFree",
        "cuMemFree_v2",
        "cuMemFreeHost",
    ];
    explicit.contains(&call) || ((call.starts_with("cudaMemcpy") || call.starts_with("cuMemcpy")) && !call.contains("Async"))
}

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
    /// The legacy default (NULL) stream (see [`LEGACY_DEFAULT_STREAM`]).
    pub legacy_default: bool,
    pub kernels: usize,
    pub copies: usize,
    pub memsets: usize,
    /// The union of its ops, µs.
    pub busy_us: f64,
    /// The window less its busy time, µs.
    pub idle_us: f64,
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

/// Everything `overlap-lab diagnose` reports about one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    /// The file, as outputs name files.
    pub file: String,
    pub format: TraceFormat,
    pub window: Window,
    pub gpus: Vec<GpuSummary>,
    pub syncs: SyncSummary,
    /// Largest cost first. Costs may overlap: one idle gap can have more
    /// than one cause.
    pub findings: Vec<Finding>,
    /// The fixes the findings suggest, predicted on the queue model
    /// ([`super::whatif`]); set by whoever holds the machine's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if: Option<super::whatif::WhatIf>,
    /// Why the trace could not be replayed for the what-if, where it was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if_error: Option<String>,
}

/// Where each CUDA call sits: the CPU ops around it, outermost first.
pub(crate) fn enclosing_ops(trace: &Trace) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); trace.calls.len()];
    let mut per_thread: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (i, op) in trace.cpu_ops.iter().enumerate() {
        per_thread.entry(op.thread).or_default().0.push(i);
    }
    for (i, c) in trace.calls.iter().enumerate() {
        per_thread.entry(c.thread).or_default().1.push(i);
    }
    for (ops, calls) in per_thread.values() {
        // Both lists are sorted by start (ops enclosing first); a stack holds
        // the ops open at each call.
        let mut stack: Vec<usize> = Vec::new();
        let mut next_op = 0;
        for &ci in calls {
            let c = &trace.calls[ci];
            while next_op < ops.len() && trace.cpu_ops[ops[next_op]].start_us <= c.start_us {
                let o = ops[next_op];
                while stack.last().is_some_and(|&t| trace.cpu_ops[t].end_us < trace.cpu_ops[o].start_us) {
                    stack.pop();
                }
                stack.push(o);
                next_op += 1;
            }
            while stack.last().is_some_and(|&t| trace.cpu_ops[t].end_us < c.start_us) {
                stack.pop();
            }
            out[ci] = stack.iter().copied().filter(|&o| trace.cpu_ops[o].end_us >= c.end_us).collect();
        }
    }
    out
}

/// Analyses a read trace. `file` names it in the report; `links` are the
/// recorded link rates at hand (each GPU's copies are set beside the one
/// whose GPU name matches).
pub fn diagnose(trace: &Trace, file: &str, links: &[LinkRates]) -> Diagnosis {
    let (start_us, end_us) = trace.window_us();
    let window = Window { start_us, end_us };
    let legacy = legacy_default_stream(trace);
    let launch_of = launch_calls(trace);
    // The call that launched GPU op `oi`, where the trace has it.
    let launch = |oi: usize| trace.gpu_ops[oi].correlation.and_then(|k| launch_of.get(&k)).copied();
    let enclosing = enclosing_ops(trace);
    let call_ref = |ci: usize| {
        let c = &trace.calls[ci];
        let mut name: Vec<&str> = enclosing[ci].iter().map(|&o| &trace.cpu_ops[o]).filter(|o| !o.annotation).map(|o| o.name.as_str()).collect();
        name.push(&c.name);
        CallRef {
            name: name.join(" > "),
            ts_us: c.start_us,
            correlation: c.correlation,
            thread: trace.threads.get(c.thread).map_or(String::new(), |t| t.to_string()),
        }
    };
    // The launching call of an op, or where there is none (the course's
    // traces) the op itself.
    let op_ref = |oi: usize| {
        let o = &trace.gpu_ops[oi];
        match launch(oi) {
            Some(ci) => call_ref(ci),
            None => CallRef { name: o.name.clone(), ts_us: o.start_us, correlation: o.correlation, thread: format!("GPU {} stream {}", o.gpu, o.stream) },
        }
    };

    let mut gpus = Vec::new();
    let mut findings = Vec::new();
    let sync_calls: Vec<usize> = (0..trace.calls.len()).filter(|&i| synchronizes(&trace.calls[i].name)).collect();
    let mut sync_cost = vec![0.0; sync_calls.len()];
    // The GPU each sync left idle (the last one, where it drained several).
    let mut sync_gpu = vec![0u32; sync_calls.len()];
    for gpu in trace.gpus() {
        let ops: Vec<usize> = (0..trace.gpu_ops.len()).filter(|&i| trace.gpu_ops[i].gpu == gpu).collect();
        let span = |i: &usize| (trace.gpu_ops[*i].start_us, trace.gpu_ops[*i].end_us);
        let busy = union(ops.iter().map(span).collect());
        let kernels = union(ops.iter().filter(|&&i| trace.gpu_ops[i].kind == GpuOpKind::Kernel).map(span).collect());
        let name = trace.gpu_name(gpu).map(String::from);
        let link = name.as_deref().and_then(|n| links.iter().find(|l| l.matches(n)));

        // Streams.
        let mut by_stream: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for &i in &ops {
            by_stream.entry(trace.gpu_ops[i].stream).or_default().push(i);
        }
        let streams: Vec<StreamSummary> = by_stream
            .iter()
            .map(|(&stream, v)| {
                let busy_us = total(&union(v.iter().map(span).collect()));
                let count = |f: fn(GpuOpKind) -> bool| v.iter().filter(|&&i| f(trace.gpu_ops[i].kind)).count();
                StreamSummary {
                    stream,
                    legacy_default: legacy == Some(stream),
                    kernels: count(|k| k == GpuOpKind::Kernel),
                    copies: count(GpuOpKind::is_copy),
                    memsets: count(|k| k == GpuOpKind::Memset),
                    busy_us,
                    idle_us: window.duration_us() - busy_us,
                }
            })
            .collect();

        // Copies, by kind.
        let mut by_kind: BTreeMap<(Direction, Option<HostMemory>), Vec<usize>> = BTreeMap::new();
        for &i in &ops {
            if let GpuOpKind::Copy { direction, host } = trace.gpu_ops[i].kind {
                by_kind.entry((direction, host)).or_default().push(i);
            }
        }
        let hidden = |i: usize| covered(&kernels, span(&i));
        let mut copies = Vec::new();
        for ((direction, host), v) in &by_kind {
            let time_us: f64 = v.iter().map(|&i| trace.gpu_ops[i].duration_us()).sum();
            let bytes: Option<u64> = v.iter().map(|&i| trace.gpu_ops[i].bytes).sum();
            let hidden_us: f64 = v.iter().map(|&i| hidden(i)).sum();
            let mut sizes: Vec<u64> = v.iter().filter_map(|&i| trace.gpu_ops[i].bytes).collect();
            sizes.sort_unstable();
            let median = sizes.get(sizes.len() / 2).copied();
            // The recording's rate of copies from `h` memory the same way, at their median size.
            let rate_of = |h: HostMemory| match (link, median) {
                (Some(l), Some(m)) if direction.crosses_host_link() => l.rate(h, *direction, m),
                _ => None,
            };
            let recorded = host.and_then(rate_of);
            let recorded_pinned = if *host == Some(HostMemory::Pageable) { rate_of(HostMemory::Pinned) } else { None };
            copies.push(CopyGroup {
                direction: *direction,
                host: *host,
                count: v.len(),
                bytes,
                time_us,
                gbps: bytes.filter(|_| time_us > 0.0).map(|b| b as f64 / time_us / 1e3),
                recorded,
                recorded_pinned,
                hidden_us,
                exposed_us: time_us - hidden_us,
            });
        }

        // Findings about copies.
        for g in copies.iter().filter(|g| g.host == Some(HostMemory::Pageable)) {
            let v = &by_kind[&(g.direction, g.host)];
            let rates: Vec<String> = [(g.recorded, "pageable"), (g.recorded_pinned, "pinned")]
                .iter()
                .filter_map(|(r, what)| r.map(|r| format!("{what} {:.1} GB/s at {}", r.gbps, crate::units::Bytes(r.at_bytes))))
                .collect();
            let recorded = if rates.is_empty() { String::new() } else { format!(" (this machine's lab 1 recording: {})", rates.join(", ")) };
            findings.push(Finding {
                cause: Cause::PageableCopies,
                gpu,
                call: op_ref(v[0]),
                count: g.count,
                cost_us: g.exposed_us,
                text: format!(
                    "{} from pageable memory{}{}{}: the driver stages pageable memory through a pinned buffer while the CPU waits, and the copy cannot start early; {} of their {} ran with no kernel beside them",
                    counted(g.count, &format!("{} copy", g.direction), &format!("{} copies", g.direction)),
                    g.bytes.map_or(String::new(), |b| format!(", {}", crate::units::Bytes(b))),
                    g.gbps.map_or(String::new(), |r| format!(", at {} GB/s", gbps(r))),
                    recorded,
                    us(g.exposed_us),
                    us(g.time_us),
                ),
            });
        }
        for (&stream, v) in &by_stream {
            let page_locked: Vec<usize> =
                v.iter().copied().filter(|&i| matches!(trace.gpu_ops[i].kind, GpuOpKind::Copy { host, direction } if host != Some(HostMemory::Pageable) && direction.crosses_host_link())).collect();
            if page_locked.is_empty() {
                continue;
            }
            // Each copy's time with no kernel beside it; a copy counts as
            // exposed from half a µs on (timestamps are whole ns, and a copy
            // issued with its kernel starts a little before it).
            let exposed_each: Vec<(usize, f64)> =
                page_locked.iter().map(|&i| (i, trace.gpu_ops[i].duration_us() - hidden(i))).filter(|&(_, e)| e >= 0.5).collect();
            let Some(&(first, _)) = exposed_each.first() else { continue };
            let exposed: f64 = exposed_each.iter().map(|(_, e)| e).sum();
            let has_kernels = v.iter().any(|&i| trace.gpu_ops[i].kind == GpuOpKind::Kernel);
            let legacy_note = if legacy == Some(stream) { " (the legacy default stream)" } else { "" };
            let before_any_kernel = kernels.first().is_none_or(|k| trace.gpu_ops[first].end_us <= k.0);
            let (cause, why) = if has_kernels {
                (Cause::CopiesShareStreamWithKernels, "they share the stream with kernels, so each copy waits for the kernel before it and holds back the one after: put them on a stream of their own")
            } else if exposed_each.len() == 1 && before_any_kernel {
                (Cause::ExposedCopies, "it is the first, before any kernel had work: the pipeline's fill, which no schedule hides")
            } else {
                (
                    Cause::ExposedCopies,
                    "their stream runs only copies, yet no kernel ran beside them then: the compute stream waited for them, or had nothing queued",
                )
            };
            findings.push(Finding {
                cause,
                gpu,
                call: op_ref(first),
                count: exposed_each.len(),
                cost_us: exposed,
                text: format!(
                    "{} of {} on stream {stream}{legacy_note} ran {} with no kernel beside {}: {why}",
                    exposed_each.len(),
                    counted(page_locked.len(), "copy", "copies"),
                    us(exposed),
                    if exposed_each.len() == 1 { "it" } else { "them" }
                ),
            });
        }

        // Idle gaps: each between one busy stretch's end and the next op.
        let mut gaps: Vec<(f64, f64, usize)> = Vec::new();
        let mut busy_end = f64::NEG_INFINITY;
        for &i in &ops {
            let o = &trace.gpu_ops[i];
            if busy_end.is_finite() && o.start_us > busy_end {
                gaps.push((busy_end, o.start_us, i));
            }
            busy_end = busy_end.max(o.end_us);
        }
        let longest_sync = sync_calls.iter().map(|&s| trace.calls[s].end_us - trace.calls[s].start_us).fold(0.0, f64::max);
        let mut blamed = vec![false; gaps.len()];
        for (g, &(a, b, next)) in gaps.iter().enumerate() {
            let Some(li) = launch(next) else { continue };
            let l: &Call = &trace.calls[li];
            // A sync the CPU was blocked in when this GPU ran dry, and after
            // whose start the CPU issued the op that ended the gap.
            let upto = sync_calls.partition_point(|&s| trace.calls[s].start_us <= a);
            let mut best: Option<usize> = None;
            for k in (0..upto).rev() {
                let s = &trace.calls[sync_calls[k]];
                if s.start_us < a - longest_sync {
                    break;
                }
                if s.end_us >= a && l.start_us >= s.start_us {
                    let better = match best {
                        None => true,
                        Some(b) => s.thread == l.thread && trace.calls[sync_calls[b]].thread != l.thread,
                    };
                    if better {
                        best = Some(k);
                    }
                }
            }
            if let Some(k) = best {
                sync_cost[k] += b - a;
                sync_gpu[k] = gpu;
                blamed[g] = true;
            }
        }

        // Issue-bound stretches: runs of short gaps, each ended by an op
        // the CPU had not finished launching when the GPU ran dry.
        let starved = |g: usize| {
            let (a, b, next) = gaps[g];
            !blamed[g] && b - a <= ISSUE_GAP_MAX_US && launch(next).is_some_and(|li| trace.calls[li].end_us >= a)
        };
        // Every stretch of one GPU becomes one finding: a loop of tiny ops
        // is one cause, however often a longer op breaks its run.
        // (idle µs, ops, their GPU time, launches and their first and last times, the first op)
        let mut stretches: Vec<(f64, usize, f64, usize, f64, f64, usize)> = Vec::new();
        let mut g = 0;
        while g < gaps.len() {
            if !starved(g) {
                g += 1;
                continue;
            }
            let first = g;
            while g < gaps.len() && starved(g) {
                g += 1;
            }
            let run = &gaps[first..g];
            if run.len() >= ISSUE_BOUND_MIN_GAPS {
                let idle: f64 = run.iter().map(|(a, b, _)| b - a).sum();
                let launches: Vec<f64> = run.iter().filter_map(|&(_, _, n)| launch(n)).map(|li| trace.calls[li].start_us).collect();
                let ran: f64 = run.iter().map(|&(_, _, n)| trace.gpu_ops[n].duration_us()).sum();
                let (l0, l1) = (launches.first().copied().unwrap_or(0.0), launches.last().copied().unwrap_or(0.0));
                stretches.push((idle, run.len(), ran, launches.len(), l0, l1, run[0].2));
            }
        }
        // The finding names the longest stretch's first launch, one of eager
        // launches where there are such (a graph's own stretches are no
        // case for a graph, `whatif` reads from the call).
        let by_graph = |s: &(f64, usize, f64, usize, f64, f64, usize)| op_ref(s.6).name.ends_with("cudaGraphLaunch");
        let eager = stretches.iter().filter(|s| !by_graph(s)).max_by(|a, b| a.0.total_cmp(&b.0)).copied();
        if let Some(longest) = eager.or_else(|| stretches.iter().max_by(|a, b| a.0.total_cmp(&b.0)).copied()) {
            let idle: f64 = stretches.iter().map(|s| s.0).sum();
            let ops: usize = stretches.iter().map(|s| s.1).sum();
            let mean_op = stretches.iter().map(|s| s.2).sum::<f64>() / ops as f64;
            // The launch interval within stretches (the time between them is not the CPU's launching).
            let (spans, steps) = stretches.iter().filter(|s| s.3 > 1).fold((0.0, 0usize), |(t, n), s| (t + s.5 - s.4, n + s.3 - 1));
            let every = (steps > 0).then(|| spans / steps as f64);
            let stretched = if stretches.len() == 1 {
                String::new()
            } else {
                format!(" in {} stretches (the one named: {} ops, {} idle)", stretches.len(), longest.1 + 1, us(longest.0))
            };
            findings.push(Finding {
                cause: Cause::IssueBound,
                gpu,
                call: op_ref(longest.6),
                count: ops + stretches.len(),
                cost_us: idle,
                text: format!(
                    "{} ops of {mean_op:.1} µs on average{stretched}{}: the GPU waited {} in all for the CPU to launch the next (fewer, larger ops or a CUDA graph would cut it)",
                    ops + stretches.len(),
                    every.map_or(String::new(), |e| format!(", launched every {e:.1} µs")),
                    us(idle)
                ),
            });
        }

        let busy_us = total(&busy);
        gpus.push(GpuSummary { gpu, name, busy_us, idle_us: window.duration_us() - busy_us, streams, copies, link_source: link.map(|l| l.source.clone()) });
    }

    // Syncs, grouped by where they were called.
    // The outermost CPU op (not an annotation) around call `ci`.
    let outermost_op = |ci: usize| enclosing[ci].iter().copied().find(|&x| !trace.cpu_ops[x].annotation);
    let reads_to_host: HashMap<usize, u64> = {
        // The outermost CPU op of every call whose copy went to the host.
        let mut m = HashMap::new();
        for (oi, o) in trace.gpu_ops.iter().enumerate() {
            if let (GpuOpKind::Copy { direction: Direction::D2h, .. }, Some(ci)) = (o.kind, launch(oi)) {
                if let Some(outer) = outermost_op(ci) {
                    *m.entry(outer).or_insert(0) += o.bytes.unwrap_or(0);
                }
            }
        }
        m
    };
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (k, &ci) in sync_calls.iter().enumerate() {
        groups.entry(call_ref(ci).name).or_default().push(k);
    }
    for (name, ks) in &groups {
        let cost: f64 = ks.iter().map(|&k| sync_cost[k]).sum();
        if cost < FINDING_MIN_US {
            continue;
        }
        let costly = ks.iter().filter(|&&k| sync_cost[k] > 0.0).count();
        let worst = *ks.iter().max_by(|&&a, &&b| sync_cost[a].total_cmp(&sync_cost[b])).expect("a group has a call");
        let ci = sync_calls[worst];
        let read = outermost_op(ci).and_then(|o| reads_to_host.get(&o).map(|b| (o, b))).map(|(o, b)| {
            format!(
                "a read to the host ({}-style: {} copied back, then a wait): ",
                if trace.cpu_ops[o].name.contains("item") { ".item()" } else { ".cpu()" },
                crate::units::Bytes(*b)
            )
        });
        let gpu = sync_gpu[worst];
        findings.push(Finding {
            cause: Cause::Sync,
            gpu,
            call: call_ref(ci),
            count: ks.len(),
            cost_us: cost,
            text: format!(
                "{}{costly} of {} of {name} left the GPU idle, {} in all (the costliest {}): the CPU waited for the GPU to drain, and the GPU then waited for the CPU to issue more",
                read.unwrap_or_default(),
                counted(ks.len(), "call", "calls"),
                us(cost),
                us(sync_cost[worst])
            ),
        });
    }
    let syncs = SyncSummary { calls: sync_calls.len(), costly: sync_cost.iter().filter(|&&c| c > 0.0).count(), cost_us: sync_cost.iter().sum() };
    findings.retain(|f| f.cost_us >= FINDING_MIN_US);
    findings.sort_by(|a, b| b.cost_us.total_cmp(&a.cost_us));
    Diagnosis { file: file.to_string(), format: trace.format.unwrap_or(TraceFormat::Kineto), window, gpus, syncs, findings, what_if: None, what_if_error: None }
}

/// A rate in GB/s with the digits it needs: "53.0", "0.0021".
pub fn gbps(r: f64) -> String {
    if r >= 1.0 || r <= 0.0 {
        format!("{r:.1}")
    } else {
        let digits = 1 + (-r.log10().floor()) as usize;
        format!("{r:.digits$}")
    }
}

/// "1 copy", "3 copies".
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A time in µs as the report prints it (`3.36 ms`, `12.0 µs`).
pub fn us(t: f64) -> String {
    crate::units::fmt_ms(t / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{CpuOp, GpuOp, Thread};

    /// A trace under construction: GPU 0, one CPU thread.
    struct Build {
        t: Trace,
        next: u64,
    }

    impl Build {
        fn new() -> Build {
            let t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
            Build { t, next: 1 }
        }
        /// `call` on the CPU over `cpu`, issuing `kind` on `stream` over `gpu_span`.
        fn launch(&mut self, call: &str, cpu: (f64, f64), stream: u64, kind: GpuOpKind, gpu_span: (f64, f64), bytes: Option<u64>) -> &mut Build {
            let k = self.next;
            self.next += 1;
            self.t.calls.push(Call { name: call.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, correlation: Some(k) });
            let name = match kind {
                GpuOpKind::Copy { .. } => "Memcpy".into(),
                _ => "kernel".into(),
            };
            self.t.gpu_ops.push(GpuOp { gpu: 0, stream, kind, name, start_us: gpu_span.0, end_us: gpu_span.1, correlation: Some(k), bytes });
            self
        }
        fn call(&mut self, call: &str, cpu: (f64, f64)) -> &mut Build {
            let k = self.next;
            self.next += 1;
            self.t.calls.push(Call { name: call.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, correlation: Some(k) });
            self
        }
        fn op(&mut self, name: &str, cpu: (f64, f64)) -> &mut Build {
            self.t.cpu_ops.push(CpuOp { name: name.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, annotation: false });
            self
        }
        fn done(&mut self) -> Diagnosis {
            self.t.sort();
            diagnose(&self.t, "test.json", &[])
        }
    }

    const K: GpuOpKind = GpuOpKind::Kernel;
    const UP_PINNED: GpuOpKind = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pinned) };
    const UP_PAGEABLE: GpuOpKind = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) };
    const DOWN: GpuOpKind = GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pageable) };

    #[test]
    fn busy_is_the_union_of_every_stream_and_idle_the_rest_of_the_window() {
        let d = Build::new()
            .launch("cudaMemcpyAsync", (0.0, 1.0), 13, UP_PINNED, (10.0, 40.0), Some(3_000_000))
            .launch("cudaLaunchKernel", (1.0, 2.0), 7, K, (20.0, 60.0), None)
            .launch("cudaLaunchKernel", (2.0, 3.0), 7, K, (80.0, 100.0), None)
            .done();
        assert_eq!(d.window, Window { start_us: 10.0, end_us: 100.0 });
        let g = &d.gpus[0];
        assert_eq!((g.busy_us, g.idle_us), (70.0, 20.0));
        let s7 = g.streams.iter().find(|s| s.stream == 7).unwrap();
        assert_eq!((s7.busy_us, s7.idle_us, s7.kernels, s7.legacy_default), (60.0, 30.0, 2, true));
        let s13 = g.streams.iter().find(|s| s.stream == 13).unwrap();
        assert_eq!((s13.busy_us, s13.copies, s13.legacy_default), (30.0, 1, false));
        // The copy ran 10-40; kernels ran from 20: 20 µs hidden, 10 exposed.
        let c = &g.copies[0];
        assert_eq!((c.count, c.hidden_us, c.exposed_us, c.bytes), (1, 20.0, 10.0, Some(3_000_000)));
        assert!((c.gbps.unwrap() - 100.0).abs() < 1e-9, "3 MB in 30 µs is 100 GB/s");
        let f = &d.findings[0];
        assert_eq!((f.cause, f.cost_us, f.count), (Cause::ExposedCopies, 10.0, 1));
        assert!(f.text.contains("1 of 1 copy on stream 13 ran 10.0 µs with no kernel beside it"), "{}", f.text);
        assert_eq!((gbps(53.04), gbps(0.0021), gbps(0.25)), ("53.0".to_string(), "0.0021".to_string(), "0.25".to_string()));
        assert_eq!(f.call.name, "cudaMemcpyAsync");
        assert_eq!(f.call.correlation, Some(1));
    }

    #[test]
    fn a_sync_that_drains_the_gpu_is_named_with_the_idle_it_caused() {
        // .item(): the kernel ends at 100 inside the sync (50-110); the next
        // kernel, launched after the sync, starts at 130: 30 µs idle.
        let d = Build::new()
            .launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 95.0), None)
            .op("aten::item", (40.0, 112.0))
            .op("aten::_local_scalar_dense", (41.0, 111.0))
            .launch("cudaMemcpyAsync", (42.0, 48.0), 7, DOWN, (95.0, 100.0), Some(4))
            .call("cudaStreamSynchronize", (50.0, 110.0))
            .launch("cudaLaunchKernel", (120.0, 125.0), 7, K, (130.0, 200.0), None)
            .done();
        let f = d.findings.iter().find(|f| f.cause == Cause::Sync).expect("the sync is blamed");
        assert_eq!(f.cost_us, 30.0);
        assert_eq!(f.call.name, "aten::item > aten::_local_scalar_dense > cudaStreamSynchronize");
        assert_eq!(f.call.ts_us, 50.0);
        assert!(f.text.contains(".item()-style") && f.text.contains("4 B copied back"), "{}", f.text);
        assert_eq!((d.syncs.calls, d.syncs.costly, d.syncs.cost_us), (1, 1, 30.0));
    }

    #[test]
    fn a_sync_while_the_gpu_has_work_queued_costs_nothing() {
        // The CPU waits on 50-110 for the copy stream, but the compute
        // stream's kernel runs on to 300: no gap starts in the sync.
        let d = Build::new()
            .launch("cudaMemcpyAsync", (0.0, 5.0), 13, UP_PINNED, (10.0, 100.0), Some(1 << 20))
            .launch("cudaLaunchKernel", (6.0, 8.0), 7, K, (10.0, 300.0), None)
            .call("cudaEventSynchronize", (50.0, 110.0))
            .launch("cudaLaunchKernel", (120.0, 125.0), 7, K, (300.0, 400.0), None)
            .done();
        assert!(d.findings.iter().all(|f| f.cause != Cause::Sync), "{:?}", d.findings);
        assert_eq!((d.syncs.calls, d.syncs.costly, d.syncs.cost_us), (1, 0, 0.0));
        // And the GPU already idle before a sync is not the sync's doing.
        let d = Build::new()
            .launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 20.0), None)
            .call("cudaDeviceSynchronize", (50.0, 52.0))
            .launch("cudaLaunchKernel", (60.0, 65.0), 7, K, (70.0, 80.0), None)
            .done();
        assert_eq!(d.syncs.costly, 0);
    }

    #[test]
    fn a_pageable_copy_is_named_pageable_with_its_exposed_time() {
        let d = Build::new()
            .op("aten::to", (0.0, 120.0))
            .launch("cudaMemcpyAsync", (1.0, 100.0), 7, UP_PAGEABLE, (5.0, 100.0), Some(1 << 20))
            .launch("cudaLaunchKernel", (110.0, 115.0), 7, K, (120.0, 150.0), None)
            .done();
        let f = &d.findings[0];
        assert_eq!((f.cause, f.cost_us), (Cause::PageableCopies, 95.0));
        assert_eq!(f.call.name, "aten::to > cudaMemcpyAsync");
        assert!(f.text.contains("1 H2D copy from pageable memory, 1 MiB"), "{}", f.text);
    }

    #[test]
    fn many_tiny_ops_launched_late_are_an_issue_bound_stretch() {
        let mut b = Build::new();
        // 40 kernels of 2 µs, each launched 10 µs after the last: the GPU
        // waits 8 µs before each but the first.
        for i in 0..40 {
            let t = 10.0 * i as f64;
            b.launch("cudaLaunchKernel", (t, t + 4.0), 7, K, (t + 5.0, t + 7.0), None);
        }
        let d = b.done();
        let f = &d.findings[0];
        assert_eq!((f.cause, f.count), (Cause::IssueBound, 40));
        assert!((f.cost_us - 39.0 * 8.0).abs() < 1e-9, "{}", f.cost_us);
        assert!(f.text.contains("launched every 10.0 µs"), "{}", f.text);
        // The same kernels queued ahead of the GPU (all launched at once) are not.
        let mut b = Build::new();
        for i in 0..40 {
            let t = 10.0 * i as f64;
            b.launch("cudaLaunchKernel", (i as f64 * 0.1, i as f64 * 0.1 + 0.05), 7, K, (t + 5.0, t + 7.0), None);
        }
        assert!(b.done().findings.iter().all(|f| f.cause != Cause::IssueBound));
    }

    #[test]
    fn the_legacy_default_stream_is_the_synchronous_copys_where_there_is_one() {
        let mut b = Build::new();
        b.launch("cudaMemcpy", (0.0, 20.0), 3, UP_PAGEABLE, (5.0, 15.0), Some(8));
        b.t.sort();
        assert_eq!(legacy_default_stream(&b.t), Some(3));
        let mut b = Build::new();
        b.launch("cudaLaunchKernel", (0.0, 1.0), 3, K, (5.0, 15.0), None);
        assert_eq!(legacy_default_stream(&b.t), Some(LEGACY_DEFAULT_STREAM));
        b.t.format = Some(TraceFormat::Course);
        assert_eq!(legacy_default_stream(&b.t), None);
    }

    #[test]
    fn synchronizing_calls_are_known_by_name() {
        for c in ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cuMemcpyDtoH_v2", "cudaFree"] {
            assert!(synchronizes(c), "{c}");
        }
        for c in ["cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent", "cudaEventRecord", "cuMemcpyHtoDAsync_v2"] {
            assert!(!synchronizes(c), "{c}");
        }
    }
}
