//! Lab 4 with no GPU: the lab's iteration code (it implements
//! [`CallbackIssue`]) recorded as a pipeline [`Schedule`]: kernels and
//! copies on the two streams, host functions on them, argmins on the
//! worker and the event-waiting thread, the enqueue loop waiting for slots.
//! The schedule's own checks find what a wrong wiring does to the data (an
//! argmin not ordered after its D2H, a slot reused under its reader), and
//! the pipeline's queue model ([`predict`]) times it from the recorded
//! costs, on the resources that really serialize them: the streams, the
//! driver's one callback thread, each CPU thread.
//!
//! Assumptions (stated, not measured here), as the machine model takes
//! them: a host function's stream pays half its round trip to reach the
//! callback thread and half to be released after it returns; the round
//! trip is the recorded one, R (after a kernel: the callback thread had
//! gone to sleep), unless the thread ran something within the last R, when
//! it is [`HOST_FN_AWAKE_MS`]. A thread woken by an event takes R/2; a
//! hand-off (a channel send) costs [`HAND_OFF_MS`]; issuing costs the
//! enqueue loop nothing.

use super::order::{Reader, SlotOrder};
use super::work::{CALLBACK_LANE, MAIN_LANE, WAITER_LANE, WORKER_LANE};
use super::{CallbackIssue, Iteration, On, Slot};
use crate::error::{LabError, Result};
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{Access, Lane, Op, OpId, OpKind};
use crate::pipeline::predict::predict;
use crate::pipeline::schedule::{Race, Schedule};
use crate::pipeline::timeline::{Span, Timeline};
use std::collections::HashMap;

/// A host function that only sends a job down a channel.
pub const HAND_OFF_MS: f64 = 0.005;
/// An empty host function's round trip when the callback thread is awake
/// (with nothing before it; after a kernel it takes several times that).
pub const HOST_FN_AWAKE_MS: f64 = 0.016;

/// The host threads of the schedule.
const MAIN: usize = 0;
const WORKER: usize = 1;
const WAITER: usize = 2;

/// One iteration's costs, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelCosts {
    pub kernel_ms: f64,
    pub d2h_ms: f64,
    /// One argmin, wherever it runs.
    pub cpu_ms: f64,
    /// An empty host function's round trip on a stream.
    pub host_fn_ms: f64,
}

impl ModelCosts {
    pub fn gpu_ms(&self) -> f64 {
        self.kernel_ms + self.d2h_ms
    }
    /// The machine these costs run on (copy engines do not matter here:
    /// one stream's D2H at a time).
    pub fn machine(&self) -> Machine {
        Machine { host_fn_round_trip: self.host_fn_ms, host_fn_awake: HOST_FN_AWAKE_MS, host_wake: self.host_fn_ms / 2.0, ..Machine::engines(2) }
    }
}

/// Where an argmin ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgminOn {
    /// Inside a host function, on the driver's callback thread, enqueued on a stream.
    HostFn(On),
    Worker,
    WaitingThread,
}

/// One argmin as it ran in the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArgmin {
    pub iteration: usize,
    pub on: ArgminOn,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// One slot as the issuer sees it.
#[derive(Clone, Debug, Default)]
struct ModelSlot {
    /// The iteration holding it until its argmin is issued.
    lease: Option<usize>,
    /// The op that reads its scores last (the slot is free once it ends).
    last_reader: Option<OpId>,
    /// What orders a reader after its D2H (to name a missing link).
    order: SlotOrder,
    /// The iteration whose row_dot wrote its device scores last, in issue
    /// order (a later-issued op never runs before an earlier one it is
    /// ordered with, and an unordered pair is a race, named as such).
    device_holds: Option<usize>,
    /// What its last D2H copied to the host: the iteration of the device
    /// scores then (`Some(None)`: scores no row_dot had written).
    host_holds: Option<Option<usize>>,
    /// Whether scores were copied into it since it was taken.
    copied: bool,
}

/// The lab's iteration code recorded as a schedule (see the module docs).
pub struct ModelIssuer {
    pub costs: ModelCosts,
    pub schedule: Schedule,
    slots: Vec<ModelSlot>,
    /// The iteration and the argmin's place of each op that is an argmin.
    argmin_ops: Vec<(OpId, usize, ArgminOn)>,
    /// The iteration of every op (for the problems' wording).
    iteration_of: HashMap<OpId, usize>,
    /// Per iteration whose reader was unordered when handed out: the missing link.
    unordered: HashMap<usize, String>,
    /// Filled by `run`: every argmin with its predicted times.
    pub argmins: Vec<ModelArgmin>,
    /// Reads of the wrong scores, slots reused too early, argmins never issued.
    pub problems: Vec<String>,
    times: Vec<(f64, f64)>,
}

