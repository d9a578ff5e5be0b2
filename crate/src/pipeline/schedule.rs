//! A pipeline as the GPU sees it: operations on streams and host threads,
//! ordered by stream order, events, host waits and program order. Recorded
//! as a pipeline is issued, the schedule says what happens before what, so
//! "a buffer refilled before the copy reading it finished" is found from
//! the schedule itself, whatever the timing was: every access to a buffer
//! region must happen after every conflicting earlier access. The queue
//! model ([`super::predict`]) and the timelines ([`super::timeline`]) read
//! the same schedule.

use super::op::{Access, Lane, Op, OpId, OpKind, StreamDecl, StreamKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The accesses to one buffer that a later access must be ordered after,
/// by start offset, so finding those that overlap a range visits only
/// those near it (a pipeline of 4096 chunks stays linear, not quadratic).
#[derive(Clone, Debug, Default)]
struct LiveAccesses {
    by_start: std::collections::BTreeMap<u64, Vec<(Access, OpId)>>,
    /// The longest access so far: none starting further before a range can reach it.
    longest: u64,
}

impl LiveAccesses {
    /// Every access that overlaps `a`, oldest first within each start.
    fn overlapping(&self, a: &Access) -> Vec<&(Access, OpId)> {
        let from = a.start.saturating_sub(self.longest);
        self.by_start.range(from..a.end).flat_map(|(_, v)| v.iter()).filter(|(o, _)| o.overlaps(a)).collect()
    }
    fn insert(&mut self, a: Access, id: OpId) {
        self.longest = self.longest.max(a.end - a.start);
        self.by_start.entry(a.start).or_default().push((a, id));
    }
    /// Forgets the accesses (start, end, op) listed.
    fn remove(&mut self, gone: &[(u64, u64, OpId)]) {
        for &(start, end, id) in gone {
            if let Some(v) = self.by_start.get_mut(&start) {
                v.retain(|(a, o)| !(*o == id && a.end == end));
                if v.is_empty() {
                    self.by_start.remove(&start);
                }
            }
        }
    }
}

/// Two accesses to one region with no ordering between them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    pub earlier: OpId,
    pub later: OpId,
    pub buffer: String,
    pub what: String,
}

/// What a CPU thread waited for, as the loop asked: an event
/// (cuEventSynchronize), a stream by the loop's own number for it
/// (cuStreamSynchronize), every stream (cuCtxSynchronize), a host
/// function's signal, or the end of set-up (the run's clock restarted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    Event(usize),
    Stream(usize),
    Device,
    Signal(usize),
    Restart,
}

/// One wait of a CPU thread's for the GPU: what for, and how many ops had
/// been issued before it (those it can order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuWait {
    pub thread: usize,
    pub on: WaitFor,
    pub after_ops: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Schedule {
    pub ops: Vec<Op>,
    /// No start gate: the GPU starts each op as soon as the CPU has issued
    /// it, so the CPU's issue cost is in the pipeline's time from its first
    /// op (lab 5's issue-cost sweep). Otherwise every op issued before the
    /// issuing thread first waits or works is there when the GPU starts.
    #[serde(default)]
    pub issued_live: bool,
    #[serde(skip)]
    stream_frontier: HashMap<usize, Vec<OpId>>,
    #[serde(skip)]
    host_frontier: HashMap<usize, Vec<OpId>>,
    #[serde(skip)]
    events: HashMap<usize, Vec<OpId>>,
    #[serde(skip)]
    live: HashMap<String, LiveAccesses>,
    #[serde(skip)]
    races: Vec<Race>,
    /// Each declared stream's kind, priority and GPU (undeclared:
    /// non-blocking, 0, GPU 0).
    #[serde(skip)]
    streams: HashMap<usize, StreamDecl>,
    /// Every wait of a CPU thread's for the GPU, in issue order, as the
    /// loop asked for it ([`Self::note_wait`]): a checker names the call.
    #[serde(skip)]
    pub cpu_waits: Vec<CpuWait>,
}

/// `frontier` (ops something waits for) extended by `more`, kept to the
/// last op of each lane: on a stream, and on a CPU thread, each op follows the one before
/// it, so waiting for the last is waiting for all. Without this, two
/// threads that join each other again and again (autograd's thread and
/// the loop's, in a training step's replay) doubled their frontiers at
/// each join.
fn extend_frontier(ops: &[Op], frontier: &mut Vec<OpId>, more: impl IntoIterator<Item = OpId>) {
    frontier.extend(more);
    frontier.sort_unstable_by(|a, b| b.cmp(a));
    frontier.dedup();
    let mut lanes: Vec<Lane> = Vec::with_capacity(frontier.len());
    frontier.retain(|&id| {
        let lane = ops[id].lane;
        let first = !lanes.contains(&lane);
        if first {
            lanes.push(lane);
        }
        first
    });
    frontier.reverse();
}

