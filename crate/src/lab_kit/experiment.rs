//! An experiment: a few variants of one pipeline written as [`Plan`]s, so
//! the GPU and the model run the same loop. On the GPU its variants run
//! interleaved (they take turns, run by run, so a slow phase of the host
//! lands on all alike), each verified, timed with its spread, drawn, and
//! predicted by the queue model from each op measured alone; the
//! differences the lab claims ([`Effect`]) are judged against both
//! variants' spreads. Labs 5 and 6 are made of experiments.
//!
//! May use: `pipeline` (plans, the model), `gpu` (the rig that runs them),
//! `measure`.

use crate::error::{LabError, Result};
use crate::gpu::{MachineFacts, PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{Lane, OpKind};
use crate::pipeline::plan::{Costs, Plan};
use crate::pipeline::timeline::Timeline;
use crate::present::gantt::Gantt;
use serde::{Deserialize, Serialize};

/// One experiment: what it shows and its variants.
pub struct Experiment {
    pub name: &'static str,
    pub shows: &'static str,
    pub variants: Vec<Plan>,
    /// The label of the op whose end the experiment watches (the urgent job).
    pub watch: Option<&'static str>,
    /// The differences it shows: each compares two of its variants.
    pub effects: Vec<Effect>,
    /// The variant that runs an H2D and a D2H of the whole size at once:
    /// the variants after it take the bidirectional ceiling from its run.
    pub ceiling_from: Option<usize>,
}

/// A difference an experiment shows: variant `changed` against variant
/// `base` (indices into its variants), in their totals or, with `watched`,
/// in the watched op's end; `expected` says whether the lab claims one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Effect {
    pub what: String,
    pub base: usize,
    pub changed: usize,
    pub watched: bool,
    pub expected: bool,
}

impl Effect {
    pub fn new(what: &str, base: usize, changed: usize, expected: bool) -> Effect {
        Effect { what: what.into(), base, changed, watched: false, expected }
    }
}

/// One variant of an experiment, measured and predicted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    pub name: String,
    /// First op's start to the last op's end on the GPU (events), ms.
    pub total_ms: Summary,
    /// The queue model's total from each op measured alone, ms.
    pub model_ms: f64,
    /// When the experiment names a job to watch (the urgent job of the
    /// priority experiment): its last op's end, measured and predicted, ms.
    pub watched_ms: Option<Summary>,
    pub watched_model_ms: Option<f64>,
    /// The best this pipeline could do on this machine, ms (three-way
    /// overlap: a bound that knows the bidirectional ceiling).
    #[serde(default)]
    pub bound_ms: Option<f64>,
    /// The drawn run's timeline: of its traced runs, the one nearest the
    /// untraced median.
    pub timeline: Timeline,
    pub predicted: Timeline,
}

impl VariantResult {
    /// |ln(model / measured)| of the total.
    pub fn model_error(&self) -> f64 {
        (self.model_ms / self.total_ms.median).ln().abs()
    }
}

/// An effect's difference of medians and the two variants' spreads (ms).
pub type EffectSize = (f64, f64, f64);

/// One experiment's variants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExperimentResult {
    pub name: String,
    pub shows: String,
    pub variants: Vec<VariantResult>,
    /// The differences it shows (see [`Self::effect_lines`]).
    #[serde(default)]
    pub effects: Vec<Effect>,
    /// The machine and its ops alone, measured just before its variants:
    /// what its model column was computed from.
    #[serde(default)]
    pub machine: Option<MachineFacts>,
    /// Each direction's share of its speed alone while both run, as this
    /// experiment measured it (the model and the bound of its later
    /// variants use it; see [`crate::labs::streams::experiments::Experiment::ceiling_from`]).
    #[serde(default)]
    pub ceiling: Option<f64>,
    #[serde(default)]
    pub costs: Vec<(crate::pipeline::op::OpKind, usize, f64)>,
}

impl ExperimentResult {
    /// Each variant's time (and the watched job's end, where there is one),
    /// as figures named by the experiment and the variant.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let mut v = Vec::new();
        for r in &self.variants {
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{}: {}", self.name, r.name), "ms", r.total_ms));
            if let Some(w) = r.watched_ms {
                v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{}: {}, watched job done", self.name, r.name), "ms", w));
            }
        }
        v
    }

    /// The costs its model used, by (kind, elements).
    pub fn costs_map(&self) -> Costs {
        self.costs.iter().map(|&(k, n, ms)| ((k, n), ms)).collect()
    }
    pub fn variant(&self, name: &str) -> Option<&VariantResult> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// Each effect with (difference of medians, spread of `base`, spread
    /// of `changed`), a spread being the middle half of the runs (the
    /// interquartile range, ms).
    pub fn effects(&self) -> Vec<(&Effect, Option<EffectSize>)> {
        let of = |i: usize, watched: bool| self.variants.get(i).and_then(|v| if watched { v.watched_ms } else { Some(v.total_ms) });
        self.effects
            .iter()
            .map(|e| {
                let pair = of(e.base, e.watched).zip(of(e.changed, e.watched));
                (e, pair.map(|(a, b)| (b.median - a.median, a.middle_spread(), b.middle_spread())))
            })
            .collect()
    }

    /// One line per effect: the difference, both spreads, the verdict.
    pub fn effect_lines(&self) -> String {
        self.effects().into_iter().filter_map(|(e, d)| d.map(|(diff, sa, sb)| effect_line(&e.what, diff, sa, sb, e.expected))).collect()
    }
}

