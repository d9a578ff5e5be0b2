//! Lab 8: several GPUs — peer copies, cross-GPU events, communication
//! overlapping compute.
//!
//! Every part is a plan of the pipeline vocabulary, run verified by the
//! GPU's executor over the lab's GPUs (`gpu::PlanRig::over`) and by the
//! queue model, which knows each GPU's engines and the link between them:
//!
//! * [`peer`]: a copy from one GPU to another, one way and both ways at
//!   once, and staged through pinned host memory (what it costs without
//!   peer access), by size, beside the host link and PyTorch's own copy
//!   between the same GPUs ([`mod@reference`]);
//! * [`four_way`]: an upload, a download, a copy to the other GPU of the
//!   first pair and a kernel on one GPU at once, against the longest of
//!   them alone;
//! * [`pipeline_parallel`]: a stage on each GPU over micro-batches,
//!   ordered by events across the GPUs only, its bubble against
//!   (S−1)/(M+S−1); the exercise ([`exercise`]) has the learner schedule it;
//! * [`all_reduce`]: data-parallel gradients summed by NCCL, after the
//!   backward pass or bucket by bucket beside it, by bucket size.
//!
//! The lab runs on every GPU from `--device` on (`--gpus N` of them); the
//! copies and the four-way overlap use the first two. With one GPU the lab
//! runs what one GPU can (copies within it, the four operations with a
//! copy within it, two stages on it), says so, and skips
//! the all-reduce; the notebook shows a two-GPU recording where there is one.
//! [`measure::run`] runs it all; [`charts`] draws it.
//!
//! May use: what every lab may (see `labs`).

pub mod all_reduce;
pub mod charts;
pub mod exercise;
pub mod four_way;
pub mod measure;
pub mod peer;
pub mod pipeline_parallel;
pub mod reference;
pub mod training;

use crate::error::{LabError, Result};
use crate::gpu::topology::Topology;
use crate::lab_kit::check::pct;
use crate::measure::stats::Summary;
#[cfg(test)]
use crate::pipeline::op::{Link, OpKind};
use crate::pipeline::timeline::Timeline;
use crate::units::{fmt_ms, Bytes};
use measure::{AllReducePoint, BubblePoint, FourWay, PeerPoint};
use reference::TorchPeer;
use serde::{Deserialize, Serialize};

pub const LAB: &str = "multi-gpu";

/// The lab's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct MultiGpuConfig {
    #[arg(skip)]
    pub device: usize,
    /// How many GPUs the lab runs on: --device and the ones after it
    /// (wrapping), two at least. Copies and the four-way overlap use the
    /// first two; the pipeline has a stage on each, the all-reduce a rank
    /// on each. Default: every GPU this machine has.
    #[arg(long)]
    #[serde(default)]
    pub gpus: Option<usize>,
    /// Sizes of the copies between GPUs, comma-separated, MiB if no unit
    /// is given (1,16,1GiB).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().sizes_mib)]
    pub sizes_mib: Vec<usize>,
    /// Copies (rounds, training steps) in a long run: each is timed as the
    /// long run minus a run of one, over one fewer.
    #[arg(long, default_value_t = MultiGpuConfig::default().copies)]
    pub copies: usize,
    /// Timed runs of each measurement, after one untimed run.
    #[arg(long, default_value_t = MultiGpuConfig::default().repeats)]
    pub repeats: usize,
    /// Chunks of the copy staged through pinned host memory.
    #[arg(long, default_value_t = MultiGpuConfig::default().staging_chunks)]
    pub staging_chunks: usize,
    /// What each of the four operations of the four-way overlap moves or
    /// computes, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().four_way_mib)]
    pub four_way_mib: usize,
    /// The pipeline's data, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().pipeline_mib)]
    pub pipeline_mib: usize,
    /// How long one stage takes over all of the pipeline's data, ms (its
    /// kernel is calibrated to it; each micro-batch takes its share).
    #[arg(long, default_value_t = MultiGpuConfig::default().stage_ms)]
    pub stage_ms: f64,
    /// Micro-batch counts of the bubble sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = MultiGpuConfig::default().micro_batches)]
    pub micro_batches: Vec<usize>,
    /// Gradients on each GPU, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().grad_mib)]
    pub grad_mib: usize,
    /// Bucket sizes of the all-reduce sweep, comma-separated, MiB if no
    /// unit is given (each divides --grad-mib).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().buckets_mib)]
    pub buckets_mib: Vec<usize>,
    /// The backward pass's compute against its all-reduces at the largest
    /// bucket: 2 makes the kernels twice as long as the communication
    /// there. NCCL moves small buckets at a fraction of its speed on large
    /// ones, so a ratio near 1 leaves the small buckets' sums longer than
    /// their layers, and nothing could hide them.
    #[arg(long, default_value_t = MultiGpuConfig::default().compute_ratio)]
    pub compute_ratio: f64,
    /// Message sizes of the all-reduce's bus-bandwidth sweep,
    /// comma-separated, MiB if no unit is given (1,64,1GiB); PyTorch's
    /// all_reduce runs the same sizes on the same GPUs.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().all_reduce_mib)]
    #[serde(default = "MultiGpuConfig::default_all_reduce_mib")]
    pub all_reduce_mib: Vec<usize>,
    /// The SMs NCCL's kernels may take beside the layers, swept: each
    /// setting a communicator of its own ("default" for NCCL's choice, 8
    /// for at most 8 CTAs, 2-8 for 2 to 8), comma-separated.
    #[arg(long, value_name = "CTAS", value_delimiter = ',', default_values = ["default", "32", "24", "16", "12"])]
    #[serde(default = "MultiGpuConfig::default_nccl_ctas")]
    pub nccl_ctas: Vec<crate::gpu::nccl::NcclCtas>,
    /// The Python that has PyTorch, for the reference copy between the same GPUs.
    #[arg(long, default_value_t = MultiGpuConfig::default().python)]
    pub python: String,
    /// Skip PyTorch's reference copy.
    #[arg(long)]
    pub no_reference: bool,
}

impl Default for MultiGpuConfig {
    fn default() -> Self {
        MultiGpuConfig {
            device: 0,
            gpus: None,
            sizes_mib: vec![1, 4, 16, 64],
            copies: 8,
            repeats: 7,
            staging_chunks: 8,
            four_way_mib: 64,
            pipeline_mib: 64,
            stage_ms: 20.0,
            micro_batches: vec![1, 2, 4, 8, 16, 32],
            grad_mib: 512,
            buckets_mib: vec![4, 8, 16, 32, 64],
            compute_ratio: 2.0,
            all_reduce_mib: Self::default_all_reduce_mib(),
            nccl_ctas: Self::default_nccl_ctas(),
            python: "python3".into(),
            no_reference: false,
        }
    }
}

