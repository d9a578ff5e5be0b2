//! Lab 4 with no GPU: the lab's iteration code, recorded on the dry run
//! (the vocabulary's executor with no GPU) by a [`ScoreLoop`] (kernels and
//! copies on the two streams, host functions on them, argmins on the
//! worker and the event-waiting thread, the enqueue loop waiting for
//! slots), is timed by the pipeline's queue model ([`predict`]) from the
//! recorded costs, on the resources that really serialize them: the
//! streams, the driver's one callback thread, each CPU thread. The
//! schedule's own checks find what a wrong wiring does to the data (an
//! argmin not ordered after its D2H, a slot reused under its reader); the
//! loop names them in the lab's words.
//!
//! Assumptions (stated, not measured here), as the machine model takes
//! them: a host function's stream pays half its round trip to reach the
//! callback thread and half to be released after it returns; the round
//! trip is the recorded one, R (after a kernel: the callback thread had
//! gone to sleep), unless the thread ran something within the last R, when
//! it is [`HOST_FN_AWAKE_MS`]. A thread woken by an event takes R/2; a
//! hand-off (a channel send) costs [`HAND_OFF_MS`]; issuing costs the
//! enqueue loop nothing.

use super::op::ArgminOn;
use super::score_loop::{Recorded, ScoreLoop, WAITER_THREAD, WORKER_THREAD};
use super::work::{CALLBACK_LANE, MAIN_LANE, WAITER_LANE, WORKER_LANE};
use super::{Iteration, On};
use crate::error::Result;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{Lane, Op, OpKind};
use crate::pipeline::predict::predict;
use crate::pipeline::schedule::Schedule;
use crate::pipeline::timeline::{Span, Timeline};

/// A host function that only sends a job down a channel.
pub const HAND_OFF_MS: f64 = 0.005;
/// An empty host function's round trip when the callback thread is awake
/// (with nothing before it; after a kernel it takes several times that).
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
    /// The machine these costs run on (copy engines do not matter here:
    /// one stream's D2H at a time).
    pub fn machine(&self) -> Machine {
        Machine { host_fn_round_trip: self.host_fn_ms, host_fn_awake: HOST_FN_AWAKE_MS, host_wake: self.host_fn_ms / 2.0, ..Machine::engines(2) }
    }
}

/// One argmin as the queue model times it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArgmin {
    pub iteration: usize,
    pub on: ArgminOn,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// A loop recorded on the dry run ([`ScoreLoop::dry_run`]) and timed by
/// the queue model.
pub struct ModelRun {
    pub schedule: Schedule,
    /// Every argmin with its predicted times.
    pub argmins: Vec<ModelArgmin>,
    /// Reads of the wrong scores, races, slots reused too early, argmins never issued.
    pub problems: Vec<String>,
    times: Vec<(f64, f64)>,
}

impl ModelRun {
    /// Runs `iteration` for `n` iterations over `slots` slots on the dry
    /// run and times it with `costs`; Err is what the loop itself returned (a
    /// slot that can never come back, a job handed out twice).
    pub fn run(costs: ModelCosts, slots: usize, n: usize, iteration: Iteration) -> Result<ModelRun> {
        Ok(ModelRun::timed(ScoreLoop::dry_run(slots, n, iteration)?, costs))
    }

    /// Times a recorded loop on the resources that serialize its ops.
    pub fn timed(rec: Recorded, costs: ModelCosts) -> ModelRun {
        let times = predict(&rec.schedule, costs.machine(), |op| duration(&costs, op));
        let argmins = rec.argmins.iter().map(|&(id, iteration, on)| ModelArgmin { iteration, on, start_ms: times[id].0, end_ms: times[id].1 }).collect();
        ModelRun { schedule: rec.schedule, argmins, problems: rec.problems, times }
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
                    Lane::HostThread(WORKER_THREAD) => WORKER_LANE,
                    Lane::HostThread(WAITER_THREAD) => WAITER_LANE,
                    Lane::HostThread(_) => MAIN_LANE,
                };
                Span { lane: lane.into(), kind: op.kind, label: op.label.clone(), start_us: start * 1e3, end_us: end * 1e3, class: None, index: None }
            })
            .collect();
        Timeline { title: title.into(), device: "queue model".into(), spans, source: "model".into(), untraced_ms: None }
    }
}

/// How long an op of the loop takes in the queue model, ms.
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

#[cfg(test)]
mod tests {
    use super::super::{bound_ms, serial_ms, Variant};
    use super::*;

    const COSTS: ModelCosts = ModelCosts { kernel_ms: 0.26, d2h_ms: 0.01, cpu_ms: 0.27, host_fn_ms: 0.07 };

    fn run(v: Variant, n: usize) -> ModelRun {
        let m = ModelRun::run(COSTS, 4, n, &v.iteration()).unwrap();
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
        let m = ModelRun::run(ModelCosts { cpu_ms: 1.0, ..COSTS }, 4, 32, &|l, t| {
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
        let m = ModelRun::run(COSTS, 4, 8, &|l, t| {
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
        let e = ModelRun::run(COSTS, 4, 8, &|l, t| {
            let s = l.take_slot(t)?;
            l.row_dot(On::Compute, t, s)?;
            l.d2h_scores(On::Compute, s)
        })
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(e.contains("iteration 4 would wait for a slot forever"), "{e}");
    }

    #[test]
    fn scores_copied_before_their_kernel_was_issued_are_the_slots_old_ones() {
        // The D2H comes first on the compute stream: ordered, no race, and
        // it copies what the slot held before (nothing, then iteration t-4's).
        let m = ModelRun::run(COSTS, 4, 8, &super::super::exercise::copies_before_computing).unwrap();
        assert!(m.problems.iter().any(|p| p.contains("iteration 0's argmin reads slot 0's scores before any row_dot wrote them")), "{:?}", m.problems);
        assert!(m.problems.iter().any(|p| p.contains("iteration 4's argmin reads iteration 0's scores from slot 0")), "{:?}", m.problems);
        assert_eq!(m.problems.len(), 8, "every iteration reads the wrong scores: {:?}", m.problems);
        // The same wiring with the D2H after the row_dot has no problem.
        let m = ModelRun::run(COSTS, 4, 8, &super::super::hand_off_to_worker).unwrap();
        assert!(m.problems.is_empty(), "{:?}", m.problems);
    }

    #[test]
    fn scores_copied_before_their_kernel_finished_are_caught() {
        // The D2H on the callback stream does not wait for the kernel.
        let m = ModelRun::run(COSTS, 4, 4, &|l, t| {
            let s = l.take_slot(t)?;
            l.row_dot(On::Compute, t, s)?;
            l.d2h_scores(On::Callback, s)?;
            l.host_fn_argmin(On::Callback, s)
        })
        .unwrap();
        assert!(m.problems.iter().any(|p| p.contains("iteration 0 read slot 0 before its scores arrived")), "{:?}", m.problems);
    }
}