/// Whether a difference of medians `diff` stands clear of both runs'
/// spreads (the middle half of each one's runs, ms), as the lab claims
/// (`expected`) or not: one line of the table.
pub fn effect_line(what: &str, diff: f64, sa: f64, sb: f64, expected: bool) -> String {
    let shown = diff.abs() > sa.max(sb);
    let verdict = match (shown, expected) {
        (true, true) => "shown: larger than either one's spread",
        (false, false) => "none beyond the spreads, as the lab expects",
        (true, false) => "a difference the lab does not expect: look at the timelines",
        (false, true) => "NOT shown: within the spread on this run",
    };
    format!("  effect: {what}: {diff:+.3} ms, spreads {sa:.3} / {sb:.3} ms (middle half of runs): {verdict}\n")
}

impl ExperimentResult {
    /// `e`'s results: its `variants` measured on the machine `facts`
    /// describes, predicted from `costs`.
    pub fn new(e: &Experiment, variants: Vec<VariantResult>, facts: MachineFacts, costs: &Costs) -> ExperimentResult {
        ExperimentResult {
            name: e.name.into(),
            shows: e.shows.into(),
            variants,
            effects: e.effects.clone(),
            machine: Some(facts),
            ceiling: None,
            costs: costs.iter().map(|(&(k, n), &ms)| (k, n, ms)).collect(),
        }
    }

    /// Its measured timelines, one per variant, or each beside the
    /// model's with `with_model`: a Gantt chart `stem` titled for `lab`.
    pub fn gantt(&self, lab: &str, stem: &str, with_model: bool, origin: &str) -> Gantt {
        let mut panels = Vec::new();
        for v in &self.variants {
            let measured = v.timeline.clone().illustrating(v.total_ms);
            panels.push(Timeline { title: format!("{}: measured, {:.3} ms", v.name, v.total_ms.median), ..measured });
            if with_model {
                panels.push(Timeline { title: format!("{}: model, {:.3} ms", v.name, v.model_ms), ..v.predicted.clone() });
            }
        }
        Gantt::new(stem, &format!("{lab}, {}: {}", self.name, if with_model { "measured and model" } else { "measured" }), origin, panels)
    }

    /// Whether every effect the lab expects stood clear of the spreads,
    /// and none it does not expect did.
    pub fn effects_as_claimed(&self) -> bool {
        self.effects().iter().all(|(e, d)| d.is_some_and(|(diff, sa, sb)| (diff.abs() > sa.max(sb)) == e.expected))
    }
}

/// What a variant's loop needs of the clock that draws it, least first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClockNeed {
    /// Pure GPU work: the best clock, CUPTI where it can record (it draws
    /// what each engine really ran; an event only says when its stream
    /// reached it).
    Gpu,
    /// The CPU takes part (host work, host waits, memory calls timed on
    /// the host): CUPTI's cost per API call lands inside the loop, so
    /// events, unless `OVERLAP_LAB_TIMELINE` says otherwise.
    HostPipeline,
    /// Another CPU thread's per-thread stream: CUPTI cannot name it.
    EventsOnly,
}

/// What `plan` (dry-run as `model`) needs of the clock that draws it.
pub fn clock_need(plan: &Plan, model: &DryRun) -> ClockNeed {
    let host_takes_part = model.schedule.ops.iter().any(|o| !o.after_host_wait.is_empty() || matches!(o.lane, Lane::HostThread(_)));
    if model.stream_names().len() > plan.streams.len() {
        ClockNeed::EventsOnly
    } else if host_takes_part {
        ClockNeed::HostPipeline
    } else {
        ClockNeed::Gpu
    }
}

impl Experiment {
    /// What its variants (dry-run as `models`, in order) need of the
    /// clock, together: the most any needs.
    pub fn clock_need(&self, models: &[DryRun]) -> ClockNeed {
        self.variants.iter().zip(models).map(|(p, m)| clock_need(p, m)).max().unwrap_or(ClockNeed::Gpu)
    }

