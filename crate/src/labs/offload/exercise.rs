//! Exercise 9: write the prefetch schedule of the ring. The learner's pass
//! gets a copy stream (at high priority), a compute stream and K slots,
//! and must run every layer from a slot holding its weights while the
//! next layers' weights stream in. The checker runs it on the model (no
//! GPU, this recording's costs) or on the GPU and names what is wrong: a
//! layer reading a slot still being filled, an upload overwriting a slot
//! a layer still reads, a layer reading the wrong weights, layers missing
//! or out of order, too few slots to overlap, the CPU waiting every layer,
//! pageable weights; a right schedule passes within 10% of the bound.

use super::forward::{ring_with, Books, Costs, Forward, Pass, PassFn, RingOrders, Streams, Task};
use super::measure::{pass_with, Sweep};
use super::rig::{Hidden, OffloadRig};
use super::{OffloadResults, Shape};
use crate::error::Result;
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::progress::Exercise;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::OpKind;
use crate::pipeline::schedule::Schedule;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise { id: "09-offload", asks: "the ring's prefetch schedule", file: None }];

/// The share of the bound a right schedule reaches.
pub const TARGET_EFFICIENCY: f64 = 0.90;

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "Before the first layer, fill every slot of the ring: layer j goes into slot j. From then on, slot i % K serves layer i.",
    "Two events per slot do all the ordering: one recorded on the copy stream after a slot's upload (the layer waits for it), one recorded on the compute stream after the layer that read the slot (the next upload into it waits for that).",
    "After layer i, its slot is free for layer i + K: the copy stream waits on the slot's 'freed' event, uploads layer i + K into it and records 'copied'. The CPU never waits: every wait is a stream's.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

/// The notebook's starting point: the ring with one ordering left out
/// (an upload does not wait for the layer that last read its slot).
pub fn given(f: &mut dyn Forward, t: &Task) -> Result<()> {
    ring_with(f, t, RingOrders { upload_waits_for_layer: false, ..RingOrders::ALL })
}

/// What a pass's books and schedule show wrong (the same with or without a GPU).
fn findings(rep: &mut CheckReport, books: &Books, schedule: &Schedule, (layers, slots): (usize, usize)) {
    if books.pageable_uploads > 0 {
        rep.problem(format!(
            "pageable weights: {} of the {} uploads read Weights::Pageable, so each one blocks the CPU until the driver has staged it",
            books.pageable_uploads, books.uploads
        ));
    }
    // Layers: each once, in order.
    let mut seen = vec![0usize; layers];
    for &l in &books.ran {
        seen[l] += 1;
    }
    if let Some(l) = seen.iter().position(|&n| n > 1) {
        rep.problem(format!("layer {l} runs {} times in one pass", seen[l]));
    }
    let missing: Vec<usize> = (0..layers).filter(|&l| seen[l] == 0).collect();
    if let Some(&first) = missing.first() {
        rep.problem(format!("{} of the {} layers never run (the first: layer {first})", missing.len(), layers));
    } else if let Some(w) = books.ran.windows(2).find(|w| w[1] < w[0]) {
        rep.problem(format!("layer {} runs after layer {}: each layer reads the activations the one before it wrote", w[1], w[0]));
    }
    if let Some(&(layer, slot, held)) = books.wrong_weights.first() {
        let what = match held {
            Some(h) => format!("layer {h}'s weights"),
            None => "nothing any upload put there".into(),
        };
        rep.problem(format!(
            "wrong weights: layer {layer} reads slot {slot}, which holds {what} ({} layers in all read the wrong slot)",
            books.wrong_weights.len()
        ));
    }
    // Races, by what they are between.
    let ops = &schedule.ops;
    let (mut filling, mut overwritten, mut other) = (None, None, None);
    for r in schedule.races() {
        let (a, b) = (&ops[r.earlier], &ops[r.later]);
        match (a.kind, b.kind) {
            (OpKind::H2d, OpKind::Kernel) => filling = filling.or(Some((a.label.clone(), b.label.clone(), r.buffer.clone()))),
            (OpKind::Kernel, OpKind::H2d) => overwritten = overwritten.or(Some((a.label.clone(), b.label.clone(), r.buffer.clone()))),
            _ => other = other.or(Some(r.what.clone())),
        }
    }
    if let Some((up, layer, slot)) = filling {
        rep.problem(format!("race: {layer} reads {slot} while '{up}' may still be filling it (nothing orders the layer after that upload)"));
    }
    if let Some((layer, up, slot)) = overwritten {
        rep.problem(format!("race: '{up}' may overwrite {slot} while {layer} still reads it (nothing orders the upload after that layer)"));
    }
    if let Some(what) = other {
        rep.problem(format!("race: {what}"));
    }
    let used = books.slots_used.iter().filter(|&&u| u).count();
    if used == 1 && slots > 1 {
        rep.problem(format!(
            "one slot of the {} does all the work: an upload into it must wait for the layer reading it, so copies and layers take turns",
            slots
        ));
    }
    if books.host_waits * 2 >= layers {
        rep.problem(format!("the CPU waits on the GPU {} times in a pass of {} layers: the GPU's queues run dry at every wait", books.host_waits, layers));
    }
}