impl MultiGpuConfig {
    fn default_all_reduce_mib() -> Vec<usize> {
        vec![1, 4, 16, 64, 256, 1024]
    }
    fn default_nccl_ctas() -> Vec<crate::gpu::nccl::NcclCtas> {
        use crate::gpu::nccl::NcclCtas;
        [None, Some(32), Some(24), Some(16), Some(12)].map(|c| c.map_or(NcclCtas::Default, NcclCtas::at_most)).to_vec()
    }
    /// The headline's sizes (the largest copy) with one below, fewer repeats.
    pub fn headline() -> Self {
        MultiGpuConfig { sizes_mib: vec![4, 64], repeats: 5, ..Self::default() }
    }
    /// The notebook's run.
    pub fn quick() -> Self {
        MultiGpuConfig {
            sizes_mib: vec![4, 64],
            copies: 6,
            repeats: 5,
            four_way_mib: 32,
            pipeline_mib: 32,
            stage_ms: 10.0,
            micro_batches: vec![1, 2, 4, 8, 16],
            grad_mib: 64,
            buckets_mib: vec![4, 16, 64],
            all_reduce_mib: vec![4, 64],
            nccl_ctas: vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(16)],
            ..Self::default()
        }
    }
    /// Every code path, small (for compute-sanitizer and smoke tests). The
    /// copies stay at 32 MiB: under compute-sanitizer each API call is
    /// slowed, so the gaps between runs drown a copy of a microsecond.
    pub fn small() -> Self {
        MultiGpuConfig {
            sizes_mib: vec![32],
            copies: 4,
            repeats: 2,
            staging_chunks: 2,
            four_way_mib: 2,
            pipeline_mib: 2,
            stage_ms: 2.0,
            micro_batches: vec![1, 4],
            grad_mib: 4,
            buckets_mib: vec![1, 2],
            all_reduce_mib: vec![1],
            nccl_ctas: vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(2)],
            no_reference: true,
            ..Self::default()
        }
    }
    pub fn validate(&self) -> Result<()> {
        let mib = |what: &str, v: usize| {
            if v == 0 || v > 16384 {
                Err(LabError::config(format!("{what} must be 1-16384 MiB (got {v})")))
            } else {
                Ok(())
            }
        };
        if self.sizes_mib.is_empty() {
            return Err(LabError::config("--sizes-mib must list at least one size"));
        }
        for &s in &self.sizes_mib {
            mib("--sizes-mib", s)?;
        }
        mib("--four-way-mib", self.four_way_mib)?;
        mib("--pipeline-mib", self.pipeline_mib)?;
        mib("--grad-mib", self.grad_mib)?;
        if self.copies < 2 || self.copies > 1000 {
            return Err(LabError::config(format!("--copies must be 2-1000: a copy is timed as a run of that many minus a run of one (got {})", self.copies)));
        }
        if self.repeats == 0 || self.repeats > 1000 {
            return Err(LabError::config(format!("--repeats must be 1-1000 (got {})", self.repeats)));
        }
        let smallest = self.sizes_mib.iter().min().copied().unwrap_or(1) << 18;
        if self.staging_chunks == 0 || self.staging_chunks > 1024 || smallest < 2 * self.staging_chunks {
            return Err(LabError::config(format!(
                "--staging-chunks must be 1-1024 and leave at least 8 bytes a chunk of the smallest --sizes-mib (got {})",
                self.staging_chunks
            )));
        }
        if !(self.stage_ms > 0.0 && self.stage_ms <= 10_000.0) {
            return Err(LabError::config(format!("--stage-ms must be more than 0 and at most 10000 ms (got {})", self.stage_ms)));
        }
        let elements = self.pipeline_mib << 18;
        if self.micro_batches.is_empty() || self.micro_batches.iter().any(|&m| m == 0 || m > 4096 || 2 * m > elements) {
            return Err(LabError::config(format!("--micro-batches must list counts of 1-4096 (got {:?})", self.micro_batches)));
        }
        if self.buckets_mib.is_empty() || self.buckets_mib.iter().any(|&b| b == 0 || b > self.grad_mib || self.grad_mib % b != 0) {
            return Err(LabError::config(format!(
                "--buckets-mib must list bucket sizes that divide --grad-mib {} evenly (got {:?})",
                self.grad_mib, self.buckets_mib
            )));
        }
        if self.all_reduce_mib.is_empty() {
            return Err(LabError::config("--all-reduce-mib must list at least one size"));
        }
        for &m in &self.all_reduce_mib {
            mib("--all-reduce-mib", m)?;
        }
        if self.nccl_ctas.first() != Some(&crate::gpu::nccl::NcclCtas::Default) {
            return Err(LabError::config(format!(
                "--nccl-ctas must start with default (NCCL's own choice, what the other settings are compared with): got {}",
                self.nccl_ctas.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        for c in &self.nccl_ctas {
            c.check()?;
        }
        if !(0.05..=20.0).contains(&self.compute_ratio) {
            return Err(LabError::config(format!("--compute-ratio must be 0.05-20 (got {})", self.compute_ratio)));
        }
        if let Some(n) = self.gpus.filter(|&n| !(2..=64).contains(&n)) {
            return Err(LabError::config(format!(
                "--gpus must be 2-64 (got {n}): the lab runs over several GPUs; on a machine with one, leave --gpus out and it runs what one GPU can"
            )));
        }
        Ok(())
    }

    /// The lab's GPUs (ordinals) on a machine of `found` GPUs: --device and
    /// the ones after it, wrapping, --gpus of them (default: all); just
    /// --device on a machine with one.
    pub fn lab_gpus(&self, found: usize) -> Result<Vec<usize>> {
        let n = match self.gpus {
            Some(n) if n > found => {
                return Err(LabError::config(format!("--gpus {n}: this machine has {found} GPU(s)")));
            }
            Some(n) => n,
            None => found.max(1),
        };
        Ok((0..n).map(|k| (self.device + k) % found.max(1)).collect())
    }
}

crate::lab_config!(MultiGpuConfig);

/// The pipeline's sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineResults {
    /// Its stages: one per GPU (two, sharing it, on a machine with one).
    #[serde(default = "two_stages")]
    pub stages: usize,
    /// FMAs per element of the stage kernel.
    pub iterations: i32,
    /// One stage's kernel over all the data alone, ms.
    pub stage_ms: Summary,
    pub points: Vec<BubblePoint>,
    /// One run at [`PipelineResults::drawn`] micro-batches.
    pub timeline: Option<Timeline>,
    /// Training, forward and backward, in each order (none in
    /// recordings made before the lab had them).
    #[serde(default)]
    pub training: Vec<TrainingSweep>,
}

/// One training order's bubble by micro-batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingSweep {
    /// Recorded as `schedule`, the literature's word for it.
    #[serde(rename = "schedule")]
    pub order: training::TrainingOrder,
    pub points: Vec<BubblePoint>,
    /// One run at [`PipelineResults::drawn`] micro-batches.
    pub timeline: Option<Timeline>,
}

impl PipelineResults {
    /// The micro-batch count whose run is drawn: the largest up to 8.
    pub fn drawn(micro_batches: &[usize]) -> usize {
        micro_batches.iter().copied().filter(|&m| m <= 8).max().or_else(|| micro_batches.iter().copied().min()).unwrap_or(1)
    }
}

/// Recordings made before the pipeline had a stage per GPU had two.
fn two_stages() -> usize {
    2
}

/// The gradient all-reduce's sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllReduceResults {
    pub nccl_version: String,
    pub ranks: usize,
    /// The layer kernel's FMAs per element.
    pub iterations: i32,
    /// The bucket sweep with NCCL's own choice of CTAs.
    pub points: Vec<AllReducePoint>,
    /// One overlapped step at the middle bucket size.
    pub timeline: Option<Timeline>,
    /// One all-reduce alone by message size, ms (none in recordings made
    /// before the lab swept sizes).
    #[serde(default)]
    pub sizes: Vec<(u64, Summary)>,
    /// PyTorch's all_reduce at the same sizes on the same GPUs, or why
    /// there is none.
    #[serde(default)]
    pub torch: Option<std::result::Result<reference::TorchAllReduce, String>>,
    /// The bucket sweep again under each capped CTA setting, the layers
    /// calibrated once (so that steps compare across settings).
    #[serde(default)]
    pub capped: Vec<CtaSweep>,
    /// The CTA settings this NCCL could not make, each with why.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// Said when NCCL_MAX_CTAS or NCCL_MIN_CTAS is set: it overrides every
    /// setting of the sweep.
    #[serde(default)]
    pub env_override: Option<String>,
}

