//! Lab 4's vocabulary, written once over the runner's two executors.
//!
//! The variants and the learner's exercise speak of what this lab is about
//! (take a score slot, run `row_dot`, copy the scores back, the "scores
//! ready" event, where the argmin runs) to a [`ScoreLoop`]. Each call
//! keeps the lab's own bookkeeping (which iteration holds a slot, what
//! orders its reader after its D2H, whose scores it holds) and then
//! becomes the runner's operations: on a GPU, ops of a
//! [`crate::gpu::Runner`] (the lab's kernel and copy, events, host
//! functions, argmins on the worker and the event-waiting thread); with no
//! GPU, the same calls recorded on the runner's dry run
//! ([`crate::pipeline::dry_run::DryRun`]), whose schedule the queue model
//! times ([`super::model`]). Either way the schedule's race check sees the
//! same ops, and a problem reads the same on both.

use super::order::{Reader, SlotOrder};
use super::rig::CallbackRig;
use super::slots::Lease;
use super::work::{self, ArgminJob, CallbackTask, RunState, WaitForScores, Worker};
use super::{On, Slot};
use crate::error::{LabError, Result};
use crate::gpu::{Event, Run, Runner};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{EventRef, Issue, StreamRef};
use crate::pipeline::op::{Access, OpId, OpKind, StreamDecl, StreamKind};
use crate::pipeline::schedule::{Race, Schedule};
use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// The host threads of a run's schedule: 0 is the enqueue loop.
pub const MAIN_THREAD: usize = 0;
pub const WORKER_THREAD: usize = 1;
pub const WAITER_THREAD: usize = 2;

/// Where an argmin ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgminOn {
    /// Inside a host function, on the driver's callback thread, enqueued on a stream.
    HostFn(On),
    Worker,
    WaitingThread,
}

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

/// The GPU side of a run: the runner, the rig's buffers, the threads.
struct Live<'r> {
    rig: &'r CallbackRig,
    /// Taken by `finish`; on an error, dropping it waits for the GPU.
    p: Option<Runner<'r>>,
    state: Arc<RunState>,
    /// Per slot: its lease from the slot book until the job is handed out.
    leases: Vec<Option<Lease>>,
    worker: Option<Worker>,
    waiter: Option<Worker>,
}

impl<'r> Live<'r> {
    fn p(&mut self) -> &mut Runner<'r> {
        self.p.as_mut().expect("the runner lives until finish")
    }
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
}

impl Drop for Live<'_> {
    /// On an error: nothing may still use the slots when the run returns.
    fn drop(&mut self) {
        // The runner synchronizes as it drops; then the threads end.
        self.p.take();
        self.worker.take();
        self.waiter.take();
    }
}

/// Which executor the loop's calls become.
enum Exec<'r> {
    Gpu(Box<Live<'r>>),
    Model(Box<DryRun>),
}

/// What one iteration's code may call (see the module docs). The lab's
/// variants and the learner's exercise are written against it; it runs on
/// a GPU or on the queue model.
pub struct ScoreLoop<'r> {
    exec: Exec<'r>,
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

/// A loop run on the queue model, judged and ready to time.
pub struct Recorded {
    pub schedule: Schedule,
    /// Each argmin op: its iteration and where it runs.
    pub argmins: Vec<(OpId, usize, ArgminOn)>,
    /// Reads of the wrong scores, races, slots reused too early, argmins never issued.
    pub problems: Vec<String>,
}

impl ScoreLoop<'static> {
    /// A loop recorded on the dry run, with `slots` score slots.
    pub fn on_model(slots: usize) -> ScoreLoop<'static> {
        let mut dry = DryRun::new();
        let mut stream = |on: On| dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), on.name());
        let streams = [stream(On::Compute), stream(On::Callback)];
        let ready = (0..slots).map(|_| dry.event().expect("the dry run makes events")).collect();
        ScoreLoop::new(Exec::Model(Box::new(dry)), streams, ready, slots)
    }
}

