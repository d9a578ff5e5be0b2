//! Questions asked of a read trace by more than one room: which CUDA calls
//! issue GPU work ([`issues_gpu_work`]) and which make the CPU wait for
//! the GPU ([`synchronizes`]); which copy, record or join streams
//! ([`copies`], [`records_event`], [`waits_for_event`]); which call launched each GPU op
//! ([`launch_calls`]); which CPU ops sit around each call
//! (`enclosing_ops`) and which annotation a run starts at ([`run_start`]);
//! which stream is the legacy default one ([`legacy_default_stream`]). Reading uses the first to check a trace is
//! whole; the analysis and the replay use them all.
//!
//! May use: `events` only. Answers, no judgement: what a finding makes of
//! them is the analysis's.

use super::events::{Trace, TraceFormat};
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

/// The legacy default stream of a torch.profiler trace: the stream of a
/// synchronous `cudaMemcpy`'s copy where there is one, else
/// [`LEGACY_DEFAULT_STREAM`]. `None` for the course's own traces, whose
/// streams are the lab's.
pub fn legacy_default_stream(trace: &Trace) -> Option<u64> {
    if !trace.format.is_some_and(TraceFormat::is_kineto_schema) {
        return None;
    }
    let sync_copies: HashSet<u64> = trace.calls.iter().filter(|c| c.name == "cudaMemcpy").filter_map(|c| c.correlation).collect();
    Some(trace.gpu_ops.iter().find(|o| o.correlation.is_some_and(|c| sync_copies.contains(&c))).map_or(LEGACY_DEFAULT_STREAM, |o| o.stream))
}

/// The share of the kernels' busy time (on each GPU, summed) in which
/// kernels of two or more streams ran at once: near 0 where one stream
/// computes (each kernel fills the GPU), near 1 where a program runs its
/// kernels on several streams side by side (each then slower, sharing the
/// SMs, as its measured time says).
pub fn kernels_side_by_side(trace: &Trace) -> f64 {
    use super::events::GpuOpKind;
    use super::intervals::{total, union};
    let mut per_stream: HashMap<(u32, u64), Vec<(f64, f64)>> = HashMap::new();
    for o in trace.gpu_ops.iter().filter(|o| o.kind == GpuOpKind::Kernel) {
        per_stream.entry((o.gpu, o.stream)).or_default().push((o.start_us, o.end_us));
    }
    // Each stream's busy spans as +1/-1 steps, by GPU; and all its kernels' spans.
    let mut steps: HashMap<u32, Vec<(f64, i32)>> = HashMap::new();
    let mut all: HashMap<u32, Vec<(f64, f64)>> = HashMap::new();
    for ((gpu, _), spans) in per_stream {
        all.entry(gpu).or_default().extend(spans.iter().copied());
        let s = steps.entry(gpu).or_default();
        for (a, b) in union(spans) {
            s.push((a, 1));
            s.push((b, -1));
        }
    }
    let busy: f64 = all.into_values().map(|spans| total(&union(spans))).sum();
    let mut together = 0.0;
    for s in steps.values_mut() {
        s.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut running, mut since) = (0, 0.0);
        for &(t, d) in s.iter() {
            if running >= 2 {
                together += t - since;
            }
            running += d;
            since = t;
        }
    }
    if busy > 0.0 {
        together / busy
    } else {
        0.0
    }
}

/// Where the traced run of the work `call` belongs to starts: the
/// outermost annotation on its thread that holds it (a `record_function`
/// range, `ProfilerStep#N`), as (its start, µs; its name). The CPU's work
/// in it before the first GPU op (the first batch built, a first
/// upload's preparation) is part of the run a program's own clock times.
/// None where no annotation holds the call.
pub fn run_start(trace: &Trace, call: usize) -> Option<(f64, String)> {
    let c = &trace.calls[call];
    trace
        .cpu_ops
        .iter()
        .filter(|o| o.annotation && o.thread == c.thread && o.start_us <= c.start_us && o.end_us >= c.end_us)
        .min_by(|a, b| a.start_us.total_cmp(&b.start_us))
        .map(|o| (o.start_us, o.name.clone()))
}

/// Whether a CUDA call issues GPU work (a kernel, a copy, a memset or a
/// graph launch) that the trace records under its correlation id: the
/// trace files' own list, which their converter also keeps to.
pub use overlap_lab_tracefile::issues_gpu_work;

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
    explicit.contains(&call) || (copies(call) && !call.contains("Async"))
}

/// Whether a CUDA call launches a CUDA graph (runtime or driver API).
pub fn launches_graph(call: &str) -> bool {
    call.starts_with("cudaGraphLaunch") || call.starts_with("cuGraphLaunch")
}

/// Whether a CUDA call records an event (runtime or driver API).
pub fn records_event(call: &str) -> bool {
    call.starts_with("cudaEventRecord") || call.starts_with("cuEventRecord")
}

/// Whether a CUDA call makes a stream wait for an event (runtime or driver
/// API): the join of two streams.
pub fn waits_for_event(call: &str) -> bool {
    call.starts_with("cudaStreamWaitEvent") || call.starts_with("cuStreamWaitEvent")
}

/// Whether a CUDA call is a copy (synchronous or not, runtime or driver API).
pub fn copies(call: &str) -> bool {
    call.starts_with("cudaMemcpy") || call.starts_with("cuMemcpy")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronizing_calls_are_known_by_name() {
        for c in ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cuMemcpyDtoH_v2", "cudaFree"] {
            assert!(synchronizes(c), "{c}");
        }
        for c in ["cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent", "cudaEventRecord", "cuMemcpyHtoDAsync_v2"] {
            assert!(!synchronizes(c), "{c}");
        }
    }

    #[test]
    fn copies_and_event_calls_are_known_by_name_in_either_api() {
        assert!(copies("cudaMemcpyAsync") && copies("cuMemcpyDtoH_v2") && !copies("cudaMemsetAsync"));
        assert!(records_event("cudaEventRecord") && records_event("cuEventRecord") && !records_event("cudaEventSynchronize"));
        assert!(waits_for_event("cudaStreamWaitEvent") && waits_for_event("cuStreamWaitEvent") && !waits_for_event("cudaEventRecord"));
    }

    #[test]
    fn calls_that_issue_gpu_work_are_known_by_name() {
        for c in ["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync", "cudaGraphLaunch"] {
            assert!(issues_gpu_work(c), "{c}");
        }
        for c in ["cudaStreamSynchronize", "cudaEventRecord", "cudaStreamWaitEvent", "cudaMalloc", "cudaFree"] {
            assert!(!issues_gpu_work(c), "{c}");
        }
    }
}