/// The time against the bound (`how`: predicted or measured).
fn judge(rep: &mut CheckReport, how: &str, ms: f64, layers: usize, costs: Costs) {
    let serial = layers as f64 * (costs.h2d + costs.layer);
    let bound = crate::lab_kit::two_stage_bound_ms(layers, costs.h2d, costs.layer);
    rep.judge_overlap(
        how,
        ms,
        ("copy then compute", serial),
        bound,
        TARGET_EFFICIENCY,
        "each upload waits for a layer and each layer for its upload, so the link and the GPU take turns",
    );
}

/// The batch the exercise is judged at: the recording's timeline batch
/// (nearest the crossover, where hiding the stream matters most).
fn costs_at(r: &OffloadResults) -> Option<(usize, Costs)> {
    let p = r.points.iter().find(|p| p.batch == r.timeline_batch).or(r.points.first())?;
    Some((p.batch, Costs { h2d: p.h2d_ms.median, h2d_pageable: p.h2d_pageable_ms.median, layer: p.layer_ms.median }))
}

/// Checks a prefetch schedule with no GPU: the pass's books, its races, and
/// the queue model's time with the recording's costs against the bound.
pub fn check_on_model(r: &OffloadResults, schedule: &dyn Fn(&mut dyn Forward, &Task) -> Result<()>) -> CheckReport {
    let (shape, k) = (r.shape, r.config.ring);
    let mut rep = CheckReport::new(&format!("prefetch schedule, {} layers, a ring of {k} (queue model, no GPU)", shape.layers));
    let Some((batch, costs)) = costs_at(r) else {
        rep.problem("the recording holds no batch to judge the schedule at");
        return rep;
    };
    let mut f = Pass::dry_run(shape, batch, k, Streams { copy_high: true }, Hidden::Fixed);
    let task = f.task;
    if rep.learner("your schedule", || schedule(&mut f, &task)).is_none() {
        return rep;
    }
    let s = f.schedule().expect("a pass on the model");
    findings(&mut rep, &f.books, s, (task.layers, task.slots));
    if !rep.passed {
        return rep;
    }
    match f.predicted_ms(costs, Machine::engines(r.copy_engines)) {
        Ok(ms) => judge(&mut rep, &format!("predicted at {batch} tokens"), ms, shape.layers, costs),
        Err(e) => rep.problem(format!("the queue model could not time the pass: {e}")),
    }
    rep
}

/// Timed passes of a learner's schedule on the GPU (after a verified one).
const TIMED_PASSES: usize = 3;

