//! Where a program's events joined its streams: the fork and join of a
//! multi-stream step (`torch.cuda.Event.record()` on one stream, then
//! `stream.wait_event()` on another), read from the CUDA calls, for the
//! replay of a CUDA graph ([`super::replay`]'s `Change::CudaGraph`).
//!
//! An eager program's kernels are ordered by their launches as much as by
//! their events: a launch-bound step's joins leave no mark on the GPU's
//! times. A captured graph has no launches to order it: only the captured
//! streams' order and their events' joins are left, so those must be read
//! from the calls. An ordinary trace's `cudaEventRecord` and
//! `cudaStreamWaitEvent` do not say which stream or event they name, so
//! both are inferred from the order of the thread's calls:
//!
//! - a record records the stream last launched on before it; in a run of
//!   records with no launch between them, each records a different stream,
//!   the last record the stream used last, the one before it the stream
//!   used before that (`for s, e in zip(streams, events): e.record(s)`);
//! - a wait waits for the oldest record not yet waited for, else for the
//!   last record (one event forks several streams);
//! - the stream that waits is the next stream launched on, other than the
//!   recorded one; the waits for one record go to different streams (a
//!   fork), each to the next one launched on.
//!
//! May use: `events`, `queries` (which calls record an event or wait for one).

use super::events::Trace;
use super::queries::{records_event, waits_for_event};
use std::collections::HashMap;

/// A join: the GPU op `op` may start only once `after` (an op of another
/// stream) has ended. Indices into the trace's `gpu_ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Join {
    pub op: usize,
    pub after: usize,
}

/// A wait not yet given to the stream that waits: the op it waits for,
/// the stream that op ran on, and the record it was paired with.
struct PendingWait {
    after: usize,
    recorded_on: (u32, u64),
    record: usize,
}

/// The joins the events of `calls` (the issuing thread's calls, in order;
/// indices into the trace's `calls`) made between the GPU ops each call
/// issued (`ops_of_call`).
pub fn event_joins(trace: &Trace, calls: &[usize], ops_of_call: &HashMap<usize, Vec<usize>>) -> Vec<Join> {
    let mut joins = Vec::new();
    // Streams by their last launch, most recent last; each one's last op.
    let mut recent: Vec<(u32, u64)> = Vec::new();
    let mut last_op: HashMap<(u32, u64), usize> = HashMap::new();
    // Records: the op each captured and its stream (None: nothing launched yet).
    let mut records: Vec<Option<(usize, (u32, u64))>> = Vec::new();
    let mut records_in_run = 0usize;
    let mut next_unwaited = 0usize;
    let mut pending: Vec<PendingWait> = Vec::new();
    // Per record: the streams its waits went to so far.
    let mut forked_to: HashMap<usize, Vec<(u32, u64)>> = HashMap::new();
    for &ci in calls {
        let name = trace.calls[ci].name.as_str();
        if records_event(name) {
            // This record and the run's earlier ones record the streams used
            // last, latest first: shift the run's records one stream back.
            records_in_run += 1;
            let run_start = records.len() + 1 - records_in_run;
            records.push(None);
            for (back, r) in records[run_start..].iter_mut().rev().enumerate() {
                *r = recent.iter().rev().nth(back).map(|&s| (last_op[&s], s));
            }
            continue;
        }
        if waits_for_event(name) {
            records_in_run = 0;
            let paired = if next_unwaited < records.len() {
                next_unwaited += 1;
                next_unwaited - 1
            } else if let Some(last) = records.len().checked_sub(1) {
                last
            } else {
                continue;
            };
            if let Some((after, recorded_on)) = records[paired] {
                pending.push(PendingWait { after, recorded_on, record: paired });
            }
            continue;
        }
        let Some(ops) = ops_of_call.get(&ci) else { continue };
        records_in_run = 0;
        for &op in ops {
            let o = &trace.gpu_ops[op];
            let stream = (o.gpu, o.stream);
            pending.retain(|w| {
                let forked = forked_to.entry(w.record).or_default();
                if w.recorded_on == stream || forked.contains(&stream) {
                    return true;
                }
                forked.push(stream);
                joins.push(Join { op, after: w.after });
                false
            });
            recent.retain(|&s| s != stream);
            recent.push(stream);
            last_op.insert(stream, op);
        }
    }
    joins.sort_by_key(|j| (j.op, j.after));
    joins.dedup();
    joins
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{Call, GpuOp, GpuOpKind};

    /// A trace of `calls` in order: ("k", stream) launches a kernel on
    /// that stream, ("r", _) records an event, ("w", _) waits for one.
    fn trace(calls: &[(&str, u64)]) -> (Trace, Vec<usize>, HashMap<usize, Vec<usize>>) {
        let mut t = Trace::default();
        let mut ops_of_call = HashMap::new();
        for (i, &(what, stream)) in calls.iter().enumerate() {
            let name = match what {
                "k" => "cudaLaunchKernel",
                "r" => "cudaEventRecord",
                _ => "cudaStreamWaitEvent",
            };
            t.calls.push(Call { name: name.into(), thread: 0, start_us: i as f64, end_us: i as f64 + 0.5, correlation: Some(i as u64) });
            if what == "k" {
                ops_of_call.insert(i, vec![t.gpu_ops.len()]);
                let s = i as f64 + 1.0;
                t.gpu_ops.push(GpuOp {
                    gpu: 0,
                    stream,
                    kind: GpuOpKind::Kernel,
                    name: "k".into(),
                    start_us: s,
                    end_us: s + 0.5,
                    correlation: Some(i as u64),
                    bytes: None,
                });
            }
        }
        (t, (0..calls.len()).collect(), ops_of_call)
    }

    #[test]
    fn a_fork_goes_to_each_side_stream_and_a_join_comes_back() {
        // Kernel 0 on stream 1; the fork: one record, two waits; kernels 1
        // and 2 on streams 2 and 3; each side records, stream 1 waits for
        // both; kernel 3 on stream 1.
        let (t, calls, ops) = trace(&[("k", 1), ("r", 0), ("w", 0), ("w", 0), ("k", 2), ("k", 3), ("r", 0), ("r", 0), ("w", 0), ("w", 0), ("k", 1)]);
        let joins = event_joins(&t, &calls, &ops);
        let want = [Join { op: 1, after: 0 }, Join { op: 2, after: 0 }, Join { op: 3, after: 1 }, Join { op: 3, after: 2 }];
        assert_eq!(joins, want);
    }

    #[test]
    fn records_made_inside_each_stream_join_the_same_way() {
        // `with torch.cuda.stream(s): ...; e.record()`: each record follows its own stream's kernels.
        let (t, calls, ops) = trace(&[("k", 1), ("r", 0), ("w", 0), ("k", 2), ("k", 2), ("r", 0), ("w", 0), ("k", 1)]);
        assert_eq!(event_joins(&t, &calls, &ops), [Join { op: 1, after: 0 }, Join { op: 3, after: 2 }]);
    }

    #[test]
    fn no_events_no_joins() {
        let (t, calls, ops) = trace(&[("k", 1), ("k", 2), ("w", 0), ("k", 1)]);
        assert!(event_joins(&t, &calls, &ops).is_empty(), "a wait with no record before it joins nothing");
    }
}