/// The bucket sweep under one CTA setting of NCCL's communicators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CtaSweep {
    pub ctas: crate::gpu::nccl::NcclCtas,
    pub points: Vec<AllReducePoint>,
}

impl AllReduceResults {
    /// The point that hid the most communication among those whose
    /// compute is at least as long as their communication (NCCL's own
    /// choice of CTAs).
    pub fn best(&self) -> Option<&AllReducePoint> {
        best_of(&self.points)
    }
    /// Every CTA setting's sweep, NCCL's own choice first.
    pub fn sweeps(&self) -> Vec<(crate::gpu::nccl::NcclCtas, &[AllReducePoint])> {
        std::iter::once((crate::gpu::nccl::NcclCtas::Default, &self.points[..])).chain(self.capped.iter().map(|c| (c.ctas, &c.points[..]))).collect()
    }
    /// The setting chosen by measurement: the one under which the overlap
    /// hid the most of the communication, at its best bucket (where
    /// compute is at least as long as the communication), with that point.
    /// (Not the shortest step: a step's layers run faster in fewer, larger
    /// kernels, so the shortest step is the largest bucket's, whatever NCCL
    /// takes.)
    pub fn chosen(&self) -> Option<(crate::gpu::nccl::NcclCtas, &AllReducePoint)> {
        self.sweeps().into_iter().filter_map(|(c, pts)| best_of(pts).map(|p| (c, p))).max_by(|a, b| a.1.hidden().total_cmp(&b.1.hidden()))
    }
    /// Bus bandwidth by size, GB/s (medians): ours and PyTorch's where it ran.
    pub fn bus_by_size(&self) -> Vec<(u64, f64, Option<f64>)> {
        let torch = self.torch.as_ref().and_then(|t| t.as_ref().ok()).map(reference::TorchAllReduce::bus_gbps).unwrap_or_default();
        self.sizes
            .iter()
            .map(|&(bytes, ms)| {
                let theirs = torch.iter().find(|(b, _)| *b == bytes).map(|(_, s)| s.median);
                (bytes, all_reduce::bus_gbps(bytes as f64, ms.median, self.ranks), theirs)
            })
            .collect()
    }
}

/// Among `points`, the one that hid the most communication where compute
/// is at least as long as the communication.
fn best_of(points: &[AllReducePoint]) -> Option<&AllReducePoint> {
    points.iter().filter(|p| p.compute_ms() >= p.comm_ms()).max_by(|a, b| a.hidden().total_cmp(&b.hidden()))
}

/// The lab's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiGpuResults {
    pub config: MultiGpuConfig,
    /// Every GPU of the machine and the path between each pair.
    pub topology: Topology,
    /// The GPUs the lab ran on (ordinals): --device, then the ones after
    /// it ([`MultiGpuConfig::lab_gpus`]).
    pub gpus: Vec<usize>,
    /// Copies to the second GPU (within GPU 0 with one), by size.
    pub peer: Vec<PeerPoint>,
    /// Every GPU copying to the next at once at the largest size, against
    /// each copy alone (three GPUs or more).
    #[serde(default)]
    pub ring: Option<measure::RingPoint>,
    /// PyTorch's copy between the same GPUs at the largest size, or why there is none.
    pub torch: std::result::Result<TorchPeer, String>,
    pub four_way: FourWay,
    /// One round of the four at once.
    pub four_way_timeline: Option<Timeline>,
    pub pipeline: PipelineResults,
    /// The gradient all-reduce, or why it was skipped (one GPU, no NCCL).
    pub all_reduce: std::result::Result<AllReduceResults, String>,
}

impl MultiGpuResults {
    /// Whether the lab ran on two GPUs or more (else copies within one GPU).
    pub fn several_gpus(&self) -> bool {
        self.gpus.len() > 1
    }
    /// "stage 0 on GPU 0, stage 1 on GPU 1", or "both stages on GPU 0"
    /// with one GPU (the machine's numbers).
    pub fn stages_placed(&self) -> String {
        match self.gpus[..] {
            [a] => format!("both stages on GPU {a}"),
            [] => "no GPU".into(),
            _ => self.gpus.iter().enumerate().map(|(s, g)| format!("stage {s} on GPU {g}")).collect::<Vec<_>>().join(", "),
        }
    }
    /// What joins the lab's GPUs, as the driver and NVML tell it: one
    /// line for every pair where all pairs are alike ("NVLink x18, peer
    /// access"), else each pair's.
    pub fn links(&self) -> String {
        let pairs: Vec<(usize, usize)> = self.gpus.iter().enumerate().flat_map(|(i, &a)| self.gpus[i + 1..].iter().map(move |&b| (a, b))).collect();
        let each: Vec<String> = pairs.iter().map(|&(a, b)| self.path_line(a, b)).collect();
        match &each[..] {
            [] => "one GPU".into(),
            [one] => one.clone(),
            [first, ..] if each.iter().all(|e| e == first) => format!("every pair {first}"),
            _ => pairs.iter().zip(&each).map(|((a, b), e)| format!("{a}-{b}: {e}")).collect::<Vec<_>>().join("; "),
        }
    }
    /// "GPU 0 -> GPU 1 (NVLink x18, peer access)", or over more GPUs
    /// "GPUs 0, 1, 2, 3 (every pair …); copies and the four-way overlap
    /// GPU 0 -> GPU 1".
    pub fn gpus_line(&self) -> String {
        if self.gpus.len() > 2 {
            let list: Vec<String> = self.gpus.iter().map(|g| g.to_string()).collect();
            format!("GPUs {} ({}); copies and the four-way overlap {}", list.join(", "), self.links(), self.pair())
        } else {
            format!("{} ({})", self.pair(), self.link())
        }
    }
    /// "GPU 0 -> GPU 1", or "within GPU 0" with one GPU.
    pub fn pair(&self) -> String {
        match self.gpus[..] {
            [a, b, ..] => format!("GPU {a} -> GPU {b}"),
            [a] => format!("within GPU {a}"),
            [] => "no GPU".into(),
        }
    }
    /// The link between the lab's first two GPUs (the copies' pair), as
    /// the driver and NVML tell it.
    pub fn link(&self) -> String {
        match self.gpus[..] {
            [a, b, ..] => self.path_line(a, b),
            _ => "one GPU".into(),
        }
    }
    /// "NVLink x18, peer access": the path between GPUs `a` and `b`.
    fn path_line(&self, a: usize, b: usize) -> String {
        self.topology
            .path(a, b)
            .map_or("unknown".into(), |p| format!("{}, {}", p.link, if p.can_access { "peer access" } else { "no peer access: copies go through host memory" }))
    }
    /// The largest size's point.
    pub fn largest(&self) -> Option<&PeerPoint> {
        self.peer.iter().max_by_key(|p| p.bytes)
    }
    /// Ours over PyTorch's at the largest size: (one way, both ways).
    pub fn against_torch(&self) -> Option<(f64, f64)> {
        let (ours, torch) = (self.largest()?, self.torch.as_ref().ok()?);
        Some((ours.one_way.median / torch.one_way.median, ours.both_ways.median / torch.both_ways.median))
    }
    /// The bubble point at `m` micro-batches.
    pub fn bubble(&self, m: usize) -> Option<&BubblePoint> {
        self.pipeline.points.iter().find(|p| p.micro_batches == m)
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let mut out = self.topology.describe();
        out += &format!("the lab's GPUs: {}\n", self.gpus_line());
        if !self.several_gpus() {
            out += "ONE GPU: the copies below are within GPU 0, the pipeline's two stages share it, and the all-reduce needs two GPUs; the notebook shows a two-GPU recording where there is one\n";
        }
        out += &self.peer_lines();
        out += &self.four_way_lines();
        out += &self.pipeline_lines();
        out += &self.all_reduce_lines();
        out
    }