/// Checks a prefetch schedule on the GPU: its dry run first (a schedule
/// with a race or wrong weights never reaches the GPU), then verified
/// passes of a 24-layer model at the recording's width and batch, timed
/// against the bound from costs measured alone beside them.
pub fn check_on_gpu(gpu: &crate::gpu::Gpu, r: &OffloadResults, schedule: PassFn) -> Result<CheckReport> {
    let model = check_on_model(r, &*schedule);
    if !model.passed {
        return Ok(model);
    }
    let k = r.config.ring;
    let shape = Shape { layers: 24, d: r.shape.d };
    let batch = costs_at(r).map_or(1024, |c| c.0);
    let mut rep = CheckReport::new(&format!("prefetch schedule, {} layers, a ring of {k}, {batch} tokens (live on {})", shape.layers, gpu.name()));
    let mut rig = OffloadRig::new(gpu, shape, batch, k)?;
    let cfg = super::OffloadConfig { warmup: 1, repeats: TIMED_PASSES, ..r.config.clone() };
    let mut sweep = Sweep::new(&mut rig, &cfg, batch)?;
    let (h2d, layer) = sweep.costs(batch)?;
    // No pageable upload reaches the GPU: the dry run refused them above.
    let costs = Costs { h2d: h2d.median, h2d_pageable: f64::NAN, layer: layer.median };
    let mut fastest = f64::INFINITY;
    for attempt in 0..=TIMED_PASSES {
        let (run, books) = pass_with(sweep.rig, batch, (k, Streams { copy_high: true }, Hidden::Fixed), &*schedule, crate::gpu::TimelineSource::Off)?;
        if attempt == 0 {
            findings(&mut rep, &books, &run.schedule, (shape.layers, k));
            if !rep.passed {
                return Ok(rep);
            }
        }
        if let Err(e) = sweep.check(batch, "your schedule") {
            rep.problem(format!("wrong data: {e}"));
            return Ok(rep);
        }
        if attempt > 0 {
            fastest = fastest.min(run.total_ms);
        }
    }
    judge(&mut rep, "measured (fastest pass)", fastest, shape.layers, costs);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::super::forward::{copy_then_compute, ring, Weights};
    use super::*;

    fn check(f: impl Fn(&mut dyn Forward, &Task) -> Result<()>) -> CheckReport {
        check_on_model(&crate::testing::offload_results(), &f)
    }
    fn fails_with(r: &CheckReport, what: &str) {
        assert!(!r.passed, "{r}");
        assert!(r.to_string().contains(what), "wanted '{what}' in:\n{r}");
    }

    #[test]
    fn the_ring_passes_and_the_first_programs_do_not() {
        let r = check(ring);
        assert!(r.passed, "{r}");
        fails_with(&check(|f, t| copy_then_compute(f, t, Weights::Pinned)), "one slot of the 3 does all the work");
        let r = check(|f, t| copy_then_compute(f, t, Weights::Pageable));
        fails_with(&r, "pageable weights: 96 of the 96 uploads");
    }

    #[test]
    fn the_notebooks_given_schedule_fails_on_its_race() {
        fails_with(&check(given), "race: 'H2D layer 3' may overwrite ring slot 0 while layer 0 still reads it");
    }

    #[test]
    fn each_missing_order_is_named_as_the_race_it_allows() {
        let with = |o| move |f: &mut dyn Forward, t: &Task| ring_with(f, t, o);
        let all = RingOrders::ALL;
        fails_with(
            &check(with(RingOrders { layer_waits_for_upload: false, ..all })),
            "race: layer 0 reads ring slot 0 while 'H2D layer 0' may still be filling it",
        );
        fails_with(
            &check(with(RingOrders { upload_waits_for_layer: false, ..all })),
            "race: 'H2D layer 3' may overwrite ring slot 0 while layer 0 still reads it",
        );
        fails_with(&check(with(RingOrders { cpu_waits_for_upload: true, ..all })), "the CPU waits on the GPU 96 times in a pass of 96 layers");
    }

    #[test]
    fn wrong_slots_missing_and_reordered_layers_are_named() {
        // Every layer from slot 0, though the ring put them in i % K.
        fails_with(
            &check(|f, t| {
                for j in 0..t.slots {
                    f.upload(t.copy, Weights::Pinned, j, j)?;
                }
                f.host_sync(t.copy)?;
                for i in 0..t.slots {
                    f.layer(t.compute, i, 0)?;
                }
                Ok(())
            }),
            "wrong weights: layer 1 reads slot 0, which holds layer 0's weights",
        );
        fails_with(&check(|f, t| ring(f, &Task { layers: t.layers - 1, ..*t })), "1 of the 96 layers never run (the first: layer 95)");
        fails_with(&check(|_, _| Err(crate::LabError::config("a bad slot"))), "a bad slot");
        fails_with(&check(|f, t| ring(f, &Task { slots: 1, ..*t })), "one slot of the 3 does all the work");
    }

    #[test]
    fn no_message_dictates_the_fix() {
        // CheckReport::problem asserts it on every problem above; this names the promise.
        assert!(crate::lab_kit::check::dictated_fix("race: layer 0 reads ring slot 0 while 'H2D layer 0' may still be filling it").is_none());
    }
}
