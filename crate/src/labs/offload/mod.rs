//! Lab 9, the capstone: run a neural network whose weights do not fit the
//! GPU memory the lab lets itself use, at the speed of the host link.
//!
//! The network is a stack of layers, each two FP16 GEMMs (d x 4d, then 4d
//! x d, by cuBLAS) with a ReLU between ([`rig`], [`kernel`]). Its weights
//! live in host memory; the GPU holds a ring of a few layer buffers and the
//! activations, under `--gpu-budget`. A forward pass ([`forward`]) uploads
//! each layer's weights into a slot of the ring and runs the layer from
//! it. Per layer the bound is the slower of the two, the upload at the
//! link's rate and the GEMMs alone, each at its best (its fastest quarter;
//! the upload the run's one, since it moves the same weights at every
//! batch): over a sweep of batch sizes it moves from the link to the GPU's
//! arithmetic, and the crossover batch is where compute hides the stream.
//!
//! Nine variants, each a pass on the one runner ([`Variant`]): pageable
//! weights copied then computed, pinned copied then computed, a ring of 2
//! on a copy stream ordered by events, a ring of K with the copy stream at
//! high priority, that pass captured as a CUDA graph, and that pass with
//! its hidden activations from the stream-ordered pool; then past the
//! streaming bound, by changing the problem: the ReLU fused into the
//! first GEMM's epilogue, the budget spent on resident layers as the
//! planner places them ([`placement`]), and FP8 weights (half the bytes
//! over the link, each GEMM quantizing its output in its epilogue) where
//! the GPU has FP8. A sweep over the budget shows tokens/s against GPU
//! memory, and the planner's choice beside the best of a measured grid of
//! placements. Each is predicted
//! by the queue model from the costs measured alone (the pass recorded on
//! the dry run, no GPU), verified against the CPU on sampled rows
//! ([`cpu`]), and set beside PyTorch in the same run ([`mod@reference`]).
//! The exercise ([`exercise`]) has the learner write the ring's prefetch
//! schedule, and then place the layers under a budget. [`measure::run`] runs it all; [`charts`] draws it.
//!
//! May use: what every lab may (see `labs`).

pub mod charts;
pub mod cpu;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
pub mod forward;
pub mod kernel;
pub mod measure;
pub mod placement;
pub mod reference;
pub mod rig;

use crate::error::{LabError, Result};
use crate::gpu::MachineFacts;
use crate::lab_kit::check::pct;
use crate::lab_kit::headline::HeadlineFigure;
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::timeline::Timeline;
use crate::units::Bytes;
use placement::{Placement, Plan};
use rig::{LayerKind, Precision};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const LAB: &str = "offload";

/// The network's shape: how many layers, and its width d (a layer's
/// weights are W1, d x 4d, and W2, 4d x d, in FP16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub layers: usize,
    pub d: usize,
}

impl Shape {
    /// One layer's weights: 8 d² halves.
    pub fn layer_bytes(&self) -> usize {
        16 * self.d * self.d
    }
    /// One layer's weights in `precision` (8 d² values).
    pub fn layer_bytes_in(&self, precision: Precision) -> usize {
        8 * precision.bytes() * self.d * self.d
    }
    /// The whole network's weights.
    pub fn network_bytes(&self) -> usize {
        self.layers * self.layer_bytes()
    }
    /// One activation buffer (batch x d halves).
    pub fn act_bytes(&self, batch: usize) -> usize {
        batch * self.d * 2
    }
    /// The hidden activations (batch x 4d halves).
    pub fn hidden_bytes(&self, batch: usize) -> usize {
        batch * self.d * 8
    }
    /// The GPU memory a pass uses: the ring, both activation buffers, the
    /// hidden activations and cuBLAS's workspace.
    pub fn gpu_bytes(&self, batch: usize, slots: usize) -> usize {
        self.placement_bytes(batch, Placement { resident: 0, ring: slots }, Precision::Fp16)
    }
    /// The GPU memory a pass of `placement` in `precision` uses: its layer
    /// buffers, the activations (the same FP16-sized buffers in FP8: a
    /// pass of either kind runs on one rig), cuBLAS's workspace,
    /// and FP8's scales.
    pub fn placement_bytes(&self, batch: usize, placement: Placement, precision: Precision) -> usize {
        let scales = if precision == Precision::Fp8 { rig::fp8_slot::bytes(self.layers) } else { 0 };
        placement.buffers() * self.layer_bytes_in(precision) + 2 * self.act_bytes(batch) + self.hidden_bytes(batch) + crate::gpu::blas::WORKSPACE_BYTES + scales
    }
    /// FLOPs of one layer over `batch` tokens (two GEMMs of 2·batch·d·4d).
    pub fn layer_flops(&self, batch: usize) -> f64 {
        16.0 * batch as f64 * (self.d * self.d) as f64
    }
}

/// Lab 9's settings; `overlap-lab offload` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct OffloadConfig {
    #[arg(skip)]
    pub device: usize,
    /// Layers of the network (fewer where host memory cannot hold the
    /// weights' copies: the run says what it chose).
    #[arg(long, default_value_t = OffloadConfig::default().layers)]
    pub layers: usize,
    /// The network's width d (a multiple of 64).
    #[arg(long, default_value_t = OffloadConfig::default().d_model)]
    pub d_model: usize,
    /// Slots in the GPU's ring of layer buffers (the ring-of-K variants; at least 3).
    #[arg(long, default_value_t = OffloadConfig::default().ring)]
    pub ring: usize,
    /// GPU memory the lab lets itself use, MiB if no unit is given (1536,
    /// 1.5GiB): the ring and the activations of the largest batch must fit
    /// in it.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = OffloadConfig::default().gpu_budget)]
    pub gpu_budget: usize,
    /// Batch sizes (tokens per forward pass), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OffloadConfig::default().batches)]
    pub batches: Vec<usize>,
    /// Untimed passes first, per variant and batch size.
    #[arg(long, default_value_t = OffloadConfig::default().warmup)]
    pub warmup: usize,
    /// Timed passes per variant and batch size.
    #[arg(long, default_value_t = OffloadConfig::default().repeats)]
    pub repeats: usize,
    /// The Python with PyTorch that runs the references (empty: none).
    #[arg(long, default_value_t = OffloadConfig::default().python)]
    pub python: String,
    /// Batch sizes the placement sweep runs at, each one of --batches
    /// (default: the first, middle and last of --batches).
    #[arg(long, value_delimiter = ',')]
    #[serde(default)]
    pub sweep_batches: Vec<usize>,
    /// GPU budgets at which the sweep measures a grid of placements beside
    /// the planner's choice, comma-separated, MiB if no unit is given (it
    /// also runs the planner's choice from all-streamed to all-resident).
    #[arg(long, value_name = "MIB", value_delimiter = ',', value_parser = crate::units::mib_option, default_values_t = OffloadConfig::default().sweep_budgets)]
    #[serde(default)]
    pub sweep_budgets: Vec<usize>,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            device: 0,
            layers: 96,
            d_model: 2048,
            ring: 3,
            gpu_budget: 1536,
            batches: vec![1024, 2048, 4096, 8192, 16384, 24576],
            warmup: 1,
            repeats: 5,
            python: "python3".into(),
            sweep_batches: Vec::new(),
            sweep_budgets: vec![1536, 3072, 4608],
        }
    }
}

