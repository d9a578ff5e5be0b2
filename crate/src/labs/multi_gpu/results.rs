//! Lab 8's results: what each measurement gives (a point of each sweep:
//! [`PeerPoint`], [`RingPoint`], [`FourWay`], [`BubblePoint`],
//! [`AllReducePoint`]), each part's sweep ([`PipelineResults`],
//! [`AllReduceResults`]), the whole run ([`MultiGpuResults`]) and what
//! they say of themselves (the best bucket, the CTA setting chosen, the
//! GPUs and the links between them, the activations a stage keeps). The
//! measured data only: no CUDA; what is printed from it is in
//! [`super::table`] and [`super::headline`], what is drawn in
//! [`super::charts`], how it is measured in [`super::measure`].
//!
//! May use: the lab's settings ([`super::config`]), its closed forms and
//! plans' own numbers ([`super::all_reduce`], [`super::training`]), its
//! references' results ([`super::reference`]), and `measure::stats`,
//! `gpu::topology` (what the machine is), `pipeline::timeline`.

use super::config::MultiGpuConfig;
use super::reference::{self, TorchPeer};
use super::{all_reduce, training};
use crate::gpu::topology::Topology;
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

/// GPU-to-GPU bandwidth at one size, GB/s (10^9 bytes a second).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerPoint {
    pub bytes: u64,
    /// One way, from the pair's first GPU to its second.
    pub one_way: Summary,
    /// Both ways at once: the bytes that crossed in both directions per second.
    pub both_ways: Summary,
    /// One way, staged through pinned host memory.
    pub staged: Summary,
    /// The host link for comparison: uploads from pinned host memory to
    /// the second GPU, timed the same way.
    pub host: Summary,
}

/// Every GPU copying to the next at once, against each of those copies
/// alone, GB/s a link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RingPoint {
    pub bytes: u64,
    /// Each link's rate with every link busy.
    pub per_link: Summary,
    /// GPU g to GPU g+1 alone, by g.
    pub alone: Vec<Summary>,
}

/// The four-way experiment's times, ms: each op alone and the four at once
/// (a round of each), by difference; and the bound and the serial sum of
/// the alone times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FourWay {
    pub bytes: u64,
    /// The GPU the copy goes to (0: within GPU 0).
    pub peer: usize,
    /// H2D, D2H, the copy to `peer`, the kernel ([`super::four_way::kinds`]).
    pub alone_ms: Vec<Summary>,
    /// The H2D and the D2H at once (one round of both): the host link's
    /// two directions share it.
    pub host_link_ms: Summary,
    pub together_ms: Summary,
}

impl FourWay {
    /// The longest alone, each at its fast end (its fastest quarter, the
    /// rule of every bound: see [`Efficiency`]): the four at once cannot
    /// beat it. (A median would be beaten by a lucky run of the four: the
    /// host link's speed varies from run to run.)
    pub fn bound_ms(&self) -> f64 {
        self.alone_ms.iter().map(Summary::fast_end).fold(0.0, f64::max)
    }
    /// The bound with the host link's two directions as measured together:
    /// the longest of (H2D and D2H at once, the copy, the kernel), each at
    /// its fast end.
    pub fn link_bound_ms(&self) -> f64 {
        self.alone_ms.get(2..).unwrap_or_default().iter().map(Summary::fast_end).fold(self.host_link_ms.fast_end(), f64::max)
    }
    /// The four at once against [`Self::link_bound_ms`].
    pub fn efficiency(&self) -> Efficiency {
        let parts: Vec<&Summary> = self.alone_ms.get(2..).unwrap_or_default().iter().chain([&self.host_link_ms]).collect();
        Efficiency::new(self.link_bound_ms(), &parts, &self.together_ms)
    }
    /// The alone medians summed: no overlap at all.
    pub fn serial_ms(&self) -> f64 {
        self.alone_ms.iter().map(|s| s.median).sum()
    }
}

/// The pipeline at one micro-batch count: its bubble measured
/// (from each run's timeline) beside the model's (S−1)/(M+S−1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BubblePoint {
    pub micro_batches: usize,
    /// (S−1)/(M+S−1).
    pub model: f64,
    /// The runs' bubble fractions (`None`: no run had a timeline, as under
    /// Nsight, which holds CUPTI).
    pub measured: Option<Summary>,
    /// The runs' totals, ms (CUDA events).
    pub total_ms: Summary,
}

