//! Exercise 8: schedule the micro-batches over the GPUs with cross-GPU
//! events. The learner is given the loop a careful first program has
//! ([`host_synchronized`]: the CPU waits after every stage, so only one
//! GPU works at a time) and rewrites it so that every GPU works at once,
//! ordered by events only. The checker runs the loop on the model and
//! names what is wrong, then times it: with the queue model from each op's
//! cost ([`check_on_model`]), or live on the GPUs with its bubble read off
//! the run's timeline ([`check_on_gpu`]). What it names: wrong data (a
//! stage or a copy missing, an offset), a race (a copy or stage not
//! ordered after what it reads), a host synchronization in the loop, work
//! on another GPU's stream, and a bubble larger than the pipeline's own.
//! The pipeline has a stage per GPU: two on a pair, four on four.

use super::config::MultiGpuConfig;
use super::measure::{open_gpus, pipeline_rig};
use super::pipeline_parallel::{bubble, bubble_model, events_only, placement, plan_over, stage_label, Loop};
use super::results::MultiGpuResults;
use crate::gpu::topology::Topology;
use crate::gpu::{Gpu, PlanRig, TimelineSource};
use crate::lab_kit::check::{pct, CheckReport};
use crate::lab_kit::loop_check::{costs_for, shape};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{Link, OpKind};
use crate::pipeline::plan::Costs;
use crate::pipeline::plan::Plan;
use crate::pipeline::schedule::Schedule;
use std::sync::Arc;

#[cfg(doc)]
use super::pipeline_parallel::host_synchronized;
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise::in_cell("08-multi-gpu", "a stage per GPU, ordered by events only", HINTS, example, "host synchronization")];

/// The exercise answered on the recording in `dev`: the stages ordered
/// by events only, or by the host waiting for each.
fn example(dev: &std::path::Path, right: bool) -> crate::error::Result<Option<CheckReport>> {
    let Some(rec) = <crate::measure::record::Record<MultiGpuResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    let pp = if right { super::pipeline_parallel::events_only } else { super::pipeline_parallel::host_synchronized };
    Ok(Some(check_recorded(&rec, Arc::new(pp))))
}

/// A pass: a bubble at most this much above the model's (S−1)/(M+S−1)
/// (the copies between the stages add a little).
pub const BUBBLE_SLACK: f64 = 0.05;

/// The exercise's name in its reports.
pub const EXERCISE: &str = "lab 8: micro-batches over the GPUs";

/// Micro-batches the notebook's check runs.
pub const MICRO_BATCHES: usize = 8;

/// Each op's cost for the model's check, from a recording of the lab: the
/// stage kernel's share of its time over all the data, and the copies at
/// the rates measured nearest their size (every hop between stages at the
/// copy between the first two GPUs, the host link's upload for uploads
/// and downloads).
pub fn recorded_costs(r: &MultiGpuResults, micro_batches: usize) -> Costs {
    let n = r.config.pipeline_mib << 18;
    let per = (n / micro_batches.max(1)).max(1);
    let nearest = |bytes: u64| r.peer.iter().min_by_key(|p| p.bytes.abs_diff(bytes));
    let ms = |bytes: u64, gbps: Option<f64>| gbps.filter(|g| *g > 0.0).map_or(0.0, |g| bytes as f64 / g / 1e6);
    let (per_bytes, all_bytes) = (per as u64 * 4, n as u64 * 4);
    let hop = ms(per_bytes, nearest(per_bytes).map(|p| p.one_way.median));
    let at = placement(r.gpus.len());
    let mut costs: Costs = [
        ((OpKind::Kernel, per), r.pipeline.stage_ms.median / micro_batches.max(1) as f64),
        ((OpKind::H2d, n), ms(all_bytes, nearest(all_bytes).map(|p| p.host.median))),
        ((OpKind::D2h, n), ms(all_bytes, nearest(all_bytes).map(|p| p.host.median))),
    ]
    .into();
    for w in at.windows(2) {
        costs.insert((OpKind::D2d(Link { from: w[0] as u8, to: w[1] as u8 }), per), hop);
    }
    costs
}