impl<'r> ScoreLoop<'r> {
    fn new(exec: Exec<'r>, streams: [StreamRef; 2], ready: Vec<EventRef>, slots: usize) -> ScoreLoop<'r> {
        ScoreLoop {
            exec,
            streams,
            ready,
            slots: vec![SlotUse::default(); slots],
            sent: Vec::new(),
            argmins: Vec::new(),
            iteration_of: HashMap::new(),
            unordered: HashMap::new(),
            problems: Vec::new(),
            t: 0,
        }
    }

    /// A loop issued through `p` on the rig's streams; the argmins run
    /// with `state` (its slot book, its score views).
    pub(super) fn on_gpu(rig: &'r CallbackRig, mut p: Runner<'r>, state: Arc<RunState>) -> Result<ScoreLoop<'r>> {
        let streams = [p.stream(rig.stream(On::Compute), On::Compute.name()), p.stream(rig.stream(On::Callback), On::Callback.name())];
        let slots = rig.slots();
        let ready = (0..slots).map(|_| p.event()).collect::<Result<Vec<_>>>()?;
        let live = Live { rig, p: Some(p), state, leases: (0..slots).map(|_| None).collect(), worker: None, waiter: None };
        Ok(ScoreLoop::new(Exec::Gpu(Box::new(live)), streams, ready, slots))
    }

