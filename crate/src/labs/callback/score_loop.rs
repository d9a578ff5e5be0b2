//! Lab 4's vocabulary, written once for both executors.
//!
//! The variants and the learner's exercise speak of what this lab is about
//! (take a score slot, run `row_dot`, copy the scores back, the "scores
//! ready" event, where the argmin runs) to a [`ScoreLoop`]. Each call
//! keeps the lab's own bookkeeping (which iteration holds a slot, what
//! orders its reader after its D2H, whose scores it holds) and then
//! becomes calls of the vocabulary's hook for a lab's own operations
//! ([`LabIssue`]): the lab's operations (`ScoreOp`: row_dot, the D2H of a
//! slot's scores, an argmin, a hand-off), its slot calls (`SlotCall`),
//! the "scores ready" events, and what its CPU threads learn. The loop
//! holds one executor through that trait and never asks which it is: with
//! no GPU, the dry run ([`DryRun`], [`ScoreLoop::dry_run`]), whose
//! schedule the queue model times ([`super::model`]); on a GPU, the runner
//! with the lab's GPU side ([`LabRunner`], `ScoreLoop::on_gpu`), which
//! enqueues the rig's kernel and copy, launches the host functions and
//! feeds the worker and the event-waiting thread. Either way the
//! schedule's race check sees the same ops (the dry run words a race in
//! the lab's terms, the GPU's run as the runner reports it).

use super::op::{ArgminOn, ScoreOp};
use super::order::{Reader, SlotOrder};
use super::rig::CallbackRig;
use super::slots::Lease;
use super::work::{self, ArgminJob, CallbackTask, RunState, WaitForScores, Worker};
use super::{Iteration, On, Slot};
use crate::error::{LabError, Result};
use crate::gpu::runner::{Enqueue, LabOnGpu, LabRunner};
use crate::gpu::{Event, Run, Runner};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{EventRef, Issue, StreamRef};
use crate::pipeline::lab_op::{LabIssue, LabOp};
use crate::pipeline::op::{Lane, Op, OpId, OpKind, StreamDecl, StreamKind};
use crate::pipeline::schedule::{Race, Schedule};
use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// The host threads of a run's schedule: 0 is the enqueue loop.
pub const MAIN_THREAD: usize = 0;
pub const WORKER_THREAD: usize = 1;
pub const WAITER_THREAD: usize = 2;

/// Where the loop sent an argmin: a place it ran, or the stream a
/// hand-off's host function went on (a hand-off on the compute stream
/// still stops it). What the checker judges the wiring by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    To(ArgminOn),
    HandOffOn(On),
}

/// A second reader asked for a slot whose job was handed out already.
fn handed_out(slot: Slot) -> LabError {
    LabError::config(format!("slot {} holds no iteration's scores (its job was already handed out)", slot.0))
}

/// Lab 4's calls of its own on the loop's thread: taking a score slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotCall {
    /// Waits until a slot is free (its last reader gave it back) and
    /// leases it to iteration `t`.
    Free { t: usize },
    /// Slot `index` at once, free or not, leased to iteration `t`.
    At { index: usize, t: usize },
}

/// One slot as the loop sees it.
#[derive(Clone, Debug, Default)]
struct SlotUse {
    /// The iteration holding it until its argmin is issued.
    lease: Option<usize>,
    /// What orders a reader after its D2H (to name a missing link).
    order: SlotOrder,
    /// The op that reads its scores last (the slot is free once it ends).
    last_reader: Option<OpId>,
    /// Whether scores were copied into it since it was taken.
    copied: bool,
    /// The iteration whose row_dot wrote its device scores last, in issue
    /// order (a later-issued op never runs before an earlier one it is
    /// ordered with, and an unordered pair is a race, named as such).
    device_holds: Option<usize>,
    /// What its last D2H copied to the host: the iteration of the device
    /// scores then (`Some(None)`: scores no row_dot had written).
    host_holds: Option<Option<usize>>,
}

