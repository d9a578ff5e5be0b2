//! Where a program's events joined its streams: the fork and join of a
//! multi-stream step (`torch.cuda.Event.record()` on one stream, then
//! `stream.wait_event()` on another), read from the CUDA calls, for the
//! replay of a CUDA graph ([`super::replay`]'s `Change::CudaGraph`).
//!
//! An eager program's kernels are ordered by their launches as much as by
//! their events: a launch-bound step's joins leave no mark on the GPU's
//! times. A captured graph has no launches to order it: only the captured
//! streams' order and their events' joins are left, so those must be known
//! from the calls. They are known one of two ways, wait by wait
//! ([`event_joins`] picks, [`JoinsKnown`] says which were used):
//!
//! - **Read** ([`joins_read_from_sync_events`]), for each
//!   `cudaStreamWaitEvent` the trace's CUDA sync events name (torch.profiler
//!   run with `enable_cuda_sync_events=True`: a "Stream Wait Event" with
//!   the wait call's correlation id, the stream that waits, the stream the
//!   event was recorded on and the record call's correlation id, as
//!   HolisticTraceAnalysis reads them). The op waited for is the last op on
//!   the recorded stream issued before the record call (before the wait
//!   call, where the record call is not in the trace); the op that waits is
//!   the next op on the waiting stream issued after the wait call.
//! - **Inferred** from the order of the thread's calls, for every other
//!   wait (all of them in an ordinary trace, whose `cudaEventRecord` and
//!   `cudaStreamWaitEvent` do not say which stream or event they name):
//!   - a record records the stream last launched on before it; in a run
//!     of records with no launch between them, each records a different
//!     stream, the last record the stream used last, the one before it the
//!     stream used before that (`for s, e in zip(streams, events): e.record(s)`);
//!   - a record right after waits, with no launch between them, follows
//!     what those waits waited for too: the join, then the next fork, of a
//!     stream that launches nothing itself (the current stream of a
//!     multi-stream step, which waits for every side stream's event and
//!     then records the event they all wait for next). A wait for it waits
//!     for every side stream, not for the last one launched on alone;
//!   - a wait waits for the oldest record not yet waited for, else for the
//!     last record (one event forks several streams);
//!   - the stream that waits is the next stream launched on, other than the
//!     recorded one; the waits for one record go to different streams (a
//!     fork), each to the next one launched on.
//!
//!   A sync event that names a wait's stream and event but not the
//!   recorded stream (PyTorch 2.11 writes `wait_on_stream` and the record
//!   call as -1, and CUPTI's event id) still helps the inference: the
//!   stream that waits is the one it names, and a wait for the same event
//!   as the wait just before it, by another stream, waits for the same
//!   record (a fork), not for the oldest one not yet waited for.
//!
//! A graph launch joins too ([`graph_launch_joins`]): it is ordered on its
//! stream as one op, so none of its ops starts before every op of the
//! graph launched before it there has ended, whichever branch's stream
//! that last op ran on (a captured graph joins its branches back to the
//! stream it was captured on).
//!
//! A wait that was read still takes its turn among the records the
//! inference pairs waits with (it waited for one), but joins nothing by
//! inference. A trace without sync events is inferred exactly as before
//! they were read.
//!
//! May use: `events`, `queries` (which calls record an event or wait for one).

use super::events::{StreamWait, Trace};
use super::queries::{launches_graph, records_event, waits_for_event};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// A join: the GPU op `op` may start only once `after` (an op of another
/// stream) has ended. Indices into the trace's `gpu_ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Join {
    pub op: usize,
    pub after: usize,
}

/// A wait not yet given to the stream that waits: the op it waits for
/// (and the ops its record followed through waits before it), the stream
/// its record recorded (none known where the record followed waits: a
/// stream that launches nothing), and the record it was paired with.
struct PendingWait {
    after: usize,
    also_after: Vec<usize>,
    recorded_on: Option<(u32, u64)>,
    record: usize,
    /// The stream that waits, where a sync event names it.
    to: Option<(u32, u64)>,
}