fn stream(on: On) -> usize {
    on as usize
}

impl ModelIssuer {
    pub fn new(costs: ModelCosts, slots: usize) -> ModelIssuer {
        ModelIssuer {
            costs,
            schedule: Schedule::new(),
            slots: vec![ModelSlot::default(); slots],
            argmin_ops: Vec::new(),
            iteration_of: HashMap::new(),
            unordered: HashMap::new(),
            argmins: Vec::new(),
            problems: Vec::new(),
            times: Vec::new(),
        }
    }

    /// Runs `iteration` for `n` iterations, then judges the schedule and
    /// times it; Err is what the loop itself returned (a slot that can
    /// never come back, a job handed out twice).
    pub fn run(&mut self, n: usize, iteration: Iteration) -> Result<()> {
        for t in 0..n {
            iteration(self, t)?;
        }
        for (i, s) in self.slots.iter().enumerate() {
            match s.lease {
                Some(t) if !s.copied => self.problems.push(format!(
                    "iteration {t} took slot {i} and never copied scores into it: the slot stays taken, so fewer are left for the iterations after (an iteration takes one slot)"
                )),
                Some(t) => self.problems.push(format!("iteration {t}: its scores were copied into slot {i} but no argmin was ever issued")),
                None => {}
            }
        }
        let races: Vec<String> = self.schedule.races().iter().map(|r| self.explain(r)).collect();
        self.problems.extend(races);
        let costs = self.costs;
        self.times = predict(&self.schedule, costs.machine(), |op| Self::duration(&costs, op));
        self.argmins =
            self.argmin_ops.iter().map(|&(id, iteration, on)| ModelArgmin { iteration, on, start_ms: self.times[id].0, end_ms: self.times[id].1 }).collect();
        Ok(())
    }

    fn duration(c: &ModelCosts, op: &Op) -> f64 {
        match op.kind {
            OpKind::Kernel => c.kernel_ms,
            OpKind::D2h => c.d2h_ms,
            OpKind::Host if op.label.starts_with("hand-off") => HAND_OFF_MS,
            OpKind::Host => c.cpu_ms,
            // This lab issues nothing else.
            _ => 0.0,
        }
    }

    /// A race of the schedule in the lab's words.
    fn explain(&self, r: &Race) -> String {
        let (e, l) = (&self.schedule.ops[r.earlier], &self.schedule.ops[r.later]);
        let t = |id: OpId| self.iteration_of.get(&id).copied().unwrap_or(0);
        let slot = r.buffer.rsplit(' ').next().unwrap_or("?");
        match (e.kind, l.kind) {
            // The argmin of t is issued before a later iteration's D2H into its slot.
            (OpKind::Host, OpKind::D2h) => format!(
                "slot {slot} was reused too early: iteration {}'s D2H may overwrite it while iteration {}'s argmin reads it (take a slot that is free: take_slot, not slot_at)",
                t(r.later),
                t(r.earlier)
            ),
            (OpKind::D2h, OpKind::Host) if t(r.earlier) == t(r.later) => self.unordered.get(&t(r.later)).cloned().unwrap_or_else(|| {
                format!(
                    "iteration {} read slot {slot} before its scores arrived: its argmin is not ordered after its D2H (record \"scores ready\" on the D2H's stream after it, and wait for it where the argmin runs)",
                    t(r.later)
                )
            }),
            (OpKind::D2h, OpKind::Host) => {
                format!("slot {slot} held iteration {}'s scores when iteration {} read it: the slot was reused too early", t(r.earlier), t(r.later))
            }
            (OpKind::Kernel, OpKind::D2h) => format!(
                "iteration {} read slot {slot} before its scores arrived: its D2H is not ordered after its row_dot (copy on the stream that computed them, or wait for them)",
                t(r.later)
            ),
            _ => r.what.clone(),
        }
    }

    /// From the start to the end of the last argmin, ms.
    pub fn total_ms(&self) -> f64 {
        self.argmins.iter().map(|a| a.end_ms).fold(0.0, f64::max)
    }

