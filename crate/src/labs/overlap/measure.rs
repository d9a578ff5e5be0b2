//! Runs lab 2 on a GPU: calibrate the kernel to each intensity, measure the
//! parts alone, then sweep chunks x streams x issue order, verifying every
//! run's output.

use super::{ChunkTask, Intensity, IntensityResults, IssueOrder, OverlapConfig, OverlapPoint, OverlapResults, Parts};
use crate::error::{LabError, Result};
use crate::gpu::kernels::compute_reference;
use crate::gpu::trace;
use crate::gpu::{ComputeKernel, DeviceBuffer, Gpu, HostBuffer, PinnedBuffer, Run, Stream};
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::pipeline::op::OpKind;
use crate::pipeline::timeline::Timeline;
use crate::present::progress::{Progress, ProgressMode};
use rayon::prelude::*;
use std::time::Instant;

/// Buffers, streams and the kernel, shared by every run.
pub struct Rig {
    pub gpu: Gpu,
    pub kernel: ComputeKernel,
    pub host_in: PinnedBuffer,
    pub host_out: PinnedBuffer,
    pub dev_in: DeviceBuffer,
    pub dev_out: DeviceBuffer,
    pub streams: Vec<Stream>,
    pub elements: usize,
    /// What times timelines (CUPTI when available).
    pub timeline_source: crate::gpu::TimelineSource,
    /// Whether runs start behind the gate (device time only); on by default.
    pub gated: bool,
}