impl OffloadConfig {
    /// Every headline figure (the best pass over the pageable one at the
    /// sweep's ends) at the full run's sizes: the two ends only, fewer
    /// repeats, no PyTorch.
    pub fn headline() -> Self {
        let full = Self::default();
        let ends = vec![full.batches[0], *full.batches.last().expect("a sweep")];
        OffloadConfig { batches: ends, repeats: 3, python: String::new(), sweep_budgets: Vec::new(), ..full }
    }
    /// The notebook's live run: a narrower network (d = 1024) under a
    /// smaller budget, still four times the budget, both sides of the crossover.
    pub fn quick() -> Self {
        OffloadConfig {
            d_model: 1024,
            gpu_budget: 384,
            batches: vec![2048, 8192, 24576],
            repeats: 3,
            sweep_batches: vec![2048],
            sweep_budgets: vec![384, 768],
            ..Self::default()
        }
    }
    /// The smallest run that touches every code path: for
    /// compute-sanitizer and smoke tests, not for numbers.
    pub fn small() -> Self {
        OffloadConfig {
            layers: 4,
            d_model: 256,
            ring: 3,
            gpu_budget: 64,
            batches: vec![64, 256],
            warmup: 0,
            repeats: 1,
            python: String::new(),
            sweep_batches: vec![256],
            sweep_budgets: vec![64, 80],
            ..Self::default()
        }
    }
    /// The batches the sweep runs at: those asked for, or the first,
    /// middle and last of the batches (none where no budget is asked for).
    pub fn sweep_at(&self) -> Vec<usize> {
        if self.sweep_budgets.is_empty() {
            return Vec::new();
        }
        if !self.sweep_batches.is_empty() {
            return self.sweep_batches.clone();
        }
        let mut b = self.batches.clone();
        b.sort_unstable();
        let mut at = vec![b[0], b[b.len() / 2], b[b.len() - 1]];
        at.dedup();
        at
    }
    pub fn validate(&self) -> Result<()> {
        if !(2..=10_000).contains(&self.layers) {
            return Err(LabError::config(format!("--layers must be 2-10000 (got {})", self.layers)));
        }
        if self.d_model == 0 || self.d_model % 64 != 0 || self.d_model > 16384 {
            return Err(LabError::config(format!("--d-model must be a multiple of 64, up to 16384 (got {})", self.d_model)));
        }
        if !(3..=64).contains(&self.ring) {
            return Err(LabError::config(format!("--ring must be 3-64 slots (got {}); the lab also runs a ring of 2", self.ring)));
        }
        if self.batches.is_empty() || self.batches.iter().any(|&b| b == 0 || b % 8 != 0 || b > 1 << 20) {
            return Err(LabError::config(format!("--batches must be multiples of 8, 8 to 2^20 (got {:?})", self.batches)));
        }
        if self.repeats == 0 || self.repeats > 1000 || self.warmup > 100 {
            return Err(LabError::config("--repeats must be 1-1000 and --warmup 0-100"));
        }
        if let Some(b) = self.sweep_batches.iter().find(|b| !self.batches.contains(b)) {
            return Err(LabError::config(format!("--sweep-batches: {b} is not one of --batches {:?}", self.batches)));
        }
        if self.sweep_budgets.iter().any(|&m| m == 0 || m > 1 << 24) {
            return Err(LabError::config(format!("--sweep-budgets must be 1 MiB to 16 TiB each (got {:?} MiB)", self.sweep_budgets)));
        }
        let shape = Shape { layers: self.layers, d: self.d_model };
        let largest = *self.batches.iter().max().expect("checked non-empty");
        let need = shape.gpu_bytes(largest, self.ring);
        if need > self.gpu_budget << 20 {
            return Err(LabError::config(format!(
                "a ring of {} layers ({}) and the activations of {largest} tokens need {}, over --gpu-budget {} MiB",
                self.ring,
                Bytes((self.ring * shape.layer_bytes()) as u64),
                Bytes(need as u64),
                self.gpu_budget
            )));
        }
        Ok(())
    }
}

/// The forward passes the lab compares, simplest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Pageable weights, each layer copied then computed on one stream.
    Pageable,
    /// Pinned weights, still copied then computed.
    Pinned,
    /// A ring of 2 (double buffering) on a copy stream ordered by events.
    Ring2,
    /// A ring of K with the copy stream at the highest priority.
    RingK,
    /// The ring-of-K pass captured once as a CUDA graph and launched whole.
    Graph,
    /// The ring of K with each layer's hidden activations from the
    /// stream-ordered pool instead of a buffer made up front.
    Pool,
    /// The ring of K with the ReLU in the first GEMM's epilogue: a layer
    /// of two kernels, not three.
    Fused,
    /// The planner's placement under the budget: R layers kept on the GPU
    /// (spread through the network), the rest through a ring of K, fused
    /// layers.
    Resident,
    /// FP8 weights (half the bytes a layer) in the planner's placement for
    /// FP8, each GEMM quantizing its output in its epilogue.
    Fp8,
}

