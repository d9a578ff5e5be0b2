//! Lab 7: pipelining inside a kernel. Streams keep the GPU fed; inside one
//! kernel, loading tile N+1 from device memory while computing tile N keeps
//! each SM busy. The kernels of `kernels/tile_*.cu` (naive tiled,
//! asynchronous copies with 1 to 4 stages, warp-specialized, the TMA) run
//! over one workload, each against the device-memory ceiling (the fastest
//! device-to-device copy of the input's size or larger, measured in the
//! same run), beside a plain CUDA kernel of the same workload written as
//! the CUDA programming guide writes a two-stage pipeline
//! (`kernels/tile_plain.cu`): the yardstick the lab's own are held to.
//! Two timelines show it: one round of every kernel on the stream, and,
//! from traced builds of four kernels, what each warp of one block does
//! when.
//!
//! May use what every lab may (see `labs`).

pub mod charts;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
pub mod kernel;
pub mod measure;
pub mod warps;

use crate::error::{LabError, Result};
use crate::measure::stats::Summary;
use crate::pipeline::timeline::Timeline;
use crate::present::gantt::Gantt;
use kernel::{KernelResources, TileKind, TileShape, WarpPhase};
use serde::{Deserialize, Serialize};
use warps::{phase_shares, tile_period_us, tile_range};

pub const LAB: &str = "kernel-pipeline";

/// The lab's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct KernelPipelineConfig {
    #[arg(skip)]
    pub device: usize,
    /// Input size (and as much output), MiB if no unit is given (64,
    /// 1GiB): well past the L2 cache, so every kernel reads device memory.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = KernelPipelineConfig::default().mib)]
    pub mib: usize,
    /// Outputs per tile for the naive, warp-specialized and TMA kernels and the plain CUDA reference.
    #[arg(long, default_value_t = KernelPipelineConfig::default().tile)]
    pub tile: u32,
    /// Tile sizes of the stage sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = KernelPipelineConfig::default().sweep_tiles)]
    pub sweep_tiles: Vec<u32>,
    /// Stage counts of the stage sweep (comma-separated, 1-8).
    #[arg(long, value_delimiter = ',', default_values_t = KernelPipelineConfig::default().stages)]
    pub stages: Vec<u32>,
    /// Threads per block of every kernel but the warp-specialized one.
    #[arg(long, default_value_t = KernelPipelineConfig::default().threads)]
    pub threads: u32,
    /// Timed runs of each kernel (and of a D2D copy of the input), interleaved round by round.
    #[arg(long, default_value_t = KernelPipelineConfig::default().repeats)]
    pub repeats: usize,
    /// The largest D2D copy the device-memory ceiling is looked for with,
    /// MiB if no unit is given (the sweep doubles from twice `--mib`;
    /// below that, no sweep).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = KernelPipelineConfig::default().ceiling_max_mib)]
    #[serde(default = "ceiling_max_mib_of_recordings")]
    pub ceiling_max_mib: usize,
    /// Outputs each thread of every kernel blurs and stores at once: 4 (a
    /// float4: 16-byte shared loads and stores) or 1 (one float at a time).
    #[arg(long, default_value_t = KernelPipelineConfig::default().vector_width)]
    #[serde(default = "vector_width_of_recordings")]
    pub vector_width: u32,
    /// Blocks per SM of the stage sweep's kernels (comma-separated; `max`:
    /// as many as fit): 1 keeps every tile in flight in one block's stages.
    #[arg(long, value_delimiter = ',', default_values_t = KernelPipelineConfig::default().sweep_blocks_per_sm)]
    #[serde(default = "one_block_per_sm")]
    pub sweep_blocks_per_sm: Vec<BlocksPerSm>,
    /// Blocks per SM of the plain CUDA reference (comma-separated; `max`:
    /// as many as fit, as a CUDA program sizes its grid by the occupancy
    /// calculator), at `--tile`, `--threads` and 2 stages.
    #[arg(long, value_delimiter = ',', default_values_t = KernelPipelineConfig::default().plain_blocks_per_sm)]
    #[serde(default)]
    pub plain_blocks_per_sm: Vec<BlocksPerSm>,
}

/// What recordings made before the setting existed swept up to.
fn ceiling_max_mib_of_recordings() -> usize {
    measure::CEILING_SWEEP_MAX_MIB
}

/// What recordings made before the setting existed ran: one float at a time.
fn vector_width_of_recordings() -> u32 {
    1
}

/// What recordings made before the setting existed ran the sweep at.
fn one_block_per_sm() -> Vec<BlocksPerSm> {
    vec![BlocksPerSm::ONE]
}

/// Blocks a kernel is launched with per SM: a number, or as many as fit
/// (`max` on the command line; the occupancy calculator's count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlocksPerSm(pub u32);

impl BlocksPerSm {
    pub const ONE: BlocksPerSm = BlocksPerSm(1);
    /// As many as fit on an SM.
    pub const MAX: BlocksPerSm = BlocksPerSm(u32::MAX);
    /// The most a number may ask (an SM holds at most 32 blocks).
    pub const LIMIT: u32 = 32;
    /// How a kernel's name says it ("" for one block per SM, the lab's usual launch).
    pub fn in_name(self) -> String {
        match self {
            BlocksPerSm::ONE => String::new(),
            BlocksPerSm::MAX => ", as many blocks as fit".into(),
            BlocksPerSm(n) => format!(", {n} blocks per SM"),
        }
    }
}

impl std::fmt::Display for BlocksPerSm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == BlocksPerSm::MAX {
            write!(f, "max")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl std::str::FromStr for BlocksPerSm {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "max" => Ok(BlocksPerSm::MAX),
            n => match n.parse::<u32>() {
                Ok(k) if (1..=BlocksPerSm::LIMIT).contains(&k) => Ok(BlocksPerSm(k)),
                _ => Err(format!("`{n}` is not a number of blocks per SM: 1 to {} or `max` (as many as fit)", BlocksPerSm::LIMIT)),
            },
        }
    }
}