impl Rig {
    pub fn new(gpu: &Gpu, elements: usize, streams: usize) -> Result<Rig> {
        let bytes = elements * 4;
        gpu.ensure_free(2 * bytes as u64 + (64 << 20), &format!("{elements} elements in and out"))?;
        let (dev_in, dev_out) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?);
        let streams: Vec<Stream> = (0..streams.max(super::STAGE_STREAMS)).map(|_| gpu.stream()).collect::<Result<_>>()?;
        // Poisoned, not left uninitialized: the D2H timed alone copies
        // `dev_out` before any kernel wrote it (compute-sanitizer's
        // initcheck reports every such read).
        streams[0].fill_u32(&dev_in, 0xDEAD_BEEF)?;
        streams[0].fill_u32(&dev_out, 0xDEAD_BEEF)?;
        Ok(Rig {
            gpu: gpu.clone(),
            kernel: ComputeKernel::load(gpu)?,
            host_in: PinnedBuffer::new(gpu, bytes)?,
            host_out: PinnedBuffer::new(gpu, bytes)?,
            dev_in,
            dev_out,
            streams,
            elements,
            timeline_source: crate::gpu::TimelineSource::best(),
            gated: true,
        })
    }

    /// Fresh random input, poisoned output; returns the input's seed.
    pub fn prepare(&mut self) -> u64 {
        let seed = pattern::fresh_seed();
        pattern::fill_f32(self.host_in.words_mut(), seed);
        pattern::poison(self.host_out.words_mut());
        seed
    }

    /// Issues the chunked pipeline; `sync` adds a host synchronize after
    /// every operation (the synchronous baseline).
    pub fn run(&mut self, chunks: usize, streams: usize, order: IssueOrder, iterations: i32, timeline: bool, sync: bool) -> Result<Run> {
        self.run_stages(chunks, streams, order, &OpKind::STAGES, iterations, timeline, sync)
    }

    /// Like `run` (all stages, no syncs) with the timeline from `source`.
    pub fn run_with_source(&mut self, chunks: usize, streams: usize, order: IssueOrder, iterations: i32, source: crate::gpu::TimelineSource) -> Result<Run> {
        let before = std::mem::replace(&mut self.timeline_source, source);
        let r = self.run(chunks, streams, order, iterations, true, false);
        self.timeline_source = before;
        r
    }

    /// Issues only `stages` of the chunked pipeline (to time a stage alone
    /// with a point's own chunking).
    pub fn run_stages(
        &mut self,
        chunks: usize,
        streams: usize,
        order: IssueOrder,
        stages: &[OpKind],
        iterations: i32,
        timeline: bool,
        sync: bool,
    ) -> Result<Run> {
        let source = if timeline { self.timeline_source } else { crate::gpu::TimelineSource::Off };
        let names: Vec<String> = match order {
            IssueOrder::StageStreams => ["uploads", "kernels", "downloads"].map(String::from).to_vec(),
            _ => (0..streams).map(|i| format!("s{i}")).collect(),
        };
        self.run_loop(chunks, &names, source, iterations, &|p, t| {
            if sync {
                order.issue(&mut crate::pipeline::issue::SyncEach(p), t, stages)
            } else {
                order.issue(p, t, stages)
            }
        })
    }

    /// Runs an issue loop on this rig's buffers and its first `streams.len()`
    /// streams (named `streams`): the lab's own orders and a learner's loop alike.
    pub fn run_loop(
        &mut self,
        chunks: usize,
        streams: &[String],
        source: crate::gpu::TimelineSource,
        iterations: i32,
        issue: &dyn Fn(&mut dyn crate::pipeline::issue::Issue, &ChunkTask) -> Result<()>,
    ) -> Result<Run> {
        if streams.len() > self.streams.len() {
            return Err(LabError::config(format!("{} streams asked for; this rig has {}", streams.len(), self.streams.len())));
        }
        let mut p = self.gpu.runner(source, chunks * 3, self.gated)?;
        let ss: Vec<_> = self.streams.iter().zip(streams).map(|(s, name)| p.stream(s, name)).collect();
        let task = ChunkTask {
            elements: self.elements,
            chunks,
            streams: ss,
            host_in: p.host(&mut self.host_in, "host in"),
            host_out: p.host(&mut self.host_out, "host out"),
            dev_in: p.device(&self.dev_in, "device in"),
            dev_out: p.device(&self.dev_out, "device out"),
        };
        let mut issuer = crate::gpu::GpuIssuer { runner: &mut p, kernel: &self.kernel, iterations, dataset: None };
        issue(&mut issuer, &task)?;
        p.finish()
    }

    /// Every output element written (no poison left), and `per_chunk`
    /// samples of each chunk bit-exact against the CPU reference.
    pub fn verify(&self, seed: u64, chunks: usize, iterations: i32, per_chunk: usize) -> Result<()> {
        let _v = trace::range("verify");
        let out = pattern::as_f32(self.host_out.words());
        if let Some(i) = out.par_iter().position_any(|x| !x.is_finite() || x.abs() > 1e6) {
            return Err(LabError::wrong_data("host out", i, format!("is {} (never written: still poison)", out[i])));
        }
        let ranges = OverlapConfig::chunk_ranges(self.elements, chunks);
        // The reference costs `iterations` dependent FMAs per sample: spread over cores.
        let bad = ranges.par_iter().enumerate().find_map_first(|(c, &(a, b))| {
            let n = b - a;
            let k = per_chunk.min(n).max(1);
            (0..k).find_map(|j| {
                // Spread samples over the chunk, first and last element included.
                let i = a + if k == 1 { 0 } else { j * (n - 1) / (k - 1) };
                let want = compute_reference(pattern::f32_at(seed, i), iterations);
                (out[i].to_bits() != want.to_bits()).then(|| LabError::wrong_data("host out", i, format!("(chunk {c}) got {}, expected {want}", out[i])))
            })
        });
        bad.map_or(Ok(()), Err)
    }
}

impl Rig {
    /// One stage over the whole data on one stream, alone (ms).
    pub fn timed_alone(&mut self, kind: OpKind, iterations: i32) -> Result<f64> {
        Ok(self.run_stages(1, 1, IssueOrder::DepthFirst, &[kind], iterations, false, false)?.total_ms)
    }

