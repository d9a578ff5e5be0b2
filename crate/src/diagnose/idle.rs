//! Every idle stretch of a GPU put down to exactly one cause
//! ([`attribute_idle`]), with the calls or CPU ops behind it; what the
//! trace cannot explain is kept apart as unattributed, never folded into
//! a cause, so that the causes and the unattributed share add up to the
//! GPU's idle time.
//!
//! A stretch runs from the end of a busy stretch to the start of the next
//! op (`busy::idle_gaps`); the call that launched that op (its launch) says
//! where the CPU was. In this order:
//!
//! 1. a stretch a synchronizing call caused (`syncs`) is the sync's;
//! 2. where the launch began only after the GPU ran dry (HTA's "host
//!    wait"), the CPU was doing something else in between: what its thread
//!    did most of that time names the cause: blocked in a sync (sync), in
//!    a copy call (copy: the driver staging pageable memory), in CUDA
//!    calls or the CPU ops that make them (waiting for launches), in CPU
//!    ops that launch nothing (the host's own work); time in no traced op
//!    is Python between the calls: launching overhead where the stretch is
//!    short ([`ISSUE_GAP_MAX_US`]), the program's own code where it is
//!    longer (the host's own work);
//! 3. where the launch had begun but not ended when the GPU ran dry, the
//!    GPU waited for that call: a copy call's (copy), else a launch's;
//! 4. the op was queued before the GPU ran dry: a stretch under
//!    [`KERNEL_WAIT_MAX_US`] is the delay between back-to-back ops; a
//!    longer one where its stream had been told to wait on an event
//!    (`cudaStreamWaitEvent`) is another stream's work; else unattributed,
//!    as is a stretch whose next op has no launching call in the trace.
//!
//! The host's own work is also a finding ([`host_work_finding`]): what the
//! GPU lost while the CPU prepared its work, and the CPU ops behind it.
//!
//! May use: `events`, `intervals`, `queries` (which calls synchronize, copy or wait for an event),
//! `host_work` (which CPU ops launch nothing),
//! `text`, `diagnosis` (what it fills in), `callers` (the launch of an op, a
//! call's name), `busy` (the GPU's work, its gaps), `issue_bound` (what a
//! launching gap is).

use super::busy::{Gap, GpuWork};
use super::callers::Callers;
use super::diagnosis::{Cause, Finding, IdleBehind, IdleCause, IdleShare, KERNEL_WAIT_MAX_US};
use super::events::Trace;
use super::host_work::outermost_ops;
use super::intervals::{covered, union};
use super::issue_bound::ISSUE_GAP_MAX_US;
use super::queries::{copies, synchronizes, waits_for_event};
use super::text::{counted, us};
use std::collections::{BTreeMap, HashMap};

/// How many calls or ops a share names.
pub const BEHIND_SHOWN: usize = 3;

/// What a CPU thread can be doing, in the order one outranks another
/// where they overlap (a sync inside `aten::item` is a sync).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Doing {
    Sync,
    Copy,
    Launching,
    OwnWork,
}

const DOINGS: [Doing; 4] = [Doing::Sync, Doing::Copy, Doing::Launching, Doing::OwnWork];

/// A span of a thread's time: a call (index into `trace.calls`) or an
/// outermost CPU op (index into `trace.cpu_ops`).
#[derive(Clone, Copy, Debug)]
enum Item {
    Call(usize),
    Op(usize),
}

/// One CPU thread's time, by what it was doing.
#[derive(Default)]
struct ThreadTime {
    /// Each [`Doing`]'s spans, by start, with what each is (one thread's
    /// calls, and its outermost ops, follow one another).
    items: [Vec<(f64, f64, Item)>; 4],
    /// `layers[k]`: the union of the spans of the first `k + 1` doings
    /// (sync; sync and copy; ...), so each doing's share of a stretch is
    /// what its layer covers beyond the one below.
    layers: [Vec<(f64, f64)>; 4],
    /// Its `cudaStreamWaitEvent` calls, by start.
    event_waits: Vec<usize>,
}

/// Which kind of CUDA call `name` is, to a thread's time.
fn call_doing(name: &str) -> Doing {
    if synchronizes(name) {
        Doing::Sync
    } else if copies(name) {
        Doing::Copy
    } else {
        Doing::Launching
    }
}