impl Default for KernelPipelineConfig {
    fn default() -> Self {
        KernelPipelineConfig {
            device: 0,
            mib: 256,
            tile: 4096,
            sweep_tiles: vec![2048, 4096, 8192],
            stages: vec![1, 2, 3, 4],
            threads: 256,
            repeats: 15,
            ceiling_max_mib: measure::CEILING_SWEEP_MAX_MIB,
            vector_width: kernel::VEC_DEFAULT,
            sweep_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm::MAX],
            plain_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm::MAX],
        }
    }
}

impl KernelPipelineConfig {
    /// Every kernel and the ceiling's sweep, fewer repeats.
    pub fn headline() -> Self {
        KernelPipelineConfig { repeats: 9, ..Self::default() }
    }
    pub fn quick() -> Self {
        KernelPipelineConfig { mib: 128, repeats: 7, ..Self::default() }
    }
    pub fn small() -> Self {
        KernelPipelineConfig {
            mib: 1,
            tile: 1024,
            sweep_tiles: vec![1024, 2048],
            stages: vec![1, 2],
            threads: 128,
            repeats: 2,
            ceiling_max_mib: 2,
            ..Self::default()
        }
    }
    /// Outputs of the run: the input's MiB in floats.
    pub fn elements(&self) -> usize {
        self.mib << 18
    }
    pub fn validate(&self) -> Result<()> {
        if self.mib == 0 || self.mib > 16384 {
            return Err(LabError::config(format!("--mib must be 1-16384 (got {})", self.mib)));
        }
        if self.repeats == 0 || self.repeats > 1000 {
            return Err(LabError::config(format!("--repeats must be 1-1000 (got {})", self.repeats)));
        }
        if self.threads < 96 || self.threads > 1024 || self.threads % 32 != 0 {
            return Err(LabError::config(format!("--threads must be a multiple of 32 from 96 to 1024 (got {})", self.threads)));
        }
        if self.stages.is_empty() || self.stages.iter().any(|&s| s == 0 || s > 8) {
            return Err(LabError::config(format!("--stages must list stage counts of 1-8 (got {:?})", self.stages)));
        }
        let n = self.elements();
        for &t in std::iter::once(&self.tile).chain(&self.sweep_tiles) {
            if t < 32 || t % 4 != 0 || n % t as usize != 0 {
                return Err(LabError::config(format!(
                    "tile {t}: a tile must be a multiple of 4 outputs, at least 32, dividing the {} MiB input ({n} floats) evenly",
                    self.mib
                )));
            }
        }
        if self.ceiling_max_mib > 65536 {
            return Err(LabError::config(format!("--ceiling-max-mib must be at most 65536 (got {})", self.ceiling_max_mib)));
        }
        if self.sweep_tiles.is_empty() {
            return Err(LabError::config("--sweep-tiles must list at least one tile size"));
        }
        if !kernel::VEC_WIDTHS.contains(&self.vector_width) {
            return Err(LabError::config(format!("--vector-width must be 1 or 4 (got {})", self.vector_width)));
        }
        for (option, list) in [("--sweep-blocks-per-sm", &self.sweep_blocks_per_sm), ("--plain-blocks-per-sm", &self.plain_blocks_per_sm)] {
            if list.is_empty() || list.iter().any(|b| b.0 == 0 || (b.0 > BlocksPerSm::LIMIT && *b != BlocksPerSm::MAX)) {
                return Err(LabError::config(format!(
                    "{option} must list blocks per SM, each 1 to {} or max (got {})",
                    BlocksPerSm::LIMIT,
                    list.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
                )));
            }
        }
        Ok(())
    }

    /// Every kernel the lab runs, in the order its table prints them: the
    /// lab's own, then the plain CUDA reference.
    pub fn variants(&self) -> Vec<Variant> {
        let shape = |tile, threads, stages| TileShape { tile, threads, stages };
        let variant = |name: String, kind, shape, blocks: BlocksPerSm, role| Variant {
            name,
            kind,
            shape,
            blocks_per_sm: blocks.0,
            role,
            vector_width: self.vector_width,
        };
        let mut v = vec![
            variant("naive".into(), TileKind::Naive, shape(self.tile, self.threads, 1), BlocksPerSm::ONE, Role::Baseline),
            variant("naive, as many blocks as fit".into(), TileKind::Naive, shape(self.tile, self.threads, 1), BlocksPerSm::MAX, Role::Occupancy),
        ];
        for &blocks in &self.sweep_blocks_per_sm {
            for &tile in &self.sweep_tiles {
                for &stages in &self.stages {
                    let name = match stages {
                        1 => format!("async copies, 1 stage, tile {tile}"),
                        2 => format!("double-buffered (2 stages), tile {tile}"),
                        s => format!("async copies, {s} stages, tile {tile}"),
                    };
                    v.push(variant(name + &blocks.in_name(), TileKind::Async, shape(tile, self.threads, stages), blocks, Role::Sweep));
                }
            }
        }
        // One loader and one storer warp beside 6 or 10 compute warps.
        for (stages, threads) in [(3u32, 256u32), (4, 384)] {
            let name = format!("warp-specialized, {stages} stages, {} compute warps", threads / 32 - 2);
            v.push(variant(name, TileKind::WarpSpecialized, shape(self.tile, threads, stages), BlocksPerSm::ONE, Role::Pipelined));
        }
        for stages in [2, 3] {
            v.push(variant(
                format!("TMA bulk copies, {stages} stages"),
                TileKind::Tma,
                shape(self.tile, self.threads, stages),
                BlocksPerSm::ONE,
                Role::Pipelined,
            ));
        }
        for &blocks in &self.plain_blocks_per_sm {
            let name = format!("plain CUDA reference (2 stages), tile {}{}", self.tile, blocks.in_name());
            v.push(variant(name, TileKind::Plain, shape(self.tile, self.threads, 2), blocks, Role::PlainReference));
        }
        v
    }

