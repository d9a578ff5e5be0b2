//! Runs lab 2 on a GPU, on the runner's rig (`gpu::PlanRig`): calibrate the
//! kernel to each intensity, measure the parts alone, then sweep chunks x
//! streams x issue order. Every run is a plan — the chunked loop in an
//! issue order, over all three stages or one alone, or a learner's loop —
//! and the rig verifies every one of them against its dry run.

use super::{ChunkTask, Intensity, IntensityResults, IssueOrder, OverlapConfig, OverlapPoint, OverlapResults, Parts};
use crate::error::{LabError, Result};
use crate::gpu::{trace, Gpu, PlanRig, Run, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{Issue, SyncEach};
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{Plan, StreamSpec};
use crate::pipeline::timeline::Timeline;
use crate::present::progress::{Progress, ProgressMode};
use std::collections::HashMap;
use std::sync::Arc;

/// A learner's (or the lab's) issue loop over a [`ChunkTask`].
pub type ChunkLoop = Arc<dyn Fn(&mut dyn Issue, &ChunkTask) -> Result<()> + Send + Sync>;

/// `names.len()` non-blocking streams named so.
fn streams_named(names: &[String]) -> Vec<StreamSpec> {
    names.iter().map(|n| StreamSpec::new(n, StreamKind::NonBlocking, 0)).collect()
}

/// The streams `order` runs on at a point with `streams` streams: uploads,
/// kernels, downloads for the stream per stage, else s0, s1, ...
fn stream_names(order: IssueOrder, streams: usize) -> Vec<String> {
    match order {
        IssueOrder::StageStreams => ["uploads", "kernels", "downloads"].map(String::from).to_vec(),
        _ => (0..streams).map(|i| format!("s{i}")).collect(),
    }
}

/// `body` over `elements` in `chunks` chunks on the given streams, as a
/// plan (device buffer 0 the input, 1 the output).
fn chunk_plan(name: &str, elements: usize, chunks: usize, names: &[String], body: ChunkLoop) -> Plan {
    Plan::new(name, streams_named(names), elements, 2, move |p, r| body(p, &ChunkTask::of(r, chunks)))
}

/// The lab's loop at a point: `stages` of every chunk issued in `order`;
/// with `sync`, the CPU waits for each op (the synchronous baseline).
pub fn point_plan(elements: usize, chunks: usize, streams: usize, order: IssueOrder, stages: &[OpKind], sync: bool) -> Plan {
    let stages = stages.to_vec();
    let name = format!("{chunks} chunks on {streams} streams, {}", order.label());
    let body: ChunkLoop = Arc::new(move |p, t| if sync { order.issue(&mut SyncEach(p), t, &stages) } else { order.issue(p, t, &stages) });
    chunk_plan(&name, elements, chunks, &stream_names(order, streams), body)
}

/// A learner's loop on `streams` streams named s0, s1, ...
pub fn learner_plan(elements: usize, chunks: usize, streams: usize, issue: ChunkLoop) -> Plan {
    chunk_plan("your issue loop", elements, chunks, &stream_names(IssueOrder::DepthFirst, streams), issue)
}

/// All data up and all data down at the same time, in `chunks` copies
/// each way: uploads on one stream, downloads on another, no kernel.
pub fn both_copies_plan(elements: usize, chunks: usize) -> Plan {
    let body: ChunkLoop = Arc::new(|p, t| {
        for c in 0..t.chunks {
            let (at, n) = t.chunk(c);
            p.h2d(t.streams[0], t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}"))?;
            p.d2h(t.streams[1], t.host_out, at, t.dev_out, at, n, &format!("D2H chunk {c}"))?;
        }
        Ok(())
    });
    chunk_plan("both copies at once", elements, chunks, &["up".into(), "down".into()], body)
}

/// Which run of the lab a plan is: (chunks, streams, order, stages, sync).
type PlanKey = (usize, usize, IssueOrder, Vec<OpKind>, bool);

/// The rig and the lab's plans, each with its dry run, made once.
pub struct Sweep {
    pub rig: PlanRig,
    elements: usize,
    plans: HashMap<PlanKey, (Plan, DryRun)>,
    both: HashMap<usize, (Plan, DryRun)>,
}

impl Sweep {
    /// A rig for `elements` in and out.
    pub fn new(gpu: &Gpu, elements: usize) -> Result<Sweep> {
        Ok(Sweep { rig: PlanRig::new(gpu, elements, 2, 0)?, elements, plans: HashMap::new(), both: HashMap::new() })
    }

    /// Runs `stages` of the point's loop once, verified; `source` times its timeline.
    pub fn run(&mut self, chunks: usize, streams: usize, order: IssueOrder, stages: &[OpKind], sync: bool, source: TimelineSource) -> Result<Run> {
        let key = (chunks, streams, order, stages.to_vec(), sync);
        if !self.plans.contains_key(&key) {
            let plan = point_plan(self.elements, chunks, streams, order, stages, sync);
            let model = plan.dry_run()?;
            self.plans.insert(key.clone(), (plan, model));
        }
        let (plan, model) = &self.plans[&key];
        self.rig.run_modelled(plan, model, source)
    }

    /// The whole point (every stage), untimed per op.
    pub fn point(&mut self, chunks: usize, streams: usize, order: IssueOrder) -> Result<Run> {
        self.run(chunks, streams, order, &OpKind::STAGES, false, TimelineSource::Off)
    }

    /// One stage over the whole data on one stream, alone (ms).
    pub fn timed_alone(&mut self, kind: OpKind) -> Result<f64> {
        Ok(self.run(1, 1, IssueOrder::DepthFirst, &[kind], false, TimelineSource::Off)?.total_ms)
    }

    /// Sets the kernel's FMAs per element so it takes `ratio` x the H2D time.
    pub fn calibrate(&mut self, h2d_ms: f64, ratio: f64) -> Result<i32> {
        let iterations = crate::lab_kit::calibrate_iterations(ratio * h2d_ms, |it| {
            self.rig.iterations = it;
            Ok(Summary::of_runs(3, || self.timed_alone(OpKind::Kernel))?.median)
        })?;
        self.rig.iterations = iterations;
        Ok(iterations)
    }

    /// All data up and all data down at once in `chunks` copies each way (ms).
    pub fn both_copies(&mut self, chunks: usize) -> Result<f64> {
        let elements = self.elements;
        let (plan, model) = match self.both.entry(chunks) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let plan = both_copies_plan(elements, chunks);
                let model = plan.dry_run()?;
                e.insert((plan, model))
            }
        };
        Ok(self.rig.run_modelled(plan, model, TimelineSource::Off)?.total_ms)
    }

    /// One sample of a point's parts (ms): each stage alone with its
    /// chunks, streams and order, and both copies at once in its chunks.
    pub fn parts_once(&mut self, chunks: usize, streams: usize, order: IssueOrder) -> Result<[f64; 4]> {
        // Breadth-first issues a stage alone exactly as depth-first does.
        let order = if order == IssueOrder::BreadthFirst { IssueOrder::DepthFirst } else { order };
        let mut alone = |stage: OpKind| Ok::<f64, LabError>(self.run(chunks, streams, order, &[stage], false, TimelineSource::Off)?.total_ms);
        let (h, k, d) = (alone(OpKind::H2d)?, alone(OpKind::Kernel)?, alone(OpKind::D2h)?);
        Ok([h, k, d, self.both_copies(chunks)?])
    }

    /// Runs the point `warmup + repeats` times, each run verified, and after
    /// every timed run one sample of its parts: the pipeline and the bound
    /// come from the same moments, so a slow spell of the link (a direction
    /// at a fraction of its speed for a while) slows both or neither.
    pub fn measure_point(&mut self, chunks: usize, streams: usize, order: IssueOrder, warmup: usize, repeats: usize) -> Result<(Summary, Parts)> {
        let (mut totals, mut parts) = (Vec::new(), Vec::new());
        for rep in 0..warmup + repeats {
            let run = self.point(chunks, streams, order)?;
            if rep >= warmup {
                totals.push(run.total_ms);
                parts.push(self.parts_once(chunks, streams, order)?);
            }
        }
        Ok((Summary::of(&totals)?, Parts::of_samples(&parts)?))
    }
}