/// Lab 4's GPU side: the rig, the run's shared state (its slot book, its
/// score views), each slot's lease while the loop holds it, and the
/// threads the argmins are handed to.
struct Live<'r> {
    rig: &'r CallbackRig,
    state: Arc<RunState>,
    /// Per slot: its lease from the slot book until the job is handed out.
    leases: Vec<Option<Lease>>,
    /// Per slot, its "scores ready" event, for the event-waiting thread.
    ready: Vec<Arc<Event>>,
    /// Dropped (joined) before the waiter, as the runner has synchronized.
    worker: Option<Worker>,
    waiter: Option<Worker>,
}

impl Live<'_> {
    fn job(&mut self, slot: Slot) -> Result<ArgminJob> {
        let lease = self.leases[slot.0].take();
        lease.map(|lease| ArgminJob { lease }).ok_or_else(|| handed_out(slot))
    }
    fn worker_sender(&mut self) -> Result<Sender<ArgminJob>> {
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn("argmin-worker", work::WORKER_LANE, self.state.clone(), None)?);
        }
        Ok(self.worker.as_ref().expect("just made").sender())
    }
    /// The event-waiting thread's sender, started on first use.
    fn waiter_sender(&mut self) -> Result<Sender<ArgminJob>> {
        if self.waiter.is_none() {
            let (gpu, ready) = (self.rig.gpu.clone(), self.ready.clone());
            let wait: WaitForScores = Box::new(move |lease: &Lease| {
                gpu.bind()?;
                ready[lease.slot].synchronize()
            });
            self.waiter = Some(Worker::spawn("event-waiter", work::WAITER_LANE, self.state.clone(), Some(wait))?);
        }
        Ok(self.waiter.as_ref().expect("just made").sender())
    }
}

/// Refuses a reader that is not ordered after its D2H: on a GPU it could
/// read scores that have not arrived.
fn ordered(unordered: &Option<String>) -> Result<()> {
    unordered.as_ref().map_or(Ok(()), |why| Err(LabError::schedule(why.clone())))
}

// SAFETY: row_dot writes only its slot's device scores and reads the keys
// and queries, which nothing in the loop writes; the D2H reads the slot's
// device scores and writes its pinned twin. All are the rig's buffers,
// borrowed for 'r, so they outlive the runner, and `ScoreOp::accesses`
// names both sides of every slot's scores.
unsafe impl<'r> LabOnGpu<'r> for Live<'r> {
    type Op = ScoreOp;
    type Call = SlotCall;
    type Task = CallbackTask;

    fn enqueue(&mut self, op: &ScoreOp) -> Result<Enqueue<'r>> {
        // SAFETY: the rig's buffers stay allocated until the runner has
        // synchronized (this impl's contract, above); the argmins read the
        // slots only through their views.
        unsafe { self.rig.enqueue(op) }
    }

    fn host_task(&mut self, op: &ScoreOp) -> Result<CallbackTask> {
        match op {
            ScoreOp::Argmin { slot, on: ArgminOn::HostFn(_), unordered, .. } => {
                ordered(unordered)?;
                let job = self.job(*slot)?;
                Ok(CallbackTask::Argmin { state: self.state.clone(), job })
            }
            ScoreOp::HandOff { slot, unordered, .. } => {
                ordered(unordered)?;
                let to = self.worker_sender()?;
                let job = self.job(*slot)?;
                Ok(CallbackTask::HandOff { state: self.state.clone(), job, to })
            }
            _ => Err(LabError::config(format!("{}: not a host function", op.label()))),
        }
    }

    fn on_thread(&mut self, thread: usize, op: &ScoreOp) -> Result<()> {
        match op {
            // The hand-off's host function carries the job to the worker.
            ScoreOp::Argmin { on: ArgminOn::Worker, .. } if thread == WORKER_THREAD => Ok(()),
            ScoreOp::Argmin { slot, on: ArgminOn::WaitingThread, unordered, .. } if thread == WAITER_THREAD => {
                ordered(unordered)?;
                let to = self.waiter_sender()?;
                let job = self.job(*slot)?;
                to.send(job).map_err(|_| LabError::Thread("the event-waiting thread is gone".into()))
            }
            _ => Err(LabError::config(format!("{} on CPU thread {thread}: not that thread's work", op.label()))),
        }
    }

    fn call(&mut self, call: SlotCall) -> Result<usize> {
        match call {
            SlotCall::Free { t } => {
                let start = self.state.now_us();
                let lease = self.state.book.take(t)?;
                let end = self.state.now_us();
                if end - start > 2.0 {
                    self.state.span(work::MAIN_LANE, format!("wait for a slot ({t})"), start, end);
                }
                let i = lease.slot;
                self.leases[i] = Some(lease);
                Ok(i)
            }
            SlotCall::At { index, t } => {
                self.leases[index] = Some(self.state.book.take_at(index, t)?);
                Ok(index)
            }
        }
    }
}

