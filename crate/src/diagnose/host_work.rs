//! The host's own work: the CPU ops a thread ran that launch nothing (a
//! batch built on the CPU, a data loader's work), what `idle` puts the
//! GPU's idle down to and what preparing the next batch ahead
//! ([`super::replay::Change::PrepareAhead`]) moves off the issuing thread.
//!
//! The profiler slows the CPU ops it records: where whoever sits above
//! hands in a cost per recorded CPU op (lab 10's programs timed traced and
//! untraced), [`own_work_before_calls`] takes it out of each op's time.
//!
//! May use: `events`.

use super::events::Trace;
use std::collections::HashMap;

/// A CPU thread's outermost ops (not annotations), by start: (op index
/// into `trace.cpu_ops`, whether a CUDA call of its thread runs inside it).
/// An op with no call inside is the host's own work.
pub fn outermost_ops(trace: &Trace) -> Vec<(usize, bool)> {
    let threads = trace.calls.iter().map(|c| c.thread + 1).chain(trace.cpu_ops.iter().map(|o| o.thread + 1)).max().unwrap_or(0);
    let mut call_starts: Vec<Vec<f64>> = vec![Vec::new(); threads];
    for c in &trace.calls {
        call_starts[c.thread].push(c.start_us);
    }
    for starts in &mut call_starts {
        starts.sort_by(f64::total_cmp);
    }
    // Ops are sorted by start, enclosing first: an op starting before the
    // last outermost one ends is inside it.
    let mut outer_end = vec![f64::NEG_INFINITY; threads];
    let mut out = Vec::new();
    for (oi, o) in trace.cpu_ops.iter().enumerate().filter(|(_, o)| !o.annotation) {
        if o.start_us < outer_end[o.thread] {
            continue;
        }
        outer_end[o.thread] = o.end_us;
        let starts = &call_starts[o.thread];
        let first_call = starts.partition_point(|&s| s < o.start_us);
        out.push((oi, starts.get(first_call).is_some_and(|&s| s <= o.end_us)));
    }
    out
}

/// The host's own work on the issuing thread, by the call it came before:
/// for each of `calls` (indices into `trace.calls`, one thread's, in
/// order), the time of the outermost ops that launch nothing between the
/// call before it and it, µs, less `per_op_us` for each CPU op the
/// profiler recorded in them (never below nothing). Ops before the first
/// call are not counted (the replay starts there).
pub fn own_work_before_calls(trace: &Trace, calls: &[usize], per_op_us: f64) -> HashMap<usize, OwnWork> {
    let mut out: HashMap<usize, OwnWork> = HashMap::new();
    let (Some(&first), Some(thread)) = (calls.first(), calls.first().map(|&c| trace.calls[c].thread)) else { return out };
    let starts: Vec<f64> = calls.iter().map(|&c| trace.calls[c].start_us).collect();
    for (oi, launches) in outermost_ops(trace) {
        let o = &trace.cpu_ops[oi];
        if launches || o.thread != thread || o.start_us < trace.calls[first].start_us {
            continue;
        }
        let Some(&next) = calls.get(starts.partition_point(|&s| s < o.end_us)) else { continue };
        // The ops the profiler recorded in it, itself included.
        let recorded =
            trace.cpu_ops[oi..].iter().take_while(|x| x.start_us <= o.end_us).filter(|x| x.thread == thread && x.end_us <= o.end_us && !x.annotation).count();
        let w = out.entry(next).or_default();
        w.traced_us += o.end_us - o.start_us;
        w.untraced_us += (o.end_us - o.start_us - per_op_us * recorded as f64).max(0.0);
        w.ops += recorded;
    }
    out
}

/// The host's own work before one call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OwnWork {
    /// As traced, µs.
    pub traced_us: f64,
    /// With the profiler's cost per recorded op taken out, µs.
    pub untraced_us: f64,
    /// The CPU ops the profiler recorded in it.
    pub ops: usize,
}