    /// The kernels whose warps the lab traces, one of each way to keep
    /// tiles in flight: the naive kernel, double buffering (2 stages at
    /// --tile, one block per SM where the sweep has it, else at the sweep's
    /// first tile with 2 stages, else the sweep's first kernel), the first
    /// warp-specialized kernel and the TMA kernel with the most stages.
    pub fn diagram_variants(&self) -> Vec<Variant> {
        let v = self.variants();
        let sweep = v
            .iter()
            .find(|x| x.role == Role::Sweep && x.shape.stages == 2 && x.shape.tile == self.tile && x.blocks_per_sm == 1)
            .or_else(|| v.iter().find(|x| x.role == Role::Sweep && x.shape.stages == 2 && x.shape.tile == self.tile))
            .or_else(|| v.iter().find(|x| x.role == Role::Sweep && x.shape.stages == 2))
            .or_else(|| v.iter().find(|x| x.role == Role::Sweep));
        let picks = [
            v.iter().find(|x| x.role == Role::Baseline),
            sweep,
            v.iter().find(|x| x.kind == TileKind::WarpSpecialized),
            v.iter().filter(|x| x.kind == TileKind::Tma).max_by_key(|x| x.shape.stages),
        ];
        picks.into_iter().flatten().cloned().collect()
    }
}

crate::lab_config!(KernelPipelineConfig);

/// What a variant is in the lab's story.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The naive kernel at one block per SM: what the others are compared with.
    Baseline,
    /// The naive kernel with as many blocks per SM as fit: latency hidden
    /// by more warps instead of by a pipeline.
    Occupancy,
    /// A point of the stage and tile sweep (asynchronous copies).
    Sweep,
    /// Warp-specialized and TMA kernels.
    Pipelined,
    /// The plain CUDA two-stage kernel (kernels/tile_plain.cu): not the
    /// lab's own, the yardstick its kernels are held to.
    PlainReference,
}

/// One kernel the lab runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub name: String,
    pub kind: TileKind,
    pub shape: TileShape,
    /// Blocks per SM asked (u32::MAX: as many as fit).
    pub blocks_per_sm: u32,
    pub role: Role,
    /// Outputs each thread blurs and stores at once (kernels/tile_blur.cuh's VEC).
    #[serde(default = "vector_width_of_recordings")]
    pub vector_width: u32,
}

/// One variant's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: Variant,
    /// Skipped, and why (a GPU without the TMA, a shape that does not fit).
    pub skipped: Option<String>,
    pub resources: Option<KernelResources>,
    /// Each timed run, ms (CUDA events).
    pub ms: Option<Summary>,
}

/// One D2D copy size of the ceiling sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyPoint {
    pub mib: usize,
    /// Each timed copy, ms (CUDA events).
    pub ms: Summary,
}

impl CopyPoint {
    /// Read + write GB/s at the median.
    pub fn gbps(&self) -> f64 {
        measure::gbps((self.mib << 20) / 4, self.ms.median)
    }
}

/// The lab's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelPipelineResults {
    pub config: KernelPipelineConfig,
    /// The D2D copy of the input (the lab's size), ms, one per round.
    pub copy_ms: Summary,
    /// Larger D2D copies, each size twice the one before, up to
    /// `config.ceiling_max_mib` (or what the memory holds): the
    /// device-memory ceiling is the fastest of these and the lab's own.
    #[serde(default)]
    pub ceiling_sweep: Vec<CopyPoint>,
    pub variants: Vec<VariantResult>,
    /// One round on the stream: a D2D copy of the input and every kernel.
    #[serde(default)]
    pub round: Option<Timeline>,
    /// What block 0's warps did over their first tiles, per traced kernel
    /// ([`KernelPipelineConfig::diagram_variants`]), titled by variant.
    #[serde(default)]
    pub warps: Vec<Timeline>,
}

impl KernelPipelineResults {
    /// GB/s of useful traffic (every input read once, every output written once) in `ms`.
    pub fn gbps(&self, ms: f64) -> f64 {
        measure::gbps(self.config.elements(), ms)
    }
    /// The lab's own copy as a point of the sweep.
    pub fn own_copy(&self) -> CopyPoint {
        CopyPoint { mib: self.config.mib, ms: self.copy_ms }
    }
    /// The copy that reaches the ceiling: the fastest (GB/s, median) of
    /// the lab's own size and the sweep's larger ones.
    pub fn ceiling_copy(&self) -> CopyPoint {
        let own = self.own_copy();
        self.ceiling_sweep.iter().filter(|p| p.gbps() > own.gbps()).max_by(|a, b| a.gbps().total_cmp(&b.gbps())).cloned().unwrap_or(own)
    }
    /// The device-memory ceiling, GB/s read + write: the fastest copy's median.
    pub fn ceiling_gbps(&self) -> f64 {
        self.ceiling_copy().gbps()
    }
    /// A result's share of the ceiling (median run).
    pub fn share(&self, r: &VariantResult) -> Option<f64> {
        r.ms.as_ref().map(|m| self.gbps(m.median) / self.ceiling_gbps())
    }
    fn ran(&self) -> impl Iterator<Item = &VariantResult> {
        self.variants.iter().filter(|r| r.ms.is_some())
    }
    /// The fastest (median) of the kernels that ran and are `which`.
    fn fastest(&self, which: impl Fn(&Variant) -> bool) -> Option<&VariantResult> {
        self.ran().filter(|r| which(&r.variant)).min_by(|a, b| a.ms.as_ref().unwrap().median.total_cmp(&b.ms.as_ref().unwrap().median))
    }
    /// The lab's fastest kernel that pipelines (async copies, warp-specialized or TMA).
    pub fn best_pipelined(&self) -> Option<&VariantResult> {
        self.fastest(|v| v.kind != TileKind::Naive && v.role != Role::PlainReference)
    }
    /// The fastest run of the plain CUDA reference (kernels/tile_plain.cu).
    pub fn plain_reference(&self) -> Option<&VariantResult> {
        self.fastest(|v| v.role == Role::PlainReference)
    }
    pub fn by_role(&self, role: Role) -> Option<&VariantResult> {
        self.ran().find(|r| r.variant.role == role)
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let mut out = self.ceiling_lines();
        // The kernel column as wide as the longest name.
        let w = self.variants.iter().map(|r| r.variant.name.chars().count()).max().unwrap_or(0).max(48);
        out += &format!(
            "  {:<w$} {:>4} {:>6} {:>5} {:>4} {:>7} {:>5} {:>3} {:>9} {:>17} {:>7} {:>7}\n",
            "kernel", "regs", "smem", "occ", "bps", "grid", "lcl", "vec", "ms", "25%..75%", "GB/s", "of ceil"
        );
        for r in &self.variants {
            match (&r.ms, &r.resources, &r.skipped) {
                (Some(m), Some(res), _) => {
                    let (lo, hi) = m.middle_range();
                    out += &format!(
                        "  {:<w$} {:>4} {:>6} {:>4.0}% {:>4} {:>7} {:>5} {:>3} {:>9.4} {:>8.4}..{:<8.4} {:>7.0} {:>6.1}%\n",
                        r.variant.name,
                        res.registers,
                        crate::units::Bytes((res.static_smem + res.dynamic_smem) as u64).to_string(),
                        100.0 * res.occupancy,
                        res.blocks_per_sm,
                        res.grid,
                        res.local_bytes,
                        r.variant.vector_width,
                        m.median,
                        lo,
                        hi,
                        self.gbps(m.median),
                        100.0 * self.share(r).unwrap_or(0.0)
                    )
                }
                (_, _, Some(why)) => out += &format!("  {:<w$} skipped: {why}\n", r.variant.name),
                _ => {}
            }
        }
        out += "  (regs: registers per thread; smem: shared memory per block; occ: the share of an SM's threads that fit; bps: blocks per SM launched; lcl: spilled bytes per thread; vec: outputs a thread blurs and stores at once; the plain CUDA reference is not the lab's own: the yardstick it is held to)\n";
        out += &self.summary_lines();
        out += &self.warp_lines();
        out
    }