/// The notebook's check with no GPU here: on the model, a stage per GPU
/// of `rec` (a recording of the lab), timed with its costs on its GPU's
/// copy engines.
pub fn check_recorded(rec: &crate::measure::record::Record<MultiGpuResults>, learner: Loop) -> CheckReport {
    let r = &rec.results;
    let mut rep = check_on_model(
        MICRO_BATCHES,
        r.config.pipeline_mib << 18,
        &placement(r.gpus.len()),
        Machine::engines(rec.fingerprint.async_engine_count.max(1)),
        &recorded_costs(r, MICRO_BATCHES),
        learner,
    );
    if !r.several_gpus() {
        rep.note("the recording is of one GPU: its copy within GPU 0 stands in for the copy between GPUs in the model's costs");
    }
    rep
}

/// The notebook's check where notebooks run live: the lab's GPUs from
/// `gpu` (a stage on each, or two on `gpu` where there is one), the stage
/// kernel calibrated as the lab does.
pub fn check_live(gpu: &Gpu, cfg: &MultiGpuConfig, learner: Loop) -> crate::error::Result<CheckReport> {
    let topology = Topology::discover()?;
    let gpus = open_gpus(gpu, cfg, &topology)?;
    let (mut rig, _) = pipeline_rig(&gpus, cfg)?;
    let mut rep = check_on_gpu(&mut rig, MICRO_BATCHES, cfg.pipeline_mib << 18, &placement(gpus.len()), learner);
    if gpus.len() < 2 {
        rep.note("one GPU here: both stages ran on it, so the bubble shows how the stages shared its SMs, not two GPUs taking turns");
    }
    Ok(rep)
}

/// Checks `learner` over `micro_batches` micro-batches of `elements`,
/// stage s on the plan's GPU `at[s]`, with no GPU: the model's data, races
/// and CPU waits, then the bubble the queue model predicts from `costs`
/// (each op alone, ms) on `machine`.
pub fn check_on_model(micro_batches: usize, elements: usize, at: &[usize], machine: Machine, costs: &Costs, learner: Loop) -> CheckReport {
    let mut rep = CheckReport::new(&format!("{EXERCISE} (queue model, no GPU)"));
    let Some((mine, model)) = shape_findings(micro_batches, elements, learner, at, &mut rep) else { return rep };
    // The events-only loop with the same costs: slow links leave it a
    // bubble above the formula's, and no loop can do better.
    let fix = plan_over("events only", micro_batches, elements, Arc::new(events_only), at);
    let reference = fix.dry_run().ok().and_then(|m| {
        let pred = fix.prediction(&m, machine, &costs_for(costs.clone(), &m.schedule)).ok()?;
        bubble(&m.schedule, &pred.times)
    });
    match mine.prediction(&model, machine, &costs_for(costs.clone(), &model.schedule)) {
        Ok(pred) => {
            judge_bubble(&mut rep, &model.schedule, &pred.times, micro_batches, at, reference.map(|b| b.fraction()), "predicted from each op's cost alone")
        }
        Err(e) => rep.problem(format!("cannot predict your loop: {e}")),
    }
    rep
}