/// Every CPU thread's time in `trace`, by what it was doing: its calls by
/// kind, and its outermost CPU ops (not annotations): launching where a
/// call runs inside, the host's own work where none does.
fn thread_times(trace: &Trace) -> Vec<ThreadTime> {
    let used = trace.calls.iter().map(|c| c.thread).chain(trace.cpu_ops.iter().map(|o| o.thread)).max();
    let threads = trace.threads.len().max(used.map_or(0, |t| t + 1));
    let mut out: Vec<ThreadTime> = (0..threads).map(|_| ThreadTime::default()).collect();
    for (ci, c) in trace.calls.iter().enumerate() {
        let t = &mut out[c.thread];
        t.items[call_doing(&c.name) as usize].push((c.start_us, c.end_us, Item::Call(ci)));
        if waits_for_event(&c.name) {
            t.event_waits.push(ci);
        }
    }
    for (oi, launches) in outermost_ops(trace) {
        let o = &trace.cpu_ops[oi];
        let doing = if launches { Doing::Launching } else { Doing::OwnWork };
        out[o.thread].items[doing as usize].push((o.start_us, o.end_us, Item::Op(oi)));
    }
    for t in &mut out {
        let mut spans: Vec<(f64, f64)> = Vec::new();
        for d in DOINGS {
            let items = &mut t.items[d as usize];
            items.sort_by(|a, b| a.0.total_cmp(&b.0));
            spans.extend(items.iter().map(|&(s, e, _)| (s, e)));
            spans = union(spans);
            t.layers[d as usize] = spans.clone();
        }
    }
    out
}

impl ThreadTime {
    /// How long the thread spent in each doing over `span` (µs), each
    /// time counted once, under the doing that outranks the others there.
    fn shares(&self, span: (f64, f64)) -> [f64; 4] {
        let mut below = 0.0;
        DOINGS.map(|d| {
            let upto = covered(&self.layers[d as usize], span);
            let share = upto - below;
            below = upto;
            share
        })
    }

    /// The spans of `doing` that overlap `span`, and for how long each does.
    fn over(&self, doing: Doing, span: (f64, f64)) -> Vec<(Item, f64)> {
        let items = &self.items[doing as usize];
        let first = items.partition_point(|&(_, e, _)| e <= span.0);
        items[first..].iter().take_while(|&&(s, _, _)| s < span.1).map(|&(s, e, i)| (i, e.min(span.1) - s.max(span.0))).filter(|&(_, t)| t > 0.0).collect()
    }
}

/// One idle stretch's cause and what is behind it: the calls or CPU ops,
/// each with the CPU's time in it during the stretch (the whole stretch
/// for the one call that held the GPU back).
struct Blame {
    cause: IdleCause,
    behind: Vec<(String, f64)>,
}

impl Blame {
    /// `cause`, the whole stretch `(a, b)` put down to `behind`.
    fn whole(cause: IdleCause, behind: String, (a, b): (f64, f64)) -> Blame {
        Blame { cause, behind: vec![(behind, b - a)] }
    }
}

/// The GPU ran dry at `a`, and op `next` ended the stretch at `b`, launched
/// by call `launch`; where was the CPU? (Rules 2-4 of the module doc.)
fn blame_stretch(trace: &Trace, callers: &Callers, work: &GpuWork, times: &[ThreadTime], (a, b, next): Gap, launch: usize) -> Blame {
    let l = &trace.calls[launch];
    let thread = &times[l.thread];
    let name_of = |item: Item| match item {
        Item::Call(ci) => callers.call_ref(ci).name,
        Item::Op(oi) => trace.cpu_ops[oi].name.clone(),
    };
    let before = l.start_us.min(b);
    if before > a {
        // Rule 2: what the thread did most between the GPU running dry and the launch.
        let shares = thread.shares((a, before));
        let untraced = (before - a) - shares.iter().sum::<f64>();
        let (most, time) = DOINGS.iter().zip(shares).max_by(|x, y| x.1.total_cmp(&y.1)).map(|(&d, t)| (d, t)).expect("four doings");
        if untraced > time {
            let at = callers.outermost_op(launch).map_or_else(|| l.name.clone(), |o| trace.cpu_ops[o].name.clone());
            let cause = if b - a <= ISSUE_GAP_MAX_US { IdleCause::WaitingForLaunches } else { IdleCause::HostWork };
            return Blame { cause, behind: vec![(format!("untraced code before {at}"), untraced)] };
        }
        let cause = match most {
            Doing::Sync => IdleCause::Sync,
            Doing::Copy => IdleCause::Copy,
            Doing::Launching => IdleCause::WaitingForLaunches,
            Doing::OwnWork => IdleCause::HostWork,
        };
        return Blame { cause, behind: thread.over(most, (a, before)).into_iter().map(|(i, t)| (name_of(i), t)).collect() };
    }
    if l.end_us > a {
        // Rule 3: the launch was under way when the GPU ran dry.
        let cause = if call_doing(&l.name) == Doing::Copy { IdleCause::Copy } else { IdleCause::WaitingForLaunches };
        return Blame::whole(cause, callers.call_ref(launch).name, (a, b));
    }
    // Rule 4: queued before the GPU ran dry.
    let stream = trace.gpu_ops[next].stream;
    if b - a < KERNEL_WAIT_MAX_US {
        return Blame::whole(IdleCause::KernelGaps, format!("back-to-back ops on stream {stream}"), (a, b));
    }
    // An event wait the thread put on the stream after launching its op before this one.
    let on_stream = &work.by_stream[&stream];
    let at = on_stream.partition_point(|&i| trace.gpu_ops[i].start_us < trace.gpu_ops[next].start_us);
    let since = at.checked_sub(1).and_then(|p| callers.launch(on_stream[p])).map_or(f64::NEG_INFINITY, |ci| trace.calls[ci].start_us);
    let waits = &thread.event_waits;
    let upto = waits.partition_point(|&w| trace.calls[w].start_us <= l.start_us);
    let wait = waits[..upto].last().copied().filter(|&w| trace.calls[w].start_us >= since);
    match wait {
        Some(w) => Blame::whole(IdleCause::OtherStream, format!("stream {stream}: {}", callers.call_ref(w).name), (a, b)),
        None => Blame::whole(IdleCause::Unattributed, format!("an op queued on stream {stream}, waiting on nothing the trace shows"), (a, b)),
    }
}