    /// The device-memory ceiling and the copies it was taken from: the lab's
    /// own size and each larger one, with which reaches the ceiling.
    pub fn ceiling_lines(&self) -> String {
        let c = self.ceiling_copy();
        let mut out = format!(
            "device-memory ceiling: {:.0} GB/s read + write, a D2D copy of {} MiB ({:.4} ms, 25%..75% {:.4}..{:.4})\n",
            c.gbps(),
            c.mib,
            c.ms.median,
            c.ms.middle_range().0,
            c.ms.middle_range().1
        );
        let own = self.own_copy();
        if c.mib != own.mib {
            out += &format!(
                "  the same copy of the lab's {} MiB: {:.0} GB/s ({:.4} ms, 25%..75% {:.4}..{:.4}), {:.1}% of the ceiling: a copy this size does not reach it\n",
                own.mib,
                own.gbps(),
                own.ms.median,
                own.ms.middle_range().0,
                own.ms.middle_range().1,
                100.0 * own.gbps() / c.gbps()
            );
        }
        if self.ceiling_sweep.is_empty() {
            out +=
                "  (this recording has no larger copies: made before the lab swept them, its ceiling is the lab's own size's, which a larger copy may beat)\n";
        } else {
            let sizes: Vec<String> = std::iter::once(&own).chain(&self.ceiling_sweep).map(|p| format!("{} MiB {:.0}", p.mib, p.gbps())).collect();
            out += &format!("  copies swept (GB/s, median): {}\n", sizes.join(", "));
        }
        out
    }

    /// Per traced kernel: how long block 0 took a tile, and
    /// how the first warp of each job split that time between phases.
    pub fn warp_lines(&self) -> String {
        if self.warps.is_empty() {
            return String::new();
        }
        let mut out = String::from("what block 0's warps did, tile by tile (a traced build; share of each warp's stamped time):\n");
        for t in &self.warps {
            let (a, b) = tile_range(t).unwrap_or((0, 0));
            out += &format!("  {:<48} tiles {a} to {b}: a tile every {:.2} us\n", t.title, tile_period_us(t).unwrap_or(f64::NAN));
            let mut seen = Vec::new();
            for lane in t.lanes() {
                let job = lane.split(": ").nth(1).unwrap_or("all alike").to_string();
                if seen.contains(&job) {
                    continue;
                }
                seen.push(job);
                let shares = phase_shares(t, &lane);
                let parts: Vec<String> =
                    WarpPhase::ALL.iter().zip(shares).filter(|(_, s)| *s > 0.0).map(|(p, s)| format!("{} {:.0}%", p.label(), 100.0 * s)).collect();
                out += &format!("    {:<22} {}\n", lane, parts.join(", "));
            }
        }
        out
    }

    /// What the run shows, in words, with the numbers and spreads.
    pub fn summary_lines(&self) -> String {
        let mut out = String::new();
        if let (Some(best), Some(naive)) = (self.best_pipelined(), self.by_role(Role::Baseline)) {
            let (b, n) = (best.ms.as_ref().unwrap(), naive.ms.as_ref().unwrap());
            out += &format!(
                "best pipelined kernel: {} at {:.1}% of the ceiling, {:.2}x the naive kernel at one block per SM ({:.4} vs {:.4} ms, spreads {:.4} / {:.4}: {})\n",
                best.variant.name,
                100.0 * self.share(best).unwrap(),
                n.median / b.median,
                b.median,
                n.median,
                b.middle_spread(),
                n.middle_spread(),
                if n.median - b.median > b.middle_spread().max(n.middle_spread()) { "beyond the spreads" } else { "NOT beyond the spreads" }
            );
        }
        if let (Some(best), Some(plain)) = (self.best_pipelined(), self.plain_reference()) {
            let (b, p) = (best.ms.as_ref().unwrap(), plain.ms.as_ref().unwrap());
            let points = 100.0 * (self.share(best).unwrap() - self.share(plain).unwrap());
            let beyond = (p.median - b.median).abs() > b.middle_spread().max(p.middle_spread());
            out += &format!(
                "the plain CUDA reference (the CUDA guide's two-stage cuda::pipeline), at its best ({}), reaches {:.1}% of the ceiling: the lab's best pipelined kernel is {:.1} points {} it ({:.4} vs {:.4} ms, spreads {:.4} / {:.4}: {})\n",
                plain.variant.name,
                100.0 * self.share(plain).unwrap(),
                points.abs(),
                if points >= 0.0 { "above" } else { "BELOW" },
                b.median,
                p.median,
                b.middle_spread(),
                p.middle_spread(),
                if beyond { "beyond the spreads" } else { "within the spreads" }
            );
        }
        if let (Some(best), Some(occ)) = (self.best_pipelined(), self.by_role(Role::Occupancy)) {
            let (b, o) = (best.ms.as_ref().unwrap(), occ.ms.as_ref().unwrap());
            let res = occ.resources.unwrap();
            out += &format!(
                "the naive kernel with {} blocks per SM reaches {:.1}% of the ceiling: more warps also keep loads in flight; the best pipelined kernel is {:+.1}% faster than it, with one block per SM\n",
                res.blocks_per_sm,
                100.0 * self.share(occ).unwrap(),
                100.0 * (o.median / b.median - 1.0)
            );
        }
        out
    }

