//! Runs lab 3 on a GPU.

use super::{no_overlap, pipelined, BufferTask, DoubleBufferConfig, DoubleBufferResults};
use crate::error::{LabError, Result};
use crate::gpu::kernels::compute_reference;
use crate::gpu::trace;
use crate::gpu::{ComputeKernel, DeviceBuffer, Gpu, HostBuffer, PinnedBuffer, Run, Stream};
use crate::gpu::{Dataset, GpuIssuer};
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::pipeline::issue::Issue;
use crate::present::progress::{Progress, ProgressMode};
use rayon::prelude::*;
use std::time::Instant;

/// A double-buffering loop: what a learner writes, and the lab's two.
pub type BufferLoop<'s> = &'s dyn Fn(&mut dyn Issue, &BufferTask) -> Result<()>;

pub struct DbRig {
    pub gpu: Gpu,
    kernel: ComputeKernel,
    /// The producer's source: every batch, made in advance (pageable).
    dataset: Vec<u64>,
    seed: u64,
    host: [PinnedBuffer; 2],
    dev: [DeviceBuffer; 2],
    results: DeviceBuffer,
    check: PinnedBuffer,
    copy: Stream,
    compute: Stream,
    pub batches: usize,
    pub batch_elements: usize,
    /// Batches the producer was timed on alone so far.
    produced: usize,
}

impl DbRig {
    pub fn new(gpu: &Gpu, batches: usize, batch_elements: usize) -> Result<DbRig> {
        let batch_bytes = batch_elements * 4;
        let total = batches * batch_bytes;
        gpu.ensure_free((total + 2 * batch_bytes) as u64 + (64 << 20), &format!("{batches} batches of {batch_bytes} bytes"))?;
        let mut dataset = Vec::new();
        dataset.try_reserve_exact(total / 8).map_err(|_| LabError::OutOfMemory { what: "host", call: "malloc", bytes: crate::Bytes(total as u64) })?;
        dataset.resize(total / 8, 0);
        let seed = pattern::fresh_seed();
        pattern::fill_f32(&mut dataset, seed);
        Ok(DbRig {
            gpu: gpu.clone(),
            kernel: ComputeKernel::load(gpu)?,
            dataset,
            seed,
            host: [PinnedBuffer::new(gpu, batch_bytes)?, PinnedBuffer::new(gpu, batch_bytes)?],
            dev: [gpu.alloc(batch_bytes)?, gpu.alloc(batch_bytes)?],
            results: gpu.alloc(total)?,
            check: PinnedBuffer::new(gpu, total)?,
            copy: gpu.stream()?,
            compute: gpu.stream()?,
            batches,
            batch_elements,
            produced: 0,
        })
    }

    /// Poisons the results, runs `schedule`, returns the run.
    pub fn run(&mut self, schedule: BufferLoop<'_>, iterations: i32, timeline: bool) -> Result<Run> {
        self.compute.fill_u32(&self.results, 0xDEAD_BEEF)?;
        let source = if timeline { crate::gpu::TimelineSource::for_host_pipeline() } else { crate::gpu::TimelineSource::Off };
        let mut p = self.gpu.runner(source, self.batches * 3, true)?;
        let (copy, compute) = (p.stream(&self.copy, "copy"), p.stream(&self.compute, "compute"));
        let [h0, h1] = &mut self.host;
        let task = BufferTask {
            batches: self.batches,
            batch_elements: self.batch_elements,
            copy,
            compute,
            host: [p.host(h0, "host buffer 0"), p.host(h1, "host buffer 1")],
            dev: [p.device(&self.dev[0], "device buffer 0"), p.device(&self.dev[1], "device buffer 1")],
            results: p.device(&self.results, "device results"),
        };
        let dataset = Dataset { words: &self.dataset, batch_elements: self.batch_elements };
        let mut issuer = GpuIssuer { runner: &mut p, kernel: &self.kernel, iterations, dataset: Some(dataset) };
        schedule(&mut issuer, &task)?;
        p.finish()
    }