/// One bucket size of the gradient all-reduce, ms unless said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllReducePoint {
    pub bucket_bytes: u64,
    pub buckets: usize,
    /// One bucket's kernel alone and its all-reduce alone (lower
    /// quartiles, as the queue model's costs).
    pub kernel_ms: Summary,
    pub all_reduce_ms: Summary,
    /// A training step by difference (a run of k steps minus a run of
    /// one, over k−1): summed after the backward pass, and bucket by
    /// bucket beside it.
    pub serial_ms: Summary,
    pub overlapped_ms: Summary,
    /// The queue model's overlapped step from the costs alone.
    pub predicted_ms: f64,
}

impl AllReducePoint {
    /// The backward pass's kernels alone: every bucket's kernel.
    pub fn compute_ms(&self) -> f64 {
        self.buckets as f64 * self.kernel_ms.median
    }
    /// Every bucket's all-reduce alone.
    pub fn comm_ms(&self) -> f64 {
        self.buckets as f64 * self.all_reduce_ms.median
    }
    /// The share of the communication the overlapped step hid: what it
    /// saved against the serial one, over the communication alone.
    pub fn hidden(&self) -> f64 {
        (self.serial_ms.median - self.overlapped_ms.median) / self.comm_ms()
    }
    /// The most an overlapped step can hide: all but the last bucket's
    /// sum where compute is the longer, else the compute's length (minus
    /// the first bucket's kernel, which nothing runs beside).
    pub fn hidden_bound(&self) -> f64 {
        let (compute, comm) = (self.compute_ms(), self.comm_ms());
        let exposed = if compute >= comm { self.all_reduce_ms.median } else { comm - compute + self.kernel_ms.median };
        ((comm - exposed) / comm).clamp(0.0, 1.0)
    }
    /// NCCL's bus bandwidth of one bucket's all-reduce over `ranks` GPUs, GB/s.
    pub fn bus_gbps(&self, ranks: usize) -> f64 {
        all_reduce::bus_gbps(self.bucket_bytes as f64, self.all_reduce_ms.median, ranks)
    }
}

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
    /// The device memory the sweep's buffers held on each GPU at its end,
    /// bytes, in the lab's GPU order (NCCL's own besides): each rank's
    /// batch and gradients on its own GPU, and what timing one bucket's
    /// sum alone placed there (none in recordings made before the lab
    /// said it).
    #[serde(default)]
    pub device_bytes: Vec<u64>,
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
pub(super) fn best_of(points: &[AllReducePoint]) -> Option<&AllReducePoint> {
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
    pub ring: Option<RingPoint>,
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

    /// The activation bytes each stage keeps under `order` at `m`
    /// micro-batches of the pipeline's data.
    pub fn kept(&self, order: training::TrainingOrder, m: usize) -> Vec<u64> {
        let per = training::micro_batch_elements(self.config.pipeline_mib << 18, m) as u64 * 4;
        (0..self.pipeline.stages).map(|s| training::kept_slots(order, self.pipeline.stages, s, m) as u64 * per).collect()
    }
}

pub type MultiGpuRecord = crate::measure::record::Record<MultiGpuResults>;

/// Every lab 8 recording in `data` with all-reduces timed alone by size,
/// as the rates `overlap-lab diagnose` sets a data-parallel step's
/// collectives beside ([`crate::diagnose::ranks::Ranks::beside`]). No
/// recording is no rates; `Err` where one cannot be read.
pub fn recorded_all_reduce_rates(data: &std::path::Path) -> crate::error::Result<Vec<crate::diagnose::ranks::CollectiveRates>> {
    use crate::measure::record::{display_path, find_recordings, Record};
    let recordings: Vec<(std::path::PathBuf, Record<MultiGpuResults>)> = match find_recordings(data, super::LAB) {
        Ok(r) => r,
        Err(crate::error::LabError::MissingData { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(recordings
        .into_iter()
        .filter_map(|(path, rec)| {
            let a = rec.results.all_reduce.as_ref().ok()?;
            let points: Vec<(u64, f64)> = a.sizes.iter().map(|(bytes, t)| (*bytes, t.median * 1e3)).collect();
            (!points.is_empty()).then(|| crate::diagnose::ranks::CollectiveRates {
                gpu_name: rec.fingerprint.gpu_name.clone(),
                source: display_path(&path),
                ranks: a.ranks,
                points,
            })
        })
        .collect())
}