    /// The predicted timeline, lanes named as the GPU run names them.
    pub fn timeline(&self, title: &str) -> Timeline {
        let spans = self
            .schedule
            .ops
            .iter()
            .zip(&self.times)
            .map(|(op, &(start, end))| {
                let lane = match op.lane {
                    Lane::Stream(s) if op.kind != OpKind::Host => if s == 0 { On::Compute } else { On::Callback }.lane(),
                    Lane::Stream(_) => CALLBACK_LANE,
                    Lane::HostThread(WORKER) => WORKER_LANE,
                    Lane::HostThread(WAITER) => WAITER_LANE,
                    Lane::HostThread(_) => MAIN_LANE,
                };
                Span { lane: lane.into(), kind: op.kind, label: op.label.clone(), start_us: start * 1e3, end_us: end * 1e3, class: None, index: None }
            })
            .collect();
        Timeline { title: title.into(), device: "queue model".into(), spans, source: "model".into(), untraced_ms: None }
    }

    fn slot(&mut self, slot: Slot) -> Result<&mut ModelSlot> {
        let n = self.slots.len();
        self.slots.get_mut(slot.0).ok_or_else(|| LabError::config(format!("slot {} does not exist ({n} slots)", slot.0)))
    }

    fn lease(&mut self, index: usize, t: usize) -> Slot {
        let s = &mut self.slots[index];
        s.lease = Some(t);
        s.order = SlotOrder::default();
        s.copied = false;
        Slot(index)
    }

    /// The iteration whose scores `slot` holds, now handed to `reader`.
    fn hand_out(&mut self, slot: Slot, reader: Reader) -> Result<usize> {
        let s = self.slot(slot)?;
        let t = s.lease.take().ok_or_else(|| LabError::config(format!("slot {} holds no iteration's scores (its job was already handed out)", slot.0)))?;
        if let Some(why) = s.order.missing(reader, slot, t) {
            self.unordered.insert(t, why);
        }
        Ok(t)
    }

    fn note(&mut self, id: OpId, t: usize) -> OpId {
        self.iteration_of.insert(id, t);
        id
    }

    /// The argmin op `id` of iteration `t` reads `slot`.
    fn argmin_issued(&mut self, id: OpId, slot: Slot, t: usize, on: ArgminOn) {
        self.note(id, t);
        // Whose scores it reads: a D2H issued before the row_dot it should
        // carry copies what the slot held before (no race: the stream
        // orders them, the other way round).
        let s = slot.0;
        match self.slots[s].host_holds {
            Some(Some(x)) if x == t => {}
            Some(Some(x)) => self.problems.push(format!(
                "iteration {t}'s argmin reads iteration {x}'s scores from slot {s}: its D2H was issued before its row_dot, so it copied what the slot held before"
            )),
            Some(None) => self.problems.push(format!(
                "iteration {t}'s argmin reads slot {s}'s scores before any row_dot wrote them: its D2H was issued before its row_dot"
            )),
            None => self.problems.push(format!("iteration {t}'s argmin reads slot {s}, but no D2H copied scores to it")),
        }
        self.slots[slot.0].last_reader = Some(id);
        self.argmin_ops.push((id, t, on));
    }
}