    /// Every result written; samples of every batch bit-exact.
    pub fn verify(&mut self, iterations: i32) -> Result<()> {
        let _v = trace::range("verify");
        let bytes = self.results.bytes();
        self.compute.download(&mut self.check, &self.results, bytes)?;
        let out = pattern::as_f32(self.check.words());
        if let Some(i) = out.par_iter().position_any(|x| !x.is_finite() || x.abs() > 1e6) {
            return Err(LabError::wrong_data("device results", i, format!("(batch {}) was never written: still poison", i / self.batch_elements)));
        }
        let (n, seed) = (self.batch_elements, self.seed);
        let bad = (0..self.batches).into_par_iter().find_map_first(|b| {
            (0..64usize).find_map(|j| {
                let i = b * n + j * (n - 1) / 63;
                let want = compute_reference(pattern::f32_at(seed, i), iterations);
                (out[i].to_bits() != want.to_bits())
                    .then(|| LabError::wrong_data("device results", i, format!("(batch {b}, its element {}) got {}, expected {want}", i - b * n, out[i])))
            })
        });
        bad.map_or(Ok(()), Err)
    }

    /// One sample of each stage of one batch alone: [copy, kernel, produce] (ms).
    pub fn stages_once(&mut self, iterations: i32) -> Result<[f64; 3]> {
        Ok([self.one_batch(false, 0)?, self.one_batch(true, iterations)?, self.produce_once()])
    }

    /// The producer alone on the next batch's data (host clock, ms). Each
    /// call takes another batch, so its source is as cold in the CPU caches
    /// as it is in the pipeline.
    fn produce_once(&mut self) -> f64 {
        let n = self.batch_elements;
        let first = (self.produced % self.batches) * n / 2;
        self.produced += 1;
        let t = Instant::now();
        pattern::copy_streaming(&mut self.host[0].words_mut()[..n / 2], &self.dataset[first..first + n / 2]);
        t.elapsed().as_secs_f64() * 1e3
    }

    fn one_batch(&mut self, kernel: bool, iterations: i32) -> Result<f64> {
        let mut p = self.gpu.runner(crate::gpu::TimelineSource::Off, 1, true)?;
        let s = p.stream(&self.copy, "copy");
        let h = p.host(&mut self.host[0], "host buffer 0");
        let (d, r) = (p.device(&self.dev[0], "device buffer 0"), p.device(&self.results, "device results"));
        if kernel {
            p.compute(s, &self.kernel, d, 0, r, 0, self.batch_elements * 4, iterations, "compute one batch")?;
        } else {
            p.h2d(s, d, 0, h, 0, self.batch_elements * 4, "H2D one batch")?;
        }
        Ok(p.finish()?.total_ms)
    }
}

pub fn run(gpu: &Gpu, cfg: &DoubleBufferConfig, progress: ProgressMode) -> Result<DoubleBufferResults> {
    cfg.validate()?;
    let mut progress = Progress::new(progress, 4, "double-buffer");
    let _lab = trace::range("lab 3: double buffering");
    let mut rig = DbRig::new(gpu, cfg.batches, cfg.batch_elements)?;
    let reps = cfg.repeats.max(5);
    let copy = Summary::of_runs(reps, || rig.one_batch(false, 0))?;
    let produce = Summary::of_runs(reps, || Ok(rig.produce_once()))?;
    let target = (cfg.kernel_over_copy * copy.median).max(cfg.kernel_over_produce * produce.median);
    let iterations = crate::lab_kit::calibrate_iterations(target, |it| Ok(Summary::of_runs(3, || rig.one_batch(true, it))?.median))?;
    let kernel = Summary::of_runs(reps, || rig.one_batch(true, iterations))?;
    progress.step(&format!("one batch: copy {:.3} ms, kernel {:.3} ms ({iterations} FMAs), produce {:.3} ms", copy.median, kernel.median, produce.median));
    let mut totals = [Vec::new(), Vec::new()];
    let schedules: [BufferLoop<'_>; 2] = [&no_overlap, &pipelined];
    for rep in 0..cfg.warmup + cfg.repeats {
        for (k, schedule) in schedules.iter().enumerate() {
            let run = rig.run(*schedule, iterations, false)?;
            if !run.races.is_empty() {
                return Err(LabError::schedule(format!("the lab's own schedule races: {}", run.races[0].what)));
            }
            rig.verify(iterations)?;
            if rep >= cfg.warmup {
                totals[k].push(run.total_ms);
            }
        }
    }
    progress.step("timed runs");
    // The timeline's own cost on the pipelined schedule.
    let pairs = crate::pipeline::timeline::overhead_pct(cfg.warmup, 2 * cfg.repeats + 1, |on| {
        let run = rig.run(&pipelined, iterations, on)?;
        rig.verify(iterations)?;
        Ok(run.total_ms)
    })?;
    let mut timelines = Vec::new();
    for schedule in schedules {
        let run = rig.run(schedule, iterations, true)?;
        rig.verify(iterations)?;
        timelines.push(run.timeline.expect("timeline requested"));
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
