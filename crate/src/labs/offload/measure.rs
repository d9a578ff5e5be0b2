//! Lab 9's runs: the network's shape chosen for this host, the host's
//! wake-up and issue costs (for the checker's queue model), and per batch
//! size the CPU's reference (once a batch, kept for every pass at it),
//! the costs alone (untraced passes of uploads only and of layers only,
//! each divided by its layers, for each kind of layer), the planner's
//! placements, each variant's passes (untraced, behind the start gate,
//! every one verified against the CPU on sampled rows) beside the queue
//! model's prediction; then traced passes for the timelines, the
//! placement sweep over budgets, and PyTorch's references.
//!
//! May use every file of the lab below it (`network`, `forward`,
//! `variant`, `config`, `placement`, `reference`, `results`, `cpu`,
//! `accuracy`,
//! `rig`, `live`), `error`, `gpu`, `measure`, `pipeline`, `present` and
//! `units`.

use super::config::OffloadConfig;
use super::cpu::{forward_rows, sampled_rows, LayerAmax};
use super::forward::{predict, Books, Forward, Pass, PassSetup, Streams, Task, Weights};
use super::network::{budget_bytes, LayerKind, Placement, Precision, Shape};
use super::placement::{self, PlacementPlan};
use super::reference::Planned;
use super::results::{BatchPoint, Fp8Accuracy, Int4Accuracy, OffloadResults, PlacementPoint, PlacementSweep, VariantPoint, VariantTimeline};
use super::rig::{Copies, OffloadRig};
use super::variant::Variant;
use crate::error::{LabError, Result};
use crate::gpu::{trace, Gpu, PlanRig, Run, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::present::progress::{Progress, ProgressMode};
use crate::units::Bytes;
pub use super::accuracy::{fp8_tolerance, int4_tolerance, TOLERANCE};
use super::accuracy::{verify, worst_off, Int4Checked};

/// Host memory a run may take for the weights' copies (pinned and
/// pageable FP16, FP8 and 4 bits: 2.8 times the FP16 network), as a share
/// of what the host has available.
pub const HOST_SHARE: f64 = 0.4;

/// The weights' host copies, in FP16 networks: 1 + 1 + 1/2 + 4.125/16.
const HOST_COPIES: f64 = 2.8;

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
    let fits = ((HOST_SHARE * avail as f64) / (HOST_COPIES * asked.layer_bytes() as f64)) as usize;
    if fits >= cfg.layers {
        return Ok((
            asked,
            format!(
                "{} layers as asked: the weights' copies (pinned and pageable FP16, FP8, 4-bit) take {} of the host's {} available",
                cfg.layers,
                Bytes((HOST_COPIES * asked.network_bytes() as f64) as u64),
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
            "{fits} layers instead of {}: the weights' copies (pinned and pageable FP16, FP8, 4-bit) must fit {:.0}% of the host's {} available",
            cfg.layers,
            100.0 * HOST_SHARE,
            Bytes(avail)
        ),
    ))
}

/// The run's race check: a pass whose ops race is never timed.
fn no_races(run: &Run, what: &str) -> Result<()> {
    match run.races.first() {
        Some(r) => Err(LabError::config(format!("{what}: {} ({} races)", r.what, run.races.len()))),
        None => Ok(()),
    }
}

/// One pass of `v` over `batch` tokens on the GPU (prepared first,
/// untimed), with the planner's placement `planned` for the planned
/// variants, timed by `source`: its run.
fn pass(rig: &mut OffloadRig, v: Variant, batch: usize, planned: Option<Placement>, ring: usize, source: TimelineSource) -> Result<Run> {
    let (run, _) = pass_with(rig, batch, v.setup(ring, planned), &|f, t| v.pass(f, t), source)?;
    no_races(&run, v.label())?;
    Ok(run)
}

/// One pass of `body` over `batch` tokens as `setup` says on the GPU (the
/// rig placed and prepared first, untimed), behind the start gate: its
/// run and the pass's books.
pub(super) fn pass_with(
    rig: &mut OffloadRig,
    batch: usize,
    setup: PassSetup,
    body: &dyn Fn(&mut dyn Forward, &Task) -> Result<()>,
    source: TimelineSource,
) -> Result<(Run, Books)> {
    rig.place(setup.placement, setup.kind.precision())?;
    rig.prepare(batch)?;
    let ops = 4 * rig.shape.layers + 16;
    let p = rig.gpu.runner(source, ops, true)?.deferring()?;
    let mut f = Pass::live(p, rig, batch, setup)?;
    let task = f.task;
    body(&mut f, &task)?;
    f.finish()
}

/// A batch's input and the CPU's reference for its sampled rows, made
/// once a batch: the placement sweep at that batch makes the same input
/// again from its seed and is judged by the same reference.
pub(super) struct Reference {
    pub batch: usize,
    /// The input's seed ([`OffloadRig::input_of`]).
    seed: u64,
    pub rows: Vec<usize>,
    pub want: Vec<Vec<u16>>,
    /// The sampled rows' largest activations (FP8's scales are set from them).
    amax: LayerAmax,
}

impl Reference {
    /// A fresh input of `batch` tokens in `rig`, and the CPU's reference for its sampled rows.
    pub fn fresh(rig: &mut OffloadRig, batch: usize) -> Reference {
        let rows = sampled_rows(batch);
        let seed = rig.fresh_input(batch);
        let input = rig.input_rows(&rows);
        let (want, amax) = forward_rows(rig.weights(), rig.shape, &input);
        Reference { batch, seed, rows, want, amax }
    }
}

/// Uploads alone of pageable weights time every third layer: a pageable
/// upload's time is what the queue model needs beside each pageable pass
/// (the rate drifts, so it is taken in the same moments), and a third of
/// the network's uploads, spread over all of its weights, gives it as all
/// of them do at a third of the time (each pageable upload is staged by
/// the CPU: the network's take a second).
const PAGEABLE_ALONE_EVERY: usize = 3;

/// How long the SMs compute before a layer's cost alone is timed, ms: a
/// run of GEMMs slows over its first tens of ms (in the traced passes of
/// the H100's and the H200's recordings, at 16384 tokens, the layers of a
/// pass's first quarter ran about as fast as their cost alone, those of
/// its second half 5-11% slower), and the passes the cost stands for run
/// at the settled pace.
const SETTLE_MS: f64 = 100.0;

/// The most passes of layers the warm-up runs to reach [`SETTLE_MS`]
/// (short layers at small batches run near their fastest clock anyway).
const SETTLE_PASSES: usize = 8;

/// What one batch size's measurements share: the rig, the reference, the
/// verified count and the worst error.
pub(super) struct Sweep<'a> {
    pub rig: &'a mut OffloadRig,
    pub cfg: &'a OffloadConfig,
    pub reference: &'a Reference,
    /// What a 4-bit pass must give on the sampled rows, where the rig has 4 bits.
    want_int4: Option<Vec<Vec<u16>>>,
    pub verified: usize,
    pub worst: f64,
    /// FP8's passes verified, their worst error and the largest share of
    /// E4M3's range an activation took.
    pub fp8: (usize, f64, f64),
    /// The 4-bit passes': the same, and their worst error against the FP16 reference.
    pub int4: Int4Checked,
}

