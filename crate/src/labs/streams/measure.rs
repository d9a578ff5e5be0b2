//! Lab 5 on the GPU: the kernel balanced against a chunk's copy, the
//! machine and every op measured alone, then every variant of every
//! experiment run, verified and timed, beside the model's prediction.

use super::experiments;
use super::issue_cost;
use super::{ExperimentResult, StreamsConfig, StreamsResults};
use crate::error::{LabError, Result};
use crate::gpu::{Gpu, PlanRig};
use crate::lab_kit::experiment::{balance, interleaved, machine_line, variant};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::OpKind;
use crate::pipeline::plan::{chunk, Costs, Plan};
use crate::present::progress::{Progress, ProgressMode};

/// The three-way overlap's best on this machine: every copy at the rate
/// both directions get at once while both have work, the kernels back to
/// back, and the first H2D and last D2H that nothing can hide.
/// `both_ways`: that rate, as a share of each direction's alone
/// ([`Machine::both_ways`]), all the bound takes of the machine.
pub fn three_way_bound(costs: &Costs, both_ways: f64, elements: usize, chunks: usize) -> f64 {
    let of = |kind: OpKind, c: usize| costs.get(&(kind, chunk(elements, chunks, c).1)).copied().unwrap_or(0.0);
    let sum = |kind: OpKind| (0..chunks).map(|c| of(kind, c)).sum::<f64>();
    let (h, k, d) = (sum(OpKind::H2d), sum(OpKind::Kernel), sum(OpKind::D2h));
    let r = both_ways;
    let copies = if h >= d { d / r + (h - d) } else { h / r + (d - h) };
    copies.max(of(OpKind::H2d, 0) + k + of(OpKind::D2h, chunks - 1))
}

/// Runs every experiment. Before each, the machine and the experiment's
/// ops alone are measured again, so the model works from parts timed at
/// the same moments as the runs it predicts (a host's copies drift: both
/// directions at once can read a fifth apart across runs of one day).
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
        let costs = rig.costs(&e.variants.iter().collect::<Vec<_>>(), reps)?;
        progress.step(&format!("{}: machine: {}; {} ops measured alone", e.name, machine_line(&facts), costs.len()));
        let models = e.variants.iter().map(Plan::dry_run).collect::<Result<Vec<_>>>()?;
        let totals = interleaved(&mut rig, &e.variants, &models, reps)?;
        // This host's both-ways rate drifts by several percent within
        // minutes: variants after the one that runs both directions at once
        // take the ceiling from its runs, interleaved with theirs, at their
        // fast end (the lower quartile, as each op alone is costed, since
        // those runs are bimodal when the host has slow phases): the model
        // and the bound alike, the bound's parts at their fast ends as
        // every bound's are.
        let ceiling = match e.ceiling_from {
            Some(i) => {
                let alone =
                    |kind| costs.get(&(kind, cfg.elements)).copied().ok_or_else(|| LabError::config(format!("{}: no whole-size copy measured alone", e.name)));
                let both = Summary::of(&totals[i])?;
                Some((i, Machine::copies_measured(facts.copy_engines, alone(OpKind::H2d)?, alone(OpKind::D2h)?, both.fast_end()).both_ways))
            }
            None => None,
        };
        let source = e.clock(&models);
        let mut variants = Vec::new();
        for (i, (plan, model)) in e.variants.iter().zip(&models).enumerate() {
            let at = match ceiling {
                Some((from, share)) if i > from => Machine { both_ways: share, ..machine },
                _ => machine,
            };
            let mut v = variant(&mut rig, plan, model, e, source, &totals[i], at, &costs, reps)?;
            if plan.name == experiments::THREE_WAY {
                v.bound_ms = Some(three_way_bound(&costs, at.both_ways, cfg.elements, experiments::three_way_chunks(cfg)));
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