impl Variant {
    pub const ALL: [Variant; 9] =
        [Variant::Pageable, Variant::Pinned, Variant::Ring2, Variant::RingK, Variant::Graph, Variant::Pool, Variant::Fused, Variant::Resident, Variant::Fp8];
    pub fn label(self) -> &'static str {
        match self {
            Variant::Pageable => "pageable, copy then compute",
            Variant::Pinned => "pinned, copy then compute",
            Variant::Ring2 => "ring of 2, copy stream + events",
            Variant::RingK => "ring of K, high-priority copy stream",
            Variant::Graph => "ring of K as one CUDA graph",
            Variant::Pool => "ring of K, activations from the pool",
            Variant::Fused => "ring of K, ReLU in the GEMM's epilogue",
            Variant::Resident => "resident layers + ring, as planned",
            Variant::Fp8 => "FP8 weights, resident + ring, as planned",
        }
    }
    /// Each step of the lesson: (the pass before, the pass that improves on it).
    pub const STEPS: [(Variant, Variant); 8] = [
        (Variant::Pageable, Variant::Pinned),
        (Variant::Pinned, Variant::Ring2),
        (Variant::Ring2, Variant::RingK),
        (Variant::RingK, Variant::Graph),
        (Variant::RingK, Variant::Pool),
        (Variant::RingK, Variant::Fused),
        (Variant::Fused, Variant::Resident),
        (Variant::Resident, Variant::Fp8),
    ];
    /// Its name in a few words (the gains line).
    pub fn short(self) -> &'static str {
        match self {
            Variant::Pageable => "pageable",
            Variant::Pinned => "pinned",
            Variant::Ring2 => "ring of 2",
            Variant::RingK => "ring of K",
            Variant::Graph => "graph",
            Variant::Pool => "pool",
            Variant::Fused => "fused",
            Variant::Resident => "resident",
            Variant::Fp8 => "FP8",
        }
    }
    /// Slots of the ring it uses (`k`: the ring's size; the planned
    /// variants' come from their placement).
    pub fn slots(self, k: usize) -> usize {
        match self {
            Variant::Pageable | Variant::Pinned => 1,
            Variant::Ring2 => 2,
            _ => k,
        }
    }
    /// Whether the planner places it under the budget.
    pub fn planned(self) -> bool {
        matches!(self, Variant::Resident | Variant::Fp8)
    }
    /// Its layers' kernels.
    pub fn kind(self) -> LayerKind {
        match self {
            Variant::Fused | Variant::Resident => LayerKind::Fused,
            Variant::Fp8 => LayerKind::Fp8,
            _ => LayerKind::Separate,
        }
    }
    /// How its pass runs, with a ring of `k` (`planned`: the planner's
    /// placement, which the planned variants take).
    pub fn setup(self, k: usize, planned: Option<Placement>) -> forward::PassSetup {
        let placement = match (self.planned(), planned) {
            (true, Some(p)) => p,
            _ => Placement { resident: 0, ring: self.slots(k) },
        };
        forward::PassSetup { placement, streams: self.streams(), hidden: self.hidden(), kind: self.kind() }
    }
    pub fn streams(self) -> forward::Streams {
        forward::Streams { copy_high: !matches!(self, Variant::Pageable | Variant::Pinned | Variant::Ring2) }
    }
    pub fn hidden(self) -> rig::Hidden {
        if self == Variant::Pool {
            rig::Hidden::Pool
        } else {
            rig::Hidden::Fixed
        }
    }
    /// Its pass.
    pub fn pass(self, f: &mut dyn forward::Forward, t: &forward::Task) -> Result<()> {
        match self {
            Variant::Pageable => forward::copy_then_compute(f, t, forward::Weights::Pageable),
            Variant::Pinned => forward::copy_then_compute(f, t, forward::Weights::Pinned),
            _ => forward::ring(f, t),
        }
    }
}

/// One of PyTorch's passes at a batch size, where it ran.
type TorchPass = fn(&BatchPoint) -> Option<&Summary>;

/// One variant at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantPoint {
    pub variant: Variant,
    /// One forward pass, ms.
    pub ms: Summary,
    /// The queue model's time from this batch's costs measured alone
    /// (their medians), ms.
    pub predicted_ms: f64,
    /// The planner's placement, for the planned variants.
    #[serde(default)]
    pub plan: Option<Plan>,
}

/// Everything measured at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchPoint {
    pub batch: usize,
    /// One layer's upload from pinned memory, alone, ms (this batch's
    /// passes; the bound takes the run's one, [`OffloadResults::upload_ms`]).
    pub h2d_ms: Summary,
    /// The same from pageable memory.
    pub h2d_pageable_ms: Summary,
    /// One layer's GEMMs and ReLU alone, ms.
    pub layer_ms: Summary,
    pub variants: Vec<VariantPoint>,
    /// PyTorch's forward pass at this batch size, ms: (per-layer `.to()`
    /// offload, the hand-written pinned ring), where it ran.
    #[serde(default)]
    pub torch_to_ms: Option<Summary>,
    #[serde(default)]
    pub torch_ring_ms: Option<Summary>,
    /// One layer alone with the ReLU in its first GEMM's epilogue, ms.
    #[serde(default)]
    pub layer_fused_ms: Option<Summary>,
    /// One layer's upload from the FP8 weights, alone, ms (where the GPU has FP8).
    #[serde(default)]
    pub h2d_fp8_ms: Option<Summary>,
    /// One FP8 layer alone, ms.
    #[serde(default)]
    pub layer_fp8_ms: Option<Summary>,
    /// PyTorch's passes and layers past the streaming bound, where it ran.
    #[serde(default)]
    pub torch_beyond: Option<reference::TorchBeyond>,
}