    /// Runs `iteration` for iterations `0..n`.
    pub fn run(&mut self, n: usize, iteration: &dyn Fn(&mut ScoreLoop<'r>, usize) -> Result<()>) -> Result<()> {
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
    /// The iteration whose scores `slot` holds, now handed to `reader`. An
    /// unordered reader is refused on the GPU (there the race would be
    /// real) and named on the model, where the schedule finds its race.
    fn hand_out(&mut self, slot: Slot, reader: Reader) -> Result<usize> {
        let s = self.slot(slot)?;
        let t = s.lease.ok_or_else(|| handed_out(slot))?;
        if let Some(why) = s.order.missing(reader, slot, t) {
            match self.exec {
                Exec::Gpu(_) => return Err(LabError::schedule(why)),
                Exec::Model(_) => {
                    self.unordered.insert(t, why);
                }
            }
        }
        self.slots[slot.0].lease = None;
        Ok(t)
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
    /// The slot's pinned scores, as the argmin reads them.
    fn read_of(slot: Slot) -> Vec<Access> {
        vec![Access::read(&slot.scores(true), 0, 1)]
    }

    // ---- the vocabulary --------------------------------------------------

    /// Waits until a slot is free (its last reader gave it back) and leases it to `t`.
    pub fn take_slot(&mut self, t: usize) -> Result<Slot> {
        if self.slots.iter().all(|s| s.lease.is_some()) {
            let uncopied: Vec<(usize, usize)> = self.slots.iter().enumerate().filter(|(_, s)| !s.copied).filter_map(|(i, s)| s.lease.map(|u| (i, u))).collect();
            return Err(super::slots::no_slot_ever(t, &uncopied));
        }
        let i = match &mut self.exec {
            Exec::Gpu(live) => {
                let start = live.state.now_us();
                let lease = live.state.book.take(t)?;
                let end = live.state.now_us();
                if end - start > 2.0 {
                    live.state.span(work::MAIN_LANE, format!("wait for a slot ({t})"), start, end);
                }
                let i = lease.slot;
                live.leases[i] = Some(lease);
                i
            }
            // A never-used slot, else the one whose argmin was issued first
            // (the readers finish in issue order).
            Exec::Model(_) => {
                let free = (0..self.slots.len()).filter(|&i| self.slots[i].lease.is_none());
                free.min_by_key(|&i| self.slots[i].last_reader.map_or((0, 0), |r| (1, r))).expect("a slot is free")
            }
        };
        // The loop got the slot back from its last reader.
        if let Some(reader) = self.slots[i].last_reader {
            match &mut self.exec {
                Exec::Gpu(live) => live.p().learns(MAIN_THREAD, reader),
                Exec::Model(dry) => dry.learns(MAIN_THREAD, reader),
            }
        }
        Ok(self.lease(i, t))
    }
    /// Slot `index` at once, free or not: what `buffers[t % n]` does.
    pub fn slot_at(&mut self, index: usize, t: usize) -> Result<Slot> {
        self.slot(Slot(index))?;
        if let Exec::Gpu(live) = &mut self.exec {
            live.leases[index] = Some(live.state.book.take_at(index, t)?);
        }
        Ok(self.lease(index, t))
    }
    /// Enqueues `row_dot` of query `t` into the slot's device scores.
    pub fn row_dot(&mut self, on: On, t: usize, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        let s = self.stream(on);
        let id = match &mut self.exec {
            Exec::Gpu(live) => {
                let rig = live.rig;
                rig.row_dot_op(live.p(), s, t, slot)?
            }
            Exec::Model(dry) => dry.op(s, OpKind::Kernel, &format!("row_dot {t}"), vec![Access::write(&slot.scores(false), 0, 1)])?,
        };
        self.note(id, t);
        self.slots[slot.0].device_holds = Some(t);
        Ok(())
    }
    /// Enqueues the D2H of the slot's scores into its pinned memory.
    pub fn d2h_scores(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.slot(slot)?.lease.unwrap_or(self.t);
        let s = self.stream(on);
        let id = match &mut self.exec {
            Exec::Gpu(live) => {
                let rig = live.rig;
                rig.d2h_op(live.p(), s, t, slot)?
            }
            Exec::Model(dry) => {
                let acc = vec![Access::read(&slot.scores(false), 0, 1), Access::write(&slot.scores(true), 0, 1)];
                dry.op(s, OpKind::D2h, &format!("D2H scores {t}"), acc)?
            }
        };
        self.note(id, t);
        let u = &mut self.slots[slot.0];
        (u.order, u.host_holds, u.copied) = (SlotOrder::d2h(on), Some(u.device_holds), true);
        Ok(())
    }
    /// Records the slot's "scores ready" event on `on`.
    pub fn record_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        self.slots[slot.0].order.record(on);
        let (e, s) = (self.ready[slot.0], self.stream(on));
        match &mut self.exec {
            Exec::Gpu(live) => live.p().record(e, s),
            Exec::Model(dry) => dry.record(e, s),
        }
    }
    /// Makes `on` wait for the slot's "scores ready" event.
    pub fn wait_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        self.slots[slot.0].order.wait(on);
        let (e, s) = (self.ready[slot.0], self.stream(on));
        match &mut self.exec {
            Exec::Gpu(live) => live.p().wait(s, e),
            Exec::Model(dry) => dry.wait(s, e),
        }
    }
    /// A host function on `on` that does the argmin itself.
    pub fn host_fn_argmin(&mut self, on: On, slot: Slot) -> Result<()> {
        self.sent.push(Sent::To(ArgminOn::HostFn(on)));
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let (s, label) = (self.stream(on), format!("argmin {t}"));
        let id = match &mut self.exec {
            Exec::Gpu(live) => {
                let job = live.job(slot)?;
                let state = live.state.clone();
                live.p().host_fn(s, &label, Self::read_of(slot), CallbackTask::Argmin { state, job })?
            }
            Exec::Model(dry) => dry.host_fn(s, &label, Self::read_of(slot))?,
        };
        self.argmin_issued(id, slot, t, ArgminOn::HostFn(on));
        Ok(())
    }
    /// A host function on `on` that only hands the argmin to the worker.
    pub fn host_fn_hand_off(&mut self, on: On, slot: Slot) -> Result<()> {
        self.sent.push(Sent::HandOffOn(on));
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let (s, label, argmin) = (self.stream(on), format!("hand-off {t}"), format!("argmin {t}"));
        let (hand_off, id) = match &mut self.exec {
            Exec::Gpu(live) => {
                let to = live.worker_sender()?;
                let job = live.job(slot)?;
                let state = live.state.clone();
                let p = live.p();
                let hand_off = p.host_fn(s, &label, vec![], CallbackTask::HandOff { state, job, to })?;
                p.learns(WORKER_THREAD, hand_off);
                (hand_off, p.on_thread(WORKER_THREAD, &argmin, Self::read_of(slot)))
            }
            Exec::Model(dry) => {
                let hand_off = dry.host_fn(s, &label, vec![])?;
                dry.learns(WORKER_THREAD, hand_off);
                (hand_off, dry.on_thread(WORKER_THREAD, &argmin, Self::read_of(slot)))
            }
        };
        self.note(hand_off, t);
        self.argmin_issued(id, slot, t, ArgminOn::Worker);
        Ok(())
    }
    /// Gives the job to a thread that waits on the "scores ready" event itself.
    pub fn hand_to_waiting_thread(&mut self, slot: Slot) -> Result<()> {
        self.sent.push(Sent::To(ArgminOn::WaitingThread));
        let t = self.hand_out(slot, Reader::WaitingThread)?;
        let (e, label) = (self.ready[slot.0], format!("argmin {t}"));
        let id = match &mut self.exec {
            Exec::Gpu(live) => {
                if live.waiter.is_none() {
                    let gpu = live.rig.gpu.clone();
                    let p = live.p.as_ref().expect("live");
                    let ready: Vec<Arc<Event>> = self.ready.iter().map(|&e| p.shared_event(e)).collect::<Result<_>>()?;
                    let wait: WaitForScores = Box::new(move |lease: &Lease| {
                        gpu.bind()?;
                        ready[lease.slot].synchronize()
                    });
                    live.waiter = Some(Worker::spawn("event-waiter", work::WAITER_LANE, live.state.clone(), Some(wait))?);
                }
                let job = live.job(slot)?;
                let p = live.p();
                // The job arrives from the enqueue loop; the thread then waits on the event.
                p.hands_to(WAITER_THREAD);
                p.thread_waits(WAITER_THREAD, e);
                let id = p.on_thread(WAITER_THREAD, &label, Self::read_of(slot));
                live.waiter.as_ref().expect("just made").sender().send(job).map_err(|_| LabError::Thread("the event-waiting thread is gone".into()))?;
                id
            }
            Exec::Model(dry) => {
                dry.hands_to(WAITER_THREAD);
                dry.thread_waits(WAITER_THREAD, e);
                dry.on_thread(WAITER_THREAD, &label, Self::read_of(slot))
            }
        };
        self.argmin_issued(id, slot, t, ArgminOn::WaitingThread);
        Ok(())
    }

    // ---- after the loop ----------------------------------------------------

    /// The slots still held after the loop: (slot, iteration, whether
    /// scores were copied into it). An iteration that took a slot and never
    /// copied into it, or scores whose argmin never came.
    fn unfinished(&self) -> Vec<(usize, usize, bool)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.lease.map(|t| (i, t, s.copied))).collect()
    }
    /// Why a slot was still held, without the iteration (the caller names it).
    fn unfinished_why((slot, _, copied): (usize, usize, bool)) -> String {
        if copied {
            format!("its scores were copied into slot {slot} but no argmin was ever issued")
        } else {
            format!("it took slot {slot} and never copied scores into it: the slot stays taken, so fewer are left for the iterations after (an iteration takes one slot)")
        }
    }

    /// A race of the schedule in the lab's words.
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
                    "iteration {} read slot {slot} before its scores arrived: its argmin is not ordered after its D2H (record \"scores ready\" on the D2H's stream after it, and wait for it where the argmin runs)",
                    t(r.later)
                )
            }),
            (OpKind::D2h, OpKind::Host) => format!("slot {slot} held iteration {}'s scores when iteration {} read it: the slot was reused too early", t(r.earlier), t(r.later)),
            (OpKind::Kernel, OpKind::D2h) => format!(
                "iteration {} read slot {slot} before its scores arrived: its D2H is not ordered after its row_dot (copy on the stream that computed them, or wait for them)",
                t(r.later)
            ),
            _ => r.what.clone(),
        }
    }

    /// Ends a loop recorded on the model: every problem found, the schedule to time.
    pub fn finish_on_model(self) -> Result<Recorded> {
        let Exec::Model(dry) = &self.exec else {
            return Err(LabError::config("this loop ran on a GPU, not on the model"));
        };
        let races: Vec<String> = dry.schedule.races().iter().map(|r| self.explain(&dry.schedule, r)).collect();
        let unfinished = self.unfinished().into_iter().map(|u| format!("iteration {}: {}", u.1, Self::unfinished_why(u)));
        let mut problems = self.problems.clone();
        problems.extend(unfinished);
        problems.extend(races);
        match self.exec {
            Exec::Model(dry) => Ok(Recorded { schedule: dry.schedule, argmins: self.argmins, problems }),
            Exec::Gpu(_) => Err(LabError::config("this loop ran on a GPU, not on the model")),
        }
    }

    /// Ends a loop issued on the GPU: waits for the GPU (every host
    /// function has run: a hand-off may still be on its way to the
    /// worker), then for the threads; jobs never handed out give their
    /// slots back with the reason. The problems found in issue order and
    /// the run's races come back beside the run.
    pub(super) fn finish_on_gpu(mut self) -> Result<(Run, Vec<String>)> {
        let unfinished = self.unfinished();
        let Exec::Gpu(live) = &mut self.exec else {
            return Err(LabError::config("this loop ran on the model, not on a GPU"));
        };
        let run = live.p.take().expect("finished once").finish()?;
        for w in [live.worker.take(), live.waiter.take()].into_iter().flatten() {
            w.join()?;
        }
        for u in unfinished {
            if let Some(lease) = live.leases[u.0].take() {
                live.state.drop_job(ArgminJob { lease }, Self::unfinished_why(u));
            }
        }
        live.state.book.wait_all_back()?;
        let mut problems = self.problems.clone();
        problems.extend(run.races.iter().map(|r| format!("race: {}", r.what)));
        Ok((run, problems))
    }
}