/// What one iteration's code may call (see the module docs). The lab's
/// variants and the learner's exercise are written against it; it runs on
/// a GPU or on the dry run.
pub struct ScoreLoop<'x> {
    /// The executor: the dry run, or the runner with the lab's GPU side.
    x: &'x mut dyn LabIssue<ScoreOp, SlotCall>,
    streams: [StreamRef; 2],
    /// Per slot: "scores ready", recorded after its D2H.
    ready: Vec<EventRef>,
    slots: Vec<SlotUse>,
    /// Every argmin sent, in issue order.
    sent: Vec<Sent>,
    /// Each argmin op: its iteration and where it runs.
    argmins: Vec<(OpId, usize, ArgminOn)>,
    /// The iteration of every op (for the problems' wording).
    iteration_of: HashMap<OpId, usize>,
    /// Per iteration whose reader was unordered when handed out: the missing link.
    unordered: HashMap<usize, String>,
    /// Reads of the wrong scores, found in issue order.
    problems: Vec<String>,
    /// The iteration being issued.
    t: usize,
}

/// A loop run on the dry run, judged and ready to time.
pub struct Recorded {
    pub schedule: Schedule,
    /// Each argmin op: its iteration and where it runs.
    pub argmins: Vec<(OpId, usize, ArgminOn)>,
    /// Reads of the wrong scores, races, slots reused too early, argmins never issued.
    pub problems: Vec<String>,
}

/// The loop's own books once it ended (its executor is free again).
struct Ended {
    streams: [StreamRef; 2],
    argmins: Vec<(OpId, usize, ArgminOn)>,
    iteration_of: HashMap<OpId, usize>,
    unordered: HashMap<usize, String>,
    problems: Vec<String>,
    /// The slots still held: (slot, iteration, whether scores were copied into it).
    unfinished: Vec<(usize, usize, bool)>,
}

impl ScoreLoop<'_> {
    /// Runs `iteration` for iterations `0..n` over `slots` score slots on
    /// the dry run: every problem found, and the schedule for the queue
    /// model to time. Err is what the loop itself returned (a slot that
    /// can never come back, a job handed out twice).
    pub fn dry_run(slots: usize, n: usize, iteration: Iteration) -> Result<Recorded> {
        let mut dry = DryRun::new();
        let streams = [On::Compute, On::Callback].map(|on| dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), on.name()));
        let ready = (0..slots).map(|_| dry.event()).collect::<Result<Vec<_>>>()?;
        let mut l = ScoreLoop::new(&mut dry, streams, ready);
        l.run(n, iteration)?;
        let end = l.end();
        let races: Vec<String> = dry.schedule.races().iter().map(|r| end.explain(&dry.schedule, r)).collect();
        let mut problems = end.problems;
        problems.extend(end.unfinished.iter().map(|&u| format!("iteration {}: {}", u.1, unfinished_why(u))));
        problems.extend(races);
        Ok(Recorded { schedule: dry.schedule, argmins: end.argmins, problems })
    }

    /// Runs `iteration` for iterations `0..n` through `p` on the rig's
    /// streams; the argmins run with `state` (its slot book, its score
    /// views). At the end it waits for the GPU (every host function has
    /// run: a hand-off may still be on its way to the worker), then for the
    /// threads; jobs never handed out give their slots back with the
    /// reason. The problems found in issue order and the run's races come
    /// back beside the run.
    pub(super) fn on_gpu<'r>(rig: &'r CallbackRig, mut p: Runner<'r>, state: Arc<RunState>, n: usize, iteration: Iteration) -> Result<(Run, Vec<String>)> {
        let streams = [On::Compute, On::Callback].map(|on| p.stream(rig.stream(on), on.name()));
        let ready = (0..rig.slots()).map(|_| p.event()).collect::<Result<Vec<_>>>()?;
        let shared = ready.iter().map(|&e| p.shared_event(e)).collect::<Result<Vec<_>>>()?;
        let leases = (0..rig.slots()).map(|_| None).collect();
        let mut exec = LabRunner::new(p, Live { rig, state, leases, ready: shared, worker: None, waiter: None });
        let mut l = ScoreLoop::new(&mut exec, streams, ready);
        l.run(n, iteration)?;
        let end = l.end();
        let LabRunner { runner, lab: mut live } = exec;
        let run = runner.finish()?;
        for w in [live.worker.take(), live.waiter.take()].into_iter().flatten() {
            w.join()?;
        }
        for &u in &end.unfinished {
            if let Some(lease) = live.leases[u.0].take() {
                live.state.drop_job(ArgminJob { lease }, unfinished_why(u));
            }
        }
        live.state.book.wait_all_back()?;
        let mut problems = end.problems;
        problems.extend(run.races.iter().map(|r| format!("race: {}", r.what)));
        Ok((run, problems))
    }
}