impl BatchPoint {
    pub fn variant(&self, v: Variant) -> Option<&VariantPoint> {
        self.variants.iter().find(|p| p.variant == v)
    }
    /// The fastest variant here (by median).
    pub fn best(&self) -> Option<&VariantPoint> {
        self.variants.iter().min_by(|a, b| a.ms.median.total_cmp(&b.ms.median))
    }
    /// The parts `kind`'s layers cost alone here: (upload, layer), where measured.
    pub fn parts(&self, kind: LayerKind) -> Option<(&Summary, &Summary)> {
        match kind {
            LayerKind::Separate => Some((&self.h2d_ms, &self.layer_ms)),
            LayerKind::Fused => Some((&self.h2d_ms, self.layer_fused_ms.as_ref()?)),
            LayerKind::Fp8 => Some((self.h2d_fp8_ms.as_ref()?, self.layer_fp8_ms.as_ref()?)),
        }
    }
    /// The queue model's costs for `kind`'s layers here (the medians).
    pub fn costs(&self, kind: LayerKind) -> Option<forward::Costs> {
        let (up, layer) = self.parts(kind)?;
        Some(forward::Costs { h2d: up.median, h2d_pageable: self.h2d_pageable_ms.median, layer: layer.median })
    }
    /// Every PyTorch pass measured here: (what, its time, the lab's
    /// variant it does as PyTorch, with its resident layers).
    pub fn torch_passes(&self) -> Vec<(&'static str, &Summary, Variant, usize)> {
        let mut v = Vec::new();
        if let Some(t) = &self.torch_to_ms {
            v.push(("PyTorch: .to(\"cuda\") per layer in hooks", t, Variant::Pageable, 0));
        }
        if let Some(t) = &self.torch_ring_ms {
            v.push(("PyTorch: hand-written pinned ring", t, Variant::RingK, 0));
        }
        if let Some(b) = &self.torch_beyond {
            v.extend(b.passes());
        }
        v
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OffloadResults {
    pub config: OffloadConfig,
    /// The network as run (its layers may be fewer than asked: see `chose`).
    pub shape: Shape,
    /// What the run chose and why, in a line.
    pub chose: String,
    /// GPU memory a pass used at the largest batch, bytes.
    pub gpu_bytes: u64,
    pub cublas: String,
    /// The GPU's copy engines (the queue model's machine).
    pub copy_engines: u32,
    /// The host as the queue model knows it, measured as lab 5 measures
    /// it: how long a CPU thread takes to resume after the GPU work it
    /// waited for, and to issue one op (what the exercise's checker costs
    /// a CPU wait at). None in recordings made before lab 9 kept it.
    #[serde(default)]
    pub machine: Option<MachineFacts>,
    pub points: Vec<BatchPoint>,
    /// The best ring pass at `timeline_batch`, traced.
    pub timeline: Timeline,
    pub timeline_batch: usize,
    /// The traced pass's untraced median, ms.
    pub timeline_untraced_ms: f64,
    /// The worst relative error of a sampled row over every verified pass.
    pub max_error: f64,
    pub verified_passes: usize,
    /// PyTorch's version, or why the references did not run.
    pub torch: std::result::Result<String, String>,
    /// The FP8 passes' accuracy against the FP16 CPU reference (None:
    /// no FP8 here, `fp8_missing` says why; or a recording made before).
    #[serde(default)]
    pub fp8: Option<Fp8Accuracy>,
    #[serde(default)]
    pub fp8_missing: Option<String>,
    /// The placement sweep: per batch and budget, the planner's choice
    /// and the placements measured beside it.
    #[serde(default)]
    pub sweeps: Vec<PlacementSweep>,
    /// The passes past the streaming bound, traced at `timeline_batch`.
    #[serde(default)]
    pub timelines: Vec<VariantTimeline>,
}

/// How far FP8's passes are from the FP16 CPU reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fp8Accuracy {
    /// The worst relative error of a sampled row over every FP8 pass.
    pub max_error: f64,
    /// What a row may be off ([`measure::fp8_tolerance`] for this depth).
    pub tolerance: f64,
    /// The largest share of E4M3's range an activation took (its amax over
    /// what its scale reaches): at most 1, or values were clipped.
    pub range_used: f64,
    pub verified_passes: usize,
}

/// One placement measured in a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementPoint {
    pub placement: Placement,
    pub ms: Summary,
    pub predicted_ms: f64,
}

/// A budget at a batch: the planner's choice and the placements measured
/// (the planner's alone, or a grid around it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementSweep {
    pub batch: usize,
    pub budget_mib: usize,
    pub kind: LayerKind,
    pub plan: Plan,
    pub measured: Vec<PlacementPoint>,
    /// Where the grid's fastest was not the planner's choice: both again,
    /// pass for pass in turn (the planner's, the fastest's), so drift
    /// between the grid's passes and the pick of the fastest of many noisy
    /// medians do not decide how far the planner is from the best.
    #[serde(default)]
    pub head_to_head: Option<(Summary, Summary)>,
}

impl PlacementSweep {
    /// The fastest placement measured (by median).
    pub fn best(&self) -> Option<&PlacementPoint> {
        self.measured.iter().min_by(|a, b| a.ms.median.total_cmp(&b.ms.median))
    }
    /// The planner's choice as measured.
    pub fn planned(&self) -> Option<&PlacementPoint> {
        self.measured.iter().find(|m| m.placement == self.plan.placement)
    }
    /// A grid was measured, not the planner's choice alone.
    pub fn is_grid(&self) -> bool {
        self.measured.len() > 1
    }
    /// The planner's choice over the best measured, less 1 (0: it is the
    /// best), from the passes in turn where they ran.
    pub fn planner_miss(&self) -> Option<f64> {
        if let Some((planned, best)) = &self.head_to_head {
            return Some(planned.median / best.median - 1.0);
        }
        Some(self.planned()?.ms.median / self.best()?.ms.median - 1.0)
    }
}

/// A pass traced for its timeline, with its untraced median.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantTimeline {
    pub variant: Variant,
    pub timeline: Timeline,
    pub untraced_ms: f64,
}

/// The bound of a pass that keeps `resident` of `layers` layers on the GPU
/// and streams the rest, each upload taking `up` and each layer `layer`
/// (ms): the GEMMs of every layer, and the uploads with the GEMMs after the
/// first and before the last, whichever is longest. With none resident it
/// is the ring's L·max(up, layer) + min.
pub fn placement_bound_ms(layers: usize, resident: usize, up: f64, layer: f64) -> f64 {
    let streamed = layers.saturating_sub(resident) as f64;
    let gemms = layers as f64 * layer;
    if streamed == 0.0 {
        return gemms;
    }
    gemms.max(up + streamed * layer).max(streamed * up + layer)
}

pub type OffloadRecord = crate::measure::record::Record<OffloadResults>;