/// Checks `learner` on the GPUs of `rig` (stage s on its GPU `at[s]`): the
/// model's findings first, then a verified run whose bubble is read off
/// its timeline. A run that fails (wrong data on the GPU) is a failed check.
pub fn check_on_gpu(rig: &mut PlanRig, micro_batches: usize, elements: usize, at: &[usize], learner: Loop) -> CheckReport {
    // Say what runs: over one GPU the stages share it.
    let one_gpu = at.iter().all(|&g| g == at[0]);
    let title = if one_gpu { format!("{EXERCISE}, every stage on GPU 0 (one GPU here; live)") } else { format!("{EXERCISE} (live)") };
    let mut rep = CheckReport::new(&title);
    let Some((mine, model)) = shape_findings(micro_batches, elements, learner, at, &mut rep) else { return rep };
    if !rep.passed {
        return rep;
    }
    let Some(run) = rep.learner("your loop on the GPU", || rig.run_modelled(&mine, &model, TimelineSource::best())) else { return rep };
    // The events-only loop on the same GPUs, run beside it: what their
    // links leave of a bubble.
    let reference = rig
        .run(&plan_over("events only", micro_batches, elements, Arc::new(events_only), at), TimelineSource::best())
        .ok()
        .and_then(|r| r.full_timeline().and_then(|t| bubble(&r.schedule, &t.span_times())))
        .map(|b| b.fraction());
    match run.full_timeline() {
        Some(t) => judge_bubble(&mut rep, &run.schedule, &t.span_times(), micro_batches, at, reference, &format!("measured ({} timeline)", t.source)),
        None => rep.note("no timeline for this run (another tool holds CUPTI): the bubble was not measured; the checks above stand"),
    }
    rep
}

/// The learner's plan and its model, after the findings the model makes
/// without timing: data, races, memory, and a CPU that waits in the loop.
/// `None` when the loop cannot be judged further.
fn shape_findings(micro_batches: usize, elements: usize, learner: Loop, at: &[usize], rep: &mut CheckReport) -> Option<(Plan, DryRun)> {
    if micro_batches == 0 || elements < 2 * micro_batches {
        rep.problem(format!("{micro_batches} micro-batches of {elements} elements: the exercise takes at least 1 micro-batch of at least 2 elements each"));
        return None;
    }
    let mine = plan_over("your loop", micro_batches, elements, learner, at);
    let model = shape(&mine, rep)?;
    // Each stage once per micro-batch: a stage run again does the same work
    // twice (its output is the same, so the data alone cannot tell).
    for stage in 0..at.len() {
        for i in 0..micro_batches {
            let label = stage_label(stage, i);
            let runs = model.schedule.ops.iter().filter(|o| o.kind == OpKind::Kernel && o.label == label).count();
            if runs > 1 {
                // Timing it would blame the extra work on the ordering.
                rep.problem(format!("{label} runs {runs} times: each stage runs once per micro-batch"));
                return None;
            }
        }
    }
    if model.schedule.cpu_waited_for_gpu() {
        rep.problem(
            "host synchronization in the loop: the CPU waits for a GPU (a synchronize or a host wait on an event), so it cannot issue the next micro-batch meanwhile",
        );
    }
    Some((mine, model))
}

/// Judges the bubble of a run of `schedule` (ops at `times`) against the
/// model for `micro_batches`, stage s on the plan's GPU `at[s]`, or
/// against `reference` (the events-only loop's bubble on the same links)
/// where that is larger: copies over a slow link leave a bubble no loop
/// can close. `how` says where the times came from.
pub fn judge_bubble(rep: &mut CheckReport, schedule: &Schedule, times: &[(f64, f64)], micro_batches: usize, at: &[usize], reference: Option<f64>, how: &str) {
    let stages = at.len();
    let formula = bubble_model(stages, micro_batches);
    // The reference is the bar only where the links make it clearly worse
    // than the formula (a point or more).
    let model = reference.filter(|&r| r > formula + 0.01).unwrap_or(formula);
    let Some(b) = bubble(schedule, times) else {
        rep.problem("no stage ran: the loop issued no t.stage");
        return;
    };
    let per_gpu: Vec<String> = b.per_gpu.iter().map(|&(g, idle)| format!("GPU {g} {}", pct(idle))).collect();
    rep.note(format!(
        "{how}: the GPUs idle {} of the pipeline's time ({}); {micro_batches} micro-batches over {stages} stages leave (S-1)/(M+S-1) = {}",
        pct(b.fraction()),
        per_gpu.join(", "),
        pct(formula)
    ));
    if model > formula {
        rep.note(format!("the copies between the stages leave the events-only loop {} here: that is the bar", pct(model)));
    }
    if b.fraction() > model + BUBBLE_SLACK {
        rep.problem(format!(
            "bubble: the GPUs idle {} of the time, more than the pipeline's {}: {}",
            pct(b.fraction()),
            pct(model),
            why_idle(schedule, times, at)
        ));
    }
}

