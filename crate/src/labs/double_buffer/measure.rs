//! Runs lab 3 on a GPU, on the runner's rig (`gpu::PlanRig`): every
//! double-buffering loop (the lab's two, or a learner's) is a plan with a
//! CPU producer, two page-locked host buffers and two device buffers of a
//! batch each, and the device results; the rig verifies the results of
//! every run against the loop's dry run.

use super::{no_overlap, pipelined, BufferTask, DoubleBufferConfig, DoubleBufferResults};
use crate::error::{LabError, Result};
use crate::gpu::{trace, Gpu, PlanRig, Run, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::Issue;
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{Plan, Refs, StreamSpec};
use crate::present::progress::{Progress, ProgressMode};
use std::sync::Arc;

/// A double-buffering loop: what a learner writes, and the lab's two.
pub type BufferLoop = Arc<dyn Fn(&mut dyn Issue, &BufferTask) -> Result<()> + Send + Sync>;

impl BufferTask {
    /// The task a plan of [`buffer_plan`]'s shape is handed.
    pub fn of(r: &Refs, batches: usize, batch_elements: usize) -> BufferTask {
        BufferTask {
            batches,
            batch_elements,
            copy: r.streams[0],
            compute: r.streams[1],
            host: [r.hosts[0], r.hosts[1]],
            dev: [r.devices[0], r.devices[1]],
            results: r.devices[2],
        }
    }
}

/// `body` over `batches` batches of `batch_elements`: the copy and compute
/// streams, host buffers 0 and 1 and device buffers 0 and 1 of a batch
/// each, the device results of every batch (checked after each run), and
/// a producer writing the batches.
pub fn buffer_plan(name: &str, batches: usize, batch_elements: usize, body: BufferLoop) -> Plan {
    let n = batch_elements;
    let streams = vec![StreamSpec::new("copy", StreamKind::NonBlocking, 0), StreamSpec::new("compute", StreamKind::NonBlocking, 0)];
    Plan::new(name, streams, batches * n, 3, move |p, r| body(p, &BufferTask::of(r, batches, n)))
        .with_host_buffers(&[("host buffer 0", n), ("host buffer 1", n)])
        .with_device_buffers(&[("device buffer 0", n), ("device buffer 1", n), ("device results", batches * n)])
        .with_producer(n)
        .checked_on_devices(&[2])
}

/// One stage of one batch alone: its copy, its kernel (over a batch put
/// in place as set-up, so its result is checked), or the producer writing
/// it (batch `batch`, so each sample reads data as cold in the CPU's
/// caches as the pipeline's).
fn stage_plan(batches: usize, batch_elements: usize, stage: OpKind, batch: usize) -> Plan {
    let body: BufferLoop = Arc::new(move |p, t| {
        let n = t.batch_elements;
        match stage {
            OpKind::H2d => p.h2d(t.copy, t.dev[0], 0, t.host[0], 0, n, "H2D one batch"),
            OpKind::Kernel => {
                p.produce(t.host[0], 0, n, 0, "produce batch 0")?;
                p.h2d(t.copy, t.dev[0], 0, t.host[0], 0, n, "H2D batch 0")?;
                p.timed_from_here()?;
                p.compute(t.copy, t.dev[0], 0, t.results, 0, n, "compute one batch")
            }
            _ => p.produce(t.host[0], 0, n, batch, "produce one batch"),
        }
    });
    buffer_plan(&format!("one batch: {}", stage.label()), batches, batch_elements, body)
}

/// The rig and the lab's plans, each with its dry run.
pub struct Runs {
    pub rig: PlanRig,
    batches: usize,
    batch_elements: usize,
    /// Batches the producer was timed on alone so far.
    produced: usize,
}

impl Runs {
    pub fn new(gpu: &Gpu, batches: usize, batch_elements: usize) -> Result<Runs> {
        let elements = batches.checked_mul(batch_elements).ok_or_else(|| LabError::config(format!("{batches} batches of {batch_elements} elements")))?;
        Ok(Runs { rig: PlanRig::new(gpu, elements, 3, 0)?, batches, batch_elements, produced: 0 })
    }

    /// `body` as this lab's plan, with its dry run.
    pub fn plan(&self, name: &str, body: BufferLoop) -> Result<(Plan, DryRun)> {
        let plan = buffer_plan(name, self.batches, self.batch_elements, body);
        let model = plan.dry_run()?;
        Ok((plan, model))
    }

    /// Runs `plan` once, its results verified; `timeline` traces it.
    pub fn run(&mut self, (plan, model): &(Plan, DryRun), timeline: bool) -> Result<Run> {
        let source = if timeline { TimelineSource::for_host_pipeline() } else { TimelineSource::Off };
        self.rig.run_modelled(plan, model, source)
    }

    /// One batch's copy or kernel alone on one stream, ms (events).
    pub fn one_batch(&mut self, stage: OpKind) -> Result<f64> {
        let plan = stage_plan(self.batches, self.batch_elements, stage, 0);
        Ok(self.rig.run(&plan, TimelineSource::Off)?.total_ms)
    }

    /// The producer alone on the next batch's data (host clock, ms).
    pub fn produce_once(&mut self) -> Result<f64> {
        let batch = self.produced % self.batches;
        self.produced += 1;
        let plan = stage_plan(self.batches, self.batch_elements, OpKind::Host, batch);
        let run = self.rig.run(&plan, TimelineSource::Events)?;
        let span = run.timeline.as_ref().and_then(|t| t.spans.iter().find(|s| s.kind == OpKind::Host));
        span.map(|s| (s.end_us - s.start_us) / 1e3).ok_or_else(|| LabError::config("the producer's run left no span"))
    }

    /// One sample of each stage of one batch alone: [copy, kernel, produce] (ms).
    pub fn stages_once(&mut self) -> Result<[f64; 3]> {
        Ok([self.one_batch(OpKind::H2d)?, self.one_batch(OpKind::Kernel)?, self.produce_once()?])
    }
}

pub fn run(gpu: &Gpu, cfg: &DoubleBufferConfig, progress: ProgressMode) -> Result<DoubleBufferResults> {
    cfg.validate()?;
    let mut progress = Progress::new(progress, 4, "double-buffer");
    let _lab = trace::range("lab 3: double buffering");
    let mut runs = Runs::new(gpu, cfg.batches, cfg.batch_elements)?;
    let reps = cfg.repeats.max(5);
    let copy = Summary::of_runs(reps, || runs.one_batch(OpKind::H2d))?;
    let produce = Summary::of_runs(reps, || runs.produce_once())?;
    let target = (cfg.kernel_over_copy * copy.median).max(cfg.kernel_over_produce * produce.median);
    let iterations = crate::lab_kit::calibrate_iterations(target, |it| {
        runs.rig.iterations = it;
        Ok(Summary::of_runs(3, || runs.one_batch(OpKind::Kernel))?.median)
    })?;
    runs.rig.iterations = iterations;
    let kernel = Summary::of_runs(reps, || runs.one_batch(OpKind::Kernel))?;
    progress.step(&format!("one batch: copy {:.3} ms, kernel {:.3} ms ({iterations} FMAs), produce {:.3} ms", copy.median, kernel.median, produce.median));
    let plans = [runs.plan("no overlap", Arc::new(no_overlap))?, runs.plan("double-buffered", Arc::new(pipelined))?];
    let mut totals = [Vec::new(), Vec::new()];
    for rep in 0..cfg.warmup + cfg.repeats {
        for (k, plan) in plans.iter().enumerate() {
            let run = runs.run(plan, false)?;
            if rep >= cfg.warmup {
                totals[k].push(run.total_ms);
            }
        }
    }
    progress.step("timed runs");
    // The timeline's own cost on the pipelined loop.
    let pairs = crate::pipeline::timeline::overhead_pct(cfg.warmup, 2 * cfg.repeats + 1, |on| Ok(runs.run(&plans[1], on)?.total_ms))?;
    let mut timelines = Vec::new();
    for plan in &plans {
        timelines.push(runs.run(plan, true)?.timeline.ok_or_else(|| LabError::config("a traced run left no timeline"))?);
    }
    timelines[0].title = "measured: no overlap (one buffer, one stream)".into();
    timelines[1].title = "measured: double-buffered (copy and compute streams)".into();
    progress.step("timelines");
    progress.finish();
    let pipelined_timeline = timelines.pop().expect("two timelines");
    let timeline_source = pipelined_timeline.source.clone();
    let no_overlap_timeline = timelines.pop().expect("two timelines");
    Ok(DoubleBufferResults {
        config: cfg.clone(),
        iterations,
        produce_ms: produce,
        copy_ms: copy,
        kernel_ms: kernel,
        no_overlap_ms: Summary::of(&totals[0])?,
        pipelined_ms: Summary::of(&totals[1])?,
        no_overlap_timeline,
        pipelined_timeline,
        verified_runs: 2 * (cfg.warmup + cfg.repeats) + 2 * (cfg.warmup + 2 * cfg.repeats + 1) + 2,
        timeline_overhead_pct: Some(pairs.median),
        timeline_overhead_pairs_pct: Some(pairs),
        timeline_source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;

    #[test]
    fn the_lab_loops_and_each_stage_alone_are_plans_whose_results_are_what_the_lab_expects() {
        for (body, name) in [(Arc::new(no_overlap) as BufferLoop, "no overlap"), (Arc::new(pipelined), "double-buffered")] {
            let plan = buffer_plan(name, 6, 8, body);
            let m = plan.dry_run().unwrap();
            assert!(m.schedule.races().is_empty(), "{name}: {:?}", m.schedule.races());
            let results = plan.checked_cells(&m)[0];
            assert_eq!(results.len(), 48);
            assert!(results.iter().enumerate().all(|(i, c)| c == Provenance::Output(i as u32)), "{name}: every batch computed once, in place");
        }
        // Alone: a batch's copy, its kernel (over batch 0 put in place
        // first, so its result is checked), the producer.
        for (stage, ops) in [(OpKind::H2d, 1), (OpKind::Kernel, 3), (OpKind::Host, 1)] {
            let plan = stage_plan(6, 8, stage, 3);
            let m = plan.dry_run().unwrap();
            assert_eq!(m.schedule.ops.len(), ops, "{stage:?}");
            let results = plan.checked_cells(&m)[0];
            let want = if stage == OpKind::Kernel { Provenance::Output(0) } else { Provenance::Unset };
            assert_eq!((results.get(0), results.get(8)), (want, Provenance::Unset), "{stage:?}");
        }
    }
}