impl Schedule {
    pub fn new() -> Schedule {
        Schedule::default()
    }

    /// Declares `stream`'s kind, priority and GPU (before its first op).
    pub fn declare_stream(&mut self, stream: usize, decl: StreamDecl) {
        self.streams.insert(stream, decl);
    }

    fn stream_decl(&self, stream: usize) -> StreamDecl {
        self.streams.get(&stream).copied().unwrap_or_default()
    }

    /// The GPUs the schedule's ops ran on, in order (at least GPU 0).
    pub fn gpus(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.ops.iter().map(|o| o.gpu).chain([0]).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// A GPU operation issued by host thread `by` on `stream`.
    pub fn gpu_op(&mut self, by: usize, stream: usize, kind: OpKind, label: &str, accesses: Vec<Access>) -> OpId {
        let mut deps = self.stream_frontier.get(&stream).cloned().unwrap_or_default();
        // Issued after everything the issuing thread did before, and after
        // the GPU work it waited for.
        let host = self.host_frontier.get(&by).cloned().unwrap_or_default();
        let mut waited: Vec<OpId> = host.iter().copied().filter(|&d| self.ops[d].is_gpu_work()).collect();
        waited.sort_unstable();
        deps.extend(host);
        // The legacy stream and the blocking streams of one GPU wait for
        // each other (each GPU's context has its own legacy stream).
        let decl = self.stream_decl(stream);
        for (&other, o) in &self.streams {
            let meets = match decl.kind {
                StreamKind::Legacy => o.kind.meets_legacy(),
                k2 if k2.meets_legacy() => o.kind == StreamKind::Legacy,
                _ => false,
            };
            if meets && other != stream && o.gpu == decl.gpu {
                deps.extend(self.stream_frontier.get(&other).cloned().unwrap_or_default());
            }
        }
        let id = self.push(kind, Lane::Stream(stream), label, accesses, deps);
        self.ops[id].priority = decl.priority;
        self.ops[id].gpu = decl.gpu;
        self.ops[id].after_host_wait = waited;
        self.stream_frontier.insert(stream, vec![id]);
        id
    }

    /// A collective issued by host thread `by`: one op of `kind` per
    /// stream of `ranks` (each with its own accesses), as NCCL's grouped
    /// call enqueues one kernel on each rank's stream. No rank's op can get
    /// past the collective before every rank has reached it, so each
    /// depends on what every rank's stream did before (a rank's sum reads
    /// the others' buffers through the collective, ordered this way);
    /// the ranks' ops do not depend on each other: they run at once.
    pub fn collective(&mut self, by: usize, ranks: &[(usize, Vec<Access>)], kind: OpKind, label: &str) -> Vec<OpId> {
        let before: Vec<OpId> = ranks.iter().flat_map(|(s, _)| self.stream_frontier.get(s).cloned().unwrap_or_default()).collect();
        for (s, _) in ranks {
            extend_frontier(&self.ops, self.stream_frontier.entry(*s).or_default(), before.iter().copied());
        }
        ranks.iter().map(|(s, accesses)| self.gpu_op(by, *s, kind, label, accesses.clone())).collect()
    }

    /// CPU work on host thread `thread`.
    pub fn host_op(&mut self, thread: usize, label: &str, accesses: Vec<Access>) -> OpId {
        self.host_call(thread, OpKind::Host, label, accesses)
    }

    /// A blocking call of `kind` (CPU work, or an allocation or release) on
    /// host thread `thread`.
    pub fn host_call(&mut self, thread: usize, kind: OpKind, label: &str, accesses: Vec<Access>) -> OpId {
        let deps = self.host_frontier.get(&thread).cloned().unwrap_or_default();
        let id = self.push(kind, Lane::HostThread(thread), label, accesses, deps);
        self.host_frontier.insert(thread, vec![id]);
        id
    }

    /// cuEventRecord(event, stream): the event completes after the stream's work so far.
    pub fn record_event(&mut self, event: usize, stream: usize) {
        let captured = self.stream_frontier.get(&stream).cloned().unwrap_or_default();
        self.events.insert(event, captured);
    }

    /// cuStreamWaitEvent(stream, event): later work on `stream` waits for it.
    pub fn stream_wait_event(&mut self, stream: usize, event: usize) {
        let captured = self.events.get(&event).cloned().unwrap_or_default();
        extend_frontier(&self.ops, self.stream_frontier.entry(stream).or_default(), captured);
    }

    /// cuEventSynchronize on host thread `thread`.
    pub fn host_wait_event(&mut self, thread: usize, event: usize) {
        let captured = self.events.get(&event).cloned().unwrap_or_default();
        self.host_learns_all(thread, captured);
    }

    /// cuStreamSynchronize on host thread `thread`.
    pub fn host_wait_stream(&mut self, thread: usize, stream: usize) {
        let captured = self.stream_frontier.get(&stream).cloned().unwrap_or_default();
        self.host_learns_all(thread, captured);
    }

    /// cuCtxSynchronize on host thread `thread`: it waits for every stream.
    pub fn host_wait_all(&mut self, thread: usize) {
        let captured: Vec<OpId> = self.stream_frontier.values().flatten().copied().collect();
        self.host_learns_all(thread, captured);
    }

    /// Notes that host thread `thread` waited for the GPU as `on` says
    /// (its ordering is recorded by the wait itself: [`Self::host_wait_event`]
    /// and the others).
    pub fn note_wait(&mut self, thread: usize, on: WaitFor) {
        self.cpu_waits.push(CpuWait { thread, on, after_ops: self.ops.len() });
    }

    /// Host thread `thread` learns that op `op` is done (it received the
    /// job that op handed over, or the slot that op gave back).
    pub fn host_learns(&mut self, thread: usize, op: OpId) {
        self.host_learns_all(thread, vec![op]);
    }

    /// Host thread `thread` learns that everything another thread did so far
    /// is done (a channel receive, a join).
    pub fn host_joins(&mut self, thread: usize, other: usize) {
        let captured = self.host_frontier.get(&other).cloned().unwrap_or_default();
        self.host_learns_all(thread, captured);
    }

    /// Host thread `thread` learns that the ops `done` are done: its
    /// frontier gains them, kept to the last op of each lane.
    fn host_learns_all(&mut self, thread: usize, done: Vec<OpId>) {
        extend_frontier(&self.ops, self.host_frontier.entry(thread).or_default(), done);
    }

    fn push(&mut self, kind: OpKind, lane: Lane, label: &str, accesses: Vec<Access>, mut deps: Vec<OpId>) -> OpId {
        deps.sort_unstable();
        deps.dedup();
        let id = self.ops.len();
        self.ops.push(Op { id, kind, lane, label: label.to_string(), accesses: accesses.clone(), deps, priority: 0, after_host_wait: Vec::new(), gpu: 0 });
        for a in accesses {
            self.check_and_track(id, a);
        }
        id
    }

    /// Whether `a` happens before `b` (reachable through deps).
    pub fn happens_before(&self, a: OpId, b: OpId) -> bool {
        if a >= b {
            return false;
        }
        let mut stack = vec![b];
        // Only ops between a and b can lie on a path from a to b: a flag
        // each (no hashing: a learner's wrong loop asks this for every
        // pair of unordered accesses, thousands of times).
        let mut seen = vec![false; b - a];
        while let Some(x) = stack.pop() {
            for &d in &self.ops[x].deps {
                if d == a {
                    return true;
                }
                if d > a && !std::mem::replace(&mut seen[d - a], true) {
                    stack.push(d);
                }
            }
        }
        false
    }

    fn check_and_track(&mut self, id: OpId, a: Access) {
        let mut live = self.live.remove(&a.buffer).unwrap_or_default();
        let mut superseded = Vec::new();
        let mut overlapping = live.overlapping(&a);
        // Oldest first, so the first race named is the earliest access.
        overlapping.sort_by_key(|(_, op)| *op);
        for &(ref old, old_id) in overlapping {
            if old_id != id && (old.write || a.write) && !self.happens_before(old_id, id) {
                // A release is a write to the whole buffer, named as what it is.
                let verb = |op: OpId, w: bool, s: &'static str| -> String {
                    let v = match self.ops[op].kind {
                        OpKind::Free(_) => "release",
                        OpKind::Alloc(_) => "allocate",
                        _ if w => "write",
                        _ => "read",
                    };
                    format!("{v}{s}")
                };
                self.races.push(Race {
                    earlier: old_id,
                    later: id,
                    buffer: a.buffer.clone(),
                    what: format!(
                        "'{}' {} bytes {}..{} of {} while '{}' may still {} them: nothing orders the two (missing event wait or synchronize)",
                        self.ops[id].label,
                        verb(id, a.write, "s"),
                        a.start.max(old.start),
                        a.end.min(old.end),
                        a.buffer,
                        self.ops[old_id].label,
                        verb(old_id, old.write, "")
                    ),
                });
            }
            // A write that is ordered after an older access supersedes it where it covers it.
            if a.write && old.start >= a.start && old.end <= a.end && self.happens_before(old_id, id) {
                superseded.push((old.start, old.end, old_id));
            }
        }
        live.remove(&superseded);
        live.insert(a.clone(), id);
        self.live.insert(a.buffer, live);
    }