    /// FMAs per element so the kernel takes `ratio` x the H2D time.
    pub fn calibrate(&mut self, h2d_ms: f64, ratio: f64) -> Result<i32> {
        crate::lab_kit::calibrate_iterations(ratio * h2d_ms, |it| Ok(Summary::of_runs(3, || self.timed_alone(OpKind::Kernel, it))?.median))
    }

    /// One sample of a point's parts (ms): each stage alone with its
    /// chunks, streams and order, and both copies at once in its chunks.
    pub fn parts_once(&mut self, chunks: usize, streams: usize, order: IssueOrder, iterations: i32) -> Result<[f64; 4]> {
        // Breadth-first issues a stage alone exactly as depth-first does.
        let order = if order == IssueOrder::BreadthFirst { IssueOrder::DepthFirst } else { order };
        let mut alone = |stage: OpKind| Ok::<f64, LabError>(self.run_stages(chunks, streams, order, &[stage], iterations, false, false)?.total_ms);
        let (h, k, d) = (alone(OpKind::H2d)?, alone(OpKind::Kernel)?, alone(OpKind::D2h)?);
        Ok([h, k, d, self.both_copies(chunks)?])
    }

    /// Runs the point `warmup + repeats` times, each run verified, and after
    /// every timed run one sample of its parts: the pipeline and the bound
    /// come from the same moments, so a slow spell of the link (seen on the
    /// H100: D2H alone at half speed for a second) slows both or neither.
    pub fn measure_point(
        &mut self,
        chunks: usize,
        streams: usize,
        order: IssueOrder,
        iterations: i32,
        warmup: usize,
        repeats: usize,
        samples_per_chunk: usize,
    ) -> Result<(Summary, Parts)> {
        let (mut totals, mut parts) = (Vec::new(), Vec::new());
        for rep in 0..warmup + repeats {
            let seed = self.prepare();
            let run = self.run(chunks, streams, order, iterations, false, false)?;
            if !run.races.is_empty() {
                return Err(LabError::schedule(format!("the lab's own schedule races: {}", run.races[0].what)));
            }
            self.verify(seed, chunks, iterations, samples_per_chunk)?;
            if rep >= warmup {
                totals.push(run.total_ms);
                parts.push(self.parts_once(chunks, streams, order, iterations)?);
            }
        }
        Ok((Summary::of(&totals)?, Parts::of_samples(&parts)?))
    }

    /// All data up and all data down at the same time, in `chunks` copies
    /// each way: uploads on one stream, downloads on another, no kernel (ms).
    /// With one stream there is nothing to overlap: H then D.
    pub fn both_copies(&mut self, chunks: usize) -> Result<f64> {
        let ranges = OverlapConfig::chunk_ranges(self.elements, chunks);
        let mut p = self.gpu.runner(crate::gpu::TimelineSource::Off, 2 * chunks, self.gated)?;
        let (up, down) = (p.stream(&self.streams[0], "up"), p.stream(&self.streams[self.streams.len().min(2) - 1], "down"));
        let (hi, ho) = (p.host(&mut self.host_in, "host in"), p.host(&mut self.host_out, "host out"));
        let (di, dout) = (p.device(&self.dev_in, "device in"), p.device(&self.dev_out, "device out"));
        for (c, &(a, b)) in ranges.iter().enumerate() {
            p.h2d(up, di, a * 4, hi, a * 4, (b - a) * 4, &format!("H2D chunk {c}"))?;
            p.d2h(down, ho, a * 4, dout, a * 4, (b - a) * 4, &format!("D2H chunk {c}"))?;
        }
        Ok(p.finish()?.total_ms)
    }

