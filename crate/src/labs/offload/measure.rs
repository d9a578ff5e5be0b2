//! Lab 9's runs: the network's shape chosen for this host, the host's
//! wake-up and issue costs (for the checker's queue model), and per batch
//! size the costs alone (untraced passes of uploads only and of layers
//! only, each divided by its layers), each variant's passes
//! (untraced, behind the start gate, every one verified against the CPU on
//! sampled rows) beside the queue model's prediction, one traced pass for
//! the timeline, and PyTorch's two references.

use super::cpu::{forward_rows, relative_error, sampled_rows};
use super::forward::{Costs, Forward, Pass, Weights};
use super::rig::OffloadRig;
use super::{BatchPoint, OffloadConfig, OffloadResults, Shape, Variant, VariantPoint};
use crate::error::{LabError, Result};
use crate::gpu::{trace, Gpu, PlanRig, Run, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::present::progress::{Progress, ProgressMode};
use crate::units::Bytes;

/// The largest relative error a sampled row may have against the CPU's:
/// FP16 rounding after each GEMM, summed in another order, drifts by far
/// less over the network's layers; a wrong or stale layer is off by ~1.
pub const TOLERANCE: f64 = 3e-2;

/// Host memory a run may take for the weights' two copies (pinned and
/// pageable), as a share of what the host has available.
pub const HOST_SHARE: f64 = 0.4;

/// The host's available memory, bytes (`MemAvailable`), if it says.
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The network as this host can hold it: the layers asked for, or fewer
/// where two copies of the weights would not fit [`HOST_SHARE`] of the
/// available memory; and a line saying which and why.
pub fn choose_shape(cfg: &OffloadConfig, available: Option<u64>) -> Result<(Shape, String)> {
    let asked = Shape { layers: cfg.layers, d: cfg.d_model };
    let Some(avail) = available else {
        return Ok((asked, format!("{} layers as asked (the host's available memory is unknown)", cfg.layers)));
    };
    let fits = ((HOST_SHARE * avail as f64) / (2 * asked.layer_bytes()) as f64) as usize;
    if fits >= cfg.layers {
        return Ok((
            asked,
            format!(
                "{} layers as asked: two copies of the weights take {} of the host's {} available",
                cfg.layers,
                Bytes(2 * asked.network_bytes() as u64),
                Bytes(avail)
            ),
        ));
    }
    if fits < 2 {
        return Err(LabError::config(format!(
            "the host has {} available: too little for two copies of even 2 layers of d = {} ({} each)",
            Bytes(avail),
            cfg.d_model,
            Bytes(asked.layer_bytes() as u64)
        )));
    }
    let shape = Shape { layers: fits, ..asked };
    Ok((
        shape,
        format!(
            "{fits} layers instead of {}: two copies of the weights must fit {:.0}% of the host's {} available",
            cfg.layers,
            100.0 * HOST_SHARE,
            Bytes(avail)
        ),
    ))
}

/// Checks a pass's output on the sampled rows; returns the worst error.
fn verify(rig: &mut OffloadRig, batch: usize, rows: &[usize], want: &[Vec<u16>], what: &str) -> Result<f64> {
    let out = rig.output_rows(batch, rows)?;
    let d = rig.shape.d;
    let mut worst = 0f64;
    for ((&r, w), got) in rows.iter().zip(want).zip(&out) {
        let e = relative_error(got, w);
        // A NaN (a row no layer wrote) fails too.
        if e.is_nan() || e > TOLERANCE {
            return Err(LabError::Verification {
                buffer: "the last layer's activations".into(),
                element: r * d,
                detail: format!("{what}, {batch} tokens: row {r} is {e:.2e} off the CPU reference (tolerance {TOLERANCE:.0e})"),
            });
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// The run's race check: a pass whose ops race is never timed.
fn no_races(run: &Run, what: &str) -> Result<()> {
    match run.races.first() {
        Some(r) => Err(LabError::config(format!("{what}: {} ({} races)", r.what, run.races.len()))),
        None => Ok(()),
    }
}

/// One pass of `v` over `batch` tokens on the GPU (prepared first,
/// untimed), timed by `source`: its run.
fn pass(rig: &mut OffloadRig, v: Variant, batch: usize, source: TimelineSource) -> Result<Run> {
    let slots = v.slots(rig.ring.len());
    let (run, _) = pass_with(rig, batch, (slots, v.streams(), v.hidden()), &|f, t| v.pass(f, t), source)?;
    no_races(&run, v.label())?;
    Ok(run)
}

/// One pass of `body` over `batch` tokens with (slots, streams, hidden) on
/// the GPU, prepared first (untimed), behind the start gate: its run and
/// the pass's books.
pub(super) fn pass_with(
    rig: &mut OffloadRig,
    batch: usize,
    (slots, streams, hidden): (usize, super::forward::Streams, super::rig::Hidden),
    body: &dyn Fn(&mut dyn Forward, &super::forward::Task) -> Result<()>,
    source: TimelineSource,
) -> Result<(Run, super::forward::Books)> {
    rig.prepare(batch)?;
    let ops = 4 * rig.shape.layers + 16;
    let p = rig.gpu.runner(source, ops, true)?.deferring()?;
    let mut f = Pass::live(p, rig, batch, slots, streams, hidden)?;
    let task = f.task;
    body(&mut f, &task)?;
    f.finish()
}

/// What one batch size's measurements share: the rig, the reference rows,
/// the verified count and the worst error.
pub(super) struct Sweep<'a> {
    pub rig: &'a mut OffloadRig,
    pub cfg: &'a OffloadConfig,
    pub rows: Vec<usize>,
    pub want: Vec<Vec<u16>>,
    pub verified: usize,
    pub worst: f64,
}

impl<'a> Sweep<'a> {
    /// A batch size's measurements on `rig`: a fresh input, the CPU's
    /// reference for its sampled rows, cuBLAS warmed at its shapes.
    pub fn new(rig: &'a mut OffloadRig, cfg: &'a OffloadConfig, batch: usize) -> Result<Sweep<'a>> {
        let rows = sampled_rows(batch);
        let picked = rig.fresh_input(batch, &rows);
        let want = forward_rows(rig.weights(), rig.shape, &picked);
        rig.warm(batch)?;
        Ok(Sweep { rig, cfg, rows, want, verified: 0, worst: 0.0 })
    }

    pub fn check(&mut self, batch: usize, what: &str) -> Result<()> {
        self.worst = self.worst.max(verify(self.rig, batch, &self.rows, &self.want, what)?);
        self.verified += 1;
        Ok(())
    }

    /// The costs alone, each stage back to back as it runs when it bounds
    /// the pass: untraced passes of uploads only (every layer into slot
    /// i % K on the copy stream), one upload's time their total over the
    /// layers, and of layers only (each layer from slot i % K after the
    /// first K uploads), one layer's time their total less those uploads
    /// over the layers: (upload from pinned memory, layer), summarized over
    /// passes. No event between ops: a timed event drains the GPU between
    /// kernels, which a pass of layers does not. These passes compute with
    /// the wrong weights on purpose and are not verified.
    pub fn costs(&mut self, batch: usize) -> Result<(Summary, Summary)> {
        let (mut up, mut layer) = (Vec::new(), Vec::new());
        let layers = |f: &mut dyn Forward, t: &super::forward::Task| -> Result<()> {
            for i in 0..t.slots {
                f.upload(t.compute, Weights::Pinned, i, i)?;
            }
            for i in 0..t.layers {
                f.layer(t.compute, i, i % t.slots)?;
            }
            Ok(())
        };
        let (l, k) = (self.rig.shape.layers as f64, self.rig.ring.len() as f64);
        for rep in 0..self.cfg.warmup + self.cfg.repeats {
            let uploaded = self.uploads_alone(batch, Weights::Pinned)?;
            let run = pass_with(self.rig, batch, self.cost_shape(), &layers, TimelineSource::Off)?.0;
            if rep >= self.cfg.warmup {
                up.push(uploaded);
                layer.push((run.total_ms - k * uploaded) / l);
            }
        }
        Ok((Summary::of(&up)?, Summary::of(&layer)?))
    }

    /// The slots, streams and hidden buffer of the cost passes.
    fn cost_shape(&self) -> (usize, super::forward::Streams, super::rig::Hidden) {
        (self.rig.ring.len(), super::forward::Streams { copy_high: false }, super::rig::Hidden::Fixed)
    }

    /// One untraced pass of uploads only from `from`: one upload's time, ms.
    fn uploads_alone(&mut self, batch: usize, from: Weights) -> Result<f64> {
        let uploads = move |f: &mut dyn Forward, t: &super::forward::Task| -> Result<()> {
            for i in 0..t.layers {
                f.upload(t.copy, from, i, i % t.slots)?;
            }
            Ok(())
        };
        let run = pass_with(self.rig, batch, self.cost_shape(), &uploads, TimelineSource::Off)?.0;
        Ok(run.total_ms / self.rig.shape.layers as f64)
    }

    /// `v`'s passes, untraced: one pass's time, ms, over the repeats. A
    /// pageable pass comes after a traced pass of pageable uploads alone
    /// each time, pushed to `pageable_alone`: the rate of copies from
    /// pageable memory drifts from minute to minute (the CPU stages them),
    /// so the queue model takes it from the same moments.
    fn variant(&mut self, v: Variant, batch: usize, pageable_alone: &mut Vec<f64>) -> Result<Summary> {
        let mut ms = Vec::new();
        if v == Variant::Graph {
            // Captured once; each launch is one cuGraphLaunch.
            let p = self.rig.gpu.capture_runner()?;
            let slots = v.slots(self.rig.ring.len());
            let mut f = Pass::live(p, self.rig, batch, slots, v.streams(), v.hidden())?;
            let task = f.task;
            v.pass(&mut f, &task)?;
            let (graph, run, _) = f.finish_capture()?;
            no_races(&run, v.label())?;
            let (start, end) = (self.rig.gpu.timing_event()?, self.rig.gpu.timing_event()?);
            for rep in 0..self.cfg.warmup + self.cfg.repeats {
                self.rig.prepare(batch)?;
                let s = &self.rig.compute;
                start.record(s)?;
                // SAFETY: the graph touches only the rig's buffers, which
                // outlive it; nothing else uses them before the synchronize.
                let launched = unsafe { graph.launch(s) };
                let ended = end.record(s);
                s.synchronize()?;
                launched?;
                ended?;
                self.check(batch, v.label())?;
                if rep >= self.cfg.warmup {
                    ms.push(start.elapsed_ms(&end)?);
                }
            }
            return Summary::of(&ms);
        }
        // The pool keeps what it reserved between passes (as lab 6
        // shows, a threshold of 0 gives it all back at every synchronize).
        let pool = if v == Variant::Pool { Some(crate::gpu::MemPool::default_of(&self.rig.gpu)?) } else { None };
        let _keep = pool.as_ref().map(|p| p.threshold_for_now(u64::MAX)).transpose()?;
        // Copies from pageable memory vary most from pass to pass: twice the passes.
        let repeats = if v == Variant::Pageable { 2 * self.cfg.repeats } else { self.cfg.repeats };
        for rep in 0..self.cfg.warmup + repeats {
            if v == Variant::Pageable {
                let alone = self.uploads_alone(batch, Weights::Pageable)?;
                if rep >= self.cfg.warmup {
                    pageable_alone.push(alone);
                }
            }
            let run = pass(self.rig, v, batch, TimelineSource::Off)?;
            self.check(batch, v.label())?;
            if rep >= self.cfg.warmup {
                ms.push(run.total_ms);
            }
        }
        Summary::of(&ms)
    }
}

/// Elements (f32) of each buffer of the rig the host's costs are measured
/// on: 16 MiB, as lab 5's issue-cost sweep moves.
const MACHINE_ELEMENTS: usize = 1 << 22;

/// The host as the queue model knows it (a CPU thread's wake-up after the
/// GPU work it waited for, the time to issue one op), measured as lab 5
/// measures it, on a rig of its own that is given back before the
/// network's.
fn host_costs(gpu: &Gpu, repeats: usize) -> Result<crate::gpu::MachineFacts> {
    let mut rig = PlanRig::new(gpu, MACHINE_ELEMENTS, 2, 1)?;
    rig.machine(MACHINE_ELEMENTS, repeats.max(3))
}

/// The queue model's time for `v` over `batch` tokens, ms (the pass
/// recorded on the dry run).
pub fn predicted_ms(shape: Shape, batch: usize, ring: usize, v: Variant, costs: Costs, machine: Machine) -> Result<f64> {
    let mut f = Pass::dry_run(shape, batch, v.slots(ring), v.streams(), v.hidden());
    let task = f.task;
    v.pass(&mut f as &mut dyn Forward, &task)?;
    Ok(f.predicted_ms(costs, machine))
}

/// Runs lab 9 (see the module docs).
pub fn run(gpu: &Gpu, cfg: &OffloadConfig, progress: ProgressMode) -> Result<OffloadResults> {
    cfg.validate()?;
    let (shape, chose) = choose_shape(cfg, host_available())?;
    eprintln!("lab 9: {chose}");
    let largest = *cfg.batches.iter().max().expect("validated");
    let mut bar = Progress::new(progress, (cfg.batches.len() * (Variant::ALL.len() + 2) + 2) as u64, "offload");
    let facts = host_costs(gpu, cfg.repeats)?;
    bar.step(&format!("the host: a CPU thread resumes {:.1} µs after the GPU, issues an op in {:.1} µs", facts.wake_ms * 1e3, facts.issue_ms * 1e3));
    let mut rig = OffloadRig::new(gpu, shape, largest, cfg.ring)?;
    let copy_engines = gpu.copy_engines()?;
    let machine = facts.machine();
    let cublas = rig.blas.version();
    let mut points = Vec::new();
    let (mut verified, mut worst) = (0, 0f64);
    for &batch in &cfg.batches {
        let _r = trace::range(&format!("lab 9: {batch} tokens"));
        bar.step_note(&format!("{batch} tokens: the CPU reference"));
        let mut sweep = Sweep::new(&mut rig, cfg, batch)?;
        if points.is_empty() {
            // The driver's staging of pageable copies and the host pages
            // they read warm up over the first passes: one, untimed.
            sweep.uploads_alone(batch, Weights::Pageable)?;
        }
        let (h2d_ms, layer_ms) = sweep.costs(batch)?;
        bar.step(&format!("{batch} tokens: costs alone"));
        let mut pageable_alone = Vec::new();
        let mut measured = Vec::new();
        for v in Variant::ALL {
            measured.push((v, sweep.variant(v, batch, &mut pageable_alone)?));
            bar.step(&format!("{batch} tokens: {}", v.label()));
        }
        let h2d_pageable_ms = Summary::of(&pageable_alone)?;
        let costs = Costs { h2d: h2d_ms.median, h2d_pageable: h2d_pageable_ms.median, layer: layer_ms.median };
        let mut variants = Vec::new();
        for (v, ms) in measured {
            variants.push(VariantPoint { variant: v, ms, predicted_ms: predicted_ms(shape, batch, cfg.ring, v, costs, machine)? });
        }
        verified += sweep.verified;
        worst = worst.max(sweep.worst);
        points.push(BatchPoint { batch, h2d_ms, h2d_pageable_ms, layer_ms, variants, torch_to_ms: None, torch_ring_ms: None });
    }
    // The timeline: the ring of K at the batch nearest the crossover
    // (where the GEMMs and the uploads take most nearly as long).
    let near = points
        .iter()
        .min_by(|a, b| (a.layer_ms.median / a.h2d_ms.median).ln().abs().total_cmp(&(b.layer_ms.median / b.h2d_ms.median).ln().abs()))
        .expect("at least one batch");
    let (timeline_batch, timeline_untraced_ms) = (near.batch, near.variant(Variant::RingK).map_or(0.0, |v| v.ms.median));
    // Events, not CUPTI: a layer is three GPU activities (two GEMMs and
    // the ReLU), and events around the op time it whole. (cuBLAS was
    // warmed at this batch's shapes by its sweep.)
    let run = pass(&mut rig, Variant::RingK, timeline_batch, TimelineSource::Events)?;
    let timeline = run.timeline.clone().ok_or_else(|| LabError::config("the traced pass drew no timeline"))?;
    bar.step("the timeline");
    let gpu_bytes = shape.gpu_bytes(largest, cfg.ring) as u64;
    let ordinal = gpu.ordinal();
    drop(rig);
    // PyTorch in the same run, after the rig's host memory is given back.
    let torch = if cfg.python.is_empty() {
        Err("not asked for (--python is empty)".to_string())
    } else {
        bar.step_note("PyTorch's references");
        super::reference::torch_offload(&cfg.python, ordinal, shape, cfg)
    };
    let torch = torch.map(|t| {
        for p in &mut points {
            if let Some(b) = t.batches.iter().find(|b| b.batch == p.batch) {
                p.torch_to_ms = Some(b.to_hooks);
                p.torch_ring_ms = Some(b.ring);
            }
        }
        t.torch
    });
    bar.finish();
    Ok(OffloadResults {
        config: cfg.clone(),
        shape,
        chose,
        gpu_bytes,
        cublas,
        copy_engines,
        machine: Some(facts),
        points,
        timeline,
        timeline_batch,
        timeline_untraced_ms,
        max_error: worst,
        verified_passes: verified,
        torch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_shrinks_to_the_host_and_says_so() {
        let cfg = OffloadConfig::default();
        let (s, why) = choose_shape(&cfg, Some(128 << 30)).unwrap();
        assert_eq!(s.layers, cfg.layers, "{why}");
        assert!(why.contains("as asked"), "{why}");
        let (s, why) = choose_shape(&cfg, Some(8 << 30)).unwrap();
        assert!(s.layers < cfg.layers && s.layers >= 2, "{s:?}");
        assert!(why.contains("instead of 96"), "{why}");
        let e = choose_shape(&cfg, Some(64 << 20)).unwrap_err().to_string();
        assert!(e.contains("too little"), "{e}");
    }

    #[test]
    fn the_queue_model_predicts_each_variant_from_its_pass() {
        let shape = Shape { layers: 10, d: 64 };
        let c = Costs { h2d: 1.0, h2d_pageable: 3.0, layer: 0.5 };
        let m = Machine::engines(2);
        let p = |v| predicted_ms(shape, 64, 3, v, c, m).unwrap();
        assert!((p(Variant::Pageable) - 35.0).abs() < 1e-9, "{}", p(Variant::Pageable));
        assert!((p(Variant::Pinned) - 15.0).abs() < 1e-9);
        // The ring hides the layers under the uploads: the bound, 10 x 1 + 0.5.
        for v in [Variant::Ring2, Variant::RingK, Variant::Graph, Variant::Pool] {
            assert!((p(v) - 10.5).abs() < 1e-9, "{v:?}: {}", p(v));
        }
        // Compute-bound: 10 x 2 + 1.
        let c = Costs { layer: 2.0, ..c };
        assert!((predicted_ms(shape, 64, 3, Variant::RingK, c, m).unwrap() - 21.0).abs() < 1e-9);
    }
}