    /// Whether the CPU waited for GPU work somewhere in the loop: a GPU op
    /// issued after a wait, or a call or CPU work of the issuing thread
    /// made after one (it depends on that GPU work; a wait followed by a
    /// blocking call, such as a cuMemFree, leaves no GPU op marked).
    pub fn cpu_waited_for_gpu(&self) -> bool {
        self.ops.iter().any(|o| !o.after_host_wait.is_empty() || (o.lane == Lane::HostThread(0) && o.deps.iter().any(|&d| self.ops[d].is_gpu_work())))
    }

    pub fn races(&self) -> &[Race] {
        &self.races
    }

    /// How many streams the schedule's GPU operations used (what the
    /// checkers' "one stream" advice hangs on).
    pub fn streams_used(&self) -> usize {
        self.lanes().iter().filter(|l| matches!(l, Lane::Stream(_))).count()
    }

    pub fn lanes(&self) -> Vec<Lane> {
        let mut v: Vec<Lane> = self.ops.iter().map(|o| o.lane).collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::op::Memory;

    #[test]
    fn a_wait_followed_by_a_blocking_call_is_a_cpu_wait_and_a_host_functions_signal_is_not() {
        let mut s = Schedule::new();
        let d = s.gpu_op(0, 0, OpKind::D2h, "D2H", vec![]);
        let signal = s.gpu_op(0, 1, OpKind::Host, "slot free", vec![]);
        s.host_learns(0, signal);
        s.host_op(0, "produce", vec![]);
        assert!(!s.cpu_waited_for_gpu(), "a host function handing a slot back is not a wait for GPU work");
        s.host_learns(0, d);
        s.host_call(0, OpKind::Free(Memory::Device), "cuMemFree", vec![]);
        assert!(s.ops.iter().all(|o| o.after_host_wait.is_empty()), "no GPU op follows the wait");
        assert!(s.cpu_waited_for_gpu());
    }

    #[test]
    fn threads_that_join_each_other_wait_for_the_last_op_of_each_lane_only() {
        // Two threads that only launch and join each other, as autograd's
        // thread and the loop's do in a training step's replay: each
        // join once doubled their frontiers (a 40-step trace's replay ran
        // out of memory).
        let mut s = Schedule::new();
        for i in 0..2000 {
            s.gpu_op(i % 2, 7, OpKind::Kernel, "kernel", vec![]);
            s.host_wait_stream(i % 2, 7);
            s.host_joins(1 - i % 2, i % 2);
        }
        let last = s.gpu_op(0, 7, OpKind::Kernel, "last", vec![]);
        assert_eq!(s.ops[last].deps, vec![last - 1], "waiting for the stream's last op is waiting for all of it");
        assert!(s.host_frontier.values().all(|f| f.len() == 1), "{:?}", s.host_frontier);
        // Ops of two lanes: the last of each is kept, in issue order.
        let a = s.gpu_op(0, 8, OpKind::Kernel, "other stream", vec![]);
        s.host_wait_all(1);
        let on = s.host_op(1, "after both", vec![]);
        assert_eq!(s.ops[on].deps, vec![last, a]);
    }

    #[test]
    fn a_missing_event_wait_is_a_race() {
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::H2d, "copy batch 0", vec![Access::write("d", 0, 10)]);
        s.gpu_op(0, 1, OpKind::Kernel, "compute batch 0", vec![Access::read("d", 0, 10)]);
        let r = s.races();
        assert_eq!(r.len(), 1);
        assert!(r[0].what.contains("'compute batch 0' reads bytes 0..10 of d while 'copy batch 0' may still write"), "{}", r[0].what);
    }