    /// Runs a learner's issue loop on this rig's first `streams` streams.
    pub fn run_custom(
        &mut self,
        streams: usize,
        chunks: usize,
        iterations: i32,
        issue: &dyn Fn(&mut dyn crate::pipeline::issue::Issue, &ChunkTask) -> Result<()>,
    ) -> Result<Run> {
        let names: Vec<String> = (0..streams.min(self.streams.len())).map(|i| format!("s{i}")).collect();
        self.run_loop(chunks, &names, crate::gpu::TimelineSource::Off, iterations, issue)
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
    let mut rig = Rig::new(gpu, cfg.elements, cfg.max_streams().max(2))?;
    let copy_engines = gpu.copy_engines()?;
    let points = cfg.points();
    let steps = (cfg.intensities.len() * (points.len() + 2)) as u64 + 1;
    let mut progress = Progress::new(progress, steps, "overlap");
    let _lab = trace::range("lab 2: chunked overlap");
    rig.prepare();
    let reps = cfg.repeats.max(3);
    let h2d = Summary::of_runs(reps, || rig.timed_alone(OpKind::H2d, 0))?;
    let d2h = Summary::of_runs(reps, || rig.timed_alone(OpKind::D2h, 0))?;
    let both = Summary::of_runs(reps, || rig.both_copies(1))?;
    progress.step(&format!("copies alone: H2D {:.2} ms, D2H {:.2} ms, both at once {:.2} ms", h2d.median, d2h.median, both.median));
    let mut out = Vec::new();
    let mut overhead = None;
    for &intensity in &cfg.intensities {
        let _r = trace::range(&format!("intensity {}", intensity.label()));
        let iterations = rig.calibrate(h2d.median, intensity.kernel_over_copy())?;
        let kernel = Summary::of_runs(reps, || rig.timed_alone(OpKind::Kernel, iterations))?;
        let parts = Parts { h2d_ms: h2d, kernel_ms: kernel, d2h_ms: d2h, both_copies_ms: both };
        // Synchronous baseline, timed on the host clock as a user would.
        let mut sync = Vec::new();
        for rep in 0..cfg.warmup + cfg.repeats {
            let seed = rig.prepare();
            let t = Instant::now();
            rig.run(1, 1, IssueOrder::DepthFirst, iterations, false, true)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            rig.verify(seed, 1, iterations, cfg.samples_per_chunk)?;
            if rep >= cfg.warmup {
                sync.push(ms);
            }
        }
        progress.step(&format!("{}: {iterations} FMAs/element, kernel {:.2} ms", intensity.label(), kernel.median));
        let mut points_done = Vec::new();
        for &(chunks, streams, order) in &points {
            let (total_ms, parts) = rig.measure_point(chunks, streams, order, iterations, cfg.warmup, cfg.repeats, cfg.samples_per_chunk)?;
            let p = OverlapPoint { chunks, streams, order, parts, total_ms, verified_runs: cfg.warmup + cfg.repeats };
            progress.step(&format!("{} {chunks} chunks / {streams} streams {}: {:.2} ms", intensity.label(), order.label(), p.total_ms.median));
            points_done.push(p);
        }
        let r = IntensityResults {
            intensity,
            iterations,
            parts,
            synchronous_ms: Summary::of(&sync)?,
            points: points_done,
            serial_timeline: Timeline::default(),
            best_timeline: Timeline::default(),
            best_predicted: Timeline::default(),
        };
        out.push(r);
    }
    // Timelines only after every timed run: a tracing session must not
    // precede a measurement it could disturb.
    for r in out.iter_mut() {
        let (intensity, iterations) = (r.intensity, r.iterations);
        // Timelines of the serial baseline and of the best point.
        let best = r.best().cloned().expect("grid is not empty");
        for (chunks, streams, order, serial) in [(1, 1, IssueOrder::DepthFirst, true), (best.chunks, best.streams, best.order, false)] {
            let seed = rig.prepare();
            let run = rig.run(chunks, streams, order, iterations, true, false)?;
            rig.verify(seed, chunks, iterations, cfg.samples_per_chunk)?;
            let mut measured = run.timeline.clone().expect("timeline requested");
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
                rig.prepare();
                Ok(rig.run(best.chunks, best.streams, best.order, iterations, on, false)?.total_ms)
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
        timeline_source: out.iter().map(|r| r.best_timeline.source.clone()).next().unwrap_or_else(|| rig.timeline_source.label().into()),
        intensities: out,
    })
}
