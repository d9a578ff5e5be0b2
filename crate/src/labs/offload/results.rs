//! Lab 9's results ([`OffloadResults`]): per batch the costs alone and
//! each variant's passes beside the queue model ([`BatchPoint`]), the
//! placement sweep ([`PlacementSweep`]), the traced passes, FP8's
//! accuracy; and what they say: each pass against its bound (the parts
//! at their fast ends, the run's one upload), the crossover, the worst
//! misses of the planner and the queue model, and the queue model's
//! machine a check on them uses. The tables that print them are in
//! `tables`.
//!
//! May use: `network`, `config`, `forward` (the costs), `variant`,
//! `placement` (the planner's choice), `reference` (PyTorch's times),
//! `lab_kit`, `measure::stats`, `pipeline` and `gpu::MachineFacts` (the
//! host as measured, a record). No CUDA.

use super::config::OffloadConfig;
use super::forward::Costs;
use super::network::{budget_bytes, LayerKind, Placement, Precision, Shape};
use super::placement::PlacementPlan;
use super::reference::TorchBeyond;
use super::variant::Variant;
use crate::gpu::MachineFacts;
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::machine::Machine;
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

/// One precision's pass as planned at one batch, and the parts of its
/// bound ([`OffloadResults::precision_steps`]): where the bound sits as
/// a layer's bytes shrink.
#[derive(Clone, Debug, PartialEq)]
pub struct PrecisionStep {
    pub precision: Precision,
    /// Bytes a layer's weights take in it.
    pub layer_bytes: usize,
    pub placement: Placement,
    /// The pass as planned, measured.
    pub pass: Summary,
    /// Its streamed layers' uploads alone, back to back: streamed x one
    /// upload (the run's at its fast end), ms.
    pub link_ms: f64,
    /// Its layers alone: L x one layer (for 4 bits its dequantization and
    /// FP8 GEMMs), at the fast end, ms.
    pub layers_ms: f64,
    /// Of those, the dequantization alone (4 bits only): L x its fast end, ms.
    pub dequant_ms: Option<f64>,
    /// Its placement's bound ([`placement_bound_ms`]), ms.
    pub bound_ms: f64,
}

impl PrecisionStep {
    /// What bounds the pass: the link or the GPU's layers.
    pub fn bound_by(&self) -> &'static str {
        if self.link_ms >= self.layers_ms {
            "the link"
        } else if self.dequant_ms.is_some() {
            LayerKind::Int4.work()
        } else {
            "the GEMMs"
        }
    }
}

/// One of PyTorch's passes at a batch size, where it ran.
pub(super) type TorchPass = fn(&BatchPoint) -> Option<&Summary>;

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
    pub plan: Option<PlacementPlan>,
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
    /// One layer's upload from the 4-bit weights, alone, ms (where the rig has them).
    #[serde(default)]
    pub h2d_int4_ms: Option<Summary>,
    /// One 4-bit layer alone (its dequantization into E4M3, then FP8's
    /// GEMMs), ms.
    #[serde(default)]
    pub layer_int4_ms: Option<Summary>,
    /// One 4-bit layer's dequantization alone (both matrices into E4M3), ms.
    #[serde(default)]
    pub dequant_int4_ms: Option<Summary>,
    /// PyTorch's passes and layers past the streaming bound, where it ran.
    #[serde(default)]
    pub torch_beyond: Option<TorchBeyond>,
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
            LayerKind::Int4 => Some((self.h2d_int4_ms.as_ref()?, self.layer_int4_ms.as_ref()?)),
        }
    }
    /// The queue model's costs for `kind`'s layers here (the medians).
    pub fn costs(&self, kind: LayerKind) -> Option<Costs> {
        let (up, layer) = self.parts(kind)?;
        Some(Costs { h2d: up.median, h2d_pageable: self.h2d_pageable_ms.median, layer: layer.median })
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
    /// The 4-bit passes' accuracy against the CPU's FP8 pass over the
    /// bytes their dequantization writes (`measure::int4_tolerance`), and
    /// the worst sampled row against the FP16 CPU reference (what 4 bits
    /// cost, a figure, not a check), where they ran; else why not
    /// (`int4_missing`).
    #[serde(default)]
    pub int4: Option<Int4Accuracy>,
    #[serde(default)]
    pub int4_missing: Option<String>,
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
    /// What a row may be off (`measure::fp8_tolerance` for this depth).
    pub tolerance: f64,
    /// The largest share of E4M3's range an activation took (its amax over
    /// what its scale reaches): at most 1, or values were clipped.
    pub range_used: f64,
    pub verified_passes: usize,
}

/// The 4-bit passes' accuracy (see [`OffloadResults::int4`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Int4Accuracy {
    /// Against the CPU's FP8 pass over the same E4M3 bytes, within `tolerance`.
    pub max_error: f64,
    pub tolerance: f64,
    /// The worst sampled row against the FP16 CPU reference.
    pub off_fp16: f64,
    /// The largest share of E4M3's range an activation took.
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
    pub plan: PlacementPlan,
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
        self.shape.network_bytes() as f64 / budget_bytes(self.config.gpu_budget) as f64
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
    pub(super) fn upload_point(&self) -> Option<&BatchPoint> {
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
    /// Whether the run measured `kind`'s layers (their upload and their
    /// time alone) at `batch`.
    pub fn has_layers_at(&self, batch: usize, kind: LayerKind) -> bool {
        self.points.iter().any(|p| p.batch == batch && p.parts(kind).is_some())
    }
    /// At `p`, each precision's pass as the planner placed it (FP16 fused
    /// layers, FP8, 4 bits; those the run measured), with its bound's parts.
    pub fn precision_steps(&self, p: &BatchPoint) -> Vec<PrecisionStep> {
        [Variant::Resident, Variant::Fp8, Variant::Int4]
            .into_iter()
            .filter_map(|variant| {
                let v = p.variant(variant)?;
                let placement = v.plan.as_ref()?.placement;
                let kind = variant.kind();
                let (up, layer) = (self.run_upload_of(p, kind)?.fast_end(), p.parts(kind)?.1.fast_end());
                let l = self.shape.layers;
                let bound_ms = self.bound_of_ms(p, kind, placement.resident)?;
                Some(PrecisionStep {
                    precision: kind.precision(),
                    layer_bytes: self.shape.layer_bytes_in(kind.precision()),
                    placement,
                    pass: v.ms,
                    link_ms: l.saturating_sub(placement.resident) as f64 * up,
                    layers_ms: l as f64 * layer,
                    dequant_ms: (kind == LayerKind::Int4).then(|| p.dequant_int4_ms.as_ref().map(|d| l as f64 * d.fast_end())).flatten(),
                    bound_ms,
                })
            })
            .collect()
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
    /// The queue model's machine for a check on these results: their
    /// copy engines and the host's wake-up and issue costs as measured;
    /// with the line a check says where a recording made before lab 9
    /// kept them has none (its waits and issues are then free).
    pub fn checker_machine(&self) -> (Machine, Option<&'static str>) {
        match &self.machine {
            Some(host) => (Machine { copy_engines: self.copy_engines, ..host.machine() }, None),
            None => (
                Machine::engines(self.copy_engines),
                Some("this recording has no measured host costs (made before lab 9 kept them): the queue model counts a CPU wait's wake-up and each op's issue as free"),
            ),
        }
    }
}
