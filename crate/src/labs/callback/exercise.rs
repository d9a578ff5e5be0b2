//! Exercise 4: wire the "scores ready" event, the callback stream and the
//! worker hand-off. The checker runs the learner's iteration on the queue
//! model (no GPU) or on the GPU, and says what is wrong: an argmin that
//! read the wrong scores, a reader not ordered after its D2H, a slot reused
//! too early, the argmin left in a host function (on the compute stream:
//! no overlap; on the callback stream: heavy work on the driver's thread),
//! or too little overlap.

use super::model::{ModelCosts, ModelRun};
use super::op::ArgminOn;
use super::rig::CallbackRig;
use super::score_loop::Sent;
use super::{bound_ms, serial_ms, CallbackConfig, CallbackResults, On, ScoreLoop};
use crate::error::{LabError, Result};
use crate::gpu::Gpu;
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::measure::stats::Summary;
use std::cell::RefCell;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise::in_cell("04-callback", "the argmin off the compute stream, on the callback stream", HINTS, example, "host function on the compute stream")];

/// The exercise answered on the recording in `dev`: handing the argmin to
/// a worker, or running it in a host function on the compute stream.
fn example(dev: &std::path::Path, right: bool) -> crate::error::Result<Option<CheckReport>> {
    let Some(rec) = <crate::measure::record::Record<super::CallbackResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    let iteration = if right { super::hand_off_to_worker } else { super::host_fn_on_compute };
    Ok(Some(check_on_model(&rec.results, iteration)))
}

pub const TARGET_EFFICIENCY: f64 = 0.90;
/// Iterations of a check on the GPU (a notebook waits for it).
pub const GPU_CHECK_ITERATIONS: usize = 128;

// ---- deliberately wrong iterations (tests, demonstrations) ----------------

/// The argmin reads scores the D2H may not have written yet: no event.
pub fn hands_off_without_waiting(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = l.take_slot(t)?;
    l.row_dot(On::Compute, t, s)?;
    l.d2h_scores(On::Compute, s)?;
    l.host_fn_hand_off(On::Callback, s)
}

/// `buffers[t % 3]`: the slot may still be read by the worker.
pub fn reuses_slots_by_index(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = l.slot_at(t % 3, t)?;
    l.row_dot(On::Compute, t, s)?;
    l.d2h_scores(On::Compute, s)?;
    l.record_scores_ready(On::Compute, s)?;
    l.wait_scores_ready(On::Callback, s)?;
    l.host_fn_hand_off(On::Callback, s)
}

/// Copies the scores and never finds their argmin.
pub fn forgets_the_argmin(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = l.take_slot(t)?;
    l.row_dot(On::Compute, t, s)?;
    l.d2h_scores(On::Compute, s)
}

/// Copies the slot's scores before the row_dot that computes them: ordered
/// on one stream (no race), so the argmin reads what the slot held before.
pub fn copies_before_computing(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = l.take_slot(t)?;
    l.d2h_scores(On::Compute, s)?;
    l.row_dot(On::Compute, t, s)?;
    l.record_scores_ready(On::Compute, s)?;
    l.wait_scores_ready(On::Callback, s)?;
    l.host_fn_hand_off(On::Callback, s)
}

// ---- the checker -----------------------------------------------------------

/// The learner's iteration, noting into `places` where each argmin was
/// sent as it goes (so a loop that stops early is still judged by them).
fn noting<'p>(iteration: &'p dyn Fn(&mut ScoreLoop, usize) -> Result<()>, places: &'p RefCell<Vec<Sent>>) -> impl Fn(&mut ScoreLoop, usize) -> Result<()> + 'p {
    move |l: &mut ScoreLoop, t: usize| {
        let before = l.sent().len();
        let r = iteration(l, t);
        places.borrow_mut().extend_from_slice(&l.sent()[before..]);
        r
    }
}