impl<'x> ScoreLoop<'x> {
    fn new(x: &'x mut dyn LabIssue<ScoreOp, SlotCall>, streams: [StreamRef; 2], ready: Vec<EventRef>) -> ScoreLoop<'x> {
        ScoreLoop {
            x,
            streams,
            slots: vec![SlotUse::default(); ready.len()],
            ready,
            sent: Vec::new(),
            argmins: Vec::new(),
            iteration_of: HashMap::new(),
            unordered: HashMap::new(),
            problems: Vec::new(),
            t: 0,
        }
    }

    /// Runs `iteration` for iterations `0..n`.
    fn run(&mut self, n: usize, iteration: Iteration) -> Result<()> {
        for t in 0..n {
            self.t = t;
            iteration(self, t)?;
        }
        Ok(())
    }

    /// Where every argmin was sent so far, in issue order.
    pub fn sent(&self) -> &[Sent] {
        &self.sent
    }

    fn stream(&self, on: On) -> StreamRef {
        self.streams[on as usize]
    }
    fn slot(&self, slot: Slot) -> Result<&SlotUse> {
        let n = self.slots.len();
        self.slots.get(slot.0).ok_or_else(|| LabError::config(format!("slot {} does not exist ({n} slots)", slot.0)))
    }
    fn lease(&mut self, index: usize, t: usize) -> Slot {
        let s = &mut self.slots[index];
        *s = SlotUse { lease: Some(t), last_reader: s.last_reader, device_holds: s.device_holds, host_holds: s.host_holds, ..SlotUse::default() };
        Slot(index)
    }
    /// The iteration whose scores `slot` holds, now handed to `reader`,
    /// and why that reader is not ordered after the slot's D2H, if it is
    /// not (kept to name the race the dry run's schedule finds).
    fn hand_out(&mut self, slot: Slot, reader: Reader) -> Result<(usize, Option<String>)> {
        let s = self.slot(slot)?;
        let t = s.lease.ok_or_else(|| handed_out(slot))?;
        let unordered = s.order.missing(reader, slot, t);
        if let Some(why) = &unordered {
            self.unordered.insert(t, why.clone());
        }
        self.slots[slot.0].lease = None;
        Ok((t, unordered))
    }
    fn note(&mut self, id: OpId, t: usize) -> OpId {
        self.iteration_of.insert(id, t);
        id
    }
    /// The argmin op `id` of iteration `t` reads `slot`: whose scores does it read?
    fn argmin_issued(&mut self, id: OpId, slot: Slot, t: usize, on: ArgminOn) {
        self.note(id, t);
        let s = slot.0;
        // A D2H issued before the row_dot it should carry copies what the
        // slot held before (no race: the stream orders them, the other way round).
        match self.slots[s].host_holds {
            Some(Some(x)) if x == t => {}
            Some(Some(x)) => self.problems.push(format!(
                "iteration {t}'s argmin reads iteration {x}'s scores from slot {s}: its D2H was issued before its row_dot, so it copied what the slot held before"
            )),
            Some(None) => {
                self.problems.push(format!("iteration {t}'s argmin reads slot {s}'s scores before any row_dot wrote them: its D2H was issued before its row_dot"))
            }
            None => self.problems.push(format!("iteration {t}'s argmin reads slot {s}, but no D2H copied scores to it")),
        }
        self.slots[s].last_reader = Some(id);
        self.argmins.push((id, t, on));
    }

    // ---- the vocabulary --------------------------------------------------

    /// Waits until a slot is free (its last reader gave it back) and leases it to `t`.
    pub fn take_slot(&mut self, t: usize) -> Result<Slot> {
        if self.slots.iter().all(|s| s.lease.is_some()) {
            let uncopied: Vec<(usize, usize)> = self.slots.iter().enumerate().filter(|(_, s)| !s.copied).filter_map(|(i, s)| s.lease.map(|u| (i, u))).collect();
            return Err(super::slots::no_slot_ever(t, &uncopied));
        }
        // With nothing run, the slot that comes back first: a never-used
        // one, else the one whose argmin was issued first (the readers
        // finish in issue order). On a GPU the slot book says which.
        let free = (0..self.slots.len()).filter(|&i| self.slots[i].lease.is_none());
        let first_back = free.min_by_key(|&i| self.slots[i].last_reader.map_or((0, 0), |r| (1, r))).expect("a slot is free");
        let i = self.x.lab_call(SlotCall::Free { t }, first_back)?;
        self.slot(Slot(i))?;
        // The loop got the slot back from its last reader.
        if let Some(reader) = self.slots[i].last_reader {
            self.x.learns(MAIN_THREAD, reader);
        }
        Ok(self.lease(i, t))
    }
    /// Slot `index` at once, free or not: what `buffers[t % n]` does.
    pub fn slot_at(&mut self, index: usize, t: usize) -> Result<Slot> {
        self.slot(Slot(index))?;
        let i = self.x.lab_call(SlotCall::At { index, t }, index)?;
        Ok(self.lease(i, t))
    }
    /// Enqueues `row_dot` of query `t` into the slot's device scores.
    pub fn row_dot(&mut self, on: On, t: usize, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        let id = self.x.lab_op(self.stream(on), ScoreOp::RowDot { t, slot })?;
        self.note(id, t);
        self.slots[slot.0].device_holds = Some(t);
        Ok(())
    }
    /// Enqueues the D2H of the slot's scores into its pinned memory.
    pub fn d2h_scores(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.slot(slot)?.lease.unwrap_or(self.t);
        let id = self.x.lab_op(self.stream(on), ScoreOp::D2h { t, slot })?;
        self.note(id, t);
        let u = &mut self.slots[slot.0];
        (u.order, u.host_holds, u.copied) = (SlotOrder::d2h(on), Some(u.device_holds), true);
        Ok(())
    }
    /// Records the slot's "scores ready" event on `on`.
    pub fn record_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        self.slots[slot.0].order.record(on);
        self.x.record(self.ready[slot.0], self.stream(on))
    }
    /// Makes `on` wait for the slot's "scores ready" event.
    pub fn wait_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        self.slots[slot.0].order.wait(on);
        self.x.wait(self.stream(on), self.ready[slot.0])
    }
    /// A host function on `on` that does the argmin itself.
    pub fn host_fn_argmin(&mut self, on: On, slot: Slot) -> Result<()> {
        self.sent.push(Sent::To(ArgminOn::HostFn(on)));
        let (t, unordered) = self.hand_out(slot, Reader::HostFn(on))?;
        let id = self.x.host_fn(self.stream(on), ScoreOp::Argmin { t, slot, on: ArgminOn::HostFn(on), unordered })?;
        self.argmin_issued(id, slot, t, ArgminOn::HostFn(on));
        Ok(())
    }
    /// A host function on `on` that only hands the argmin to the worker.
    pub fn host_fn_hand_off(&mut self, on: On, slot: Slot) -> Result<()> {
        self.sent.push(Sent::HandOffOn(on));
        let (t, unordered) = self.hand_out(slot, Reader::HostFn(on))?;
        let hand_off = self.x.host_fn(self.stream(on), ScoreOp::HandOff { t, slot, unordered })?;
        // The worker gets the job from the hand-off, and reads the slot after it.
        self.x.learns(WORKER_THREAD, hand_off);
        let id = self.x.on_thread(WORKER_THREAD, ScoreOp::Argmin { t, slot, on: ArgminOn::Worker, unordered: None })?;
        self.note(hand_off, t);
        self.argmin_issued(id, slot, t, ArgminOn::Worker);
        Ok(())
    }
    /// Gives the job to a thread that waits on the "scores ready" event itself.
    pub fn hand_to_waiting_thread(&mut self, slot: Slot) -> Result<()> {
        self.sent.push(Sent::To(ArgminOn::WaitingThread));
        let (t, unordered) = self.hand_out(slot, Reader::WaitingThread)?;
        // The job arrives from the enqueue loop; the thread then waits on the event.
        self.x.hands_to(WAITER_THREAD);
        self.x.thread_waits(WAITER_THREAD, self.ready[slot.0]);
        let id = self.x.on_thread(WAITER_THREAD, ScoreOp::Argmin { t, slot, on: ArgminOn::WaitingThread, unordered })?;
        self.argmin_issued(id, slot, t, ArgminOn::WaitingThread);
        Ok(())
    }

    // ---- after the loop ----------------------------------------------------

    /// The loop's books; its executor is free again.
    fn end(self) -> Ended {
        // The slots still held after the loop: an iteration that took a slot
        // and never copied into it, or scores whose argmin never came.
        let unfinished = self.slots.iter().enumerate().filter_map(|(i, s)| s.lease.map(|t| (i, t, s.copied))).collect();
        Ended { streams: self.streams, argmins: self.argmins, iteration_of: self.iteration_of, unordered: self.unordered, problems: self.problems, unfinished }
    }
}