/// A cause's idle so far, while the stretches are shared out.
#[derive(Default)]
struct Tally {
    idle_us: f64,
    stretches: usize,
    /// The CPU's time in each call or op behind it.
    behind: HashMap<String, f64>,
    /// Its longest stretch: (µs, the GPU op that ended it).
    longest: Option<(f64, usize)>,
    /// Each stretch, (start, end) µs.
    spans: Vec<(f64, f64)>,
}

/// Puts each of a GPU's idle `gaps` (`blamed`: the sync each was caused
/// by, where one was) down to one cause (the module doc's rules) and adds
/// them up by cause: the shares, most idle first, the unattributed one
/// always there and last. They add up to the gaps' total.
pub(super) fn attribute_idle(trace: &Trace, callers: &Callers, work: &GpuWork, gaps: &[Gap], blamed: &[Option<usize>]) -> Vec<IdleShare> {
    let times = thread_times(trace);
    let mut by_cause: BTreeMap<IdleCause, Tally> = BTreeMap::new();
    by_cause.insert(IdleCause::Unattributed, Tally::default());
    for (&gap, sync) in gaps.iter().zip(blamed) {
        let (a, b, next) = gap;
        let blame = match (sync, callers.launch(next)) {
            (&Some(s), _) => Blame::whole(IdleCause::Sync, callers.call_ref(s).name, (a, b)),
            (None, Some(launch)) => blame_stretch(trace, callers, work, &times, gap, launch),
            (None, None) => Blame::whole(IdleCause::Unattributed, "an op with no launching call in the trace".into(), (a, b)),
        };
        let tally = by_cause.entry(blame.cause).or_default();
        tally.idle_us += b - a;
        tally.stretches += 1;
        tally.spans.push((a, b));
        for (name, t) in blame.behind {
            *tally.behind.entry(name).or_default() += t;
        }
        if tally.longest.is_none_or(|(l, _)| b - a > l) {
            tally.longest = Some((b - a, next));
        }
    }
    let mut shares: Vec<IdleShare> = by_cause
        .into_iter()
        .map(|(cause, tally)| {
            let mut behind: Vec<IdleBehind> = tally.behind.into_iter().map(|(name, idle_us)| IdleBehind { name, idle_us }).collect();
            behind.sort_by(|x, y| y.idle_us.total_cmp(&x.idle_us).then_with(|| x.name.cmp(&y.name)));
            behind.truncate(BEHIND_SHOWN);
            let (longest_us, ended_by) = tally.longest.map_or((0.0, None), |(l, next)| (l, Some(callers.op_ref(next))));
            IdleShare { cause, idle_us: tally.idle_us, stretches: tally.stretches, behind, longest_us, longest_ended_by: ended_by, spans_us: tally.spans }
        })
        .collect();
    shares.sort_by(|x, y| (x.cause == IdleCause::Unattributed).cmp(&(y.cause == IdleCause::Unattributed)).then(y.idle_us.total_cmp(&x.idle_us)));
    shares
}

/// The finding that GPU `gpu` idled while its CPU ran the program's own
/// work (its `shares`' host-work one), named by the call that ended the
/// longest such stretch; `None` where it has none.
pub(super) fn host_work_finding(gpu: u32, shares: &[IdleShare]) -> Option<Finding> {
    let s = shares.iter().find(|s| s.cause == IdleCause::HostWork)?;
    let call = s.longest_ended_by.clone()?;
    let ops: Vec<String> = s.behind.iter().map(|b| format!("{} {}", b.name, us(b.idle_us))).collect();
    Some(Finding {
        cause: Cause::HostWork,
        gpu,
        call,
        count: s.stretches,
        cost_us: s.idle_us,
        text: format!(
            "the GPU idled {} in {} while the CPU ran the program's own work, not launching (the CPU's time in {} then): the GPU cannot go faster than the CPU prepares its work; preparing the next batch ahead, on workers of its own, would overlap that work with the GPU's",
            us(s.idle_us),
            counted(s.stretches, "stretch", "stretches"),
            ops.join(", ")
        ),
    })
}