impl OffloadResults {
    pub fn network_over_budget(&self) -> f64 {
        self.shape.network_bytes() as f64 / (self.config.gpu_budget << 20) as f64
    }
    /// One layer's upload from pinned memory as this run's link does it at
    /// its best: the batch whose uploads' fast end (fastest quarter) is the
    /// fastest. An upload moves the same weights at every batch and the
    /// link has one rate: the bound at every batch takes this one, so a
    /// batch whose uploads ran slow (a slow phase of the host) does not
    /// move its bound.
    pub fn upload_ms(&self) -> Option<&Summary> {
        self.upload_point().map(|p| &p.h2d_ms)
    }
    /// The batch whose upload is the run's one ([`Self::upload_ms`]).
    fn upload_point(&self) -> Option<&BatchPoint> {
        self.points.iter().min_by(|a, b| a.h2d_ms.fast_end().total_cmp(&b.h2d_ms.fast_end()))
    }
    /// The run's upload, for `p`, one of the run's points (so there is one).
    fn run_upload<'a>(&'a self, p: &'a BatchPoint) -> &'a Summary {
        self.upload_ms().unwrap_or(&p.h2d_ms)
    }
    /// The bound's parts at `p`, ms, each at its fast end: (the run's
    /// upload, `p`'s GEMMs and ReLU).
    pub fn bound_parts(&self, p: &BatchPoint) -> (f64, f64) {
        (self.run_upload(p).fast_end(), p.layer_ms.fast_end())
    }
    /// The bound at `p`: layers · max(upload, GEMMs) + min(upload, GEMMs)
    /// (the slower stage every layer, the faster once to fill the ring).
    pub fn bound_ms(&self, p: &BatchPoint) -> f64 {
        crate::lab_kit::two_stage_bound(self.shape.layers, self.run_upload(p), &p.layer_ms)
    }
    /// A pass of `ms` at `p` against the bound, with its passes' spread.
    pub fn efficiency(&self, p: &BatchPoint, ms: &Summary) -> Efficiency {
        crate::lab_kit::two_stage_efficiency(self.shape.layers, self.run_upload(p), &p.layer_ms, ms)
    }
    /// The run's upload of a layer of `kind` at its best (as
    /// [`Self::upload_ms`], over the batches that measured it).
    fn run_upload_of<'a>(&'a self, p: &'a BatchPoint, kind: LayerKind) -> Option<&'a Summary> {
        let of = |q: &'a BatchPoint| q.parts(kind).map(|(up, _)| up);
        self.points.iter().filter_map(of).min_by(|a, b| a.fast_end().total_cmp(&b.fast_end())).or_else(|| of(p))
    }
    /// The bound at `p` of a pass of `kind`'s layers keeping `resident`
    /// of them on the GPU, ms: its placement's, from its own layer's and
    /// upload's costs alone (a fused or FP8 pass is not held to the
    /// separate FP16 layer's bound, which it may beat).
    pub fn bound_of_ms(&self, p: &BatchPoint, kind: LayerKind, resident: usize) -> Option<f64> {
        if kind == LayerKind::Separate {
            return Some(self.bound_ms(p));
        }
        let (up, layer) = (self.run_upload_of(p, kind)?, p.parts(kind)?.1);
        Some(placement_bound_ms(self.shape.layers, resident, up.fast_end(), layer.fast_end()))
    }
    /// A pass of `ms` at `p` against [`Self::bound_of_ms`], with its passes' and its parts' spread.
    pub fn efficiency_of(&self, p: &BatchPoint, kind: LayerKind, resident: usize, ms: &Summary) -> Option<Efficiency> {
        let (up, layer) = (self.run_upload_of(p, kind)?, p.parts(kind)?.1);
        Some(Efficiency::new(self.bound_of_ms(p, kind, resident)?, &[up, layer], ms))
    }
    /// Variant `v` at `p` against its own bound (its placement's).
    pub fn variant_efficiency(&self, p: &BatchPoint, v: &VariantPoint) -> Option<Efficiency> {
        let resident = v.plan.as_ref().map_or(0, |plan| plan.placement.resident);
        self.efficiency_of(p, v.variant.kind(), resident, &v.ms)
    }
    /// Whether the link, not the GPU's arithmetic, bounds `p`.
    pub fn link_bound(&self, p: &BatchPoint) -> bool {
        let (upload, layer) = self.bound_parts(p);
        upload >= layer
    }
    /// Tokens per second of a pass of `ms` over `batch` tokens.
    pub fn tokens_per_s(batch: usize, ms: f64) -> f64 {
        batch as f64 / ms * 1e3
    }
    /// The batch where the GEMMs take as long as the upload, each as the
    /// bound takes it (interpolated between the sweep's points; None
    /// outside the sweep).
    pub fn crossover_batch(&self) -> Option<f64> {
        self.points.windows(2).find_map(|w| {
            let f = |p: &BatchPoint| {
                let (upload, layer) = self.bound_parts(p);
                layer / upload
            };
            let (a, b) = (f(&w[0]), f(&w[1]));
            (a <= 1.0 && b >= 1.0).then(|| {
                let t = if b > a { (1.0 - a) / (b - a) } else { 0.0 };
                w[0].batch as f64 + t * (w[1].batch - w[0].batch) as f64
            })
        })
    }
    /// The faster of our two FP16 layers alone at `p`: (which, its time).
    pub fn best_fp16_layer<'a>(&self, p: &'a BatchPoint) -> Option<(&'static str, &'a Summary)> {
        let fused = p.layer_fused_ms.as_ref().map(|f| ("ReLU in the epilogue", f));
        [Some(("GEMM, ReLU, GEMM", &p.layer_ms)), fused].into_iter().flatten().min_by(|a, b| a.1.median.total_cmp(&b.1.median))
    }
    /// The best variant's share of its bound at every batch size, lowest first.
    pub fn worst_efficiency(&self) -> Option<(usize, f64)> {
        self.points.iter().filter_map(|p| p.best().and_then(|b| Some((p.batch, self.variant_efficiency(p, b)?.ratio)))).min_by(|a, b| a.1.total_cmp(&b.1))
    }
    /// The best pass over the all-streamed FP16 ring of K at the first
    /// batch: (batch, the best pass, its speed-up).
    pub fn beyond_the_ring(&self) -> Option<(usize, &VariantPoint, f64)> {
        let p = self.points.first()?;
        let best = p.best()?;
        Some((p.batch, best, p.variant(Variant::RingK)?.ms.median / best.ms.median))
    }
    /// The planner's worst miss against the best placement measured in
    /// each grid: (batch, budget MiB, its choice over the best - 1).
    pub fn worst_planner_miss(&self) -> Option<(usize, usize, f64)> {
        self.sweeps.iter().filter(|s| s.is_grid()).filter_map(|s| Some((s.batch, s.budget_mib, s.planner_miss()?))).max_by(|a, b| a.2.total_cmp(&b.2))
    }
    /// The queue model's worst miss over every placement the sweeps measured.
    pub fn worst_placement_prediction(&self) -> Option<(usize, usize, Placement, f64)> {
        self.sweeps
            .iter()
            .flat_map(|s| s.measured.iter().map(move |m| (s.batch, s.budget_mib, m.placement, m.predicted_ms / m.ms.median - 1.0)))
            .max_by(|a, b| a.3.abs().total_cmp(&b.3.abs()))
    }
    /// The queue model's worst miss over every variant and batch: (variant,
    /// batch, predicted / measured - 1).
    pub fn worst_prediction(&self) -> Option<(Variant, usize, f64)> {
        self.points
            .iter()
            .flat_map(|p| p.variants.iter().map(move |v| (v.variant, p.batch, v.predicted_ms / v.ms.median - 1.0)))
            .max_by(|a, b| a.2.abs().total_cmp(&b.2.abs()))
    }

    /// The measured numbers behind the headline.
    pub fn headline_figures(&self) -> Vec<HeadlineFigure> {
        let mut v = Vec::new();
        if let (Some((batch, best, _)), Some(first)) = (self.beyond_the_ring(), self.points.first()) {
            if let Some(ring) = first.variant(Variant::RingK) {
                v.push(HeadlineFigure::new(format!("{batch} tokens: {} over the all-streamed ring of K", best.variant.short()), "x", ring.ms.over(&best.ms)));
            }
        }
        if let (Some(first), Some(last)) = (self.points.first(), self.points.last()) {
            for p in [first, last] {
                if let (Some(best), Some(base)) = (p.best(), p.variant(Variant::Pageable)) {
                    v.push(HeadlineFigure::new(format!("{} tokens: speed-up over pageable copy-then-compute", p.batch), "x", base.ms.over(&best.ms)));
                }
            }
        }
        v
    }

    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = vec![(
            "network / GPU budget".into(),
            format!("{} / {} ({:.1}x)", Bytes(self.shape.network_bytes() as u64), Bytes((self.config.gpu_budget << 20) as u64), self.network_over_budget()),
        )];
        if let Some((batch, eff)) = self.worst_efficiency() {
            rows.push(("best pass against the bound, worst batch".into(), format!("{} at {batch} tokens", pct(eff))));
        }
        if let Some((v, batch, off)) = self.worst_prediction() {
            rows.push(("queue model's worst miss".into(), format!("{:+.1}% ({}, {batch} tokens)", 100.0 * off, v.label())));
        }
        if let Some((batch, best, x)) = self.beyond_the_ring() {
            rows.push(("best pass / all-streamed ring of K".into(), format!("{x:.2}x at {batch} tokens ({})", best.variant.label())));
        }
        if let Some((batch, budget, miss)) = self.worst_planner_miss() {
            rows.push(("planner's choice / best placement swept, worst".into(), format!("{:+.1}% ({budget} MiB, {batch} tokens)", 100.0 * miss)));
        }
        if let Some(a) = &self.fp8 {
            rows.push(("FP8: worst sampled row off the FP16 CPU reference".into(), format!("{:.3} (tolerance {:.2})", a.max_error, a.tolerance)));
        }
        let torch: [(&str, TorchPass); 3] = [
            ("PyTorch's .to() offload / best pass, worst batch", |p| p.torch_to_ms.as_ref()),
            ("PyTorch's hand-written ring / best pass, worst batch", |p| p.torch_ring_ms.as_ref()),
            ("PyTorch's fastest pass / best pass, worst batch", |p| p.torch_passes().into_iter().map(|t| t.1).min_by(|a, b| a.median.total_cmp(&b.median))),
        ];
        for (what, of) in torch {
            let ratios = self.points.iter().filter_map(|p| Some((p.batch, of(p)?.median / p.best()?.ms.median)));
            if let Some((batch, r)) = ratios.min_by(|a, b| a.1.total_cmp(&b.1)) {
                rows.push((what.into(), format!("{r:.2}x at {batch} tokens")));
            }
        }
        if let Some(c) = self.crossover_batch() {
            rows.push(("crossover batch (GEMMs = upload)".into(), format!("{c:.0} tokens")));
        }
        rows
    }

    pub fn summary(&self) -> String {
        let l = self.shape.layers;
        let mut s = format!(
            "network: {l} layers of d = {} ({} each, {} in all) in host memory; GPU: a ring of {} layers + activations = {} of a {} MiB budget (the network {:.1}x the budget); cuBLAS {}\n{}\n",
            self.shape.d,
            Bytes(self.shape.layer_bytes() as u64),
            Bytes(self.shape.network_bytes() as u64),
            self.config.ring,
            Bytes(self.gpu_bytes),
            self.config.gpu_budget,
            self.network_over_budget(),
            self.cublas,
            self.chose
        );
        s += "per layer alone (medians of its passes): upload from pinned / pageable memory, GEMMs + ReLU\n";
        s += "bound = L*max(upload, GEMMs) + min, each part at its fastest quarter (25th percentile of its passes)";
        if let Some(point) = self.upload_point() {
            let (up, at) = (&point.h2d_ms, format!(" at {} tokens", point.batch));
            s += &format!(
                "; the upload the run's one, {:.3} ms ({:.1} GB/s{at}): it moves the same {} at every batch",
                up.fast_end(),
                self.shape.layer_bytes() as f64 / up.fast_end() / 1e6,
                Bytes(self.shape.layer_bytes() as u64)
            );
        }
        s += "\nof bound: bound / the pass's median, and beside it what the middle half of its passes read\n";
        if let Some(m) = &self.machine {
            s += &format!(
                "the host, for the checker's queue model: a CPU thread resumes {:.1} µs after the GPU work it waited for; issuing one op takes {:.1} µs\n",
                m.wake_ms * 1e3,
                m.issue_ms * 1e3
            );
        }
        let mut effs = Vec::new();
        for p in &self.points {
            s += &format!(
                "\n{} tokens: upload {:.3} ms ({:.1} GB/s), pageable {:.3} ms, GEMMs {:.3} ms ({:.1} TFLOP/s) -> bound {:.2} ms ({}-bound)\n",
                p.batch,
                p.h2d_ms.median,
                self.shape.layer_bytes() as f64 / p.h2d_ms.median / 1e6,
                p.h2d_pageable_ms.median,
                p.layer_ms.median,
                self.shape.layer_flops(p.batch) / p.layer_ms.median / 1e9,
                self.bound_ms(p),
                if self.link_bound(p) { "link" } else { "compute" }
            );
            let mut parts = Vec::new();
            if let Some(f) = &p.layer_fused_ms {
                parts.push(format!("GEMMs with the ReLU fused {:.3} ms ({:.1} TFLOP/s)", f.median, self.shape.layer_flops(p.batch) / f.median / 1e9));
            }
            if let (Some(up), Some(l)) = (&p.h2d_fp8_ms, &p.layer_fp8_ms) {
                parts.push(format!(
                    "FP8 upload {:.3} ms ({:.1} GB/s), FP8 GEMMs {:.3} ms ({:.1} TFLOP/s)",
                    up.median,
                    self.shape.layer_bytes_in(Precision::Fp8) as f64 / up.median / 1e6,
                    l.median,
                    self.shape.layer_flops(p.batch) / l.median / 1e9
                ));
            }
            if !parts.is_empty() {
                s += &format!("  {}\n", parts.join("; "));
            }
            s += &format!("  {:<42} {:>10} {:>9} {:>12} {:>21} {:>12}\n", "variant", "ms", "spread", "tokens/s", "of its bound", "queue model");
            for v in &p.variants {
                let e = self.variant_efficiency(p, v);
                effs.extend(e);
                s += &format!(
                    "  {:<42} {:>10.2} {:>8.1}% {:>12.0} {:>21} {:>+11.1}%\n",
                    v.variant.label(),
                    v.ms.median,
                    100.0 * v.ms.relative_spread(),
                    Self::tokens_per_s(p.batch, v.ms.median),
                    e.map_or("-".into(), |e| e.cell()),
                    100.0 * (v.predicted_ms / v.ms.median - 1.0)
                );
            }
            for (label, t, like, resident) in p.torch_passes() {
                let e = self.efficiency_of(p, like.kind(), resident, t);
                effs.extend(e);
                s += &format!(
                    "  {:<42} {:>10.2} {:>8.1}% {:>12.0} {:>21}\n",
                    label,
                    t.median,
                    100.0 * t.relative_spread(),
                    Self::tokens_per_s(p.batch, t.median),
                    e.map_or("-".into(), |e| e.cell())
                );
            }
            for v in &p.variants {
                if let Some(plan) = &v.plan {
                    s += &format!("  {} ({}): {}\n", v.variant.short(), Bytes(plan.gpu_bytes as u64), plan.why);
                }
            }
            let gains: Vec<String> = Variant::STEPS
                .iter()
                .filter_map(|&(from, to)| {
                    let g = p.variant(from)?.ms.over(&p.variant(to)?.ms);
                    Some(format!("{} over {} {:.2}x ({:.2}-{:.2})", to.short(), from.short(), g.median, g.min, g.max))
                })
                .collect();
            s += &format!("  each step's gain, median (range of the passes): {}\n", gains.join("; "));
            if let Some(best) = p.best() {
                let beside: Vec<String> = p
                    .torch_passes()
                    .iter()
                    .map(|(what, t, ..)| format!("{:.2}x {}", t.median / best.ms.median, what.trim_start_matches("PyTorch: ")))
                    .collect();
                if !beside.is_empty() {
                    s += &format!("  best pass ({}) against PyTorch's: {}\n", best.variant.short(), beside.join(", "));
                }
            }
            if let (Some(ours), Some(theirs)) = (self.best_fp16_layer(p), p.torch_beyond.as_ref().and_then(|b| b.layer_fused.as_ref())) {
                s += &format!(
                    "  one FP16 layer alone: ours {:.3} ms ({}), PyTorch's fused-epilogue layer {:.3} ms: {:.2}x\n",
                    ours.1.median,
                    ours.0,
                    theirs.median,
                    theirs.median / ours.1.median
                );
            }
        }
        if !self.sweeps.is_empty() {
            s += "\nplacements under a budget (tokens/s against GPU memory; R resident layers, a ring of K):\n";
            s += &format!(
                "  {:>7} {:>9} {:<5} {:<28} {:>10} {:>12} {:>12} {:>12}\n",
                "tokens", "budget", "", "placement", "GPU mem", "ms", "tokens/s", "queue model"
            );
            for sw in &self.sweeps {
                for m in &sw.measured {
                    let mark = if m.placement == sw.plan.placement { "plan" } else { "" };
                    s += &format!(
                        "  {:>7} {:>5} MiB {:<5} {:<28} {:>10} {:>12.2} {:>12.0} {:>+11.1}%\n",
                        sw.batch,
                        sw.budget_mib,
                        mark,
                        format!("{} {}", if sw.kind == LayerKind::Fp8 { "FP8" } else { "FP16" }, m.placement.label()),
                        Bytes(self.shape.placement_bytes(sw.batch, m.placement, sw.kind.precision()) as u64).to_string(),
                        m.ms.median,
                        Self::tokens_per_s(sw.batch, m.ms.median),
                        100.0 * (m.predicted_ms / m.ms.median - 1.0)
                    );
                }
                if let (true, Some(miss), Some(best)) = (sw.is_grid(), sw.planner_miss(), sw.best()) {
                    let how = match &sw.head_to_head {
                        Some((planned, fastest)) => format!(", the two in turn: {:.2} against {:.2} ms", planned.median, fastest.median),
                        None => String::new(),
                    };
                    s += &format!(
                        "  {:>7} {:>5} MiB: the planner's choice is {:+.1}% from the best measured ({}{how})\n",
                        sw.batch,
                        sw.budget_mib,
                        100.0 * miss,
                        best.placement.label()
                    );
                }
            }
        }
        if let Some(a) = &self.fp8 {
            s += &format!(
                "\nFP8 (E4M3 weights and activations, one FP32 scale per tensor): every sampled row within {:.3} of the FP16 CPU reference (tolerance {:.2} at {} layers; {} passes); the largest activation took {:.0}% of its scale's range\n",
                a.max_error,
                a.tolerance,
                self.shape.layers,
                a.verified_passes,
                100.0 * a.range_used
            );
        } else if let Some(why) = &self.fp8_missing {
            s += &format!("\nno FP8 variant: {why}\n");
        }
        if let Some(why) = Efficiency::note(&effs) {
            s += &format!("\n{why}\n");
        }
        s += &match &self.torch {
            Ok(v) => format!("\nPyTorch {v} ran in the same run (crate/reference/torch_offload.py)\n"),
            Err(why) => format!("\nno PyTorch reference: {why}\n"),
        };
        s += &format!("every pass verified: {} passes, sampled rows within {:.1e} relative error of the CPU reference\n", self.verified_passes, self.max_error);
        s
    }
}