/// The queue model's prediction for a run, each op lasting its share of the
/// part measured alone.
pub fn predict(run: &Run, parts: &Parts, elements: usize, copy_engines: u32) -> Timeline {
    // The timeline is in µs.
    run.predicted(parts.machine(copy_engines), |op| 1e3 * parts.op_ms(op, elements))
}

pub fn run(gpu: &Gpu, cfg: &OverlapConfig, progress: ProgressMode) -> Result<OverlapResults> {
    cfg.validate()?;
    let mut sweep = Sweep::new(gpu, cfg.elements)?;
    let copy_engines = gpu.copy_engines()?;
    let points = cfg.points();
    let steps = (cfg.intensities.len() * (points.len() + 2)) as u64 + 1;
    let mut progress = Progress::new(progress, steps, "overlap");
    let _lab = trace::range("lab 2: chunked overlap");
    let reps = cfg.repeats.max(3);
    let h2d = Summary::of_runs(reps, || sweep.timed_alone(OpKind::H2d))?;
    let d2h = Summary::of_runs(reps, || sweep.timed_alone(OpKind::D2h))?;
    let both = Summary::of_runs(reps, || sweep.both_copies(1))?;
    progress.step(&format!("copies alone: H2D {:.2} ms, D2H {:.2} ms, both at once {:.2} ms", h2d.median, d2h.median, both.median));
    let mut out = Vec::new();
    let mut overhead = None;
    for &intensity in &cfg.intensities {
        let _r = trace::range(&format!("intensity {}", intensity.label()));
        let iterations = sweep.calibrate(h2d.median, intensity.kernel_over_copy())?;
        let kernel = Summary::of_runs(reps, || sweep.timed_alone(OpKind::Kernel))?;
        let parts = Parts { h2d_ms: h2d, kernel_ms: kernel, d2h_ms: d2h, both_copies_ms: both };
        // Synchronous baseline, timed on the host clock as a user would:
        // from the loop's first call to its last wait.
        let mut sync = Vec::new();
        for rep in 0..cfg.warmup + cfg.repeats {
            let run = sweep.run(1, 1, IssueOrder::DepthFirst, &OpKind::STAGES, true, TimelineSource::Off)?;
            if rep >= cfg.warmup {
                sync.push(run.issue_ms);
            }
        }
        progress.step(&format!("{}: {iterations} FMAs/element, kernel {:.2} ms", intensity.label(), kernel.median));
        let mut points_done = Vec::new();
        for &(chunks, streams, order) in &points {
            let (total_ms, parts) = sweep.measure_point(chunks, streams, order, cfg.warmup, cfg.repeats)?;
            let p = OverlapPoint { chunks, streams, order, parts, total_ms, verified_runs: cfg.warmup + cfg.repeats };
            progress.step(&format!("{} {chunks} chunks / {streams} streams {}: {:.2} ms", intensity.label(), order.label(), p.total_ms.median));
            points_done.push(p);
        }
        out.push(IntensityResults {
            intensity,
            iterations,
            parts,
            synchronous_ms: Summary::of(&sync)?,
            points: points_done,
            serial_timeline: Timeline::default(),
            best_timeline: Timeline::default(),
            best_predicted: Timeline::default(),
        });
    }
    // Timelines only after every timed run: a tracing session must not
    // precede a measurement it could disturb.
    for r in out.iter_mut() {
        let (intensity, iterations) = (r.intensity, r.iterations);
        sweep.rig.iterations = iterations;
        // Timelines of the serial baseline and of the best point.
        let best = r.best().cloned().ok_or_else(|| LabError::config("the sweep measured no point"))?;
        for (chunks, streams, order, serial) in [(1, 1, IssueOrder::DepthFirst, true), (best.chunks, best.streams, best.order, false)] {
            let run = sweep.run(chunks, streams, order, &OpKind::STAGES, false, TimelineSource::best())?;
            let mut measured = run.timeline.clone().ok_or_else(|| LabError::config("a traced run left no timeline"))?;
            let title = format!("{} chunk(s) on {} stream(s), {}", chunks, streams, order.label());
            measured.title = format!("measured: {title}");
            if serial {
                r.serial_timeline = measured;
            } else {
                let mut pred = predict(&run, &r.parts, cfg.elements, copy_engines);
                pred.title = format!("predicted: {title}");
                r.best_timeline = measured;
                r.best_predicted = pred;
            }
        }
        progress.step(&format!("{} timelines", intensity.label()));
        // The timeline's own cost, on the balanced best point.
        if intensity == Intensity::Balanced || (overhead.is_none() && Some(&intensity) == cfg.intensities.last()) {
            overhead = Some(crate::pipeline::timeline::overhead_pct(cfg.warmup, 2 * cfg.repeats + 1, |on| {
                let source = if on { TimelineSource::best() } else { TimelineSource::Off };
                Ok(sweep.run(best.chunks, best.streams, best.order, &OpKind::STAGES, false, source)?.total_ms)
            })?);
        }
    }
    progress.finish();
    Ok(OverlapResults {
        config: cfg.clone(),
        copy_engines,
        timeline_overhead_pct: overhead.map_or(f64::NAN, |o| o.median),
        timeline_overhead_pairs_pct: overhead,
        // What really timed the drawn timelines (events, if CUPTI was taken).
        timeline_source: out.iter().map(|r| r.best_timeline.source.clone()).next().unwrap_or_else(|| TimelineSource::best().label().into()),
        intensities: out,
    })
}

#[cfg(test)]
mod tests {
    use super::super::STAGE_STREAMS;
    use super::*;

    #[test]
    fn every_plan_of_the_lab_verifies_on_its_dry_run_and_none_races() {
        for order in [IssueOrder::DepthFirst, IssueOrder::BreadthFirst, IssueOrder::StageStreams] {
            for stages in [&OpKind::STAGES[..], &[OpKind::H2d], &[OpKind::Kernel]] {
                for sync in [false, true] {
                    let p = point_plan(64, 4, 2, order, stages, sync);
                    let m = p.dry_run().unwrap();
                    assert!(m.schedule.races().is_empty(), "{}: {:?}", p.name, m.schedule.races());
                    assert_eq!(p.streams.len(), if order == IssueOrder::StageStreams { STAGE_STREAMS } else { 2 });
                }
            }
            let m = point_plan(64, 4, 2, order, &OpKind::STAGES, false).dry_run().unwrap();
            assert!(Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == crate::pipeline::cells::Provenance::Output(i as u32)));
        }
        let m = both_copies_plan(64, 4).dry_run().unwrap();
        assert!(m.schedule.races().is_empty());
        assert_eq!(m.schedule.streams_used(), 2, "uploads and downloads on their own streams");
    }
}
