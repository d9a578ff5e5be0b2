//! Lab 4 with no GPU: a queue model that runs the same iteration code as
//! the GPU (it implements [`CallbackIssue`]). It times every op from the
//! recorded costs, on the resources that really serialize them: the two
//! streams, the driver's one callback thread, the worker, the event-waiting
//! thread and the enqueue loop. It also follows the data: which iteration's
//! scores each D2H copied into which slot and each argmin read. So it gives
//! what the GPU run gives: every argmin checked, a slot reused too early
//! caught, an unordered reader refused, and a timeline.
//!
//! Assumptions (stated, not measured here): a host function's stream pays
//! half its round trip to reach the callback thread and half to be released
//! after it returns. The round trip is the recorded one, R (after a kernel:
//! the callback thread had gone to sleep), unless the thread ran something
//! within the last R, when it is [`HOST_FN_AWAKE_MS`]. A thread woken by an
//! event takes R/2; a hand-off (a channel send) costs [`HAND_OFF_MS`];
//! issuing costs the enqueue loop nothing.

use super::order::{Reader, SlotOrder};
use super::work::{CALLBACK_LANE, MAIN_LANE, WAITER_LANE, WORKER_LANE};
use super::{CallbackIssue, Iteration, On, Slot};
use crate::error::{LabError, Result};
use crate::pipeline::schedule::OpKind;
use crate::pipeline::timeline::{Span, Timeline};

/// A host function that only sends a job down a channel.
pub const HAND_OFF_MS: f64 = 0.005;
/// An empty host function's round trip when the callback thread is awake:
/// 16 µs on the lent H200 with nothing before it (71 µs after a kernel).
pub const HOST_FN_AWAKE_MS: f64 = 0.016;

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
}

/// Where an argmin ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgminOn {
    /// Inside a host function, on the driver's callback thread, enqueued on a stream.
    HostFn(On),
    Worker,
    WaitingThread,
}

impl ArgminOn {
    fn lane(self) -> &'static str {
        match self {
            ArgminOn::HostFn(_) => CALLBACK_LANE,
            ArgminOn::Worker => WORKER_LANE,
            ArgminOn::WaitingThread => WAITER_LANE,
        }
    }
}

/// One slot as the model sees it.
#[derive(Clone, Debug, Default)]
struct ModelSlot {
    /// The iteration holding it until its argmin is handed out.
    lease: Option<usize>,
    /// When its last argmin ends (the slot is free again); infinite while
    /// the argmin has not been issued.
    free_at: f64,
    /// The iteration that last held it.
    last_iteration: Option<usize>,
    order: SlotOrder,
    /// The iteration whose row_dot last wrote its device scores, and when.
    dev: Option<(usize, f64)>,
    /// Every D2H into its pinned scores: (start, end, iteration copied).
    d2h: Vec<(f64, f64, Option<usize>)>,
    /// Every argmin of its scores: (start, end, iteration).
    reads: Vec<(f64, f64, usize)>,
    ready_at: f64,
}

impl ModelSlot {
    /// What the read of iteration `t` over [start, end) saw, if wrong.
    fn misread(&self, index: usize, (start, end, t): (f64, f64, usize)) -> Option<String> {
        let landed = self.d2h.iter().filter(|d| d.1 <= start).max_by(|a, b| a.1.total_cmp(&b.1)).map(|d| d.2);
        if let Some(by) = self.d2h.iter().find(|d| d.0 < end && d.1 > start).map(|d| d.2) {
            let by = by.map_or("?".into(), |b| b.to_string());
            return Some(format!(
                "slot {index} was overwritten (by iteration {by}'s scores) while iteration {t}'s argmin read it: the slot was reused too early"
            ));
        }
        match landed {
            Some(Some(u)) if u == t => None,
            Some(Some(u)) if u > t => Some(format!("slot {index} held iteration {u}'s scores when iteration {t} read it: the slot was reused too early")),
            _ => Some(format!("iteration {t} read slot {index} before its scores arrived")),
        }
    }
}

/// One argmin as it ran in the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArgmin {
    pub iteration: usize,
    pub on: ArgminOn,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// The queue model of one run (see the module docs).
pub struct ModelIssuer {
    pub costs: ModelCosts,
    slots: Vec<ModelSlot>,
    /// The enqueue loop's clock.
    main: f64,
    stream_ready: [f64; 2],
    callback_thread_free: f64,
    worker_free: f64,
    waiter_free: f64,
    pub argmins: Vec<ModelArgmin>,
    /// Slots taken while held, and reads of the wrong scores.
    pub problems: Vec<String>,
    spans: Vec<Span>,
}