/// Why a slot was still held after the loop, without the iteration (the
/// caller names it): (slot, iteration, whether scores were copied into it).
fn unfinished_why((slot, _, copied): (usize, usize, bool)) -> String {
    if copied {
        format!("its scores were copied into slot {slot} but no argmin was ever issued")
    } else {
        format!("it took slot {slot} and never copied scores into it: the slot stays taken, so fewer are left for the iterations after (an iteration takes one slot)")
    }
}

impl Ended {
    /// The lab's name for the stream `op` ran on.
    fn stream_of(&self, op: &Op) -> &'static str {
        match op.lane {
            Lane::Stream(i) if i == self.streams[On::Compute as usize].0 => On::Compute.name(),
            Lane::Stream(i) if i == self.streams[On::Callback as usize].0 => On::Callback.name(),
            _ => "another",
        }
    }

    /// A race of the schedule in the lab's words: the fault and where.
    fn explain(&self, schedule: &Schedule, r: &Race) -> String {
        let (e, l) = (&schedule.ops[r.earlier], &schedule.ops[r.later]);
        let t = |id: OpId| self.iteration_of.get(&id).copied().unwrap_or(0);
        let slot = r.buffer.rsplit(' ').next().unwrap_or("?");
        match (e.kind, l.kind) {
            // The argmin of t is issued before a later iteration's D2H into its slot.
            (OpKind::Host, OpKind::D2h) => format!(
                "slot {slot} was reused too early: iteration {}'s D2H may overwrite it while iteration {}'s argmin reads it",
                t(r.later),
                t(r.earlier)
            ),
            (OpKind::D2h, OpKind::Host) if t(r.earlier) == t(r.later) => self.unordered.get(&t(r.later)).cloned().unwrap_or_else(|| {
                format!(
                    "iteration {} read slot {slot} before its scores arrived: its argmin is not ordered after its D2H on the {} stream",
                    t(r.later),
                    self.stream_of(e)
                )
            }),
            (OpKind::D2h, OpKind::Host) => format!("slot {slot} held iteration {}'s scores when iteration {} read it: the slot was reused too early", t(r.earlier), t(r.later)),
            (OpKind::Kernel, OpKind::D2h) => format!(
                "iteration {} read slot {slot} before its scores arrived: its D2H on the {} stream is not ordered after its row_dot on the {} stream, so it may copy the slot before the row_dot has written it",
                t(r.later),
                self.stream_of(l),
                self.stream_of(e)
            ),
            _ => r.what.clone(),
        }
    }
}