    fn peer_lines(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "\ncopies {} (GB/s, median and 25%..75% of {} runs; each copy timed as {} copies minus one, over {}):\n",
            self.pair(),
            c.repeats,
            c.copies,
            c.copies - 1
        );
        out += &format!("  {:>9} {:>22} {:>22} {:>22} {:>22}\n", "size", "one way", "both ways", "staged via host", "host link (H2D)");
        let cell = |s: &Summary| {
            let (lo, hi) = s.middle_range();
            format!("{:.1} ({:.1}..{:.1})", s.median, lo, hi)
        };
        for p in &self.peer {
            out += &format!(
                "  {:>9} {:>22} {:>22} {:>22} {:>22}\n",
                Bytes(p.bytes).to_string(),
                cell(&p.one_way),
                cell(&p.both_ways),
                cell(&p.staged),
                cell(&p.host)
            );
        }
        out += "  (both ways: the bytes that crossed in both directions per second; staged: down to pinned host memory and up again, in chunks that overlap)\n";
        if let Some(r) = &self.ring {
            let alone: Vec<String> =
                r.alone.iter().enumerate().map(|(g, s)| format!("{}->{} {:.1}", self.gpus[g], self.gpus[(g + 1) % self.gpus.len()], s.median)).collect();
            let (lo, hi) = r.per_link.middle_range();
            out += &format!(
                "ring of {} at {}: every GPU sends to the next at once, {:.1} GB/s a link ({lo:.1}..{hi:.1}); each alone {} GB/s\n",
                r.alone.len(),
                Bytes(r.bytes),
                r.per_link.median,
                alone.join(", ")
            );
        }
        match (&self.torch, self.against_torch()) {
            (Ok(t), Some((one, both))) => {
                out += &format!(
                    "PyTorch {} at {}, same GPUs, same run: one way {:.1} GB/s (ours {}), both ways {:.1} GB/s (ours {})\n",
                    t.torch,
                    Bytes(t.bytes),
                    t.one_way.median,
                    pct(one),
                    t.both_ways.median,
                    pct(both)
                );
            }
            (Err(why), _) => out += &format!("no PyTorch reference: {why}\n"),
            _ => {}
        }
        out
    }

    fn four_way_lines(&self) -> String {
        let f = &self.four_way;
        let (first, copy) = match self.gpus[..] {
            [a, b, ..] => (a, format!("copy to GPU {b}")),
            [a] => (a, format!("copy within GPU {a}")),
            [] => (0, "copy".to_string()),
        };
        let names = ["H2D", "D2H", copy.as_str(), "kernel"];
        let alone: Vec<String> = names.iter().zip(&f.alone_ms).map(|(n, s)| format!("{n} {}", fmt_ms(s.median))).collect();
        let (bound, link_bound, serial, m) = (f.bound_ms(), f.link_bound_ms(), f.serial_ms(), f.together_ms.median);
        let eff = f.efficiency();
        format!(
            "\nfour-way overlap on GPU {first}, {} each (a round by difference):\n  alone: {}; H2D and D2H together {}\n  all four at once {} (25%..75% {}..{}); serial sum {}; bound (the longest alone, each at its fastest quarter) {}; with the host link's two directions as measured together {}\n  at once reached {} of the bound with the link measured (bound / time; its runs' middle half beside it), and saved {} of what overlap could save (serial - bound)\n{}",
            Bytes(f.bytes),
            alone.join(", "),
            fmt_ms(f.host_link_ms.median),
            fmt_ms(m),
            fmt_ms(f.together_ms.middle_range().0),
            fmt_ms(f.together_ms.middle_range().1),
            fmt_ms(serial),
            fmt_ms(bound),
            fmt_ms(link_bound),
            eff.cell(),
            pct((serial - m) / (serial - bound)),
            crate::measure::stats::Efficiency::note([&eff]).map_or(String::new(), |why| format!("  {why}\n"))
        )
    }

    fn pipeline_lines(&self) -> String {
        let p = &self.pipeline;
        let mut out = format!(
            "\npipeline of {} stages, {} MiB, {} ({} per stage over all the data, {} FMAs per element):\n",
            p.stages,
            self.config.pipeline_mib,
            self.stages_placed(),
            fmt_ms(p.stage_ms.median),
            p.iterations
        );
        let two = self.several_gpus();
        // On one GPU the model (a GPU a stage) does not apply: no column for it.
        if two {
            out += &format!("  {:>13} {:>24} {:>20} {:>8} {:>12}\n", "micro-batches", "bubble (25%..75%)", "model (S-1)/(M+S-1)", "diff", "total");
        } else {
            out += &format!("  {:>13} {:>24} {:>12}\n", "micro-batches", "SMs idle (25%..75%)", "total");
        }
        for b in &p.points {
            let measured = b.measured.as_ref().map_or("no timeline".to_string(), |m| {
                let (lo, hi) = m.middle_range();
                format!("{} ({}..{})", pct(m.median), pct(lo), pct(hi))
            });
            if two {
                let diff = b.measured.as_ref().map_or("-".to_string(), |m| format!("{:+.1}", 100.0 * (m.median - b.model)));
                out += &format!("  {:>13} {:>24} {:>20} {:>8} {:>12}\n", b.micro_batches, measured, pct(b.model), diff, fmt_ms(b.total_ms.median));
            } else {
                out += &format!("  {:>13} {:>24} {:>12}\n", b.micro_batches, measured, fmt_ms(b.total_ms.median));
            }
        }
        out += if self.several_gpus() {
            "  (bubble: the share of the window from the first kernel's start to the last one's end that each GPU ran no kernel, averaged over the GPUs; diff in points)\n"
        } else {
            "  (one GPU: both stages' kernels share its SMs, so the bubble model, for one GPU a stage, does not apply: this checks the code path)\n"
        };
        out += &self.training_lines();
        out
    }

    /// Training in each order: the bubble beside the model and the
    /// activations each stage keeps.
    fn training_lines(&self) -> String {
        let p = &self.pipeline;
        if p.training.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "
training, the forward and backward of every micro-batch ({} stages), bubble (25%..75%) and diff from the model in points:
",
            p.stages
        );
        out += &format!("  {:>13}", "micro-batches");
        for t in &p.training {
            out += &format!(" {:>26} {:>7}", t.order.name(), "diff");
        }
        out += &format!(
            " {:>10}   activations kept by stage 0..{}
",
            "model",
            p.stages - 1
        );
        for (k, &m) in self.config.micro_batches.iter().enumerate() {
            out += &format!("  {m:>13}");
            for t in &p.training {
                let (cell, diff) =
                    t.points.get(k).and_then(|b| b.measured.as_ref().map(|s| (s, b.model))).map_or(("no timeline".into(), "-".into()), |(s, model)| {
                        let (lo, hi) = s.middle_range();
                        (format!("{} ({}..{})", pct(s.median), pct(lo), pct(hi)), format!("{:+.1}", 100.0 * (s.median - model)))
                    });
                out += &format!(" {cell:>26} {diff:>7}");
            }
            let kept: Vec<String> = p
                .training
                .iter()
                .map(|t| format!("{} {}", t.order.name(), self.kept(t.order, m).iter().map(|b| Bytes(*b).to_string()).collect::<Vec<_>>().join(", ")))
                .collect();
            out += &format!(" {:>10}   {}\n", pct(pipeline_parallel::bubble_model(p.stages, m)), kept.join("; "));
        }
        out += "  (fill-drain runs every forward, then every backward, and keeps every micro-batch's activation; 1F1B runs one forward, one backward once the pipe is full, and keeps at most S-s on stage s; both idle (S-1)/(M+S-1) where forward and backward take the same time)\n";
        if !self.several_gpus() {
            out += "  (one GPU: both stages share its SMs, so the model, for one GPU a stage, does not apply: this checks the code path)\n";
        }
        out
    }

    /// The activation bytes each stage keeps under `order` at `m`
    /// micro-batches of the pipeline's data.
    pub fn kept(&self, order: training::TrainingOrder, m: usize) -> Vec<u64> {
        let per = training::micro_batch_elements(self.config.pipeline_mib << 18, m) as u64 * 4;
        (0..self.pipeline.stages).map(|s| training::kept_slots(order, self.pipeline.stages, s, m) as u64 * per).collect()
    }

    fn all_reduce_lines(&self) -> String {
        let a = match &self.all_reduce {
            Err(why) => return format!("\ngradient all-reduce: skipped: {why}\n"),
            Ok(a) => a,
        };
        let mut out = format!(
            "\ngradient all-reduce, NCCL {} over {} GPUs, {} MiB of gradients each, layer kernel {} FMAs per element (compute {}x the communication at the largest bucket):\n",
            a.nccl_version, a.ranks, self.config.grad_mib, a.iterations, self.config.compute_ratio
        );
        out += &format!(
            "  {:>9} {:>7} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
            "bucket", "buckets", "one sum", "bus GB/s", "compute", "comm", "serial", "overlapped", "model", "hidden", "at most"
        );
        for p in &a.points {
            out += &format!(
                "  {:>9} {:>7} {:>10} {:>9.1} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
                Bytes(p.bucket_bytes).to_string(),
                p.buckets,
                fmt_ms(p.all_reduce_ms.median),
                p.bus_gbps(a.ranks),
                fmt_ms(p.compute_ms()),
                fmt_ms(p.comm_ms()),
                fmt_ms(p.serial_ms.median),
                fmt_ms(p.overlapped_ms.median),
                fmt_ms(p.predicted_ms),
                pct(p.hidden()),
                pct(p.hidden_bound())
            );
        }
        out += "  (a training step, by difference; hidden: (serial - overlapped) / comm; at most: all but the last bucket's sum where compute is the longer; bus GB/s: NCCL's bus bandwidth of one bucket's sum)\n";
        out += &self.all_reduce_size_lines(a);
        out += &self.cta_lines(a);
        if let Some(b) = a.best() {
            out += &format!(
                "best where compute is at least as long as the communication: buckets of {} hid {} of the communication ({} at most), NCCL's bus bandwidth {:.1} GB/s\n",
                Bytes(b.bucket_bytes),
                pct(b.hidden()),
                pct(b.hidden_bound()),
                b.bus_gbps(a.ranks)
            );
        }
        out
    }

    /// Bus bandwidth by message size, beside PyTorch's.
    fn all_reduce_size_lines(&self, a: &AllReduceResults) -> String {
        if a.sizes.is_empty() {
            return String::new();
        }
        let mut out = format!("all-reduce alone by size over {} GPUs, NCCL's bus bandwidth (2(n-1)/n of the bytes over the time):\n", a.ranks);
        out += &format!("  {:>9} {:>10} {:>10} {:>12} {:>8}\n", "size", "one sum", "bus GB/s", "PyTorch GB/s", "ours");
        for ((bytes, ours, theirs), (_, ms)) in a.bus_by_size().into_iter().zip(&a.sizes) {
            let (t, ratio) = theirs.map_or(("-".into(), "-".into()), |t| (format!("{t:.1}"), pct(ours / t)));
            out += &format!("  {:>9} {:>10} {:>10.1} {:>12} {:>8}\n", Bytes(bytes).to_string(), fmt_ms(ms.median), ours, t, ratio);
        }
        match &a.torch {
            Some(Ok(t)) => out += &format!("  (PyTorch {} with NCCL {}, torch.distributed's all_reduce on the same GPUs, after ours)\n", t.torch, t.nccl),
            Some(Err(why)) => out += &format!("  no PyTorch reference: {why}\n"),
            None => out += "  no PyTorch reference: --no-reference\n",
        }
        out
    }

    /// The bucket sweep's best point under each CTA setting, and the one
    /// chosen by measurement.
    fn cta_lines(&self, a: &AllReduceResults) -> String {
        let skipped: String = a.skipped.iter().map(|why| format!("CTA setting skipped: {why}\n")).collect();
        if a.capped.is_empty() {
            return skipped;
        }
        let mut out = skipped + "the SMs NCCL takes (each setting its own communicators; the layers calibrated once): the best bucket of each\n";
        out += &format!(
            "  {:>16} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}\n",
            "NCCL's CTAs", "bucket", "layer", "one sum", "overlapped", "hidden", "at most", "bus GB/s"
        );
        for (ctas, points) in a.sweeps() {
            match best_of(points) {
                Some(p) => {
                    out += &format!(
                        "  {:>16} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9.1}\n",
                        ctas.to_string(),
                        Bytes(p.bucket_bytes).to_string(),
                        fmt_ms(p.kernel_ms.median),
                        fmt_ms(p.all_reduce_ms.median),
                        fmt_ms(p.overlapped_ms.median),
                        pct(p.hidden()),
                        pct(p.hidden_bound()),
                        p.bus_gbps(a.ranks)
                    )
                }
                None => out += &format!("  {:>16} compute shorter than the communication at every bucket\n", ctas.to_string()),
            }
        }
        if let Some((ctas, p)) = a.chosen() {
            out += &format!(
                "chosen by measurement (the setting that hid the most): {ctas}, buckets of {}: hid {} of the communication ({} at most), NCCL's bus bandwidth {:.1} GB/s\n",
                Bytes(p.bucket_bytes),
                pct(p.hidden()),
                pct(p.hidden_bound()),
                p.bus_gbps(a.ranks)
            );
        }
        if let Some(why) = &a.env_override {
            out += &format!("  NOTE: {why}: the settings above all ran as it says\n");
        }
        out
    }

    /// The measured numbers behind [`Self::headline`]: the largest copy's
    /// rates and the four-way overlap.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let mut v = Vec::new();
        if let Some(p) = self.largest() {
            let what = if self.several_gpus() { "peer copy" } else { "copy within GPU 0" };
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{what} one way, {}", Bytes(p.bytes)), "GB/s", p.one_way));
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{what} both ways, {}", Bytes(p.bytes)), "GB/s", p.both_ways));
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("staged through host memory, {}", Bytes(p.bytes)), "GB/s", p.staged));
        }
        v.push(crate::lab_kit::headline::HeadlineFigure::new("four-way overlap", "ms", self.four_way.together_ms));
        v
    }
    /// The headline rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = vec![(
            "GPUs the lab ran on".to_string(),
            if self.several_gpus() { format!("{}: {}", self.gpus.len(), self.links()) } else { "1: copies within GPU 0, no all-reduce".into() },
        )];
        if let Some(p) = self.largest() {
            let vs = |ours: f64, t: Option<f64>| t.map_or(format!("{ours:.0} GB/s"), |r| format!("{ours:.0} GB/s ({} of PyTorch)", pct(r)));
            let t = self.against_torch();
            let what = if self.several_gpus() { "peer copy" } else { "copy within GPU 0" };
            rows.push((format!("{what} one way, {}", Bytes(p.bytes)), vs(p.one_way.median, t.map(|t| t.0))));
            rows.push((format!("{what} both ways, {}", Bytes(p.bytes)), vs(p.both_ways.median, t.map(|t| t.1))));
            rows.push((format!("staged through host memory, {}", Bytes(p.bytes)), format!("{:.0} GB/s", p.staged.median)));
        }
        let f = &self.four_way;
        rows.push((
            "four-way overlap (H2D, D2H, copy, kernel at once)".into(),
            format!("{} vs bound {} (serial {})", fmt_ms(f.together_ms.median), fmt_ms(f.link_bound_ms()), fmt_ms(f.serial_ms())),
        ));
        let m = PipelineResults::drawn(&self.config.micro_batches);
        if let Some(b) = self.bubble(m).filter(|_| self.several_gpus()) {
            let measured = b.measured.as_ref().map_or("no timeline".into(), |s| pct(s.median));
            rows.push((format!("pipeline bubble, {m} micro-batches"), format!("{measured} (model {})", pct(b.model))));
        }
        rows.push((
            "all-reduce hidden behind compute (best bucket)".into(),
            match &self.all_reduce {
                Ok(a) => a.best().map_or("compute shorter than the communication at every bucket".into(), |b| {
                    format!("{} at {} buckets, bus {:.0} GB/s", pct(b.hidden()), Bytes(b.bucket_bytes), b.bus_gbps(a.ranks))
                }),
                Err(why) => format!("skipped: {why}"),
            },
        ));
        rows.push((
            "all-reduce hidden, CTAs chosen by measurement".into(),
            match &self.all_reduce {
                Ok(a) => a.chosen().map_or("compute shorter than the communication at every bucket".into(), |(ctas, b)| {
                    format!("{} at {} buckets, {ctas}, bus {:.0} GB/s", pct(b.hidden()), Bytes(b.bucket_bytes), b.bus_gbps(a.ranks))
                }),
                Err(why) => format!("skipped: {why}"),
            },
        ));
        rows
    }
}