/// Lab 9 in the report: the tokens/s chart, the timeline (+ Chrome trace), the summary.
pub fn report(rec: &OffloadRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    use crate::present::chart::Chart;
    let mut files = rec.results.throughput_chart(origin).save(dir)?;
    files.extend(charts::timeline_chart(&rec.results, origin).save(dir)?);
    if let Some(g) = charts::beyond_chart(&rec.results, origin) {
        files.extend(g.save(dir)?);
    }
    if let Some(f) = charts::budget_chart(&rec.results, origin) {
        files.extend(f.save(dir)?);
    }
    let trace = dir.join(format!("{LAB}-timeline.trace.json"));
    rec.results.timeline.save_chrome_trace(&trace)?;
    files.push(trace);
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}", rec.results.summary()))?);
    Ok(files)
}

/// Notebook entry points for lab 9.
impl crate::lab_kit::LabRun<OffloadResults> {
    pub fn summary(&self) -> String {
        self.record.results.summary()
    }
    pub fn throughput_chart(&self) -> crate::present::chart::Figure {
        self.record.results.throughput_chart(&self.origin())
    }
    pub fn timeline_chart(&self) -> crate::present::gantt::Gantt {
        charts::timeline_chart(&self.record.results, &self.origin())
    }
    /// The passes past the streaming bound, traced (None in a recording made before them).
    pub fn beyond_chart(&self) -> Option<crate::present::gantt::Gantt> {
        charts::beyond_chart(&self.record.results, &self.origin())
    }
    /// Tokens/s against the GPU memory a placement holds (None without a sweep).
    pub fn budget_chart(&self) -> Option<crate::present::chart::Figure> {
        charts::budget_chart(&self.record.results, &self.origin())
    }
    /// Checks a learner's prefetch schedule: live on a GPU, else on the
    /// dry run and the queue model with this recording's costs.
    pub fn check_prefetch(
        &self,
        schedule: impl Fn(&mut dyn forward::Forward, &forward::Task) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        let schedule: forward::PassFn = std::sync::Arc::new(schedule);
        self.check(
            "prefetch schedule",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, r, schedule.clone()),
            || exercise::check_on_model(r, &*schedule),
        )
    }
}