    /// The one clock that draws every variant's timeline. Variants of one
    /// chart are compared by eye, so they come from one clock: the
    /// variant that needs the most decides for all (a pure-GPU variant
    /// drawn by CUPTI beside variants drawn by events is drawn on another
    /// clock's cost, and can look slower than variants its table ranks
    /// slower). `models`: the variants' dry runs, in order.
    pub fn clock(&self, models: &[DryRun]) -> TimelineSource {
        match self.clock_need(models) {
            ClockNeed::Gpu => TimelineSource::best(),
            ClockNeed::HostPipeline => TimelineSource::for_host_pipeline(),
            ClockNeed::EventsOnly => TimelineSource::Events,
        }
    }
}

/// A variant's traced runs (the drawn timeline, and the watched op's end
/// on every run when the experiment watches one), timed by `source`, the
/// experiment's one clock ([`Experiment::clock`]), and its prediction;
/// `totals` are its untraced runs' times. Of its traced runs (at least
/// [`TRACED_RUNS`]) the one drawn is the one whose makespan is nearest the
/// untraced median: a drawn run stands for the runs its table ranks, so a
/// slow or fast stray is not the one drawn.
#[allow(clippy::too_many_arguments)]
pub fn variant(
    rig: &mut PlanRig,
    plan: &Plan,
    model: &DryRun,
    e: &Experiment,
    source: TimelineSource,
    totals: &[f64],
    machine: Machine,
    costs: &Costs,
    reps: usize,
) -> Result<VariantResult> {
    let total_ms = Summary::of(totals)?;
    let mut watched = Vec::new();
    let mut nearest: Option<Timeline> = None;
    let off = |t: &Timeline| (t.makespan_us() / 1e3 - total_ms.median).abs();
    for _ in 0..if e.watch.is_some() { reps.max(TRACED_RUNS) } else { TRACED_RUNS } {
        let run = rig.run_modelled(plan, model, source)?;
        let tl = run.timeline.ok_or_else(|| LabError::config("a traced run left no timeline"))?;
        if let Some(label) = e.watch {
            if let Some(s) = tl.spans.iter().find(|s| s.label == label) {
                watched.push(s.end_us / 1e3);
            }
        }
        if nearest.as_ref().is_none_or(|n| off(&tl) < off(n)) {
            nearest = Some(tl);
        }
    }
    let timeline = nearest.ok_or_else(|| LabError::config("no traced run"))?;
    let p = plan.prediction(model, machine, costs)?;
    let watched_model_ms = e.watch.and_then(|label| p.end_of(&model.schedule, label));
    Ok(VariantResult {
        name: plan.name.clone(),
        total_ms,
        model_ms: p.total_ms,
        watched_ms: if watched.is_empty() { None } else { Some(Summary::of(&watched)?) },
        watched_model_ms,
        bound_ms: None,
        timeline,
        predicted: p.timeline,
    })
}

/// Traced runs of each variant, of which the one nearest its untraced
/// median is drawn.
pub const TRACED_RUNS: usize = 3;

/// Each variant's untraced runs, interleaved: the variants take turns, so
/// a slow phase of the host (a share of runs can read far slower for a
/// while) lands on all of them alike. Two warm-up runs each first (a
/// variant's first timed runs on a freshly started GPU read slow).
/// Untraced: an event after a copy costs its engine a flush (two streams
/// copying both ways read far slower with events between).
pub fn interleaved(rig: &mut PlanRig, plans: &[Plan], models: &[DryRun], reps: usize) -> Result<Vec<Vec<f64>>> {
    interleaved_with(rig, plans, models, reps, |_, _| Ok(()))
}

/// [`interleaved`], with `each_round` run after the warm-ups (told
/// `false`) and after every round of timed runs (`true`): what it
/// measures for the model is measured in the same conditions as the runs
/// it predicts (lab 6's pinned calls and CPU producer drift over a run of
/// many pinned allocations on some hosts).
pub fn interleaved_with(
    rig: &mut PlanRig,
    plans: &[Plan],
    models: &[DryRun],
    reps: usize,
    mut each_round: impl FnMut(&mut PlanRig, bool) -> Result<()>,
) -> Result<Vec<Vec<f64>>> {
    for (plan, model) in plans.iter().zip(models) {
        for _ in 0..2 {
            rig.run_modelled(plan, model, TimelineSource::Off)?;
        }
    }
    each_round(rig, false)?;
    let mut totals = vec![Vec::with_capacity(reps); plans.len()];
    for _ in 0..reps {
        for ((plan, model), t) in plans.iter().zip(models).zip(&mut totals) {
            t.push(rig.run_modelled(plan, model, TimelineSource::Off)?.total_ms);
        }
        each_round(rig, true)?;
    }
    Ok(totals)
}