pub type MultiGpuRecord = crate::measure::record::Record<MultiGpuResults>;

/// Notebook entry points for lab 8.
impl crate::lab_kit::LabRun<MultiGpuResults> {
    /// Every measurement, as the command line prints it.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// The GPUs of the recording's machine and the path between each pair.
    pub fn topology(&self) -> String {
        self.record.results.topology.describe()
    }
    /// GB/s against size: one way, both ways, staged, the host link, PyTorch.
    pub fn peer_chart(&self) -> crate::present::chart::Figure {
        self.record.results.peer_chart(&self.origin())
    }
    /// One round of the four operations at once.
    pub fn four_way_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.four_way_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the four-way round"))
    }
    /// The bubble against micro-batches, measured and modelled.
    pub fn bubble_chart(&self) -> crate::present::chart::Figure {
        self.record.results.bubble_chart(&self.origin())
    }
    /// One run of the pipeline, a lane per GPU's stream.
    pub fn pipeline_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.pipeline_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the pipeline's run"))
    }
    /// One training run under 1F1B, a lane per GPU's stream.
    pub fn training_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.training_gantt(&self.origin()).ok_or_else(|| self.no_timeline("training under 1F1B"))
    }
    /// Hidden share against bucket size under each CTA setting, and bus
    /// bandwidth against size beside PyTorch's.
    pub fn all_reduce_chart(&self) -> Result<crate::present::chart::Figure> {
        self.record.results.all_reduce_chart(&self.origin()).ok_or_else(|| self.skipped_all_reduce())
    }
    /// One overlapped training step, a lane per GPU's compute and comm streams.
    pub fn all_reduce_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        match &self.record.results.all_reduce {
            Ok(_) => self.record.results.all_reduce_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the training step")),
            Err(_) => Err(self.skipped_all_reduce()),
        }
    }
    fn no_timeline(&self, what: &str) -> LabError {
        LabError::NothingToDraw(format!("{}: no timeline of {what} (a tool that holds CUPTI, such as Nsight or compute-sanitizer, ran it)", self.origin()))
    }
    fn skipped_all_reduce(&self) -> LabError {
        let why = self.record.results.all_reduce.as_ref().err().cloned().unwrap_or_default();
        LabError::NothingToDraw(format!("{}: the all-reduce was skipped ({why})", self.origin()))
    }
    /// Checks the learner's micro-batch loop: on the model (races, host
    /// waits, wrong GPU, the bubble predicted from the recording's stage
    /// times), and where notebooks run live, on this machine's GPUs with
    /// the bubble read off the run's timeline.
    pub fn check_micro_batches(
        &self,
        learner: impl Fn(&mut dyn crate::pipeline::issue::Issue, &pipeline_parallel::MicroBatchTask) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let learner: pipeline_parallel::Loop = std::sync::Arc::new(learner);
        let r = &self.record.results;
        let cfg = r.config.clone();
        self.check(
            exercise::EXERCISE,
            &exercise::EXERCISES[0],
            cfg.device,
            |gpu| exercise::check_live(gpu, &cfg, learner.clone()),
            || exercise::check_recorded(&self.record, learner.clone()),
        )
    }
}