    /// The measured numbers behind [`Self::headline`]: the ceiling's copy
    /// and every kernel that ran.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let c = self.ceiling_copy();
        // By rate, not time: the fastest copy's size may differ from run to run.
        let rate = c.ms.map_decreasing(|ms| measure::gbps((c.mib << 20) / 4, ms));
        let mut v = vec![crate::lab_kit::headline::HeadlineFigure::new("device-memory ceiling (the fastest copy)", "GB/s", rate)];
        v.extend(self.ran().filter_map(|r| Some(crate::lab_kit::headline::HeadlineFigure::new(r.variant.name.clone(), "ms", r.ms?))));
        v
    }
    /// The headline rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let c = self.ceiling_copy();
        let mut rows = vec![(
            "device-memory ceiling (D2D copy, read + write)".to_string(),
            format!("{:.0} GB/s ({} MiB copy{})", c.gbps(), c.mib, if self.ceiling_sweep.is_empty() { "; no larger copy swept" } else { "" }),
        )];
        let pct = |r: Option<&VariantResult>| r.and_then(|r| self.share(r)).map_or("-".to_string(), |s| format!("{:.1}%", 100.0 * s));
        rows.push(("naive kernel, one block per SM, of the ceiling".into(), pct(self.by_role(Role::Baseline))));
        rows.push(("naive kernel, as many blocks as fit, of the ceiling".into(), pct(self.by_role(Role::Occupancy))));
        if let Some(best) = self.best_pipelined() {
            rows.push(("best pipelined kernel, of the ceiling".into(), format!("{} ({})", pct(Some(best)), best.variant.name)));
        }
        if let Some(plain) = self.plain_reference() {
            rows.push(("plain CUDA two-stage reference, of the ceiling".into(), format!("{} ({})", pct(Some(plain)), plain.variant.name)));
        }
        rows
    }
}

pub type KernelPipelineRecord = crate::measure::record::Record<KernelPipelineResults>;

/// Notebook entry points for lab 7.
impl crate::lab_kit::LabRun<KernelPipelineResults> {
    /// Every kernel: resources, time, GB/s, share of the ceiling.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// Share of the ceiling against stages in flight.
    pub fn chart(&self) -> crate::present::chart::Figure {
        self.record.results.chart(&self.origin())
    }
    /// What each warp of block 0 does when, in four kernels (from traced
    /// builds).
    pub fn warps(&self) -> Result<Gantt> {
        self.record.results.warp_chart(&self.origin()).ok_or_else(|| self.predates("the warp timeline"))
    }
    /// One round on the stream: a D2D copy of the input and every kernel.
    pub fn round(&self) -> Result<Gantt> {
        self.record.results.round_chart(&self.origin()).ok_or_else(|| self.predates("the round's timeline"))
    }
    fn predates(&self, what: &str) -> LabError {
        LabError::config(format!(
            "{}: this recording has no {what} (it was made before the lab traced it): run `overlap-lab kernel-pipeline` to record again",
            self.origin()
        ))
    }
    /// Checks the learner's double-buffered kernel in `path` (read when
    /// called, so edits to the file count): on a GPU, its outputs and its
    /// speed against the naive kernel; with none, its compile and copies.
    pub fn check_double_buffered(&self, path: &str) -> crate::lab_kit::check::CheckReport {
        let cfg = KernelPipelineConfig { repeats: 9, ..self.record.results.config.clone() };
        let source = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                let mut rep = crate::lab_kit::check::CheckReport::new(exercise::EXERCISE).answering(exercise::EXERCISES[0].id);
                rep.problem(format!("could not read {path}: {e}"));
                return rep;
            }
        };
        let file = std::path::Path::new(path).file_name().map_or(path.to_string(), |f| f.to_string_lossy().into_owned());
        self.check(
            exercise::EXERCISE,
            &exercise::EXERCISES[0],
            cfg.device,
            |gpu| exercise::check_on_gpu(gpu, &file, &source, &cfg),
            || exercise::check_offline(&file, &source, &cfg),
        )
    }
}

/// Lab 7's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<KernelPipelineConfig, KernelPipelineResults> = crate::lab_kit::Entry {
    number: 7,
    name: LAB,
    module: module_path!(),
    teaches: "Pipelining inside a kernel: async copies to shared memory, stages, warp specialization, the TMA",
    builds_on: &[(2, "overlap: work in flight while other work runs")],
    kernels: &[&kernel::TILE_NAIVE, &kernel::TILE_ASYNC, &kernel::TILE_WARP_SPECIALIZED, &kernel::TILE_TMA, &kernel::TILE_PLAIN],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("regs, smem, occ, bps, lcl", "registers per thread, shared memory per block, resident share of an SM's threads, blocks per SM launched, spilled bytes per thread"),
        crate::lab_kit::Word::new("stage, tile, TMA", "tiles in flight per block, the block's unit of work, the tensor memory accelerator's bulk copies"),
    ],
    about: "Lab 7: tile kernels (naive, async copies with 1-4 stages, warp-specialized, TMA) against the device-memory ceiling, beside a plain CUDA two-stage kernel",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: charts::report,
    headline: KernelPipelineResults::headline,
    headline_figures: KernelPipelineResults::headline_figures,
    timelines: |rec, o| [rec.results.warp_chart(o), rec.results.round_chart(o)].into_iter().flatten().collect(),
    fixture: fixture::results,
};