/// FMAs per element that make one chunk's kernel take about as long as its
/// H2D (measured at `probe` FMAs and scaled: the kernel's time is linear in them).
pub fn balance(rig: &mut PlanRig, n: usize, reps: usize) -> Result<i32> {
    let probe = 64;
    rig.iterations = probe;
    let h2d = rig.alone(OpKind::H2d, n, reps)?.median;
    let kernel = rig.alone(OpKind::Kernel, n, reps)?.median;
    Ok(((probe as f64 * h2d / kernel).round() as i32).clamp(1, 1 << 20))
}

/// Runs experiment `e` on the rig: its variants interleaved (untraced,
/// timed), then each traced once and predicted on `machine` from `costs`;
/// `facts` is what the machine was measured to be.
pub fn measure(rig: &mut PlanRig, e: &Experiment, facts: MachineFacts, machine: Machine, costs: &Costs, reps: usize) -> Result<ExperimentResult> {
    let models = e.variants.iter().map(Plan::dry_run).collect::<Result<Vec<_>>>()?;
    let totals = interleaved(rig, &e.variants, &models, reps)?;
    traced_and_predicted(rig, e, &models, &totals, facts, machine, costs, reps)
}

/// The second half of [`measure`], for a lab that times the variants
/// itself (`totals`, each variant's timed runs, e.g. by
/// [`interleaved_with`]): each variant traced once and predicted on
/// `machine` from `costs`.
#[allow(clippy::too_many_arguments)]
pub fn traced_and_predicted(
    rig: &mut PlanRig,
    e: &Experiment,
    models: &[DryRun],
    totals: &[Vec<f64>],
    facts: MachineFacts,
    machine: Machine,
    costs: &Costs,
    reps: usize,
) -> Result<ExperimentResult> {
    let source = e.clock(models);
    let variants = e
        .variants
        .iter()
        .zip(models)
        .zip(totals)
        .map(|((plan, model), t)| variant(rig, plan, model, e, source, t, machine, costs, reps))
        .collect::<Result<Vec<_>>>()?;
    Ok(ExperimentResult::new(e, variants, facts, costs))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The experiment's variants' dry runs.
    fn models(e: &Experiment) -> Vec<DryRun> {
        e.variants.iter().map(|p| p.dry_run().unwrap()).collect()
    }

    /// Each variant's need, and the experiment's.
    fn needs(e: &Experiment) -> (Vec<ClockNeed>, ClockNeed) {
        let models = models(e);
        (e.variants.iter().zip(&models).map(|(p, m)| clock_need(p, m)).collect(), e.clock_need(&models))
    }

    #[test]
    fn one_clock_draws_every_variant_the_most_demanding_one_needs() {
        use ClockNeed::{EventsOnly, Gpu, HostPipeline};
        // Lab 6's alloc-stall: the stream-ordered pair is pure GPU work,
        // the others make memory calls on the CPU. It was drawn by CUPTI
        // beside the others' events, slower than variants it beats; now
        // every variant is drawn as the CPU-side ones must be.
        let stall = crate::labs::memory::experiments::stall(&crate::labs::memory::MemoryConfig::small());
        assert_eq!(needs(&stall), (vec![Gpu, HostPipeline, HostPipeline, HostPipeline], HostPipeline));
        // Lab 5: threads on their own per-thread streams need events (CUPTI
        // cannot name them), so the shared-stream variant takes them too;
        // the CPU waits of sync-weight decide for its GPU-waits variant;
        // pure-GPU experiments keep CUPTI.
        let cfg = crate::labs::streams::StreamsConfig::small();
        let lab5 = crate::labs::streams::experiments::all(&cfg, -5);
        let of = |name: &str| needs(lab5.iter().find(|e| e.name == name).unwrap());
        assert_eq!(of("threads"), (vec![Gpu, EventsOnly, EventsOnly], EventsOnly));
        assert_eq!(of("sync-weight"), (vec![Gpu, HostPipeline, HostPipeline, HostPipeline], HostPipeline));
        assert_eq!(of("copy-engines").1, Gpu);
        assert_eq!(of("legacy-stream").1, Gpu);
        // The clock each need gets, where no OVERLAP_LAB_TIMELINE overrides it.
        if std::env::var_os("OVERLAP_LAB_TIMELINE").is_none() {
            let threads = lab5.iter().find(|e| e.name == "threads").unwrap();
            assert_eq!(threads.clock(&models(threads)), TimelineSource::Events);
            assert_eq!(stall.clock(&models(&stall)), TimelineSource::Events, "the CPU takes part: events, never CUPTI");
        }
    }
}