/// One kind's costs alone at a batch: (one upload, one layer), each over
/// the repeats, with the upload's samples in the order taken (a kind of
/// the same precision reuses them).
pub(super) struct Alone {
    pub upload: Summary,
    pub layer: Summary,
    uploads: Vec<f64>,
}

impl<'a> Sweep<'a> {
    /// A batch size's measurements on `rig`: the input of `reference` in
    /// the rig (made again from its seed), FP8's scales set from its rows,
    /// with `int4` the 4-bit pass's calibrated on its CPU twin (seconds of
    /// the CPU's: only where 4-bit passes will run), cuBLAS warmed at the
    /// batch's shapes.
    pub fn new(rig: &'a mut OffloadRig, cfg: &'a OffloadConfig, reference: &'a Reference, int4: bool) -> Result<Sweep<'a>> {
        let batch = reference.batch;
        rig.input_of(batch, reference.seed);
        if rig.has_fp8() {
            rig.set_fp8_scales(batch, &reference.amax)?;
        }
        // What a 4-bit pass must give (the CPU's FP8 twin of it), its
        // scales calibrated on that twin.
        let want_int4 = if int4 && rig.has_int4() { rig.calibrate_int4(&reference.rows)? } else { None };
        // Warmed on FP16-sized slots, which every kind of layer fits.
        rig.place(Placement { resident: 0, ring: cfg.ring }, Precision::Fp16)?;
        rig.warm(batch)?;
        Ok(Sweep { rig, cfg, reference, want_int4, verified: 0, worst: 0.0, fp8: (0, 0.0, 0.0), int4: Int4Checked::default() })
    }

    pub fn check(&mut self, batch: usize, what: &str) -> Result<()> {
        let want = match (self.rig.precision, &self.want_int4) {
            (Precision::Int4, Some(w)) => w,
            (Precision::Int4, None) => return Err(LabError::config(format!("{what}: no CPU reference over the 4-bit values"))),
            _ => &self.reference.want,
        };
        // Downloaded once: verified, and for 4 bits also set against FP16.
        let out = self.rig.output_rows(batch, &self.reference.rows)?;
        let e = verify(self.rig, batch, &self.reference.rows, &out, want, what)?;
        if self.rig.precision.fp8_activations() {
            let used = self.rig.fp8_range_used()?;
            if used > 1.0 {
                return Err(LabError::Verification {
                    buffer: "FP8 activations".into(),
                    element: 0,
                    detail: format!("{what}, {batch} tokens: an activation reached {:.0}% of its scale's range: values were clipped", 100.0 * used),
                });
            }
            if self.rig.precision == Precision::Int4 {
                let off_fp16 = worst_off(&out, &self.reference.want);
                self.int4 = self.int4.merge(Int4Checked { passes: 1, max_error: e, off_fp16, range_used: used });
            } else {
                self.fp8 = (self.fp8.0 + 1, self.fp8.1.max(e), self.fp8.2.max(used));
            }
        } else {
            self.worst = self.worst.max(e);
            self.verified += 1;
        }
        Ok(())
    }

    /// The costs alone, each stage back to back as it runs when it bounds
    /// the pass: untraced passes of uploads only (every layer into slot
    /// i % K on the copy stream), one upload's time their total over the
    /// layers; then untraced passes of layers only (each layer from slot
    /// i % K after the first K uploads), one layer's time their total less
    /// those uploads over the layers, each paired with an upload sample:
    /// (upload from pinned memory, layer), summarized over passes.
    ///
    /// The passes of layers run one after another, the warm-up's first
    /// (at least [`SETTLE_MS`] of them), as the variants' passes do: from
    /// the warm-up on the GPU computes with no pause of its own, so a layer
    /// is timed at the clock a pass's layers run at. Timed right after a pass of uploads alone, through
    /// which the SMs idle, the same layers ran up to a tenth faster than
    /// in every pass of the run that holds them, even one with no upload
    /// at all (the H200's recording at 8192 tokens: FP8 layers 0.382 ms
    /// alone, 0.419 ms in its passes of 96 resident layers). No event
    /// between ops: a timed event drains the GPU between kernels, which a
    /// pass of layers does not. These passes compute with the wrong
    /// weights on purpose and are not verified. `kind`: the layers'
    /// kernels, and the weights' precision both stages move; `uploads`:
    /// this batch's uploads alone of the same weights, where already timed
    /// (both FP16 kinds upload the same layers: timing them again measures
    /// the same copies).
    pub fn costs(&mut self, batch: usize, kind: LayerKind, uploads: Option<&Alone>) -> Result<Alone> {
        let layers = |f: &mut dyn Forward, t: &Task| -> Result<()> {
            for i in 0..t.slots {
                f.upload(t.compute, t.weights, i, i)?;
            }
            for i in 0..t.layers {
                f.layer(t.compute, i, i % t.slots)?;
            }
            Ok(())
        };
        let (l, k) = (self.rig.shape.layers as f64, self.cfg.ring as f64);
        let setup = self.cost_setup(kind);
        let (warmup, repeats) = (self.cfg.warmup, self.cfg.repeats);
        let up = match uploads {
            Some(a) => a.uploads.clone(),
            None => {
                let timed = (0..warmup + repeats).map(|_| self.uploads_alone(batch, setup.weights(), kind, 1)).collect::<Result<Vec<_>>>()?;
                timed[warmup..].to_vec()
            }
        };
        // The warm-up: the run's warm-up passes, and where it asks for
        // any, more (up to SETTLE_PASSES) until the SMs have computed for SETTLE_MS.
        let (mut passes, mut warm_ms) = (0, 0.0);
        while passes < warmup || (warmup > 0 && warm_ms < SETTLE_MS && passes < SETTLE_PASSES) {
            warm_ms += pass_with(self.rig, batch, setup, &layers, TimelineSource::Off)?.0.total_ms;
            passes += 1;
        }
        let mut layer = Vec::with_capacity(repeats);
        for uploaded in &up {
            let run = pass_with(self.rig, batch, setup, &layers, TimelineSource::Off)?.0;
            layer.push((run.total_ms - k * uploaded) / l);
        }
        Ok(Alone { upload: Summary::of(&up)?, layer: Summary::of(&layer)?, uploads: up })
    }

    /// How the cost passes of `kind` run: the ring of K, no resident layers.
    fn cost_setup(&self, kind: LayerKind) -> PassSetup {
        PassSetup {
            placement: Placement { resident: 0, ring: self.cfg.ring },
            streams: Streams { copy_high: false },
            hidden: super::forward::HiddenActivations::Fixed,
            kind,
        }
    }

    /// One untraced pass of uploads only from `from` (into a ring for
    /// `kind`'s layers) of every `every`-th layer: one upload's time, ms.
    fn uploads_alone(&mut self, batch: usize, from: Weights, kind: LayerKind, every: usize) -> Result<f64> {
        let uploads = move |f: &mut dyn Forward, t: &Task| -> Result<()> {
            for (j, i) in (0..t.layers).step_by(every).enumerate() {
                f.upload(t.copy, from, i, j % t.slots)?;
            }
            Ok(())
        };
        let run = pass_with(self.rig, batch, self.cost_setup(kind), &uploads, TimelineSource::Off)?.0;
        Ok(run.total_ms / self.rig.shape.layers.div_ceil(every) as f64)
    }

    /// The ring passes of `setups` in turn (one of each, in order, each
    /// round; the warm-up rounds, then the repeats), untraced and
    /// verified: each setup's pass times, ms.
    fn in_turn<const N: usize>(&mut self, batch: usize, setups: [PassSetup; N], what: &str) -> Result<[Summary; N]> {
        let mut ms: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
        for rep in 0..self.cfg.warmup + self.cfg.repeats {
            for (i, setup) in setups.iter().enumerate() {
                let (run, _) = pass_with(self.rig, batch, *setup, &|f, t| super::forward::ring(f, t), TimelineSource::Off)?;
                no_races(&run, what)?;
                self.check(batch, what)?;
                if rep >= self.cfg.warmup {
                    ms[i].push(run.total_ms);
                }
            }
        }
        let mut out = Vec::with_capacity(N);
        for m in &ms {
            out.push(Summary::of(m)?);
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one summary a setup")))
    }

    /// `v`'s passes, untraced: one pass's time, ms, over the repeats. A
    /// pageable pass comes after an untraced pass of pageable uploads
    /// alone (of every [`PAGEABLE_ALONE_EVERY`]-th layer) each time, one
    /// upload's time pushed to `pageable_alone`: the rate of copies from
    /// pageable memory drifts from minute to minute (the CPU stages them),
    /// so the queue model takes it from the same moments.
    fn variant(&mut self, v: Variant, batch: usize, planned: Option<Placement>, pageable_alone: &mut Vec<f64>) -> Result<Summary> {
        let mut ms = Vec::new();
        let setup = v.setup(self.cfg.ring, planned);
        if v == Variant::Graph {
            // Captured once; each launch is one cuGraphLaunch.
            self.rig.place(setup.placement, setup.kind.precision())?;
            let p = self.rig.gpu.capture_runner()?;
            let mut f = Pass::live(p, self.rig, batch, setup)?;
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
                let alone = self.uploads_alone(batch, Weights::Pageable, LayerKind::Separate, PAGEABLE_ALONE_EVERY)?;
                if rep >= self.cfg.warmup {
                    pageable_alone.push(alone);
                }
            }
            let run = pass(self.rig, v, batch, planned, self.cfg.ring, TimelineSource::Off)?;
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

/// The planner's placement for `v` at `p` under `budget_mib` MiB (the
/// planned variants), from `p`'s costs for its layers.
fn plan_for(shape: Shape, p: &BatchPoint, v: Variant, budget_mib: usize, machine: Machine) -> Result<Option<PlacementPlan>> {
    if !v.planned() {
        return Ok(None);
    }
    let costs = p.costs(v.kind()).ok_or_else(|| LabError::config(format!("{}: no costs measured for its layers", v.label())))?;
    let room = placement::room(shape, p.batch, budget_mib, v.kind().precision())?;
    placement::plan(shape, p.batch, &room, v.kind(), costs, machine).map(Some)
}

/// Runs lab 9 (see the module docs).
pub fn run(gpu: &Gpu, cfg: &OffloadConfig, progress: ProgressMode) -> Result<OffloadResults> {
    cfg.validate()?;
    let (shape, chose) = choose_shape(cfg, host_available())?;
    eprintln!("lab 9: {chose}");
    let largest = *cfg.batches.iter().max().expect("validated");
    // A step a variant and batch, one a budget of the sweep, and the rest.
    let budgets: usize = cfg.sweep_at().iter().map(|&b| sweep_budgets(shape, b, &cfg.sweep_budgets).len()).sum();
    let steps = cfg.batches.len() * (Variant::ALL.len() + 1) + budgets + 3;
    let mut bar = Progress::new(progress, steps as u64, "offload");
    let facts = host_costs(gpu, cfg.repeats)?;
    bar.step(&format!("the host: a CPU thread resumes {:.1} µs after the GPU, issues an op in {:.1} µs", facts.wake_ms * 1e3, facts.issue_ms * 1e3));
    // The run's passes read every host copy of the weights: the pageable
    // pass the pageable one, the FP8 passes the FP8 one.
    let mut rig = OffloadRig::new(gpu, shape, largest, cfg.ring, Copies::ALL)?;
    let copy_engines = gpu.copy_engines()?;
    let machine = facts.machine();
    let cublas = rig.blas.version();
    let fused = rig.blas.has_fused_relu();
    let fp8_missing = (!rig.has_fp8()).then(|| super::rig::no_fp8(gpu));
    let mut points: Vec<BatchPoint> = Vec::new();
    let mut references: Vec<Reference> = Vec::new();
    let (mut verified, mut worst, mut fp8) = (0, 0f64, (0usize, 0f64, 0f64));
    let mut int4 = Int4Checked::default();
    let int4_missing = rig.no_int4();
    for &batch in &cfg.batches {
        let _r = trace::range(&format!("lab 9: {batch} tokens"));
        bar.step_note(&format!("{batch} tokens: the CPU reference"));
        let reference = Reference::fresh(&mut rig, batch);
        let mut sweep = Sweep::new(&mut rig, cfg, &reference, true)?;
        if points.is_empty() {
            // The driver's staging of pageable copies and the host pages
            // they read warm up over the first passes: one, of every layer, untimed.
            sweep.uploads_alone(batch, Weights::Pageable, LayerKind::Separate, 1)?;
        }
        let fp16 = sweep.costs(batch, LayerKind::Separate, None)?;
        let (h2d_ms, layer_ms) = (fp16.upload, fp16.layer);
        // The fused layers upload the same FP16 weights: their layers alone are timed against the same uploads.
        let layer_fused_ms = if fused { Some(sweep.costs(batch, LayerKind::Fused, Some(&fp16))?.layer) } else { None };
        let alone = |sweep: &mut Sweep, kind| -> Result<(Option<Summary>, Option<Summary>)> {
            if !sweep.rig.runs(kind) {
                return Ok((None, None));
            }
            let a = sweep.costs(batch, kind, None)?;
            Ok((Some(a.upload), Some(a.layer)))
        };
        let (h2d_fp8_ms, layer_fp8_ms) = alone(&mut sweep, LayerKind::Fp8)?;
        let (h2d_int4_ms, layer_int4_ms) = alone(&mut sweep, LayerKind::Int4)?;
        // The costs of 4-bit layers leave the rig placed for them: the
        // dequantization alone, the warm-up's passes first.
        let dequant_int4_ms = match layer_int4_ms {
            Some(_) => Some(Summary::of(&sweep.rig.dequantization_alone(cfg.warmup + cfg.repeats)?[cfg.warmup..])?),
            None => None,
        };
        bar.step(&format!("{batch} tokens: costs alone"));
        let mut point = BatchPoint {
            batch,
            // Replaced below by the pageable uploads timed beside the pageable passes.
            h2d_pageable_ms: h2d_ms,
            h2d_ms,
            layer_ms,
            variants: Vec::new(),
            torch_to_ms: None,
            torch_ring_ms: None,
            layer_fused_ms,
            h2d_fp8_ms,
            layer_fp8_ms,
            h2d_int4_ms,
            layer_int4_ms,
            dequant_int4_ms,
            torch_beyond: None,
        };
        let mut pageable_alone = Vec::new();
        let mut measured = Vec::new();
        for v in Variant::ALL {
            if !sweep.rig.runs(v.kind()) {
                bar.step(&format!("{batch} tokens: {} (not on this GPU)", v.label()));
                continue;
            }
            let plan = plan_for(shape, &point, v, cfg.gpu_budget, machine)?;
            let ms = sweep.variant(v, batch, plan.as_ref().map(|p| p.placement), &mut pageable_alone)?;
            measured.push((v, ms, plan));
            bar.step(&format!("{batch} tokens: {}", v.label()));
        }
        point.h2d_pageable_ms = Summary::of(&pageable_alone)?;
        for (v, ms, plan) in measured {
            // A planned variant's pass is the one its plan predicted (a
            // ring pass reads no pageable weights, the one cost learnt since).
            let predicted_ms = match &plan {
                Some(plan) => plan.predicted_ms,
                None => {
                    let costs = point.costs(v.kind()).ok_or_else(|| LabError::config(format!("{}: no costs measured for its layers", v.label())))?;
                    v.predicted_ms(shape, batch, cfg.ring, None, costs, machine)?
                }
            };
            point.variants.push(VariantPoint { variant: v, ms, predicted_ms, plan });
        }
        verified += sweep.verified;
        worst = worst.max(sweep.worst);
        fp8 = (fp8.0 + sweep.fp8.0, fp8.1.max(sweep.fp8.1), fp8.2.max(sweep.fp8.2));
        int4 = int4.merge(sweep.int4);
        points.push(point);
        references.push(reference);
    }
    // The timeline: the ring of K at the batch nearest the crossover
    // (where the GEMMs and the uploads take most nearly as long), and the
    // passes past the streaming bound at the same batch.
    let near = points
        .iter()
        .min_by(|a, b| (a.layer_ms.median / a.h2d_ms.median).ln().abs().total_cmp(&(b.layer_ms.median / b.h2d_ms.median).ln().abs()))
        .expect("at least one batch");
    let (timeline_batch, timeline_untraced_ms) = (near.batch, near.variant(Variant::RingK).map_or(0.0, |v| v.ms.median));
    let beyond: Vec<(Variant, f64, Option<Placement>)> = near
        .variants
        .iter()
        .filter(|v| v.variant.kind() != LayerKind::Separate)
        .map(|v| (v.variant, v.ms.median, v.plan.as_ref().map(|p| p.placement)))
        .collect();
    // Events, not CUPTI: a layer is two or three GPU activities (the GEMMs
    // and the ReLU), and events around the op time it whole. (cuBLAS was
    // warmed at this batch's shapes by its sweep.)
    let run = pass(&mut rig, Variant::RingK, timeline_batch, None, cfg.ring, TimelineSource::Events)?;
    let timeline = run.timeline.clone().ok_or_else(|| LabError::config("the traced pass drew no timeline"))?;
    let mut timelines = Vec::new();
    for (variant, untraced_ms, planned) in beyond {
        let run = pass(&mut rig, variant, timeline_batch, planned, cfg.ring, TimelineSource::Events)?;
        let timeline = run.timeline.ok_or_else(|| LabError::config("the traced pass drew no timeline"))?;
        timelines.push(VariantTimeline { variant, timeline, untraced_ms });
    }
    bar.step("the timelines");
    let mut sweeps = Vec::new();
    for batch in cfg.sweep_at() {
        let measured = points.iter().zip(&references).find(|(p, _)| p.batch == batch);
        let (p, reference) = measured.ok_or_else(|| LabError::config(format!("--sweep-batches: {batch} was not measured")))?;
        let (mut s, sweep_fp8) = placement_sweep(&mut rig, cfg, p, reference, machine, &mut bar)?;
        sweeps.append(&mut s);
        fp8 = (fp8.0 + sweep_fp8.0, fp8.1.max(sweep_fp8.1), fp8.2.max(sweep_fp8.2));
    }
    let gpu_bytes = shape.gpu_bytes(largest, cfg.ring) as u64;
    let ordinal = gpu.ordinal();
    drop(rig);
    // PyTorch in the same run, after the rig's host memory is given back,
    // with the placements the lab planned.
    let planned: Vec<Planned> = points
        .iter()
        .filter_map(|p| {
            let of = |v| p.variant(v).and_then(|x| x.plan.as_ref()).map(|plan| plan.placement);
            Some(Planned { batch: p.batch, fp16: of(Variant::Resident)?, fp8: of(Variant::Fp8), int4: of(Variant::Int4) })
        })
        .collect();
    let torch = if cfg.python.is_empty() {
        Err("not asked for (--python is empty)".to_string())
    } else {
        bar.step_note("PyTorch's references");
        super::reference::torch_offload(&cfg.python, ordinal, shape, cfg, &planned)
    };
    let torch = torch.map(|t| {
        for p in &mut points {
            if let Some(b) = t.batches.iter().find(|b| b.batch == p.batch) {
                p.torch_to_ms = Some(b.to_hooks);
                p.torch_ring_ms = Some(b.ring);
                p.torch_beyond = Some(b.beyond.clone());
            }
        }
        t.torch
    });
    bar.step("PyTorch's references");
    bar.finish();
    let fp8 = (fp8.0 > 0).then(|| Fp8Accuracy { max_error: fp8.1, tolerance: fp8_tolerance(shape.layers), range_used: fp8.2, verified_passes: fp8.0 });
    let int4 = (int4.passes > 0).then(|| Int4Accuracy {
        max_error: int4.max_error,
        tolerance: int4_tolerance(shape.layers),
        off_fp16: int4.off_fp16,
        range_used: int4.range_used,
        verified_passes: int4.passes,
    });
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
        fp8,
        fp8_missing,
        int4,
        int4_missing,
        sweeps,
        timelines,
    })
}

/// The budgets (MiB) the sweep runs the planner's choice at for `shape` at
/// `batch`: from the smallest that holds a ring of 2 to the one that holds
/// every FP16 layer (steps of about 1.6x, and where every FP8 layer fits),
/// and the grid's budgets.
pub fn sweep_budgets(shape: Shape, batch: usize, grid: &[usize]) -> Vec<usize> {
    let mib = |p: Placement, precision| shape.placement_bytes(batch, p, precision).div_ceil(1 << 20);
    let least = mib(Placement { resident: 0, ring: 2 }, Precision::Fp16);
    let all16 = mib(Placement { resident: shape.layers, ring: 0 }, Precision::Fp16);
    let all8 = mib(Placement { resident: shape.layers, ring: 0 }, Precision::Fp8);
    let mut budgets = vec![least, all8, all16];
    let mut b = least as f64;
    while (b * 1.6) < all16 as f64 {
        b *= 1.6;
        budgets.push(b.round() as usize);
    }
    budgets.extend_from_slice(grid);
    budgets.sort_unstable();
    budgets.dedup();
    budgets
}

/// The placement sweep at `p`'s batch (see the module docs), on its input
/// and CPU reference `reference`: at every budget of [`sweep_budgets`],
/// the planner's choice for fused FP16 layers and for FP8 (where there is
/// FP8), measured and verified; at the grid's budgets every placement of
/// [`placement::sweep_grid`] beside it, each set beside the queue model's
/// time (the plan's own, for each placement it weighed).
fn placement_sweep(
    rig: &mut OffloadRig,
    cfg: &OffloadConfig,
    p: &BatchPoint,
    reference: &Reference,
    machine: Machine,
    bar: &mut Progress,
) -> Result<(Vec<PlacementSweep>, (usize, f64, f64))> {
    let (shape, batch) = (rig.shape, p.batch);
    let mut kinds = vec![LayerKind::Fused];
    if rig.has_fp8() {
        kinds.push(LayerKind::Fp8);
    }
    // At most 3 timed passes a placement: the sweep measures many.
    let few = OffloadConfig { repeats: cfg.repeats.min(3), ..cfg.clone() };
    // No 4-bit placement is swept: no 4-bit calibration.
    let mut sweep = Sweep::new(rig, &few, reference, false)?;
    // A budget the GPU cannot hold (what is free, and what the rig holds now) is skipped, and said so.
    let lab_bytes = sweep.rig.gpu.memory_info()?.0 as usize + sweep.rig.gpu_bytes();
    let mut out = Vec::new();
    for budget in sweep_budgets(shape, batch, &cfg.sweep_budgets) {
        if budget_bytes(budget + 64) > lab_bytes {
            bar.step(&format!("{batch} tokens: {budget} MiB skipped: the GPU has about {} MiB for the lab", lab_bytes >> 20));
            continue;
        }
        for &kind in &kinds {
            let Some(costs) = p.costs(kind) else { continue };
            // A budget too small for this precision's ring of 2 has no point.
            let Ok(room) = placement::room(shape, batch, budget, kind.precision()) else { continue };
            let Ok(plan) = placement::plan(shape, batch, &room, kind, costs, machine) else { continue };
            let grid = cfg.sweep_budgets.contains(&budget);
            let placements = if grid { placement::sweep_grid(shape, room.buffers) } else { vec![plan.placement] };
            let mut measured = Vec::new();
            for placement in placements {
                let setup = placement::setup(placement, kind);
                let what = format!("{batch} tokens, {budget} MiB: {:?} {}", kind.precision(), placement.label());
                let [ms] = sweep.in_turn(batch, [setup], &what)?;
                let predicted_ms = match plan.predicted(placement) {
                    Some(ms) => ms,
                    None => predict(shape, batch, setup, costs, machine)?,
                };
                measured.push(PlacementPoint { placement, ms, predicted_ms });
            }
            let mut s = PlacementSweep { batch, budget_mib: budget, kind, plan, measured, head_to_head: None };
            if let (true, Some(best)) = (grid, s.best().map(|b| b.placement)) {
                if best != s.plan.placement {
                    let what = format!("{batch} tokens, {budget} MiB: the planner's choice and the fastest in turn");
                    let [planned, fastest] = sweep.in_turn(batch, [placement::setup(s.plan.placement, kind), placement::setup(best, kind)], &what)?;
                    s.head_to_head = Some((planned, fastest));
                }
            }
            out.push(s);
        }
        bar.step(&format!("{batch} tokens: {budget} MiB placed"));
    }
    Ok((out, sweep.fp8))
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
}