#[cfg(test)]
mod tests {
    use super::charts::report;
    use super::kernel::{KernelResources, WarpTrace};
    use super::warps::warp_timeline;
    use super::*;

    #[test]
    fn presets_are_valid_and_bad_settings_name_the_setting() {
        for c in [KernelPipelineConfig::default(), KernelPipelineConfig::quick(), KernelPipelineConfig::small()] {
            c.validate().unwrap();
            assert!(c.variants().iter().all(|v| v.shape.tile as usize <= c.elements()));
        }
        let bad = |f: &dyn Fn(&mut KernelPipelineConfig), want: &str| {
            let mut c = KernelPipelineConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(&|c| c.mib = 0, "--mib");
        bad(&|c| c.repeats = 0, "--repeats");
        bad(&|c| c.threads = 100, "--threads");
        bad(&|c| c.stages = vec![0], "--stages");
        bad(&|c| c.stages = vec![], "--stages");
        bad(&|c| c.tile = 4098, "tile 4098");
        bad(&|c| c.sweep_tiles = vec![3 << 20], "dividing");
        bad(&|c| c.sweep_tiles = vec![], "--sweep-tiles");
        bad(&|c| c.vector_width = 2, "--vector-width must be 1 or 4");
        bad(&|c| c.sweep_blocks_per_sm = vec![BlocksPerSm(0)], "--sweep-blocks-per-sm");
        bad(&|c| c.plain_blocks_per_sm = vec![], "--plain-blocks-per-sm");
        bad(&|c| c.plain_blocks_per_sm = vec![BlocksPerSm(40)], "--plain-blocks-per-sm must list blocks per SM, each 1 to 32 or max (got 40)");
    }

    #[test]
    fn blocks_per_sm_read_a_number_or_max_and_name_what_they_refuse() {
        assert_eq!("max".parse::<BlocksPerSm>(), Ok(BlocksPerSm::MAX));
        assert_eq!(" 3".parse::<BlocksPerSm>(), Ok(BlocksPerSm(3)));
        for bad in ["0", "33", "all", "-1", ""] {
            let e = bad.parse::<BlocksPerSm>().unwrap_err();
            assert!(e.contains(&format!("`{}` is not a number of blocks per SM", bad.trim())) && e.contains("max"), "{bad}: {e}");
        }
        for b in [BlocksPerSm::ONE, BlocksPerSm(6), BlocksPerSm::MAX] {
            assert_eq!(b.to_string().parse::<BlocksPerSm>(), Ok(b));
        }
        // In a kernel's name: nothing for the lab's one block per SM.
        assert_eq!((BlocksPerSm::ONE.in_name(), BlocksPerSm(2).in_name()), (String::new(), ", 2 blocks per SM".to_string()));
        assert_eq!(BlocksPerSm::MAX.in_name(), ", as many blocks as fit");
    }

    /// The plain CUDA reference runs in every preset, at two stages, once
    /// per launch asked; the stage sweep repeats at each blocks-per-SM
    /// count asked, one name per kernel; every kernel blurs at the run's
    /// vector width.
    #[test]
    fn every_preset_runs_the_plain_reference_beside_the_sweep_at_each_launch() {
        for c in [KernelPipelineConfig::default(), KernelPipelineConfig::headline(), KernelPipelineConfig::quick(), KernelPipelineConfig::small()] {
            let plain: Vec<_> = c.variants().into_iter().filter(|v| v.role == Role::PlainReference).collect();
            assert_eq!(plain.len(), c.plain_blocks_per_sm.len());
            assert!(!plain.is_empty() && plain.iter().all(|v| v.kind == TileKind::Plain && v.shape.stages == 2 && v.shape.tile == c.tile), "{plain:?}");
        }
        let c = KernelPipelineConfig { sweep_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm(2), BlocksPerSm::MAX], vector_width: 1, ..Default::default() };
        let v = c.variants();
        let sweep: Vec<_> = v.iter().filter(|x| x.role == Role::Sweep).collect();
        assert_eq!(sweep.len(), 3 * c.sweep_tiles.len() * c.stages.len());
        assert_eq!(sweep.iter().filter(|x| x.blocks_per_sm == u32::MAX).count(), c.sweep_tiles.len() * c.stages.len());
        assert!(v.iter().any(|x| x.name == "double-buffered (2 stages), tile 4096, 2 blocks per SM"), "{:?}", v.iter().map(|x| &x.name).collect::<Vec<_>>());
        assert!(v.iter().any(|x| x.name == "plain CUDA reference (2 stages), tile 4096, as many blocks as fit"));
        let names: std::collections::HashSet<_> = v.iter().map(|x| &x.name).collect();
        assert_eq!(names.len(), v.len(), "one name per kernel");
        assert!(v.iter().all(|x| x.vector_width == 1));
        assert!(KernelPipelineConfig::default().variants().iter().all(|x| x.vector_width == kernel::VEC_DEFAULT));
    }