impl ModelIssuer {
    pub fn new(costs: ModelCosts, slots: usize) -> ModelIssuer {
        ModelIssuer {
            costs,
            slots: vec![ModelSlot::default(); slots],
            main: 0.0,
            stream_ready: [0.0; 2],
            callback_thread_free: 0.0,
            worker_free: 0.0,
            waiter_free: 0.0,
            argmins: Vec::new(),
            problems: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Runs `iteration` for `n` iterations; Err is what the loop itself
    /// returned (an unordered reader, a slot that can never come back).
    pub fn run(&mut self, n: usize, iteration: Iteration) -> Result<()> {
        for t in 0..n {
            iteration(self, t)?;
        }
        for (i, s) in self.slots.iter().enumerate() {
            // Reads are judged once every copy is known: a later iteration's
            // copy may land under an earlier read.
            self.problems.extend(s.reads.iter().filter_map(|&r| s.misread(i, r)));
            // Jobs never handed out keep their slots.
            if let Some(t) = s.lease {
                self.problems.push(format!("iteration {t}: its scores were copied into slot {i} but no argmin was ever issued"));
            }
        }
        Ok(())
    }

    /// From the start to the end of the last argmin, ms.
    pub fn total_ms(&self) -> f64 {
        self.argmins.iter().map(|a| a.end_ms).fold(0.0, f64::max)
    }

    pub fn timeline(&self, title: &str) -> Timeline {
        Timeline { title: title.into(), device: "queue model".into(), spans: self.spans.clone(), source: "model".into() }
    }

    fn span(&mut self, lane: &str, kind: OpKind, label: String, start_ms: f64, end_ms: f64) {
        self.spans.push(Span { lane: lane.into(), kind, label, start_us: start_ms * 1e3, end_us: end_ms * 1e3 });
    }

    fn slot(&mut self, slot: Slot) -> Result<&mut ModelSlot> {
        let n = self.slots.len();
        self.slots.get_mut(slot.0).ok_or_else(|| LabError::config(format!("slot {} does not exist ({n} slots)", slot.0)))
    }

    fn lease(&mut self, index: usize, t: usize) {
        let s = &mut self.slots[index];
        *s = ModelSlot { lease: Some(t), free_at: f64::INFINITY, last_iteration: Some(t), order: SlotOrder::default(), ..std::mem::take(s) };
    }

    /// The job of `slot` leaves the issuer (it is handed to whatever runs it).
    fn hand_out(&mut self, slot: Slot, reader: Reader) -> Result<usize> {
        let s = self.slot(slot)?;
        let t = s.lease.or(s.last_iteration).unwrap_or(0);
        s.order.check(reader, slot, t)?;
        s.lease.take().ok_or_else(|| LabError::config(format!("slot {} holds no iteration's scores (its job was already handed out)", slot.0)))
    }

    /// A host function on `on` whose body takes `body_ms`: (start, end) of the body.
    fn host_fn(&mut self, on: On, body_ms: f64) -> (f64, f64) {
        let ready = self.stream_ready[on as usize];
        let asleep = ready > self.callback_thread_free + self.costs.host_fn_ms;
        let half = if asleep { self.costs.host_fn_ms } else { HOST_FN_AWAKE_MS } / 2.0;
        let start = (ready + half).max(self.callback_thread_free + half);
        let end = start + body_ms;
        self.callback_thread_free = end;
        self.stream_ready[on as usize] = end + half;
        (start, end)
    }

    /// The argmin of iteration `t` in `slot` runs from `start` and frees
    /// the slot when done (what it read is judged at the end of the run).
    fn argmin(&mut self, slot: Slot, t: usize, on: ArgminOn, start: f64) {
        let end = start + self.costs.cpu_ms;
        let s = &mut self.slots[slot.0];
        s.free_at = end;
        s.reads.push((start, end, t));
        self.argmins.push(ModelArgmin { iteration: t, on, start_ms: start, end_ms: end });
        self.span(on.lane(), OpKind::Host, format!("argmin {t}"), start, end);
    }
}

impl CallbackIssue for ModelIssuer {
    fn take_slot(&mut self, t: usize) -> Result<Slot> {
        // The oldest returned of the slots whose argmin is issued.
        let Some(i) = (0..self.slots.len()).filter(|&i| self.slots[i].lease.is_none()).min_by(|&a, &b| self.slots[a].free_at.total_cmp(&self.slots[b].free_at))
        else {
            return Err(LabError::schedule(format!("iteration {t} would wait for a slot forever: every slot holds scores whose argmin was never issued")));
        };
        let free = self.slots[i].free_at;
        if free > self.main {
            self.span(MAIN_LANE, OpKind::Host, format!("wait for a slot ({t})"), self.main, free);
            self.main = free;
        }
        self.lease(i, t);
        Ok(Slot(i))
    }
    fn slot_at(&mut self, index: usize, t: usize) -> Result<Slot> {
        let s = self.slot(Slot(index))?;
        let (held_by, free_at) = (s.lease.or(s.last_iteration), s.free_at);
        if free_at > self.main {
            let when = if free_at.is_finite() { format!("its argmin ends at {free_at:.3} ms") } else { "its argmin was not issued yet".into() };
            self.problems.push(format!(
                "iteration {t} took slot {index} at {:.3} ms while iteration {} still held it ({when}): the slot was reused too early",
                self.main,
                held_by.map_or("?".into(), |h| h.to_string())
            ));
        }
        self.lease(index, t);
        Ok(Slot(index))
    }
    fn row_dot(&mut self, on: On, t: usize, slot: Slot) -> Result<()> {
        let start = self.stream_ready[on as usize].max(self.main);
        let end = start + self.costs.kernel_ms;
        self.stream_ready[on as usize] = end;
        self.slot(slot)?.dev = Some((t, end));
        self.span(on.lane(), OpKind::Kernel, format!("row_dot {t}"), start, end);
        Ok(())
    }
    fn d2h_scores(&mut self, on: On, slot: Slot) -> Result<()> {
        let start = self.stream_ready[on as usize].max(self.main);
        let end = start + self.costs.d2h_ms;
        self.stream_ready[on as usize] = end;
        let s = self.slot(slot)?;
        // Scores still being written are not the iteration's: a race.
        let copied = s.dev.filter(|&(_, done)| done <= start).map(|(t, _)| t);
        s.d2h.push((start, end, copied));
        s.order = SlotOrder::d2h(on);
        let t = s.lease.unwrap_or(0);
        self.span(on.lane(), OpKind::D2h, format!("D2H scores {t}"), start, end);
        Ok(())
    }
    fn record_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        let at = self.stream_ready[on as usize].max(self.main);
        let s = self.slot(slot)?;
        s.order.record(on);
        s.ready_at = at;
        Ok(())
    }
    fn wait_scores_ready(&mut self, on: On, slot: Slot) -> Result<()> {
        let s = self.slot(slot)?;
        s.order.wait(on);
        let at = s.ready_at;
        let r = &mut self.stream_ready[on as usize];
        *r = r.max(at).max(self.main);
        Ok(())
    }
    fn host_fn_argmin(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let (start, _) = self.host_fn(on, self.costs.cpu_ms);
        self.argmin(slot, t, ArgminOn::HostFn(on), start);
        Ok(())
    }
    fn host_fn_hand_off(&mut self, on: On, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::HostFn(on))?;
        let (start, end) = self.host_fn(on, HAND_OFF_MS);
        self.span(CALLBACK_LANE, OpKind::Host, format!("hand-off {t}"), start, end);
        let start = end.max(self.worker_free);
        self.worker_free = start + self.costs.cpu_ms;
        self.argmin(slot, t, ArgminOn::Worker, start);
        Ok(())
    }
    fn hand_to_waiting_thread(&mut self, slot: Slot) -> Result<()> {
        let t = self.hand_out(slot, Reader::WaitingThread)?;
        let ready = self.slots[slot.0].ready_at;
        let start = (ready + self.costs.host_fn_ms / 2.0).max(self.waiter_free).max(self.main);
        self.waiter_free = start + self.costs.cpu_ms;
        self.argmin(slot, t, ArgminOn::WaitingThread, start);
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
        assert!(m.problems.iter().any(|p| p.contains("iteration 4 took slot 0") && p.contains("reused too early")), "{:?}", m.problems);
        assert!(m.problems.iter().any(|p| p.contains("overwritten") || p.contains("held iteration")), "{:?}", m.problems);
    }

    #[test]
    fn an_unordered_reader_is_refused_and_a_missing_argmin_reported() {
        let mut m = ModelIssuer::new(COSTS, 4);
        let e = m
            .run(8, &|l, t| {
                let s = l.take_slot(t)?;
                l.row_dot(On::Compute, t, s)?;
                l.d2h_scores(On::Compute, s)?;
                l.host_fn_hand_off(On::Callback, s)
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("iteration 0: a host function on the callback stream reads slot 0 but is not ordered"), "{e}");
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