/// Where the argmins went, as problems or notes.
fn judge_places(rep: &mut CheckReport, places: &[Sent]) {
    let count = |p: Sent| places.iter().filter(|&&x| x == p).count();
    let (on_compute, on_callback) = (count(Sent::To(ArgminOn::HostFn(On::Compute))), count(Sent::To(ArgminOn::HostFn(On::Callback))));
    let handed_on_compute = count(Sent::HandOffOn(On::Compute));
    if handed_on_compute > 0 {
        rep.problem(format!(
            "{handed_on_compute} hand-off(s) are host functions on the compute stream: the worker does the argmin, but the compute stream still stops for every host function's round trip (the driver's callback thread has to wake up and release it)"
        ));
    }
    if on_compute > 0 {
        rep.problem(format!(
            "{on_compute} argmin(s) run in a host function on the compute stream: the stream waits for each, so the next row_dot cannot start until the CPU is done (no overlap)"
        ));
    }
    if on_callback > 0 {
        rep.problem(format!(
            "{on_callback} argmin(s) run inside a host function on the callback stream: heavy work on the driver's one callback thread, which every host function of the context (and every stream waiting on one) queues behind"
        ));
    }
    if count(Sent::To(ArgminOn::WaitingThread)) > 0 {
        rep.note("a thread waits on each \"scores ready\" event itself (variant 4, no host function): correct too; the exercise asks for the callback stream's hand-off to the worker");
    }
}

/// The time against the bound and the serial sum.
fn judge_time(rep: &mut CheckReport, how: &str, measured: f64, serial: f64, bound: f64) {
    rep.judge_overlap(
        how,
        measured,
        ("GPU and CPU taking turns", serial),
        bound,
        TARGET_EFFICIENCY,
        "GPU iteration t+1 does not run while the CPU works on iteration t",
    );
}

/// The CPU cost the exercise is checked at, as a share of the GPU's. At
/// C = G every overlapping wiring sits exactly at the bound n·max(G, C),
/// so the jitter of either side alone costs points (an honest solution
/// can read under 90%); at C = G/2 overlap means hiding the CPU
/// entirely, a right wiring stays near 100% and a wrong one still loses a
/// third or more.
pub const CHECK_CPU_OVER_GPU: f64 = 0.5;

/// The model's costs from a recording: its GPU parts, the CPU cost at the
/// point closest to [`CHECK_CPU_OVER_GPU`], the empty host function's round trip.
pub fn check_costs(rec: &CallbackResults) -> Result<ModelCosts> {
    let p = rec.point_near(CHECK_CPU_OVER_GPU).ok_or_else(|| LabError::config("the recording has no CPU cost point"))?;
    Ok(rec.model_costs(p.cpu_ms()))
}

/// Checks an iteration with no GPU, on the queue model at the recording's
/// balanced point, its iterations and slots.
pub fn check_on_model(rec: &CallbackResults, iteration: impl Fn(&mut ScoreLoop, usize) -> Result<()>) -> CheckReport {
    let (n, slots) = (rec.config.iterations, rec.config.slots);
    let mut rep = CheckReport::new(&format!("callback-stream wiring, {n} iterations, {slots} slots (queue model, no GPU)"));
    let costs = match check_costs(rec) {
        Ok(c) => c,
        Err(e) => {
            rep.problem(format!("no costs to model: {e}"));
            return rep;
        }
    };
    let places = RefCell::new(Vec::new());
    let recorded = rep.learner("your iteration", || ScoreLoop::dry_run(slots, n, &noting(&iteration, &places)));
    let Some(recorded) = recorded else {
        judge_places(&mut rep, &places.borrow());
        return rep;
    };
    let m = ModelRun::timed(recorded, costs);
    if let Some(p) = m.problems.first() {
        rep.problem(format!("{p} ({} problem(s) in all)", m.problems.len()));
    }
    if m.argmins.len() < n {
        rep.problem(format!("only {} of {n} iterations ran their argmin", m.argmins.len()));
    }
    judge_places(&mut rep, &places.borrow());
    if rep.passed || m.argmins.len() == n {
        let (g, c) = (costs.gpu_ms(), costs.cpu_ms);
        judge_time(&mut rep, &format!("predicted (G {g:.3} ms, C {c:.3} ms per iteration)"), m.total_ms(), serial_ms(n, g, c), bound_ms(n, g, c));
    }
    rep
}