/// The joins the events of `calls` (the issuing thread's calls, in the
/// trace's order; indices into the trace's `calls`) made between the GPU
/// ops each call issued (`ops_of_call`): read from the trace's CUDA sync
/// events where they name a wait, inferred from the calls' order for
/// every other wait (every wait of a trace without them).
pub fn event_joins(trace: &Trace, calls: &[usize], ops_of_call: &HashMap<usize, Vec<usize>>) -> Vec<Join> {
    if !trace.carries_sync_events() {
        return inferred_joins(trace, calls, ops_of_call, &HashSet::new());
    }
    let (mut joins, read) = joins_read_from_sync_events(trace, calls, ops_of_call);
    joins.extend(inferred_joins(trace, calls, ops_of_call, &read));
    joins.sort_by_key(|j| (j.op, j.after));
    joins.dedup();
    joins
}

/// The joins graph launches make (`calls` and `ops_of_call` as
/// [`event_joins`] takes them, each call's ops in the order they started,
/// as the trace's `gpu_ops` are): each graph's first op on each of its
/// streams waits for the last op to end of the graph launched before it
/// on the same stream (the stream its first op ran on) and GPU. The
/// trace's times show that wait only where the GPU passed from one graph
/// to the next within their slack; under the profiler it once took 9 µs.
pub fn graph_launch_joins(trace: &Trace, calls: &[usize], ops_of_call: &HashMap<usize, Vec<usize>>) -> Vec<Join> {
    let stream_of = |op: usize| (trace.gpu_ops[op].gpu, trace.gpu_ops[op].stream);
    let mut last_graph_on: HashMap<(u32, u64), usize> = HashMap::new();
    let mut joins = Vec::new();
    for c in calls.iter().filter(|&&c| launches_graph(&trace.calls[c].name)) {
        let Some((&first, _)) = ops_of_call.get(c).and_then(|ops| ops.split_first()) else { continue };
        let ops = &ops_of_call[c];
        let last = *ops.iter().max_by(|&&a, &&b| trace.gpu_ops[a].end_us.total_cmp(&trace.gpu_ops[b].end_us)).expect("not empty");
        if let Some(before) = last_graph_on.insert(stream_of(first), last) {
            let mut streams = HashSet::from([stream_of(before)]);
            joins.extend(ops.iter().filter(|&&op| streams.insert(stream_of(op))).map(|&op| Join { op, after: before }));
        }
    }
    joins
}

/// How the joins of a trace's events were known, as the what-if says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinsKnown {
    /// Every wait read from the trace's CUDA sync events.
    SyncEvents,
    /// Every wait inferred from the calls' order (no sync event names one).
    CallsOrder,
    /// Read where a sync event names the wait, inferred for the others.
    Both,
    /// Inferred from the calls' order, with each wait's stream and event
    /// read from sync events that do not name the recorded stream.
    CallsOrderAndSyncEvents,
}

impl JoinsKnown {
    /// How the joins of `trace`'s `cudaStreamWaitEvent` calls are known;
    /// `None` where it makes none.
    pub fn of(trace: &Trace) -> Option<JoinsKnown> {
        let named = waits_named(trace);
        let partly: HashSet<u64> = trace.stream_waits.iter().map(|w| w.call_correlation).collect();
        let (mut read, mut inferred, mut helped) = (0usize, 0usize, 0usize);
        for c in trace.calls.iter().filter(|c| waits_for_event(&c.name)) {
            match c.correlation {
                Some(k) if named.contains_key(&k) => read += 1,
                Some(k) if partly.contains(&k) => helped += 1,
                _ => inferred += 1,
            }
        }
        match (read, inferred + helped) {
            (0, 0) => None,
            (_, 0) => Some(JoinsKnown::SyncEvents),
            (0, _) if helped > 0 => Some(JoinsKnown::CallsOrderAndSyncEvents),
            (0, _) => Some(JoinsKnown::CallsOrder),
            _ => Some(JoinsKnown::Both),
        }
    }

    /// How they were known, in the report's words.
    pub fn says(self) -> &'static str {
        match self {
            JoinsKnown::SyncEvents => "read from the trace's CUDA sync events",
            JoinsKnown::CallsOrder => {
                "inferred from the calls' order: the trace names no wait's streams (torch.profiler's `enable_cuda_sync_events=True`, or `overlap-lab trace --sync-events`, records them)"
            }
            JoinsKnown::Both => "read from the trace's CUDA sync events where they name the wait, else inferred from the calls' order",
            JoinsKnown::CallsOrderAndSyncEvents => {
                "inferred from the calls' order, each wait's stream and event read from the trace's CUDA sync events (they name no recorded stream)"
            }
        }
    }
}