impl crate::lab_kit::LabRun<OffloadResults> {
    /// Checks a placement under `budget_mib` MiB at `batch` tokens: R
    /// resident layers and a ring of K ([`exercise::check_placement`], on
    /// the queue model with this run's costs, live or recorded).
    pub fn check_placement(&self, budget_mib: usize, batch: usize, resident: usize, ring: usize) -> crate::lab_kit::check::CheckReport {
        exercise::check_placement(&self.record.results, budget_mib, batch, Placement { resident, ring }).answering(exercise::EXERCISES[1].id)
    }
}

/// Lab 9's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<OffloadConfig, OffloadResults> = crate::lab_kit::Entry {
    number: 9,
    name: LAB,
    module: module_path!(),
    teaches: "The capstone: a network bigger than the GPU's budget, its weights streamed over the link under cuBLAS GEMMs, then past that bound: resident layers, FP8 weights, fused epilogues",
    builds_on: &[(1, "pinned vs pageable"), (3, "double buffering with events"), (5, "stream priorities and graphs"), (6, "the stream-ordered pool")],
    kernels: &[&kernel::RELU_F16],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("layer, d, GEMM", "two FP16 matrix multiplications by cuBLAS (d x 4d, then 4d x d) with a ReLU between; d is the model's width"),
        crate::lab_kit::Word::new("GPU budget", "the GPU memory the lab lets itself use (--gpu-budget): the model's weights do not fit in it"),
        crate::lab_kit::Word::new("ring, slot, prefetch", "K layer buffers on the GPU reused in turn / one of them / a layer's upload issued while earlier layers compute"),
        crate::lab_kit::Word::new("tokens/s", "tokens (rows of a batch) through every layer per second"),
        crate::lab_kit::Word::new("link- / compute-bound, crossover", "uploads slower than the GEMMs / the other way round; the batch size where the two take as long"),
        crate::lab_kit::Word::new("epilogue, fused", "what a GEMM does as it writes its output (here the ReLU, or FP8's scaling) / done there, not by a kernel of its own"),
        crate::lab_kit::Word::new("resident, R / K", "a layer kept on the GPU for good / how many are, and the ring's slots for the rest; the planner picks both"),
        crate::lab_kit::Word::new("FP8, E4M3, scale, amax", "8-bit floats (4 exponent bits, 3 of mantissa) / a tensor's FP32 multiplier / its largest magnitude"),
    ],
    about: "Lab 9: stream a network's weights over the link through a ring of GPU buffers, then past that bound (resident layers, FP8 weights, fused epilogues), against PyTorch",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.summary(),
    figures: report,
    headline: OffloadResults::headline,
    headline_figures: OffloadResults::headline_figures,
    timelines: |rec, o| std::iter::once(charts::timeline_chart(&rec.results, o)).chain(charts::beyond_chart(&rec.results, o)).collect(),
    fixture: fixture::results,
};

