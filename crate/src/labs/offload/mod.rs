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
//! Six variants, each a pass on the one runner ([`Variant`]): pageable
//! weights copied then computed, pinned copied then computed, a ring of 2
//! on a copy stream ordered by events, a ring of K with the copy stream at
//! high priority, that pass captured as a CUDA graph, and that pass with
//! its hidden activations from the stream-ordered pool. Each is predicted
//! by the queue model from the costs measured alone (the pass recorded on
//! the dry run, no GPU), verified against the CPU on sampled rows
//! ([`cpu`]), and set beside PyTorch in the same run ([`mod@reference`]).
//! The exercise ([`exercise`]) has the learner write the ring's prefetch
//! schedule. [`measure::run`] runs it all; [`charts`] draws it.
//!
//! May use: what every lab may (see `labs`).

pub mod charts;
pub mod cpu;
pub mod exercise;
pub mod forward;
pub mod kernel;
pub mod measure;
pub mod reference;
pub mod rig;

use crate::error::{LabError, Result};
use crate::gpu::MachineFacts;
use crate::lab_kit::check::pct;
use crate::lab_kit::headline::HeadlineFigure;
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::timeline::Timeline;
use crate::units::Bytes;
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
        slots * self.layer_bytes() + 2 * self.act_bytes(batch) + self.hidden_bytes(batch) + crate::gpu::blas::WORKSPACE_BYTES
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
    /// Layers of the network (fewer where host memory cannot hold two
    /// copies of the weights: the run says what it chose).
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
        OffloadConfig { batches: ends, repeats: 3, python: String::new(), ..full }
    }
    /// The notebook's live run: a narrower network (d = 1024) under a
    /// smaller budget, still four times the budget, both sides of the crossover.
    pub fn quick() -> Self {
        OffloadConfig { d_model: 1024, gpu_budget: 384, batches: vec![2048, 8192, 24576], repeats: 3, ..Self::default() }
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
            ..Self::default()
        }
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
}

impl Variant {
    pub const ALL: [Variant; 6] = [Variant::Pageable, Variant::Pinned, Variant::Ring2, Variant::RingK, Variant::Graph, Variant::Pool];
    pub fn label(self) -> &'static str {
        match self {
            Variant::Pageable => "pageable, copy then compute",
            Variant::Pinned => "pinned, copy then compute",
            Variant::Ring2 => "ring of 2, copy stream + events",
            Variant::RingK => "ring of K, high-priority copy stream",
            Variant::Graph => "ring of K as one CUDA graph",
            Variant::Pool => "ring of K, activations from the pool",
        }
    }
    /// Each step of the lesson: (the pass before, the pass that improves on it).
    pub const STEPS: [(Variant, Variant); 5] = [
        (Variant::Pageable, Variant::Pinned),
        (Variant::Pinned, Variant::Ring2),
        (Variant::Ring2, Variant::RingK),
        (Variant::RingK, Variant::Graph),
        (Variant::RingK, Variant::Pool),
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
        }
    }
    /// Slots of the ring it uses (`k`: the ring's size).
    pub fn slots(self, k: usize) -> usize {
        match self {
            Variant::Pageable | Variant::Pinned => 1,
            Variant::Ring2 => 2,
            _ => k,
        }
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
}

impl BatchPoint {
    pub fn variant(&self, v: Variant) -> Option<&VariantPoint> {
        self.variants.iter().find(|p| p.variant == v)
    }
    /// The fastest variant here (by median).
    pub fn best(&self) -> Option<&VariantPoint> {
        self.variants.iter().min_by(|a, b| a.ms.median.total_cmp(&b.ms.median))
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
    /// The best variant's share of the bound at every batch size, lowest first.
    pub fn worst_efficiency(&self) -> Option<(usize, f64)> {
        self.points.iter().filter_map(|p| p.best().map(|b| (p.batch, self.efficiency(p, &b.ms).ratio))).min_by(|a, b| a.1.total_cmp(&b.1))
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
        let torch: [(&str, TorchPass); 2] = [
            ("PyTorch's .to() offload / best pass, worst batch", |p| p.torch_to_ms.as_ref()),
            ("PyTorch's hand-written ring / best pass, worst batch", |p| p.torch_ring_ms.as_ref()),
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
            s += &format!("  {:<40} {:>10} {:>9} {:>12} {:>21} {:>12}\n", "variant", "ms", "spread", "tokens/s", "of bound", "queue model");
            for v in &p.variants {
                let e = self.efficiency(p, &v.ms);
                effs.push(e);
                s += &format!(
                    "  {:<40} {:>10.2} {:>8.1}% {:>12.0} {:>21} {:>+11.1}%\n",
                    v.variant.label(),
                    v.ms.median,
                    100.0 * v.ms.relative_spread(),
                    Self::tokens_per_s(p.batch, v.ms.median),
                    e.cell(),
                    100.0 * (v.predicted_ms / v.ms.median - 1.0)
                );
            }
            for (label, t) in [("PyTorch: .to(\"cuda\") per layer in hooks", &p.torch_to_ms), ("PyTorch: hand-written pinned ring", &p.torch_ring_ms)] {
                if let Some(t) = t {
                    let e = self.efficiency(p, t);
                    effs.push(e);
                    s += &format!(
                        "  {:<40} {:>10.2} {:>8.1}% {:>12.0} {:>21}\n",
                        label,
                        t.median,
                        100.0 * t.relative_spread(),
                        Self::tokens_per_s(p.batch, t.median),
                        e.cell()
                    );
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
            if let (Some(best), Some(to), Some(ring)) = (p.best(), &p.torch_to_ms, &p.torch_ring_ms) {
                s += &format!(
                    "  best pass: {:.2}x PyTorch's .to() offload, {:.2}x its hand-written ring\n",
                    to.median / best.ms.median,
                    ring.median / best.ms.median
                );
            }
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

/// Lab 9's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<OffloadConfig, OffloadResults> = crate::lab_kit::Entry {
    number: 9,
    name: LAB,
    module: module_path!(),
    teaches: "The capstone: a network bigger than the GPU's budget, its weights streamed over the link under cuBLAS GEMMs",
    builds_on: &[(1, "pinned vs pageable"), (3, "double buffering with events"), (5, "stream priorities and graphs"), (6, "the stream-ordered pool")],
    kernels: &[&kernel::RELU_F16],
    exercises: exercise::EXERCISES,
    about: "Lab 9: stream a network's weights over the link through a ring of GPU buffers, against the bound and PyTorch",
    measure: measure::run,
    tables: |rec| rec.results.summary(),
    figures: report,
    headline: OffloadResults::headline,
    headline_figures: OffloadResults::headline_figures,
    timelines: |rec, o| vec![charts::timeline_chart(&rec.results, o)],
};

crate::lab_config!(OffloadConfig);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab_kit::two_stage_bound_ms;

    #[test]
    fn the_bound_takes_the_runs_one_upload_at_its_best_and_each_batchs_gemms() {
        let r = crate::testing::offload_results();
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
        let mut r = crate::testing::offload_results();
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