/// A wait as the trace's sync events name it: on which GPU, which stream
/// waits, and which stream and record call the awaited event came from.
#[derive(Clone, Copy, Debug, PartialEq)]
struct NamedWait {
    gpu: u32,
    stream: u64,
    recorded_stream: u64,
    record_correlation: Option<u64>,
}

/// The waits the trace's sync events name, by the wait call's correlation
/// id: those whose recorded stream is known, from the sync event itself
/// or from the record call's `cuda_event` where the trace has one.
fn waits_named(trace: &Trace) -> HashMap<u64, NamedWait> {
    let recorded_on: HashMap<(u32, u64), u64> = trace.event_records.iter().map(|r| ((r.gpu, r.correlation), r.stream)).collect();
    let mut named = HashMap::new();
    for &StreamWait { gpu, stream, call_correlation, recorded_stream, record_correlation, .. } in &trace.stream_waits {
        let recorded_stream = recorded_stream.or_else(|| record_correlation.and_then(|k| recorded_on.get(&(gpu, k)).copied()));
        if let Some(recorded_stream) = recorded_stream {
            named.entry(call_correlation).or_insert(NamedWait { gpu, stream, recorded_stream, record_correlation });
        }
    }
    named
}

/// The joins read from the trace's CUDA sync events: for each wait call
/// of `calls` that a "Stream Wait Event" names, the last op on the
/// recorded stream (same GPU) issued by a call of `calls` before the
/// record call (found by its correlation id among the trace's calls;
/// where it is not there, before the wait call), joined to the next op on
/// the waiting stream issued after the wait call. Also the wait calls
/// read (indices into the trace's `calls`), joins or none: the inference
/// must not guess for them.
pub fn joins_read_from_sync_events(trace: &Trace, calls: &[usize], ops_of_call: &HashMap<usize, Vec<usize>>) -> (Vec<Join>, HashSet<usize>) {
    let named = waits_named(trace);
    let mut read = HashSet::new();
    if named.is_empty() {
        return (Vec::new(), read);
    }
    // Each stream's ops, by the call that issued them: (call, op), in the trace's order.
    let mut issued: HashMap<(u32, u64), Vec<(usize, usize)>> = HashMap::new();
    for &ci in calls {
        for &op in ops_of_call.get(&ci).into_iter().flatten() {
            let o = &trace.gpu_ops[op];
            issued.entry((o.gpu, o.stream)).or_default().push((ci, op));
        }
    }
    for v in issued.values_mut() {
        v.sort_by_key(|&(ci, _)| ci);
    }
    // The record calls, by correlation id (a call that records an event first).
    let mut record_call: HashMap<u64, usize> = HashMap::new();
    for (i, c) in trace.calls.iter().enumerate() {
        let Some(k) = c.correlation else { continue };
        match record_call.get(&k) {
            Some(&r) if records_event(&trace.calls[r].name) || !records_event(&c.name) => {}
            _ => {
                record_call.insert(k, i);
            }
        }
    }
    let mut joins = Vec::new();
    for &ci in calls {
        let c = &trace.calls[ci];
        let Some(w) = c.correlation.filter(|_| waits_for_event(&c.name)).and_then(|k| named.get(&k)) else { continue };
        read.insert(ci);
        if w.recorded_stream == w.stream {
            continue;
        }
        let before = w.record_correlation.and_then(|k| record_call.get(&k)).copied().unwrap_or(ci);
        let after = issued.get(&(w.gpu, w.recorded_stream)).and_then(|v| v[..v.partition_point(|&(c, _)| c < before)].last()).map(|&(_, op)| op);
        let op = issued.get(&(w.gpu, w.stream)).and_then(|v| v.get(v.partition_point(|&(c, _)| c <= ci))).map(|&(_, op)| op);
        if let (Some(op), Some(after)) = (op, after) {
            joins.push(Join { op, after });
        }
    }
    joins.sort_by_key(|j| (j.op, j.after));
    joins.dedup();
    (joins, read)
}