crate::lab_config!(OffloadConfig);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab_kit::two_stage_bound_ms;

    #[test]
    fn the_bound_takes_the_runs_one_upload_at_its_best_and_each_batchs_gemms() {
        let r = crate::labs::offload::fixture::results();
        let (slow, fast) = (&r.points[0], &r.points[1]);
        // The link-bound batch's uploads ran slow (1.25 ms at their fastest
        // quarter): its bound still takes the run's 1.2 ms.
        assert_eq!((slow.h2d_ms.fast_end(), r.upload_ms().unwrap().fast_end()), (1.25, 1.2));
        assert_eq!(r.bound_parts(slow), (1.2, 0.6));
        assert_eq!(r.bound_ms(slow), two_stage_bound_ms(96, 1.2, 0.6));
        assert_eq!(r.bound_ms(fast), two_stage_bound_ms(96, 1.2, 1.8));
        assert!(r.link_bound(slow) && !r.link_bound(fast));
        let ring = &slow.variant(Variant::RingK).unwrap().ms;
        let e = r.efficiency(slow, ring);
        assert!((e.ratio - 1.0 / 1.03).abs() < 1e-12 && !e.above_bound(), "{e:?}");
        // GEMMs as long as an upload halfway between the two batches.
        assert_eq!(r.crossover_batch(), Some(4096.0 + 0.5 * 12288.0));
        let s = r.summary();
        assert!(s.contains("the upload the run's one, 1.200 ms (55.9 GB/s at 16384 tokens)"), "{s}");
        assert!(s.contains("4096 tokens: upload 1.300 ms") && s.contains("-> bound 115.80 ms (link-bound)"), "{s}");
        assert!(s.contains("97.1% (95.5..97.1)"), "the share with its passes' and its parts' spread: {s}");
        assert!(s.contains("the host, for the checker's queue model: a CPU thread resumes 6.0 µs"), "{s}");
        assert!(!s.contains("above 100%"), "{s}");
    }

    #[test]
    fn a_recording_made_before_quartiles_and_host_costs_still_renders() {
        let mut r = crate::labs::offload::fixture::results();
        r.machine = None;
        for p in &mut r.points {
            for s in [&mut p.h2d_ms, &mut p.layer_ms].into_iter().chain(p.variants.iter_mut().map(|v| &mut v.ms)) {
                s.middle = None;
            }
        }
        // Each part at its fastest run instead of its fastest quarter.
        assert_eq!(r.upload_ms().unwrap().fast_end(), 0.99 * 1.2);
        let s = r.summary();
        assert!(s.contains("4096 tokens") && s.contains("of bound") && !s.contains("the host, for the checker"), "{s}");
        let back: OffloadResults = serde_json::from_str(&serde_json::to_string(&r).unwrap().replace(",\"machine\":null", "")).unwrap();
        assert_eq!(back.machine, None);
    }

    #[test]
    fn every_preset_fits_its_budget_and_bad_settings_are_named() {
        for c in [OffloadConfig::default(), OffloadConfig::headline(), OffloadConfig::quick(), OffloadConfig::small()] {
            c.validate().unwrap();
        }
        for c in [OffloadConfig::default(), OffloadConfig::quick()] {
            let shape = Shape { layers: c.layers, d: c.d_model };
            assert!(shape.network_bytes() >= 4 * (c.gpu_budget << 20), "{c:?}: the network is four times the budget");
        }
        let full = OffloadConfig::default();
        let shape = Shape { layers: full.layers, d: full.d_model };
        assert!(shape.network_bytes() as f64 >= 3.0 * (full.gpu_budget << 20) as f64, "the network is several times the budget");
        let bad = |f: &dyn Fn(&mut OffloadConfig), what: &str| {
            let mut c = OffloadConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        bad(&|c| c.gpu_budget = 256, "--gpu-budget");
        bad(&|c| c.ring = 2, "--ring");
        bad(&|c| c.d_model = 100, "--d-model");
        bad(&|c| c.batches = vec![12], "--batches");
        bad(&|c| c.batches.clear(), "--batches");
    }
}
