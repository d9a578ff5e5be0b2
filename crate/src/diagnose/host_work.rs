//! The host's own work: the CPU ops a thread ran that launch nothing (a
//! batch built on the CPU, a data loader's work), what `idle` puts the
//! GPU's idle down to and what preparing the next batch ahead
//! ([`super::replay::Change::PrepareAhead`]) moves off the issuing thread.
//!
//! The profiler slows the CPU ops it records: where whoever sits above
//! hands in a cost per recorded CPU op (lab 10's programs timed traced and
//! untraced), [`OwnWork::untraced_us`] takes it out of a stretch of own
//! work, and [`RecordedOps`] counts the ops in any stretch of a thread's time
//! for the replay to take it out of the rest.
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
/// order), the stretch from the first to the last end of the outermost ops
/// that launch nothing between the call before it and it (the program's
/// code between those ops is its own work too: the Python that builds a
/// batch sample by sample), with the CPU ops the profiler recorded in
/// them. Ops before `from_us` are not counted (the replay starts there:
/// the run's start, or the first call).
pub fn own_work_before_calls(trace: &Trace, calls: &[usize], from_us: f64) -> HashMap<usize, OwnWork> {
    let mut out: HashMap<usize, OwnWork> = HashMap::new();
    let Some(thread) = calls.first().map(|&c| trace.calls[c].thread) else { return out };
    let starts: Vec<f64> = calls.iter().map(|&c| trace.calls[c].start_us).collect();
    for (oi, launches) in outermost_ops(trace) {
        let o = &trace.cpu_ops[oi];
        if launches || o.thread != thread || o.start_us < from_us {
            continue;
        }
        let Some(&next) = calls.get(starts.partition_point(|&s| s < o.end_us)) else { continue };
        // The ops the profiler recorded in it, itself included.
        let recorded =
            trace.cpu_ops[oi..].iter().take_while(|x| x.start_us <= o.end_us).filter(|x| x.thread == thread && x.end_us <= o.end_us && !x.annotation).count();
        let w = out.entry(next).or_default();
        w.from_us = if w.ops == 0 { o.start_us } else { w.from_us.min(o.start_us) };
        w.to_us = w.to_us.max(o.end_us);
        w.ops += recorded;
    }
    for w in out.values_mut() {
        w.traced_us = w.to_us - w.from_us;
    }
    out
}

/// The host's own work before one call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OwnWork {
    /// As traced, µs.
    pub traced_us: f64,
    /// The CPU ops the profiler recorded in it.
    pub ops: usize,
    /// Where it starts and ends on the trace's clock, µs.
    pub from_us: f64,
    pub to_us: f64,
}

impl OwnWork {
    /// Its time with `per_op_us` taken out for each CPU op the profiler
    /// recorded in it (never below nothing), µs.
    pub fn untraced_us(&self, per_op_us: f64) -> f64 {
        (self.traced_us - per_op_us * self.ops as f64).max(0.0)
    }
}

/// Where each thread's recorded CPU ops (not annotations) start, to count
/// those in a stretch of its time: what the profiler's cost per recorded
/// op is taken out by.
pub struct RecordedOps {
    starts: HashMap<usize, Vec<f64>>,
}

impl RecordedOps {
    pub fn of(trace: &Trace) -> RecordedOps {
        let mut starts: HashMap<usize, Vec<f64>> = HashMap::new();
        for o in trace.cpu_ops.iter().filter(|o| !o.annotation) {
            starts.entry(o.thread).or_default().push(o.start_us);
        }
        for v in starts.values_mut() {
            v.sort_by(f64::total_cmp);
        }
        RecordedOps { starts }
    }

    /// The ops of `thread` that started in `[from, to)`.
    pub fn between(&self, thread: usize, from: f64, to: f64) -> usize {
        self.starts.get(&thread).map_or(0, |v| v.partition_point(|&s| s < to).saturating_sub(v.partition_point(|&s| s < from)))
    }
}