/// The joins inferred from the order of `calls` (the module's rules), but
/// for the wait calls in `read` (known already), which join nothing here.
fn inferred_joins(trace: &Trace, calls: &[usize], ops_of_call: &HashMap<usize, Vec<usize>>, read: &HashSet<usize>) -> Vec<Join> {
    let mut joins = Vec::new();
    // What a sync event says of a wait it cannot be read by: the stream
    // that waits and the event's id, by the wait call's correlation id.
    let partly: HashMap<u64, &StreamWait> = trace.stream_waits.iter().map(|w| (w.call_correlation, w)).collect();
    // The last wait call: the record it was paired with and what its sync event said.
    let mut last_wait: Option<(usize, Option<&StreamWait>)> = None;
    // Streams by their last launch, most recent last; each one's last op.
    let mut recent: Vec<(u32, u64)> = Vec::new();
    let mut last_op: HashMap<(u32, u64), usize> = HashMap::new();
    // Records: the op each captured and its stream (None: nothing launched yet).
    let mut records: Vec<Option<(usize, (u32, u64))>> = Vec::new();
    let mut records_in_run = 0usize;
    // The ops a record followed through the waits right before it, by record.
    let mut also_after: HashMap<usize, Vec<usize>> = HashMap::new();
    // The records paired with the waits since the last launch or record.
    let mut waited_since: Vec<usize> = Vec::new();
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
            if !waited_since.is_empty() {
                let mut ops: Vec<usize> = Vec::new();
                for w in waited_since.drain(..) {
                    ops.extend(records[w].map(|(op, _)| op));
                    ops.extend(also_after.get(&w).into_iter().flatten().copied());
                }
                ops.sort_unstable();
                ops.dedup();
                also_after.insert(records.len() - 1, ops);
            }
            continue;
        }
        if waits_for_event(name) {
            records_in_run = 0;
            let named = trace.calls[ci].correlation.and_then(|k| partly.get(&k)).copied();
            // A fork: the same event waited for by another stream right
            // after the wait before: the same record (its sync event says so).
            let same_event = match (last_wait, named) {
                (Some((r, Some(before))), Some(now)) => {
                    (before.event_id.is_some() && before.event_id == now.event_id && before.stream != now.stream).then_some(r)
                }
                _ => None,
            };
            let paired = if let Some(r) = same_event {
                r
            } else if next_unwaited < records.len() {
                next_unwaited += 1;
                next_unwaited - 1
            } else if let Some(last) = records.len().checked_sub(1) {
                last
            } else {
                continue;
            };
            last_wait = Some((paired, named));
            if read.contains(&ci) {
                continue;
            }
            waited_since.push(paired);
            if let Some((after, recorded_on)) = records[paired] {
                let also_after = also_after.get(&paired).cloned().unwrap_or_default();
                let recorded_on = also_after.is_empty().then_some(recorded_on);
                pending.push(PendingWait { after, also_after, recorded_on, record: paired, to: named.map(|w| (w.gpu, w.stream)) });
            }
            continue;
        }
        let Some(ops) = ops_of_call.get(&ci) else { continue };
        records_in_run = 0;
        waited_since.clear();
        for &op in ops {
            let o = &trace.gpu_ops[op];
            let stream = (o.gpu, o.stream);
            pending.retain(|w| {
                let forked = forked_to.entry(w.record).or_default();
                if w.recorded_on == Some(stream) || forked.contains(&stream) || w.to.is_some_and(|to| to != stream) {
                    return true;
                }
                forked.push(stream);
                joins.push(Join { op, after: w.after });
                joins.extend(w.also_after.iter().filter(|&&a| a != op).map(|&after| Join { op, after }));
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
    use crate::diagnose::events::{Call, EventRecord, GpuOp, GpuOpKind};

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

    /// The trace of `calls` as a profiler with CUDA sync events records
    /// it: each `waits` entry (the wait call, the stream that waits, the
    /// recorded stream, the record call) a "Stream Wait Event" naming it.
    fn with_waits(calls: &[(&str, u64)], waits: &[(u64, u64, Option<u64>, Option<u64>)]) -> (Trace, Vec<usize>, HashMap<usize, Vec<usize>>) {
        let (mut t, calls, ops) = trace(calls);
        for &(call, stream, recorded_stream, record_correlation) in waits {
            t.stream_waits.push(StreamWait { gpu: 0, stream, call_correlation: call, recorded_stream, record_correlation, event_id: None });
        }
        t.sync_events = waits.len();
        (t, calls, ops)
    }

    /// Two steps of a fork over streams 2 and 3 from a stream that launches
    /// nothing (`forked.record(); s.wait_event(forked)` for each side, its
    /// kernel, `done.record(s)`; then the joins: two waits), as PyTorch
    /// 2.11 records it with sync events: the forks' waits name their
    /// stream and event id 9, not the record; the joins' have no sync event.
    fn fork_with_event_ids() -> (Trace, Vec<usize>, HashMap<usize, Vec<usize>>) {
        let step = [("r", 0), ("w", 2), ("k", 2), ("r", 0), ("w", 3), ("k", 3), ("r", 0), ("w", 0), ("w", 0)];
        let calls: Vec<(&str, u64)> = step.iter().chain(step.iter()).copied().collect();
        let (mut t, order, ops) = trace(&calls);
        for (i, &(what, stream)) in calls.iter().enumerate() {
            if what == "w" && stream != 0 {
                t.stream_waits.push(StreamWait {
                    gpu: 0,
                    stream,
                    call_correlation: i as u64,
                    recorded_stream: None,
                    record_correlation: None,
                    event_id: Some(9),
                });
            }
        }
        t.sync_events = t.stream_waits.len();
        (t, order, ops)
    }

    #[test]
    fn a_forks_waits_for_one_event_share_its_record_where_sync_events_name_the_event() {
        // Kernels: 0 (stream 2) and 1 (stream 3) in step 1, 2 and 3 in step 2.
        let (t, calls, ops) = fork_with_event_ids();
        let joins = event_joins(&t, &calls, &ops);
        // Stream 3 never waits for stream 2's kernel of the same step (the
        // order alone pairs its wait with the oldest record not yet waited
        // for: stream 2's `done`, a chain the program never made).
        assert!(!joins.contains(&Join { op: 1, after: 0 }) && !joins.contains(&Join { op: 3, after: 2 }), "{joins:?}");
        // Step 2's sides wait for step 1's (the joins, then the fork).
        assert!(joins.iter().any(|j| j.op == 2 && j.after == 1) && joins.iter().any(|j| j.op == 3 && j.after == 0), "{joins:?}");
        // Without the sync events the order chains them: the inference's known limit.
        let mut plain = t.clone();
        plain.stream_waits.clear();
        plain.sync_events = 0;
        assert!(event_joins(&plain, &calls, &ops).contains(&Join { op: 1, after: 0 }));
    }

    #[test]
    fn records_in_a_run_are_read_where_the_order_would_swap_their_streams() {
        // `e2.record(s2); e1.record(s1)` after kernels on s1 then s2: the
        // order takes the first record for s1 (used before last), but it
        // recorded s2; s3 waits for it.
        let calls = [("k", 1), ("k", 2), ("r", 0), ("r", 0), ("w", 0), ("k", 3)];
        let (t, c, ops) = trace(&calls);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }], "inferred: the kernel on s1");
        let (t, c, ops) = with_waits(&calls, &[(4, 3, Some(2), Some(2))]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 1 }], "read: the kernel on s2");
        assert_eq!(JoinsKnown::of(&t), Some(JoinsKnown::SyncEvents));
    }

    #[test]
    fn a_wait_for_a_later_record_is_read_where_the_order_takes_the_oldest() {
        // Records on s1 and then s2; s3 waits for the second only.
        let calls = [("k", 1), ("r", 0), ("k", 2), ("r", 0), ("w", 0), ("k", 3)];
        let (t, c, ops) = trace(&calls);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }], "inferred: the oldest record, s1's");
        let (t, c, ops) = with_waits(&calls, &[(4, 3, Some(2), Some(3))]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 1 }]);
        // The wait read takes its turn: a second wait, which no sync event
        // names, is inferred to wait for the record after the oldest.
        let calls = [("k", 1), ("r", 0), ("k", 2), ("r", 0), ("w", 0), ("k", 3), ("w", 0), ("k", 4)];
        let (t, c, ops) = with_waits(&calls, &[(4, 3, Some(1), Some(1))]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }, Join { op: 3, after: 1 }]);
        assert_eq!(JoinsKnown::of(&t), Some(JoinsKnown::Both));
    }

    #[test]
    fn the_op_waited_for_is_the_last_issued_before_the_record_call() {
        // Kernels 0 and 1 on s2 with the record between them, s3 waits.
        let calls = [("k", 2), ("r", 0), ("k", 2), ("w", 0), ("k", 3)];
        let (t, c, ops) = with_waits(&calls, &[(3, 3, Some(2), Some(1))]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }]);
        // The record call not in the trace: the last op before the wait.
        let (t, c, ops) = with_waits(&calls, &[(3, 3, Some(2), Some(99))]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 1 }]);
        let (t, c, ops) = with_waits(&calls, &[(3, 3, Some(2), None)]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 1 }]);
        // The recorded stream unknown to the sync event, known from the
        // record's `cuda_event`.
        let (mut t, c, ops) = with_waits(&calls, &[(3, 3, None, Some(1))]);
        t.event_records.push(EventRecord { gpu: 0, stream: 2, correlation: 1 });
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }]);
        assert_eq!(JoinsKnown::of(&t), Some(JoinsKnown::SyncEvents));
        // Known nowhere: inferred (the stream last launched on before the
        // record), the waiting stream read from the sync event.
        t.event_records.clear();
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 2, after: 0 }]);
        assert_eq!(JoinsKnown::of(&t), Some(JoinsKnown::CallsOrderAndSyncEvents));
        // A wait on its own stream, or with no op after it, joins nothing.
        let (t, c, ops) = with_waits(&calls, &[(3, 2, Some(2), Some(1))]);
        assert!(event_joins(&t, &c, &ops).is_empty());
        let (t, c, ops) = with_waits(&calls, &[(3, 5, Some(2), Some(1))]);
        assert!(event_joins(&t, &c, &ops).is_empty(), "nothing launched on stream 5 after the wait");
    }

    #[test]
    fn a_trace_whose_sync_events_name_no_wait_is_inferred_as_before() {
        let calls = [("k", 1), ("r", 0), ("w", 0), ("w", 0), ("k", 2), ("k", 3), ("r", 0), ("r", 0), ("w", 0), ("w", 0), ("k", 1)];
        let (t, c, ops) = trace(&calls);
        let inferred = event_joins(&t, &c, &ops);
        assert_eq!(JoinsKnown::of(&t), Some(JoinsKnown::CallsOrder));
        let (mut t, c, ops) = with_waits(&calls, &[]);
        t.sync_events = 3;
        assert_eq!(event_joins(&t, &c, &ops), inferred);
        assert!(JoinsKnown::of(&trace(&[("k", 1)]).0).is_none(), "no wait, nothing to know");
    }

    #[test]
    fn a_record_right_after_waits_follows_what_they_waited_for() {
        // A step forked from and joined to a stream that launches nothing
        // (PyTorch's current stream in a multi-stream step): kernels 0, 1
        // and 2 on streams 2, 3 and 4, each recorded; the current stream
        // waits for all three, then records the fork of the next step,
        // which each side stream waits for before its kernel (3, 4, 5).
        // Each of those follows all three of the step before: stream 4's
        // too, which the fork's record, taken for the stream launched on
        // last (4), would have left waiting for nothing.
        let side = [("k", 2), ("r", 0), ("k", 3), ("r", 0), ("k", 4), ("r", 0)];
        let next = [("w", 0), ("w", 0), ("w", 0), ("r", 0), ("w", 0), ("k", 2), ("w", 0), ("k", 3), ("w", 0), ("k", 4)];
        let calls: Vec<(&str, u64)> = side.iter().chain(next.iter()).copied().collect();
        let (t, c, ops) = trace(&calls);
        let joins = event_joins(&t, &c, &ops);
        for op in 3..6 {
            for after in (0..3).filter(|&a| a != op - 3) {
                assert!(joins.contains(&Join { op, after }), "{op} after {after} missing from {joins:?}");
            }
        }
        // A record after a launch still records the stream launched on: the
        // fork of `a_fork_goes_to_each_side_stream_and_a_join_comes_back`.
        let (t, c, ops) = trace(&[("k", 1), ("r", 0), ("w", 0), ("w", 0), ("k", 2), ("k", 3)]);
        assert_eq!(event_joins(&t, &c, &ops), [Join { op: 1, after: 0 }, Join { op: 2, after: 0 }]);
    }

    #[test]
    fn no_events_no_joins() {
        let (t, calls, ops) = trace(&[("k", 1), ("k", 2), ("w", 0), ("k", 1)]);
        assert!(event_joins(&t, &calls, &ops).is_empty(), "a wait with no record before it joins nothing");
    }
}