/// What keeps the GPUs from working at once, read off the stages' times:
/// the first pair of neighbouring stages that take turns.
fn why_idle(schedule: &Schedule, times: &[(f64, f64)], at: &[usize]) -> String {
    let stage = |k: usize| -> Vec<(f64, f64)> {
        let prefix = format!("stage {k},");
        let mut v: Vec<(f64, f64)> =
            schedule.ops.iter().zip(times).filter(|(o, _)| o.kind == OpKind::Kernel && o.label.starts_with(&prefix)).map(|(_, &t)| t).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let eps = 1e-9;
    for s in 0..at.len().saturating_sub(1) {
        let (this, next) = (stage(s), stage(s + 1));
        let last_end = this.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
        if this.len() > 1 && next.first().is_some_and(|first| first.0 >= last_end - eps) {
            return format!(
                "stage {} starts only once stage {s} has finished every micro-batch: each stage {} waits for all of stage {s}, not for its own micro-batch",
                s + 1,
                s + 1
            );
        }
        // The farthest stage whose micro-batch i this stage's next waits for.
        let later: Vec<Vec<(f64, f64)>> = (s + 1..at.len()).map(stage).collect();
        for i in 0..this.len().saturating_sub(1) {
            if let Some(k) = (0..later.len()).rev().find(|&k| later[k].get(i).is_some_and(|x| this[i + 1].0 >= x.1 - eps)) {
                let t = s + 1 + k;
                return format!(
                    "GPU {} waits for GPU {}: stage {s} of micro-batch {} starts only after stage {t} of micro-batch {i} ended",
                    at[s],
                    at[t],
                    i + 1
                );
            }
        }
    }
    "a stage waits for more than its own micro-batch's data".into()
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "With the CPU waiting after every stage, one GPU is always idle: the GPUs must be ordered by events, not by the CPU.",
    "Each micro-batch's next stage needs its activations to have arrived on the next GPU: record an event after the copy and make the next GPU's stream wait on it.",
    "Issue every micro-batch's work without waiting in between, each op on the stream of the GPU it runs on, and make sure a buffer is not overwritten before the copy that reads it is done.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::labs::multi_gpu::pipeline_parallel::Loop;
    use crate::labs::multi_gpu::pipeline_parallel::{events_only, host_synchronized, MicroBatchTask};
    use crate::pipeline::issue::Issue;
    use crate::pipeline::op::Link;
    use std::sync::Arc;

    /// Fails, saying every one of `words`.
    fn fails_with(rep: &CheckReport, words: &[&str]) {
        for w in words {
            crate::testing::fails_with(rep, w);
        }
    }

    const MB: usize = 8;
    const N: usize = 64;

    fn check(f: impl Fn(&mut dyn Issue, &MicroBatchTask) -> Result<()> + Send + Sync + 'static) -> CheckReport {
        let n = N / MB;
        let costs: Costs =
            [((OpKind::Kernel, n), 1.0), ((OpKind::D2d(Link { from: 0, to: 1 }), n), 0.05), ((OpKind::H2d, N), 2.0), ((OpKind::D2h, N), 2.0)].into();
        check_on_model(MB, N, &[0, 1], Machine::engines(2), &costs, Arc::new(f))
    }

    #[test]
    fn the_events_only_loop_passes_and_says_its_bubble_beside_the_model() {
        let rep = check(events_only);
        assert!(rep.passed, "{rep}");
        let said = rep.to_string();
        assert!(said.contains("(S-1)/(M+S-1) = 11.1%") && said.contains("GPU 0 11.6%, GPU 1 11.6%"), "{said}");
        // Sending from GPU 1's stream (a pull) is as good.
        let pull = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].copy, t.gpus[0].compute)?;
                t.send(p, 0, t.gpus[1].copy, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[1].copy)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        assert!(pull.passed, "{pull}");
        // One event object recorded again each micro-batch: a wait takes
        // its latest record, as CUDA's does.
        let reused = check(|p, t| {
            let (e, sent) = (p.event()?, p.event()?);
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.record(e, t.gpus[0].compute)?;
                p.wait(t.gpus[1].compute, e)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
                p.record(sent, t.gpus[1].compute)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        assert!(reused.passed, "{reused}");
    }

    #[test]
    fn over_four_gpus_the_pipeline_passes_and_the_given_loop_and_a_stage_waiting_for_all_fail() {
        let four = |f: Loop| {
            let n = N / MB;
            let mut costs: Costs = [((OpKind::Kernel, n), 1.0), ((OpKind::H2d, N), 2.0), ((OpKind::D2h, N), 2.0)].into();
            for s in 0..3 {
                costs.insert((OpKind::D2d(Link { from: s, to: s + 1 }), n), 0.05);
            }
            check_on_model(MB, N, &[0, 1, 2, 3], Machine::engines(2), &costs, f)
        };
        let good = four(Arc::new(events_only));
        assert!(good.passed, "{good}");
        assert!(good.to_string().contains("over 4 stages leave (S-1)/(M+S-1) = 27.3%"), "{good}");
        let given = four(Arc::new(host_synchronized));
        fails_with(
            &given,
            &["host synchronization in the loop", "GPU 0 waits for GPU 3: stage 0 of micro-batch 1 starts only after stage 3 of micro-batch 0 ended"],
        );
        // Copies as long as a stage (a slow link): the events-only loop
        // cannot reach the formula, and is the bar.
        let slow = {
            let n = N / MB;
            let mut costs: Costs = [((OpKind::Kernel, n), 1.0), ((OpKind::H2d, N), 2.0), ((OpKind::D2h, N), 2.0)].into();
            for s in 0..3 {
                costs.insert((OpKind::D2d(Link { from: s, to: s + 1 }), n), 1.0);
            }
            costs
        };
        let good = check_on_model(MB, N, &[0, 1, 2, 3], Machine::engines(2), &slow, Arc::new(events_only));
        assert!(good.passed && good.to_string().contains("the copies between the stages leave the events-only loop"), "{good}");
        let bad = check_on_model(MB, N, &[0, 1, 2, 3], Machine::engines(2), &slow, Arc::new(host_synchronized));
        fails_with(&bad, &["host synchronization in the loop", "bubble"]);
        // Stage 2 held until stage 1 has done every micro-batch.
        let held = four(Arc::new(|p: &mut dyn Issue, t: &MicroBatchTask| {
            for s in 0..t.stages {
                for i in 0..t.micro_batches {
                    if s > 0 {
                        t.send(p, s - 1, t.gpus[s].compute, i)?;
                    }
                    t.stage(p, s, t.gpus[s].compute, i)?;
                }
                if s + 1 < t.stages {
                    p.wait_for(t.gpus[s + 1].compute, t.gpus[s].compute)?;
                }
            }
            Ok(())
        }));
        fails_with(&held, &["bubble", "stage 1 starts only once stage 0 has finished every micro-batch"]);
        // A stage left out: the data says so.
        let short = four(Arc::new(|p: &mut dyn Issue, t: &MicroBatchTask| {
            for i in 0..t.micro_batches {
                for s in 0..t.stages - 1 {
                    t.stage(p, s, t.gpus[s].compute, i)?;
                    p.wait_for(t.gpus[s + 1].compute, t.gpus[s].compute)?;
                    t.send(p, s, t.gpus[s + 1].compute, i)?;
                }
            }
            Ok(())
        }));
        fails_with(&short, &["wrong data: output element 0"]);
    }

    #[test]
    fn the_given_loop_fails_for_its_host_waits_and_its_bubble() {
        let rep = check(host_synchronized);
        fails_with(&rep, &["host synchronization in the loop", "cannot issue the next micro-batch meanwhile"]);
        fails_with(
            &rep,
            &[
                "bubble: the GPUs idle 51.2% of the time, more than the pipeline's 11.1%",
                "GPU 0 waits for GPU 1: stage 0 of micro-batch 1 starts only after stage 1 of micro-batch 0 ended",
            ],
        );
        // Waiting on the CPU for an event is a host wait too.
        let rep = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                let e = p.event()?;
                p.record(e, t.gpus[0].compute)?;
                p.host_wait(e)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&rep, &["host synchronization in the loop"]);
    }

    #[test]
    fn a_missing_wait_is_a_race_naming_the_copy_and_the_stage() {
        let rep = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                t.send(p, 0, t.gpus[1].copy, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[1].copy)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&rep, &["race: 'send micro-batch 0 to GPU 1' reads", "'stage 0, micro-batch 0' may still write"]);
        // The copy waited for, but stage 1 not for the copy.
        let rep = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[0].copy, t.gpus[0].compute)?;
                t.send(p, 0, t.gpus[0].copy, i)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&rep, &["race: 'stage 1, micro-batch 0' reads", "'send micro-batch 0 to GPU 1' may still write"]);
    }

    #[test]
    fn work_on_the_other_gpus_stream_or_a_forgotten_copy_is_named() {
        let wrong_stream = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                t.send(p, 0, t.gpus[0].compute, i)?;
                t.stage(p, 1, t.gpus[0].compute, i)?;
            }
            Ok(())
        });
        fails_with(
            &wrong_stream,
            &[
                "your loop stopped with",
                "a kernel on stream compute (GPU 0) touches activation received by GPU 1, which is in GPU 1's memory: an operation on a stream reaches only its own GPU's memory",
            ],
        );
        let no_copy = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                let (at, n) = t.micro_batch(i);
                p.compute(t.gpus[1].compute, t.activations[0], at, t.output, at, n, "stage 1 straight from GPU 0's memory")?;
            }
            Ok(())
        });
        fails_with(&no_copy, &["touches activation on GPU 0, which is in GPU 0's memory", "peer copy"]);
    }

    #[test]
    fn a_stage_2_that_waits_for_all_of_stage_1_leaves_half_the_time_idle() {
        let rep = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
            }
            let all = p.event()?;
            p.record(all, t.gpus[0].compute)?;
            p.wait(t.gpus[1].compute, all)?;
            for i in 0..t.micro_batches {
                t.send(p, 0, t.gpus[1].compute, i)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&rep, &["bubble", "stage 1 starts only once stage 0 has finished every micro-batch"]);
        assert!(!rep.to_string().contains("host synchronization"), "{rep}");
    }

    #[test]
    fn a_stage_run_twice_for_a_micro_batch_is_named_as_such() {
        let rep = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                t.stage(p, 0, t.gpus[0].compute, i)?;
                events_only_one(p, t, i)?;
            }
            Ok(())
        });
        fails_with(&rep, &["stage 0, micro-batch 0 runs 3 times: each stage runs once per micro-batch"]);
        assert!(!rep.to_string().contains("waits for more than its own"), "{rep}");
    }

    #[test]
    fn wrong_data_names_the_missing_stage_or_copy_and_a_panic_is_a_failed_check() {
        let no_stage2 = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        // The lab's own D2H copies the output after the loop: what is missing is stage 1.
        fails_with(
            &no_stage2,
            &["wrong data: output element 0 was copied to the host", "which nothing ever wrote there", "(a stage, a kernel or a copy) is missing"],
        );
        assert!(!no_stage2.to_string().contains("a D2H is missing"), "{no_stage2}");
        let skipped = check(|p, t| {
            for i in 0..t.micro_batches - 1 {
                events_only_one(p, t, i)?;
            }
            Ok(())
        });
        fails_with(&skipped, &["wrong data: output element 56 was copied to the host", "nothing ever wrote there"]);
        assert!(!skipped.to_string().contains("a D2H is missing"), "{skipped}");
        let off_by_one = check(|p, t| {
            for i in 0..t.micro_batches {
                let (at, n) = t.micro_batch(i);
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
                p.compute(t.gpus[1].compute, t.received[0], at, t.output, (at + n) % t.elements, n, "stage 1 at the next offset")?;
            }
            Ok(())
        });
        fails_with(&off_by_one, &["wrong data: output element", "holds the result for element"]);
        let panics = check(|_, t| {
            let v: Vec<usize> = Vec::new();
            let _ = v[t.micro_batches];
            Ok(())
        });
        fails_with(&panics, &["your loop panicked"]);
        let bad = check_on_model(0, 64, &[0, 1], Machine::engines(2), &Costs::new(), Arc::new(events_only));
        fails_with(&bad, &["0 micro-batches of 64 elements"]);
    }

    /// The send from GPU 0 to GPU 1 forgotten (or issued after the stage
    /// that needs it): GPU 1's stage reads an activation nothing copied
    /// there, named by its micro-batch and the buffer's role.
    /// A loop one past the last micro-batch is told which micro-batch does
    /// not exist, not which element offsets do not fit a buffer.
    #[test]
    fn a_micro_batch_past_the_last_is_named_as_such() {
        let one_too_many = check(|p, t| {
            for i in 0..=t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&one_too_many, &["stage 0 of micro-batch", "there is no micro-batch", "the loop has"]);
        assert!(!one_too_many.to_string().contains("do not fit"), "{one_too_many}");
    }

    #[test]
    fn a_forgotten_send_names_the_stage_that_reads_an_activation_nothing_copied() {
        let no_send = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(
            &no_send,
            &[
                "wrong data: output element 0 was computed from data nothing wrote",
                "'stage 1, micro-batch 0' on GPU 1 reads elements 0..8 of activation received by GPU 1, and no copy or kernel issued before it writes there",
            ],
        );
        assert!(!no_send.to_string().contains("never uploaded") && !no_send.to_string().contains("race"), "{no_send}");
        let late = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                t.stage(p, 1, t.gpus[1].compute, i)?;
                t.send(p, 0, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&late, &["'stage 1, micro-batch 0' on GPU 1 reads elements 0..8 of activation received by GPU 1", "or issued after it"]);
        // Only the last micro-batch's send forgotten: named there.
        let last = check(|p, t| {
            for i in 0..t.micro_batches {
                t.stage(p, 0, t.gpus[0].compute, i)?;
                p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
                if i + 1 < t.micro_batches {
                    t.send(p, 0, t.gpus[1].compute, i)?;
                }
                t.stage(p, 1, t.gpus[1].compute, i)?;
            }
            Ok(())
        });
        fails_with(&last, &["output element 56 was computed from data nothing wrote: 'stage 1, micro-batch 7' on GPU 1 reads elements 56..64 of activation received by GPU 1"]);
    }

    /// Micro-batch `i` of the events-only loop.
    fn events_only_one(p: &mut dyn Issue, t: &MicroBatchTask, i: usize) -> Result<()> {
        t.stage(p, 0, t.gpus[0].compute, i)?;
        p.wait_for(t.gpus[1].compute, t.gpus[0].compute)?;
        t.send(p, 0, t.gpus[1].compute, i)?;
        t.stage(p, 1, t.gpus[1].compute, i)
    }
}