    /// Recordings made before the plain reference and the vector width
    /// load as what they ran (one float at a time, one block per SM, no
    /// reference) and still render.
    #[test]
    fn recordings_from_before_the_plain_reference_load_as_what_they_ran() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let found = crate::measure::record::find_recordings::<KernelPipelineResults>(&data, LAB).unwrap();
        assert!(!found.is_empty());
        for (path, rec) in found {
            let r = &rec.results;
            if r.variants.iter().any(|x| x.variant.role == Role::PlainReference) {
                continue;
            }
            let at = path.display();
            assert_eq!((r.config.vector_width, &r.config.sweep_blocks_per_sm), (1, &vec![BlocksPerSm::ONE]), "{at}");
            assert!(r.config.plain_blocks_per_sm.is_empty() && r.variants.iter().all(|x| x.variant.vector_width == 1), "{at}");
            assert!(r.plain_reference().is_none() && !r.table().contains("plain CUDA reference ("), "{at}");
            assert!(!r.headline().iter().any(|(k, _)| k.contains("plain")), "{at}");
        }
    }

    #[test]
    fn the_default_run_covers_every_kernel_and_the_stage_by_tile_sweep() {
        let c = KernelPipelineConfig::default();
        let v = c.variants();
        for kind in TileKind::ALL {
            assert!(v.iter().any(|x| x.kind == kind), "{kind:?}");
        }
        assert_eq!(v.iter().filter(|x| x.role == Role::Sweep).count(), c.sweep_tiles.len() * c.stages.len() * c.sweep_blocks_per_sm.len());
        assert!(v.iter().any(|x| x.name.starts_with("double-buffered (2 stages)")));
        let names: std::collections::HashSet<_> = v.iter().map(|x| &x.name).collect();
        assert_eq!(names.len(), v.len(), "one name per kernel");
        assert!(v.iter().filter(|x| x.kind == TileKind::WarpSpecialized).all(|x| x.shape.threads >= 96));
    }

    fn fixture() -> KernelPipelineResults {
        let c = KernelPipelineConfig::small();
        let res = KernelResources {
            registers: 32,
            static_smem: 16,
            dynamic_smem: 8192,
            local_bytes: 0,
            max_blocks_per_sm: 8,
            occupancy: 1.0,
            blocks_per_sm: 1,
            grid: 132,
        };
        let s = |ms: f64| Summary::of(&[ms * 0.99, ms, ms * 1.01]).unwrap();
        let variants = c
            .variants()
            .into_iter()
            .map(|v| {
                let ms = match (v.role, v.kind) {
                    (Role::Baseline, _) => Some(2.0),
                    (Role::Occupancy, _) => Some(1.2),
                    (_, TileKind::Tma) => None,
                    // The reference: 1.06 ms at one block per SM, 1.04 at as many as fit.
                    (Role::PlainReference, _) => Some(if v.blocks_per_sm == 1 { 1.06 } else { 1.04 }),
                    _ => Some(1.0 + 0.1 / v.shape.stages as f64),
                };
                VariantResult {
                    skipped: ms.is_none().then(|| "tile_tma.cu needs compute capability 9.0".to_string()),
                    resources: ms.map(|_| res),
                    ms: ms.map(s),
                    variant: v,
                }
            })
            .collect();
        let spans = |warp: u32, phases: &[(WarpPhase, f64)]| {
            let mut at = 0.0;
            let mut v = Vec::new();
            for tile in 0..2 {
                for &(phase, us) in phases {
                    v.push(kernel::WarpSpan { warp, phase, tile, start_us: at, end_us: at + us });
                    at += us;
                }
            }
            v
        };
        let naive: Vec<_> = (0..4).flat_map(|w| spans(w, &[(WarpPhase::Copy, 1.0), (WarpPhase::Wait, 0.5), (WarpPhase::Compute, 0.5)])).collect();
        let ws: Vec<_> = spans(0, &[(WarpPhase::Wait, 0.2), (WarpPhase::Copy, 0.3)])
            .into_iter()
            .chain(spans(1, &[(WarpPhase::Wait, 0.25), (WarpPhase::Compute, 0.75)]))
            .chain(spans(2, &[(WarpPhase::Wait, 0.1), (WarpPhase::Compute, 0.9)]))
            .chain(spans(3, &[(WarpPhase::Wait, 0.5), (WarpPhase::Store, 0.5)]))
            .collect();
        let trace = |spans| WarpTrace { spans, ns_per_cycle: 0.5 };
        let shape = TileShape { tile: 1024, threads: 128, stages: 2 };
        let warps = vec![
            warp_timeline(TileKind::Naive, shape, &trace(naive), "naive", "GPU 0 (test)"),
            warp_timeline(TileKind::WarpSpecialized, shape, &trace(ws), "warp-specialized, 2 stages, 2 compute warps", "GPU 0 (test)"),
        ];
        KernelPipelineResults { config: c, copy_ms: s(1.0), ceiling_sweep: Vec::new(), variants, round: None, warps }
    }

    #[test]
    fn the_table_and_headline_name_the_best_kernel_the_naive_one_and_the_skipped() {
        let r = fixture();
        let t = r.table();
        assert!(t.contains("skipped: tile_tma.cu needs compute capability 9.0"), "{t}");
        // Best: 1.025 ms (4 stages) against the naive 2.0 ms: 1.95x, 97.6% of the ceiling (1.0 ms).
        assert!(t.contains("best pipelined kernel: warp-specialized, 4 stages, 10 compute warps at 97.6%"), "{t}");
        assert!(t.contains("1.95x the naive kernel") && t.contains("beyond the spreads"), "{t}");
        assert!(t.contains("blocks per SM reaches 83.3%") && t.contains("+17.1% faster"), "{t}");
        let h = r.headline();
        assert_eq!(h[1].1, "50.0%");
        assert_eq!(h[2].1, "83.3%");
        assert!(h[3].1.starts_with("97.6% (warp-specialized"), "{h:?}");
        // The reference at its best (as many blocks as fit, 1.04 ms): 96.2%, 1.4 points under the best.
        assert_eq!(
            h[4],
            (
                "plain CUDA two-stage reference, of the ceiling".into(),
                format!("96.2% (plain CUDA reference (2 stages), tile {}, as many blocks as fit)", r.config.tile)
            )
        );
        assert!(t.contains("reaches 96.2% of the ceiling: the lab's best pipelined kernel is 1.4 points above it") && t.contains("within the spreads"), "{t}");
        assert!(t.contains("\n  plain CUDA reference (2 stages), tile 1024 "), "its own row: {t}");
        // A reference faster than every kernel of the lab is said so, and is never the lab's best.
        let mut fast = r.clone();
        for v in fast.variants.iter_mut().filter(|v| v.variant.role == Role::PlainReference) {
            v.ms = Some(Summary::of(&[0.9, 0.9, 0.9]).unwrap());
        }
        assert_ne!(fast.best_pipelined().unwrap().variant.role, Role::PlainReference);
        let t = fast.table();
        assert!(t.contains("the lab's best pipelined kernel is 13.6 points BELOW it") && t.contains("beyond the spreads"), "{t}");
        let ceiling = r.ceiling_gbps();
        assert!((ceiling - 2.0 * 4.0 * r.config.elements() as f64 / 1e6).abs() < 1e-6, "{ceiling}");
    }

    #[test]
    fn the_ceiling_is_the_fastest_copy_of_the_sweep_with_the_labs_own_beside_it() {
        let mut r = fixture();
        let own = r.ceiling_gbps();
        let best_share = r.share(r.best_pipelined().unwrap()).unwrap();
        // A copy twice the size runs at 1.25x the GB/s (2x the bytes in 1.6x
        // the time), four times the size only 0.5% more.
        let at = |mib: usize, ms: f64| CopyPoint { mib, ms: crate::testing::flat(ms) };
        r.ceiling_sweep = vec![at(2 * r.config.mib, 1.6), at(4 * r.config.mib, 3.184)];
        let c = r.ceiling_copy();
        assert_eq!(c.mib, 4 * r.config.mib);
        assert!((r.ceiling_gbps() / own - 4.0 / 3.184).abs() < 1e-9, "{} vs {own}", r.ceiling_gbps());
        // Every share is against the ceiling, not the lab's own copy.
        let share = r.share(r.best_pipelined().unwrap()).unwrap();
        assert!((share / best_share - 3.184 / 4.0).abs() < 1e-9, "{share} vs {best_share}");
        let t = r.ceiling_lines();
        assert!(t.contains(&format!("a D2D copy of {} MiB", 4 * r.config.mib)), "{t}");
        assert!(t.contains(&format!("the same copy of the lab's {} MiB", r.config.mib)) && t.contains("does not reach it"), "{t}");
        assert!(r.headline()[0].1.ends_with(&format!("({} MiB copy)", 4 * r.config.mib)), "{:?}", r.headline());
        // A sweep slower than the lab's own copy leaves the ceiling where it was.
        r.ceiling_sweep = vec![at(2 * r.config.mib, 2.5)];
        assert_eq!(r.ceiling_copy().mib, r.config.mib);
        assert!(!r.ceiling_lines().contains("does not reach it"));
        // A recording from before the sweep says its ceiling may be beaten.
        r.ceiling_sweep.clear();
        assert!(r.ceiling_lines().contains("no larger copies"), "{}", r.ceiling_lines());
    }

    #[test]
    fn the_warp_timeline_names_each_job_and_splits_its_time() {
        let r = fixture();
        let ws = &r.warps[1];
        assert_eq!(ws.lanes(), ["warp 0: loader", "warp 1: compute", "warp 2: compute", "warp 3: storer"]);
        assert!(ws.spans.iter().all(|s| s.class.as_deref().and_then(WarpPhase::of_class).is_some() && s.label.starts_with("tile ")), "{:?}", ws.spans[0]);
        let shares = phase_shares(ws, "warp 3: storer");
        assert_eq!(shares, [0.0, 0.5, 0.0, 0.5]);
        let lines = r.warp_lines();
        // One line per job (the second compute warp is left out), tiles and time per kernel.
        assert!(lines.contains("naive") && lines.contains("tiles 0 to 1: a tile every 2.00 us"), "{lines}");
        // Warp-specialized: loader 0.5, compute 1.0 and storer 1.0 us a tile: the median warp's 1.0, not the panel's width.
        assert_eq!(tile_period_us(ws), Some(1.0));
        assert!(lines.contains("warp 0: loader") && lines.contains("copy in 60%, wait 40%"), "{lines}");
        assert!(lines.contains("warp 1: compute") && lines.contains("wait 25%, compute 75%") && !lines.contains("warp 2: compute"), "{lines}");
        assert!(lines.contains("warp 0 ") && lines.contains("copy in 50%, wait 25%, compute 25%"), "{lines}");
        assert!(r.table().contains("what block 0's warps did"), "the table carries the warp lines");
        // The chart keeps warps 0, 1 and the last: the naive kernel's warp 2 is not drawn.
        let g = r.warp_chart("test").unwrap();
        assert_eq!(g.timelines[0].lanes(), ["warp 0", "warp 1", "warp 3"]);
        assert_eq!(g.timelines[1].lanes(), ["warp 0: loader", "warp 1: compute", "warp 3: storer"]);
        let svg = crate::present::chart::Chart::to_svg(&g).unwrap();
        assert!(svg.contains("µs") && svg.contains("copy in") && svg.contains("store") && svg.contains("its tiles 0 to 1"), "legend, units, title");
        assert!(r.round_chart("test").is_none(), "no round timeline, no chart");
        let dir = crate::testing::temp_dir("kernel-pipeline-report");
        let rec = crate::measure::record::Record::new(LAB, crate::testing::fingerprint(), r);
        let files = report(&rec, &dir, "test").unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"kernel-pipeline-warps.svg".to_string()), "{names:?}");
        assert!(names.contains(&"kernel-pipeline-warps-warp-specialized-2-stages-2-compute-warps.trace.json".to_string()), "{names:?}");
    }

    #[test]
    fn the_chart_draws_a_line_per_tile_and_the_naive_references() {
        let r = fixture();
        let f = r.chart("test");
        let labels: Vec<_> = f.panels[0].series.iter().map(|s| s.label.as_str()).collect();
        assert!(labels.contains(&"async copies, tile 1024") && labels.contains(&"naive, one block per SM"), "{labels:?}");
        assert!(!labels.iter().any(|l| l.starts_with("TMA")), "skipped kernels draw nothing: {labels:?}");
        crate::present::chart::render_svg(&f).unwrap();
    }
}