impl CallbackIssue for ModelIssuer {
    fn take_slot(&mut self, t: usize) -> Result<Slot> {
        // A never-used slot, else the one whose argmin was issued first (the
        // consumers finish in issue order): the enqueue loop waits for it.
        let free = (0..self.slots.len()).filter(|&i| self.slots[i].lease.is_none());
        let Some(i) = free.min_by_key(|&i| self.slots[i].last_reader.map_or((0, 0), |r| (1, r))) else {
            let uncopied: Vec<(usize, usize)> = self.slots.iter().enumerate().filter(|(_, s)| !s.copied).filter_map(|(i, s)| s.lease.map(|u| (i, u))).collect();
            return Err(super::slots::no_slot_ever(t, &uncopied));
        };
        if let Some(reader) = self.slots[i].last_reader {
            self.schedule.host_learns(MAIN, reader);
        }
        Ok(self.lease(i, t))
    }
    fn slot_at(&mut self, index: usize, t: usize) -> Result<Slot> {
        self.slot(Slot(index))?;
        Ok(self.lease(index, t))
    }
    fn row_dot(&mut self, on: On, t: usize, slot: Slot) -> Result<()> {
        self.slot(slot)?;
        let id = self.schedule.gpu_op(MAIN, stream(on), OpKind::Kernel, &format!("row_dot {t}"), vec![Access::write(&slot.scores(false), 0, 1)]);
        self.note(id, t);
        self.slots[slot.0].device_holds = Some(t);
        Ok(())
    }
    fn d2h_scores(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.slot(slot)?.lease.unwrap_or(0);
        let acc = vec![Access::read(&slot.scores(false), 0, 1), Access::write(&slot.scores(true), 0, 1)];
        let id = self.schedule.gpu_op(MAIN, stream(on), OpKind::D2h, &format!("D2H scores {t}"), acc);
        self.note(id, t);
        self.slots[slot.0].order = SlotOrder::d2h(on);
        self.slots[slot.0].host_holds = Some(self.slots[slot.0].device_holds);
        self.slots[slot.0].copied = true;
        Ok(())
    }
    fn record_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?.order.record(on);
        self.schedule.record_event(slot.0, stream(on));
        Ok(())
    }
    fn wait_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        self.slot(slot)?.order.wait(on);
        self.schedule.stream_wait_event(stream(on), slot.0);
        Ok(())
    }
    fn host_fn_argmin(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let id = self.schedule.gpu_op(MAIN, stream(on), OpKind::Host, &format!("argmin {t}"), vec![Access::read(&slot.scores(true), 0, 1)]);
        self.argmin_issued(id, slot, t, ArgminOn::HostFn(on));
        Ok(())
    }
    fn host_fn_hand_off(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let hand_off = self.schedule.gpu_op(MAIN, stream(on), OpKind::Host, &format!("hand-off {t}"), vec![]);
        self.note(hand_off, t);
        self.schedule.host_learns(WORKER, hand_off);
        let id = self.schedule.host_op(WORKER, &format!("argmin {t}"), vec![Access::read(&slot.scores(true), 0, 1)]);
        self.argmin_issued(id, slot, t, ArgminOn::Worker);
        Ok(())
    }
    fn hand_to_waiting_thread(&mut self, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::WaitingThread)?;
        // The job arrives from the enqueue loop; the thread then waits on the event.
        self.schedule.host_joins(WAITER, MAIN);
        self.schedule.host_wait_event(WAITER, slot.0);
        let id = self.schedule.host_op(WAITER, &format!("argmin {t}"), vec![Access::read(&slot.scores(true), 0, 1)]);
        self.argmin_issued(id, slot, t, ArgminOn::WaitingThread);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{bound_ms, serial_ms, Variant};
    use super::*;

    const COSTS: ModelCosts = ModelCosts { kernel_ms: 0.26, d2h_ms: 0.01, cpu_ms: 0.27, host_fn_ms: 0.07 };

    fn run(v: Variant, n: usize) -> ModelIssuer {
        let mut m = ModelIssuer::new(COSTS, 4);
        m.run(n, &v.iteration()).unwrap();
        assert!(m.problems.is_empty(), "{}: {:?}", v.label(), m.problems);
        assert_eq!(m.argmins.len(), n);
        m
    }

    #[test]
    fn variant_1_takes_turns_and_pays_a_round_trip_per_iteration() {
        let m = run(Variant::HostFnOnCompute, 100);
        let want = serial_ms(100, COSTS.gpu_ms(), COSTS.cpu_ms) + 100.0 * COSTS.host_fn_ms;
        assert!((m.total_ms() / want - 1.0).abs() < 0.01, "{} vs {want}", m.total_ms());
        assert!(m.argmins.iter().all(|a| a.on == ArgminOn::HostFn(On::Compute)));
    }

    #[test]
    fn the_overlapping_variants_come_near_the_bound() {
        let bound = bound_ms(200, COSTS.gpu_ms(), COSTS.cpu_ms);
        for (v, on) in [
            (Variant::HostFnOnCallbackStream, ArgminOn::HostFn(On::Callback)),
            (Variant::HandOffToWorker, ArgminOn::Worker),
            (Variant::EventWaitingThread, ArgminOn::WaitingThread),
        ] {
            let m = run(v, 200);
            let eff = bound / m.total_ms();
            // Variant 2's stream pays a host function's dispatch and release
            // per iteration on top of the argmin, which is the slower stage here.
            let want = if v == Variant::HostFnOnCallbackStream { 0.93 } else { 0.97 };
            assert!(eff > want && eff <= 1.0, "{}: {eff}", v.label());
            assert!(m.argmins.iter().all(|a| a.on == on), "{}", v.label());
            // Every argmin starts after its own D2H ends.
            let tl = m.timeline("t");
            for a in &m.argmins {
                let d2h = tl.spans.iter().find(|s| s.label == format!("D2H scores {}", a.iteration)).unwrap();
                assert!(a.start_ms * 1e3 >= d2h.end_us, "{}: argmin {}", v.label(), a.iteration);
            }
        }
    }

    #[test]
    fn a_slot_taken_by_index_is_reused_under_its_reader() {
        // CPU slower than GPU: buffers[t % 4] comes round before the worker is done.
        let mut m = ModelIssuer::new(ModelCosts { cpu_ms: 1.0, ..COSTS }, 4);
        m.run(32, &|l, t| {
            let s = l.slot_at(t % 4, t)?;
            l.row_dot(On::Compute, t, s)?;
            l.d2h_scores(On::Compute, s)?;
            l.record_scores_ready(On::Compute, s)?;
            l.wait_scores_ready(On::Callback, s)?;
            l.host_fn_hand_off(On::Callback, s)
        })
        .unwrap();
        assert!(
            m.problems.iter().any(|p| p.contains("slot 0 was reused too early: iteration 4's D2H may overwrite it while iteration 0's argmin reads it")),
            "{:?}",
            m.problems
        );
    }

    #[test]
    fn an_unordered_reader_is_a_race_named_by_its_missing_link_and_a_missing_argmin_reported() {
        let mut m = ModelIssuer::new(COSTS, 4);
        m.run(8, &|l, t| {
            let s = l.take_slot(t)?;
            l.row_dot(On::Compute, t, s)?;
            l.d2h_scores(On::Compute, s)?;
            l.host_fn_hand_off(On::Callback, s)
        })
        .unwrap();
        let e = &m.problems[0];
        assert!(
            e.contains("iteration 0: a host function on the callback stream reads slot 0 but is not ordered") && e.contains("no \"scores ready\" event"),
            "{e}"
        );
        assert_eq!(m.problems.len(), 8, "every iteration races: {:?}", m.problems);
        let mut m = ModelIssuer::new(COSTS, 4);
        let e = m
            .run(8, &|l, t| {
                let s = l.take_slot(t)?;
                l.row_dot(On::Compute, t, s)?;
                l.d2h_scores(On::Compute, s)
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("iteration 4 would wait for a slot forever"), "{e}");
    }

    #[test]
    fn scores_copied_before_their_kernel_was_issued_are_the_slots_old_ones() {
        // The D2H comes first on the compute stream: ordered, no race, and
        // it copies what the slot held before (nothing, then iteration t-4's).
        let mut m = ModelIssuer::new(COSTS, 4);
        m.run(8, &super::super::exercise::copies_before_computing).unwrap();
        assert!(m.problems.iter().any(|p| p.contains("iteration 0's argmin reads slot 0's scores before any row_dot wrote them")), "{:?}", m.problems);
        assert!(m.problems.iter().any(|p| p.contains("iteration 4's argmin reads iteration 0's scores from slot 0")), "{:?}", m.problems);
        assert_eq!(m.problems.len(), 8, "every iteration reads the wrong scores: {:?}", m.problems);
        // The same wiring with the D2H after the row_dot has no problem.
        let mut m = ModelIssuer::new(COSTS, 4);
        m.run(8, &super::super::hand_off_to_worker).unwrap();
        assert!(m.problems.is_empty(), "{:?}", m.problems);
    }

    #[test]
    fn scores_copied_before_their_kernel_finished_are_caught() {
        // The D2H on the callback stream does not wait for the kernel.
        let mut m = ModelIssuer::new(COSTS, 4);
        m.run(4, &|l, t| {
            let s = l.take_slot(t)?;
            l.row_dot(On::Compute, t, s)?;
            l.d2h_scores(On::Callback, s)?;
            l.host_fn_argmin(On::Callback, s)
        })
        .unwrap();
        assert!(m.problems.iter().any(|p| p.contains("iteration 0 read slot 0 before its scores arrived")), "{:?}", m.problems);
    }
}