/// The newest recording in `data/` made on two GPUs or more: what a
/// machine with one GPU shows of a pair (`None` while there is none).
pub fn recorded_pair() -> Result<Option<crate::lab_kit::LabRun<MultiGpuResults>>> {
    crate::lab_kit::LabRun::recorded_where(LAB, "it is the newest recording made on two GPUs or more, shown on any machine", MultiGpuResults::several_gpus)
}

/// The report's files for a recording: the charts, the timelines (with
/// Chrome traces) and the table.
pub fn report(rec: &MultiGpuRecord, dir: &std::path::Path, origin: &str) -> Result<Vec<std::path::PathBuf>> {
    charts::report(&rec.results, dir, origin)
}

/// Lab 8's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<MultiGpuConfig, MultiGpuResults> = crate::lab_kit::Entry {
    number: 8,
    name: LAB,
    module: module_path!(),
    teaches: "Several GPUs: peer copies, cross-GPU events in a pipeline, an all-reduce overlapping compute",
    builds_on: &[(2, "a pipeline over streams"), (5, "which waits stop whom")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    about: "Lab 8: copies between GPUs, four-way overlap, a pipeline with a stage per GPU, NCCL's all-reduce beside compute",
    measure: measure::run,
    tables: |rec| rec.results.table(),
    figures: report,
    headline: MultiGpuResults::headline,
    headline_figures: MultiGpuResults::headline_figures,
    timelines: |rec, o| {
        [rec.results.four_way_gantt(o), rec.results.pipeline_gantt(o), rec.results.training_gantt(o), rec.results.all_reduce_gantt(o)]
            .into_iter()
            .flatten()
            .collect()
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::issue::Issue;
    use crate::testing::{fails_with, multi_gpu_results};
    use pipeline_parallel::{events_only, host_synchronized, MicroBatchTask};

    #[test]
    fn presets_are_valid_and_bad_settings_name_the_setting() {
        for c in [MultiGpuConfig::default(), MultiGpuConfig::quick(), MultiGpuConfig::small()] {
            c.validate().unwrap();
        }
        let bad = |f: &dyn Fn(&mut MultiGpuConfig), want: &str| {
            let mut c = MultiGpuConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(&|c| c.sizes_mib = vec![], "--sizes-mib");
        bad(&|c| c.sizes_mib = vec![0], "--sizes-mib must be 1-16384");
        bad(&|c| c.copies = 1, "--copies must be 2-1000");
        bad(&|c| c.repeats = 0, "--repeats");
        bad(&|c| c.staging_chunks = 0, "--staging-chunks");
        bad(&|c| c.stage_ms = f64::NAN, "--stage-ms");
        bad(&|c| c.micro_batches = vec![0], "--micro-batches");
        bad(&|c| c.buckets_mib = vec![3], "divide --grad-mib 512");
        bad(&|c| c.buckets_mib = vec![1024], "divide --grad-mib");
        bad(&|c| c.compute_ratio = 0.0, "--compute-ratio");
        bad(&|c| c.gpus = Some(1), "--gpus must be 2-64 (got 1)");
        bad(&|c| c.nccl_ctas = vec![crate::gpu::nccl::NcclCtas::at_most(8)], "--nccl-ctas must start with default");
        bad(&|c| c.nccl_ctas = vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(0)], "NCCL's max CTAs 0");
        bad(&|c| c.all_reduce_mib = vec![], "--all-reduce-mib");
        bad(&|c| c.four_way_mib = 1 << 20, "--four-way-mib");
    }

    #[test]
    fn the_command_line_takes_gpus_sizes_and_cta_settings_and_defaults_to_the_config() {
        use crate::gpu::nccl::NcclCtas;
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            c: MultiGpuConfig,
        }
        let cli = Cli::try_parse_from(["multi-gpu", "--gpus", "4", "--all-reduce-mib", "64,1GiB", "--nccl-ctas", "default,8,2-4"]).unwrap();
        assert_eq!(cli.c.gpus, Some(4));
        assert_eq!(cli.c.all_reduce_mib, [64, 1024]);
        assert_eq!(cli.c.nccl_ctas, [NcclCtas::Default, NcclCtas::at_most(8), NcclCtas::AtMost { max: 4, min: Some(2) }]);
        assert_eq!(Cli::try_parse_from(["multi-gpu"]).unwrap().c, MultiGpuConfig::default());
        assert!(Cli::try_parse_from(["multi-gpu", "--nccl-ctas", "default,0"]).is_err());
    }

    #[test]
    fn the_lab_runs_on_every_gpu_from_device_on_or_gpus_of_them() {
        let c = MultiGpuConfig::default();
        assert_eq!(c.lab_gpus(1).unwrap(), [0]);
        assert_eq!(c.lab_gpus(2).unwrap(), [0, 1]);
        assert_eq!(c.lab_gpus(4).unwrap(), [0, 1, 2, 3]);
        assert_eq!(MultiGpuConfig { device: 3, ..c.clone() }.lab_gpus(4).unwrap(), [3, 0, 1, 2], "wraps");
        assert_eq!(MultiGpuConfig { gpus: Some(2), device: 1, ..c.clone() }.lab_gpus(4).unwrap(), [1, 2]);
        let e = MultiGpuConfig { gpus: Some(4), ..c }.lab_gpus(2).unwrap_err().to_string();
        assert!(e.contains("--gpus 4: this machine has 2 GPU(s)"), "{e}");
    }

    #[test]
    fn training_is_tabled_by_schedule_beside_the_model_with_the_activations_kept() {
        let r = crate::testing::multi_gpu_results_on(4);
        let t = r.table();
        assert!(t.contains("training, the forward and backward of every micro-batch (4 stages)"), "{t}");
        // 32 MiB over 8 micro-batches: 4 MiB each; 1F1B keeps 4, 3, 2, 1 of them.
        assert!(t.contains("fill-drain 32 MiB, 32 MiB, 32 MiB, 32 MiB; 1F1B 16 MiB, 12 MiB, 8 MiB, 4 MiB"), "{t}");
        // At 8 micro-batches the model is 3/11; measured 1 and 2 points above.
        assert!(t.contains("+1.0") && t.contains("+2.0") && t.contains("27.3%"), "{t}");
        let g = r.training_gantt("test").unwrap();
        assert!(g.title.contains("1F1B, 4 stages over 8 micro-batches"), "{}", g.title);
        let lanes = g.timelines[0].lanes();
        assert!((0..4).all(|s| lanes.iter().any(|l| l.starts_with(&format!("GPU {s} ·")))), "{lanes:?}");
    }

    #[test]
    fn the_all_reduce_by_size_stands_beside_pytorch_and_the_cta_setting_is_chosen_by_measurement() {
        let r = multi_gpu_results(true);
        let t = r.table();
        // 64 MiB in 0.5 ms over 2 GPUs: 134.2 GB/s of bus; PyTorch's 0.49 ms: 137.0.
        assert!(t.contains("134.2") && t.contains("137.0") && t.contains("98.0%"), "{t}");
        assert!(t.contains("PyTorch 2.11.0 with NCCL 2.28.3"), "{t}");
        assert!(t.contains("at most 8 CTAs") && t.contains("NCCL's choice"), "{t}");
        assert!(t.contains("chosen by measurement (the setting that hid the most): at most 8 CTAs, buckets of 4 MiB"), "{t}");
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "all-reduce hidden, CTAs chosen by measurement" && v.contains("at most 8 CTAs")), "{h:?}");
    }

    #[test]
    fn over_four_gpus_the_table_says_each_stage_and_the_links() {
        let r = crate::testing::multi_gpu_results_on(4);
        let t = r.table();
        assert!(t.contains("the lab's GPUs: GPUs 0, 1, 2, 3 (every pair NVLink x18, peer access); copies and the four-way overlap GPU 0 -> GPU 1"), "{t}");
        assert!(t.contains("pipeline of 4 stages") && t.contains("stage 0 on GPU 0, stage 1 on GPU 1, stage 2 on GPU 2, stage 3 on GPU 3"), "{t}");
        assert!(t.contains("over 4 GPUs"), "{t}");
        assert!(t.contains("ring of 4 at 64 MiB: every GPU sends to the next at once, 290.0 GB/s a link (290.0..290.0); each alone 0->1 300.0, 1->2 300.0, 2->3 300.0, 3->0 300.0 GB/s"), "{t}");
        assert!(!multi_gpu_results(true).table().contains("ring of"), "two GPUs: both ways is the ring");
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "GPUs the lab ran on" && v == "4: every pair NVLink x18, peer access"), "{h:?}");
    }

    #[test]
    fn the_table_and_headline_give_each_part_beside_its_reference() {
        let r = multi_gpu_results(true);
        let t = r.table();
        assert!(t.contains("the lab's GPUs: GPU 0 -> GPU 1 (NVLink x18, peer access)"), "{t}");
        assert!(t.contains("300.0 (300.0..300.0)") && t.contains("560.0") && t.contains("25.0") && t.contains("50.0"), "{t}");
        // 300 of 310 one way, 560 of 580 both ways.
        assert!(t.contains("one way 310.0 GB/s (ours 96.8%), both ways 580.0 GB/s (ours 96.6%)"), "{t}");
        // Four-way: 1.7 ms against a bound of 1.6 (H2D and D2H together),
        // serial 3.8, alone bound 1.2: it saved 2.1 of 2.6.
        assert!(t.contains("reached 94.1% (94.1..94.1) of the bound with the link measured"), "{t}");
        assert!(t.contains("and saved 80.8% of what overlap could save"), "{t}");
        assert!(t.contains("diff") && t.contains("+2.0"), "{t}");
        assert!(t.contains("NCCL 2.28.3 over 2 GPUs"), "{t}");
        assert!(t.contains("buckets of 4 MiB hid 93.8% of the communication (96.9% at most), NCCL's bus bandwidth 83.9 GB/s"), "{t}");
        let h = r.headline();
        let row = |what: &str| h.iter().find(|(k, _)| k.starts_with(what)).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{what}: {h:?}"));
        assert_eq!(row("GPUs the lab ran on"), "2: NVLink x18, peer access");
        assert_eq!(row("peer copy one way"), "300 GB/s (96.8% of PyTorch)");
        assert_eq!(row("pipeline bubble, 8 micro-batches"), "13.1% (model 11.1%)");
        assert!(row("all-reduce hidden").starts_with("93.8% at 4 MiB buckets, bus 84 GB/s"), "{h:?}");
        assert!(row("four-way").contains("1.70 ms vs bound 1.60 ms (serial 3.80 ms)"), "{h:?}");
    }

    #[test]
    fn with_one_gpu_the_lab_says_what_it_could_not_run() {
        let r = multi_gpu_results(false);
        let t = r.table();
        assert!(t.contains("ONE GPU") && t.contains("within GPU 0") && t.contains("one GPU: no peer"), "{t}");
        assert!(t.contains("no PyTorch reference: --no-reference"), "{t}");
        assert!(t.contains("gradient all-reduce: skipped: one GPU here"), "{t}");
        assert!(t.contains("does not apply") && !t.contains("model (S-1)"), "no model column where the model does not apply: {t}");
        let chart = r.bubble_chart("test");
        let labels = |c: &crate::present::chart::Figure| c.panels[0].series.iter().map(|s| s.label.clone()).collect::<Vec<_>>();
        assert!(!labels(&chart).iter().any(|l| l.starts_with("model")), "no model line on one GPU: {:?}", labels(&chart));
        let two = multi_gpu_results(true);
        assert!(two.table().contains("model (S-1)/(M+S-1)"));
        assert_eq!(
            labels(&two.bubble_chart("test")),
            [
                "forward only, measured (CUPTI timeline)",
                "training, fill-drain (forward and backward)",
                "training, 1F1B (forward and backward)",
                "model (S-1)/(M+S-1)"
            ]
        );
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "GPUs the lab ran on" && v.starts_with("1:")), "{h:?}");
        assert!(h.iter().any(|(k, _)| k.starts_with("copy within GPU 0 one way")), "{h:?}");
        assert!(!h.iter().any(|(k, _)| k.starts_with("pipeline bubble")), "no bubble row for one GPU: {h:?}");
        assert!(h.iter().any(|(k, v)| k.starts_with("all-reduce") && v.starts_with("skipped: one GPU")), "{h:?}");
        assert!(r.all_reduce_chart("test").is_none() && r.all_reduce_gantt("test").is_none());
    }

    #[test]
    fn the_report_draws_every_chart_and_timeline_with_chrome_traces() {
        for two in [true, false] {
            let r = multi_gpu_results(two);
            let dir = crate::testing::temp_dir("multi-gpu-report");
            let files = charts::report(&r, &dir, "test").unwrap();
            let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
            for want in ["multi-gpu-peer.svg", "multi-gpu-bubble.png", "multi-gpu-four-way.svg", "multi-gpu-pipeline.trace.json", "multi-gpu-summary.txt"] {
                assert!(names.contains(&want.to_string()), "{want}: {names:?}");
            }
            assert_eq!(names.contains(&"multi-gpu-all-reduce.svg".to_string()), two, "{names:?}");
            assert_eq!(names.contains(&"multi-gpu-all-reduce-step.trace.json".to_string()), two, "{names:?}");
            assert!(names.iter().all(|n| n.starts_with("multi-gpu-")), "{names:?}");
        }
        let r = multi_gpu_results(true);
        let svg = crate::present::chart::render_svg(&r.peer_chart("test")).unwrap();
        assert!(svg.contains("PyTorch 2.11.0: one way") && svg.contains("staged through pinned host memory"), "the legend names each line");
        let g = r.all_reduce_gantt("test").unwrap();
        let lanes = g.timelines[0].lanes();
        assert!(lanes.iter().any(|l| l.starts_with("GPU 0 ·") && l.ends_with("comm")) && lanes.iter().any(|l| l.starts_with("GPU 1 ·")), "{lanes:?}");
        let svg = crate::present::chart::Chart::to_svg(&g).unwrap();
        assert!(svg.contains("all-reduce") && svg.contains("kernel"), "the legend names the all-reduce");
    }

    #[test]
    fn the_notebook_check_on_recorded_costs_passes_events_and_names_host_waits() {
        let mut rec = crate::measure::record::Record::new(LAB, crate::testing::fingerprint(), multi_gpu_results(true));
        let r = &rec.results;
        let costs = exercise::recorded_costs(r, exercise::MICRO_BATCHES);
        // 10 ms a stage over all the data: 1.25 ms a micro-batch of 8; a
        // 4 MiB activation at 300 GB/s: 0.014 ms; the 32 MiB upload at 50 GB/s.
        let n = (r.config.pipeline_mib << 18) / 8;
        assert!((costs[&(OpKind::Kernel, n)] - 1.25).abs() < 1e-9, "{costs:?}");
        assert!((costs[&(OpKind::D2d(Link { from: 0, to: 1 }), n)] - 4.0 * 1048576.0 / 300e6).abs() < 1e-9, "{costs:?}");
        assert!((costs[&(OpKind::H2d, 8 * n)] - 32.0 * 1048576.0 / 50e6).abs() < 1e-9, "{costs:?}");
        let good = exercise::check_recorded(&rec, std::sync::Arc::new(events_only));
        assert!(good.passed, "{good}");
        let bad = exercise::check_recorded(&rec, std::sync::Arc::new(host_synchronized));
        fails_with(&bad, "host synchronization in the loop");
        fails_with(&bad, "bubble");
        let panics = exercise::check_recorded(
            &rec,
            std::sync::Arc::new(|_: &mut dyn Issue, t: &MicroBatchTask| {
                let v: Vec<usize> = vec![];
                let _ = v[t.micro_batches];
                Ok(())
            }),
        );
        fails_with(&panics, "your loop panicked");
        rec.results = multi_gpu_results(false);
        let one = exercise::check_recorded(&rec, std::sync::Arc::new(events_only));
        assert!(one.passed && one.to_string().contains("the recording is of one GPU"), "{one}");
    }
}
