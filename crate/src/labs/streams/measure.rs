//! Lab 5 on the GPU: the kernel balanced against a chunk's copy, the
//! machine and every op measured alone, then every variant of every
//! experiment run, verified and timed, beside the model's prediction.

use super::experiments::{self, Experiment};
use super::issue_cost;
use super::{ExperimentResult, StreamsConfig, StreamsResults, VariantResult};
use crate::error::{LabError, Result};
use crate::gpu::{Gpu, MachineFacts, PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::model::ModelPipeline;
use crate::pipeline::plan::{chunk, Costs, Plan};
use crate::pipeline::schedule::{Lane, Machine, OpKind};
use crate::present::progress::{Progress, ProgressMode};

/// FMAs per element that make one chunk's kernel take about as long as its
/// H2D (measured at `probe` FMAs and scaled: the kernel's time is linear in them).
fn balance(rig: &mut PlanRig, n: usize, reps: usize) -> Result<i32> {
    let probe = 64;
    rig.iterations = probe;
    let h2d = rig.alone(OpKind::H2d, n, reps)?.median;
    let kernel = rig.alone(OpKind::Kernel, n, reps)?.median;
    Ok(((probe as f64 * h2d / kernel).round() as i32).clamp(1, 1 << 20))
}

/// The three-way overlap's best on this machine: every copy at the rate
/// both directions get at once while both have work, the kernels back to
/// back, and the first H2D and last D2H that nothing can hide.
pub fn three_way_bound(costs: &Costs, machine: Machine, elements: usize, chunks: usize) -> f64 {
    let of = |kind: OpKind, c: usize| costs.get(&(kind, chunk(elements, chunks, c).1)).copied().unwrap_or(0.0);
    let sum = |kind: OpKind| (0..chunks).map(|c| of(kind, c)).sum::<f64>();
    let (h, k, d) = (sum(OpKind::H2d), sum(OpKind::Kernel), sum(OpKind::D2h));
    let r = machine.both_ways;
    let copies = if h >= d { d / r + (h - d) } else { h / r + (d - h) };
    copies.max(of(OpKind::H2d, 0) + k + of(OpKind::D2h, chunks - 1))
}

/// A variant's traced runs (the drawn timeline, and the watched op's end
/// on every run when the experiment watches one) and its prediction;
/// `totals` are its untraced runs' times.
#[allow(clippy::too_many_arguments)]
fn variant(
    rig: &mut PlanRig,
    plan: &Plan,
    model: &ModelPipeline,
    e: &Experiment,
    totals: &[f64],
    machine: Machine,
    costs: &Costs,
    reps: usize,
) -> Result<VariantResult> {
    // CUPTI draws what each engine really ran (an event only says when its
    // stream reached it), but its cost per API call lands inside loops the
    // CPU takes part in: events there. Another thread's per-thread stream
    // has no handle CUPTI can name: events there too.
    let host_takes_part = model.schedule.ops.iter().any(|o| !o.after_host_wait.is_empty() || matches!(o.lane, Lane::HostThread(_)));
    let source = if model.stream_names().len() > plan.streams.len() {
        TimelineSource::Events
    } else if host_takes_part {
        TimelineSource::for_host_pipeline()
    } else {
        TimelineSource::best()
    };
    let mut watched = Vec::new();
    let mut last = None;
    for _ in 0..if e.watch.is_some() { reps } else { 1 } {
        let run = rig.run_modelled(plan, model, source)?;
        let tl = run.timeline.ok_or_else(|| LabError::config("a traced run left no timeline"))?;
        if let Some(label) = e.watch {
            if let Some(s) = tl.spans.iter().find(|s| s.label == label) {
                watched.push(s.end_us / 1e3);
            }
        }
        last = Some(tl);
    }
    let timeline = last.ok_or_else(|| LabError::config("no traced run"))?;
    let p = plan.prediction(model, machine, costs)?;
    let watched_model_ms = e.watch.and_then(|label| p.end_of(&model.schedule, label));
    Ok(VariantResult {
        name: plan.name.clone(),
        total_ms: Summary::of(totals)?,
        model_ms: p.total_ms,
        watched_ms: if watched.is_empty() { None } else { Some(Summary::of(&watched)?) },
        watched_model_ms,
        bound_ms: None,
        timeline,
        predicted: p.timeline,
    })
}

/// Each variant's untraced runs, interleaved: the variants take turns, so
/// a slow phase of the host (this one has them: a tenth of runs or more
/// read 20-80% slow for a while) lands on all of them alike. Two warm-up
/// runs each first (a variant's first timed run read up to 50% slow after
/// one on a freshly started H100). Untraced: an event after a copy costs
/// its engine a flush (two streams copying both ways read up to 40% slower
/// with events between).
fn interleaved(rig: &mut PlanRig, plans: &[Plan], models: &[ModelPipeline], reps: usize) -> Result<Vec<Vec<f64>>> {
    for (plan, model) in plans.iter().zip(models) {
        for _ in 0..2 {
            rig.run_modelled(plan, model, TimelineSource::Off)?;
        }
    }
    let mut totals = vec![Vec::with_capacity(reps); plans.len()];
    for _ in 0..reps {
        for ((plan, model), t) in plans.iter().zip(models).zip(&mut totals) {
            t.push(rig.run_modelled(plan, model, TimelineSource::Off)?.total_ms);
        }
    }
    Ok(totals)
}

/// One line on what the model was told of the machine.
pub fn machine_line(facts: &MachineFacts) -> String {
    let machine = facts.machine();
    format!(
        "{} copy engines, both ways at {:.0}% each, wake-up {:.1} µs, a kernel behind another stream's saves {:.1} µs, issuing an op {:.1} µs",
        facts.copy_engines,
        100.0 * machine.both_ways,
        facts.wake_ms * 1e3,
        machine.kernel_overlap * 1e3,
        facts.issue_ms * 1e3
    )
}

/// Runs every experiment. Before each, the machine and the experiment's
/// ops alone are measured again, so the model works from parts timed at
/// the same moments as the runs it predicts (this host's copies drift:
/// both directions at once read 1.35 to 1.66 ms across runs of one day).
pub fn run(gpu: &Gpu, cfg: &StreamsConfig, progress: ProgressMode) -> Result<StreamsResults> {
    cfg.validate()?;
    let priority_range = gpu.stream_priority_range()?;
    let exps = experiments::all(cfg, priority_range.1);
    let variants: usize = exps.iter().map(|e| e.variants.len()).sum();
    let mut progress = Progress::new(progress, 1 + (exps.len() + variants + cfg.issue_chunks.len()) as u64, "streams");
    let reps = cfg.repeats;
    let mut rig = PlanRig::new(gpu, cfg.elements, 4, 1)?;
    let iterations = balance(&mut rig, chunk(cfg.elements, cfg.chunks, 0).1, reps)?;
    rig.iterations = iterations;
    progress.step(&format!("kernel balanced against a chunk's H2D: {iterations} FMAs per element"));
    let mut experiments = Vec::new();
    let mut all_costs = Costs::new();
    let mut first_facts = None;
    for e in &exps {
        let facts = rig.machine(cfg.elements, reps)?;
        let machine = facts.machine();
        let (costs, fastest) = rig.costs_and_fastest(&e.variants.iter().collect::<Vec<_>>(), reps)?;
        progress.step(&format!("{}: machine: {}; {} ops measured alone", e.name, machine_line(&facts), costs.len()));
        let models = e.variants.iter().map(Plan::model).collect::<Result<Vec<_>>>()?;
        let totals = interleaved(&mut rig, &e.variants, &models, reps)?;
        // This host's both-ways rate drifts by several percent within
        // minutes: variants after the one that runs both directions at once
        // take the ceiling from its runs, interleaved with theirs (the
        // model from its median run, the bound from its fastest).
        let ceiling = match e.ceiling_from {
            Some(i) => {
                let alone = |c: &Costs, kind| {
                    c.get(&(kind, cfg.elements)).copied().ok_or_else(|| LabError::config(format!("{}: no whole-size copy measured alone", e.name)))
                };
                let both = Summary::of(&totals[i])?;
                let share = |c: &Costs, ms| Ok(Machine::copies_measured(facts.copy_engines, alone(c, OpKind::H2d)?, alone(c, OpKind::D2h)?, ms).both_ways);
                Some((i, share(&costs, both.median)?, share(&fastest, both.min)?))
            }
            None => None,
        };
        let mut variants = Vec::new();
        for (i, (plan, model)) in e.variants.iter().zip(&models).enumerate() {
            let at = match ceiling {
                Some((from, median, _)) if i > from => Machine { both_ways: median, ..machine },
                _ => machine,
            };
            let mut v = variant(&mut rig, plan, model, e, &totals[i], at, &costs, reps)?;
            if plan.name == experiments::THREE_WAY {
                let best = Machine { both_ways: ceiling.map_or(machine.both_ways, |c| c.2), ..machine };
                v.bound_ms = Some(three_way_bound(&fastest, best, cfg.elements, experiments::three_way_chunks(cfg)));
            }
            progress.step(&format!("{}: {}: {:.3} ms (model {:.3} ms)", e.name, v.name, v.total_ms.median, v.model_ms));
            variants.push(v);
        }
        let ceiling = ceiling.map(|c| c.1);
        for (&k, &ms) in &costs {
            all_costs.entry(k).or_insert(ms);
        }
        first_facts.get_or_insert(facts);
        experiments.push(ExperimentResult {
            name: e.name.into(),
            shows: e.shows.into(),
            variants,
            effects: e.effects.clone(),
            machine: Some(facts),
            ceiling,
            costs: costs.into_iter().map(|((k, n), ms)| (k, n, ms)).collect(),
        });
    }
    let issue_cost = issue_cost::measure(&mut rig, cfg, &mut progress)?;
    progress.finish();
    let machine = first_facts.ok_or_else(|| LabError::config("the lab has no experiments"))?;
    let costs = all_costs.into_iter().map(|((k, n), ms)| (k, n, ms)).collect();
    Ok(StreamsResults { config: cfg.clone(), machine, iterations, priority_range, costs, experiments, issue_cost: Some(issue_cost) })
}