    #[test]
    fn refilling_a_host_buffer_needs_a_host_wait() {
        // Host fills buffer, copy reads it, host refills it.
        let mut early = Schedule::new();
        early.host_op(0, "fill A (batch 0)", vec![Access::write("host A", 0, 8)]);
        early.gpu_op(0, 0, OpKind::H2d, "H2D batch 0", vec![Access::read("host A", 0, 8)]);
        early.host_op(0, "fill A (batch 2)", vec![Access::write("host A", 0, 8)]);
        assert_eq!(early.races().len(), 1, "refilled too early");

        let mut ok = Schedule::new();
        ok.host_op(0, "fill A (batch 0)", vec![Access::write("host A", 0, 8)]);
        ok.gpu_op(0, 0, OpKind::H2d, "H2D batch 0", vec![Access::read("host A", 0, 8)]);
        ok.record_event(1, 0);
        ok.host_wait_event(0, 1);
        ok.host_op(0, "fill A (batch 2)", vec![Access::write("host A", 0, 8)]);
        assert!(ok.races().is_empty(), "{:?}", ok.races());
    }

    #[test]
    fn disjoint_regions_and_reads_do_not_race() {
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::H2d, "a", vec![Access::write("d", 0, 10)]);
        s.gpu_op(0, 1, OpKind::H2d, "b", vec![Access::write("d", 10, 20)]);
        s.gpu_op(0, 2, OpKind::Kernel, "r1", vec![Access::read("e", 0, 20)]);
        s.gpu_op(0, 3, OpKind::Kernel, "r2", vec![Access::read("e", 0, 20)]);
        assert!(s.races().is_empty());
        assert_eq!(s.lanes().len(), 4);
    }

    #[test]
    fn a_write_supersedes_only_the_accesses_it_covers() {
        // One op reads bytes 0..8 and 0..16 of b; a later write on its
        // stream covers 0..8 only, so 0..16 stays live: an unordered write
        // to 8..16 on another stream still races with the first op.
        let mut s = Schedule::new();
        let reads = s.gpu_op(0, 0, OpKind::Kernel, "reads", vec![Access::read("b", 0, 8), Access::read("b", 0, 16)]);
        s.gpu_op(0, 0, OpKind::Kernel, "covers 0..8", vec![Access::write("b", 0, 8)]);
        let late = s.gpu_op(0, 1, OpKind::Kernel, "writes 8..16", vec![Access::write("b", 8, 16)]);
        let r: Vec<(OpId, OpId)> = s.races().iter().map(|r| (r.earlier, r.later)).collect();
        assert_eq!(r, [(reads, late)], "{:?}", s.races());
    }

    #[test]
    fn synchronizing_the_device_orders_every_stream_before_the_cpu() {
        let mut s = Schedule::new();
        let a = s.gpu_op(0, 0, OpKind::Kernel, "a", vec![Access::write("d", 0, 8)]);
        let b = s.gpu_op(0, 1, OpKind::D2h, "b", vec![Access::read("d", 8, 16)]);
        s.host_wait_all(0);
        let h = s.host_call(0, OpKind::Free(Memory::Device), "cuMemFree d", vec![Access::write("d", 0, 16)]);
        assert!(s.happens_before(a, h) && s.happens_before(b, h));
        assert!(s.races().is_empty(), "{:?}", s.races());
        assert_eq!(Memory::Pool.label(false, "x"), "cuMemFreeAsync x");
        assert_eq!(OpKind::Free(Memory::Pinned).drawn(), OpKind::Free(Memory::Device));
    }

    #[test]
    fn a_legacy_stream_orders_only_its_own_gpus_blocking_streams() {
        let mut s = Schedule::new();
        s.declare_stream(0, StreamDecl::new(StreamKind::Blocking, 0, 0));
        s.declare_stream(1, StreamDecl::new(StreamKind::Blocking, 0, 1));
        s.declare_stream(2, StreamDecl::new(StreamKind::Legacy, 0, 1));
        let on0 = s.gpu_op(0, 0, OpKind::Kernel, "blocking, GPU 0", vec![]);
        let on1 = s.gpu_op(0, 1, OpKind::Kernel, "blocking, GPU 1", vec![]);
        let legacy = s.gpu_op(0, 2, OpKind::H2d, "NULL stream of GPU 1", vec![]);
        assert!(s.happens_before(on1, legacy), "GPU 1's legacy stream waits for GPU 1's blocking stream");
        assert!(!s.happens_before(on0, legacy), "each GPU's context has its own legacy stream");
    }
}