/// Checks an iteration on the GPU with real scores, at a CPU cost
/// calibrated to the GPU's (balanced), every argmin verified.
pub fn check_on_gpu(gpu: &Gpu, cfg: &CallbackConfig, iteration: impl Fn(&mut ScoreLoop, usize) -> Result<()>) -> Result<CheckReport> {
    let cfg = CallbackConfig { iterations: cfg.iterations.min(GPU_CHECK_ITERATIONS), ..cfg.clone() };
    let n = cfg.iterations;
    let mut rep = CheckReport::new(&format!("callback-stream wiring, {n} iterations, {} slots (live on {})", cfg.slots, gpu.name()));
    let rig = CallbackRig::new(gpu, &cfg)?;
    let g = rig.gpu_ms(5)?;
    let passes = rig.calibrate_passes(CHECK_CPU_OVER_GPU * g)?;
    let places = RefCell::new(Vec::new());
    if rep.learner("your iteration", || rig.run(&noting(&iteration, &places), passes, false)).is_none() {
        judge_places(&mut rep, &places.borrow());
        return Ok(rep);
    }
    judge_places(&mut rep, &places.borrow());
    let (mut totals, mut cpus, mut gpus) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let Some(out) = rep.learner("your iteration", || rig.run(&iteration, passes, false)) else {
            return Ok(rep);
        };
        totals.push(out.total_ms);
        cpus.push(out.cpu_ms);
        // G from the same moments as the runs.
        gpus.push(rig.gpu_ms(3)?);
    }
    // The fastest run against the fastest G: noise only ever slows a run.
    // C stays the median the runs saw (the CPU work each iteration really did).
    let (measured, c, g) = (Summary::of(&totals)?.min, Summary::of(&cpus)?.median, Summary::of(&gpus)?.min);
    judge_time(
        &mut rep,
        &format!("measured, fastest of 5 (G {g:.3} ms, C {c:.3} ms per iteration, {passes} argmin passes)"),
        measured,
        serial_ms(n, g, c),
        bound_ms(n, g, c),
    );
    Ok(rep)
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "The argmin must read the scores of its own iteration: whatever reads a slot must come after the D2H that fills it.",
    "An event recorded behind the D2H on the compute stream says when the scores are ready; the callback stream or the worker can wait for that instead of the compute stream.",
    "A host function runs on the driver's thread and holds up its stream: keep heavy CPU work out of it and hand it to a worker, and give a slot back only once its argmin is done.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::Variant;
    use super::*;

    #[test]
    fn the_hand_off_to_the_worker_passes_on_the_model() {
        let r = check_on_model(&crate::labs::callback::fixture::results(), super::super::hand_off_to_worker);
        assert!(r.passed, "{r}");
        assert!(r.to_string().contains("predicted"), "{r}");
    }

    #[test]
    fn an_event_waiting_thread_passes_with_a_note() {
        let r = check_on_model(&crate::labs::callback::fixture::results(), super::super::event_waiting_thread);
        assert!(r.passed && r.to_string().contains("variant 4"), "{r}");
    }

    #[test]
    fn the_callback_left_on_the_compute_stream_is_no_overlap() {
        let r = check_on_model(&crate::labs::callback::fixture::results(), Variant::HostFnOnCompute.iteration());
        let t = r.to_string();
        assert!(!r.passed && t.contains("host function on the compute stream") && t.contains("no overlap"), "{r}");
    }

    #[test]
    fn heavy_work_in_the_callback_is_named_even_when_it_overlaps() {
        let r = check_on_model(&crate::labs::callback::fixture::results(), Variant::HostFnOnCallbackStream.iteration());
        let t = r.to_string();
        assert!(!r.passed && t.contains("inside a host function on the callback stream") && t.contains("the driver's one callback thread"), "{r}");
        assert!(!t.contains("host_fn_hand_off"), "the verdict does not hand out the call: {r}");
        assert!(!t.contains("no overlap"), "{r}");
    }

    #[test]
    fn a_slot_reused_too_early_is_caught() {
        // CPU twice the GPU: the worker falls behind and buffers[t % 3] comes round.
        let mut r = crate::labs::callback::fixture::results();
        r.points[0].variants.iter_mut().for_each(|v| v.cpu_ms = crate::testing::flat(0.54));
        let rep = check_on_model(&r, reuses_slots_by_index);
        assert!(!rep.passed && rep.to_string().contains("reused too early"), "{rep}");
    }

    #[test]
    fn a_missing_event_or_argmin_is_reported() {
        let r = check_on_model(&crate::labs::callback::fixture::results(), hands_off_without_waiting);
        assert!(!r.passed && r.to_string().contains("not ordered after its D2H"), "{r}");
        let r = check_on_model(&crate::labs::callback::fixture::results(), forgets_the_argmin);
        assert!(!r.passed && r.to_string().contains("would wait for a slot forever"), "{r}");
    }

    #[test]
    fn a_recording_with_no_points_is_a_finding_not_a_panic() {
        let mut r = crate::labs::callback::fixture::results();
        r.points.clear();
        let rep = check_on_model(&r, super::super::hand_off_to_worker);
        assert!(!rep.passed && rep.to_string().contains("no costs to model"), "{rep}");
    }

    /// Wrong wirings a student writes, each with the words its message must hold.
    #[test]
    fn wrong_wirings_fail_naming_the_mistake() {
        type Wiring = Box<dyn Fn(&mut ScoreLoop, usize) -> Result<()>>;
        let cases: Vec<(&str, Wiring, &[&str])> = vec![
            ("the seed: argmin on the compute stream", Box::new(Variant::HostFnOnCompute.iteration()), &["host function on the compute stream", "no overlap"]),
            ("heavy work on the callback stream", Box::new(Variant::HostFnOnCallbackStream.iteration()), &["inside a host function on the callback stream"]),
            (
                "hand-off on the compute stream",
                Box::new(|l, t| {
                    let s = l.take_slot(t)?;
                    l.row_dot(On::Compute, t, s)?;
                    l.d2h_scores(On::Compute, s)?;
                    l.host_fn_hand_off(On::Compute, s)
                }),
                &["hand-off(s) are host functions on the compute stream", "round trip"],
            ),
            (
                "waits on the compute stream, hands off on the callback one",
                Box::new(|l, t| {
                    let s = l.take_slot(t)?;
                    l.row_dot(On::Compute, t, s)?;
                    l.d2h_scores(On::Compute, s)?;
                    l.record_scores_ready(On::Compute, s)?;
                    l.wait_scores_ready(On::Compute, s)?;
                    l.host_fn_hand_off(On::Callback, s)
                }),
                &["not ordered after its D2H", "callback stream never waited"],
            ),
            (
                "records the event on the callback stream",
                Box::new(|l, t| {
                    let s = l.take_slot(t)?;
                    l.row_dot(On::Compute, t, s)?;
                    l.d2h_scores(On::Compute, s)?;
                    l.record_scores_ready(On::Callback, s)?;
                    l.wait_scores_ready(On::Callback, s)?;
                    l.host_fn_hand_off(On::Callback, s)
                }),
                &["not ordered after its D2H"],
            ),
            ("no event at all", Box::new(hands_off_without_waiting), &["not ordered after its D2H", "no \"scores ready\" event"]),
            (
                "copies on the callback stream without waiting for the row_dot",
                Box::new(|l, t| {
                    let s = l.take_slot(t)?;
                    l.row_dot(On::Compute, t, s)?;
                    l.d2h_scores(On::Callback, s)?;
                    l.host_fn_hand_off(On::Callback, s)
                }),
                &["iteration 0 read slot 0 before its scores arrived", "its D2H on the callback stream is not ordered after its row_dot on the compute stream"],
            ),
            (
                "copies the scores before computing them",
                Box::new(copies_before_computing),
                &["iteration 0's argmin reads slot 0's scores before any row_dot wrote them", "its D2H was issued before its row_dot"],
            ),
            ("forgets the argmin", Box::new(forgets_the_argmin), &["your iteration stopped with", "would wait for a slot forever"]),
            (
                "takes two slots an iteration",
                Box::new(|l, t| {
                    let _spare = l.take_slot(t)?;
                    super::super::hand_off_to_worker(l, t)
                }),
                &["taken and never copied into", "an iteration takes one slot"],
            ),
            ("panics", Box::new(|_, t| if t == 5 { panic!("slot {t} is gone") } else { Ok(()) }), &["your iteration panicked: slot 5 is gone"]),
            ("a slot that does not exist", Box::new(|l, t| l.slot_at(99, t).map(|_| ())), &["slot 99 does not exist"]),
        ];
        for (what, f, words) in cases {
            let r = check_on_model(&crate::labs::callback::fixture::results(), f);
            let text = r.to_string();
            assert!(!r.passed, "{what} passed: {text}");
            for w in words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
            for p in r.problems() {
                assert_eq!(crate::lab_kit::check::dictated_fix(p), None, "{what}: a problem tells the fix: {p}");
            }
            assert!(!text.contains("failed: data verification failed") && !text.contains("inf%"), "{what}: {text}");
        }
        // Slots by index: caught once the worker falls behind (CPU twice the GPU).
        let mut slow = crate::labs::callback::fixture::results();
        slow.points[0].variants.iter_mut().for_each(|v| v.cpu_ms = crate::testing::flat(0.54));
        let r = check_on_model(&slow, reuses_slots_by_index);
        assert!(!r.passed && r.to_string().contains("reused too early"), "{r}");
    }
}
