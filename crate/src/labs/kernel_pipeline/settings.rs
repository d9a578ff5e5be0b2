//! Lab 7's settings and the kernels they make: the command line's options
//! ([`KernelPipelineConfig`], its presets and checks), how many blocks per
//! SM a kernel is launched with ([`BlocksPerSm`]), and every kernel a run
//! times ([`Variant`], in the table's order, each with its [`Role`] in the
//! lab's story): the lab's own, then the plain CUDA reference swept over
//! the same tiles and several launches, so that the yardstick is held at
//! its best.
//!
//! May use: `super::kernel` (kernel kinds and shapes), `error`, `units`.
//! Nothing here touches a GPU.

use super::kernel::{self, TileKind, TileShape};
use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};

/// The lab's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct KernelPipelineConfig {
    #[arg(skip)]
    pub device: usize,
    /// Input size (and as much output), MiB if no unit is given (64,
    /// 1GiB): well past the L2 cache, so every kernel reads device memory.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = KernelPipelineConfig::default().mib)]
    pub mib: usize,
    /// Outputs per tile for the naive, warp-specialized and TMA kernels.
    #[arg(long, default_value_t = KernelPipelineConfig::default().tile)]
    pub tile: u32,
    /// Tile sizes of the stage sweep and of the plain CUDA reference's
    /// sweep (comma-separated).
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
    /// Blocks per SM of the plain CUDA reference's sweep (comma-separated;
    /// `max`: as many as fit, as a CUDA program sizes its grid by the
    /// occupancy calculator), each at every tile of `--sweep-tiles`, with
    /// `--threads` and 2 stages: the yardstick is held at the best of
    /// them, as the lab's own kernels are. A count more than fit is
    /// skipped, saying so (the launch would be another's).
    #[arg(long, value_delimiter = ',', default_values_t = KernelPipelineConfig::default().plain_blocks_per_sm)]
    #[serde(default)]
    pub plain_blocks_per_sm: Vec<BlocksPerSm>,
}

/// The largest copy the ceiling sweep tries by default, MiB.
pub const CEILING_SWEEP_MAX_MIB: usize = 4096;

/// What recordings made before the setting existed swept up to.
fn ceiling_max_mib_of_recordings() -> usize {
    CEILING_SWEEP_MAX_MIB
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
    /// The launch in words: "one block per SM", "4 blocks per SM", "as
    /// many blocks as fit".
    pub fn words(self) -> String {
        match self {
            BlocksPerSm::ONE => "one block per SM".into(),
            BlocksPerSm::MAX => "as many blocks as fit".into(),
            BlocksPerSm(n) => format!("{n} blocks per SM"),
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
            ceiling_max_mib: CEILING_SWEEP_MAX_MIB,
            vector_width: kernel::VEC_DEFAULT,
            sweep_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm::MAX],
            plain_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm(2), BlocksPerSm(4), BlocksPerSm::MAX],
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
        if let Some(t) = self.sweep_tiles.iter().enumerate().find_map(|(i, t)| self.sweep_tiles[..i].contains(t).then_some(t)) {
            return Err(LabError::config(format!("--sweep-tiles lists tile {t} twice")));
        }
        if !kernel::VEC_WIDTHS.contains(&self.vector_width) {
            return Err(LabError::config(format!("--vector-width must be 1 or 4 (got {})", self.vector_width)));
        }
        for (option, list) in [("--sweep-blocks-per-sm", &self.sweep_blocks_per_sm), ("--plain-blocks-per-sm", &self.plain_blocks_per_sm)] {
            let repeated = list.iter().enumerate().any(|(i, b)| list[..i].contains(b));
            if list.is_empty() || repeated || list.iter().any(|b| b.0 == 0 || (b.0 > BlocksPerSm::LIMIT && *b != BlocksPerSm::MAX)) {
                return Err(LabError::config(format!(
                    "{option} must list blocks per SM, each 1 to {} or max, each once (got {})",
                    BlocksPerSm::LIMIT,
                    list.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
                )));
            }
        }
        Ok(())
    }

    /// Every kernel the lab runs, in the order its table prints them: the
    /// lab's own, then the plain CUDA reference's sweep (each tile of the
    /// stage sweep at each of `plain_blocks_per_sm`, tile by tile).
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
        for &tile in &self.sweep_tiles {
            for &blocks in &self.plain_blocks_per_sm {
                let name = format!("plain CUDA reference (2 stages), tile {tile}{}", blocks.in_name());
                v.push(variant(name, TileKind::Plain, shape(tile, self.threads, 2), blocks, Role::PlainReference));
            }
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

impl Variant {
    /// How it is launched, in words: "tile 4096, 4 blocks per SM".
    pub fn launch_words(&self) -> String {
        format!("tile {}, {}", self.shape.tile, BlocksPerSm(self.blocks_per_sm).words())
    }
}

#[cfg(test)]
mod tests {
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
        bad(&|c| c.plain_blocks_per_sm = vec![BlocksPerSm(40)], "--plain-blocks-per-sm must list blocks per SM, each 1 to 32 or max, each once (got 40)");
        bad(&|c| c.plain_blocks_per_sm = vec![BlocksPerSm(2), BlocksPerSm(2)], "each once (got 2,2)");
        bad(&|c| c.sweep_tiles = vec![2048, 4096, 2048], "--sweep-tiles lists tile 2048 twice");
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
        // In words, each launch plainly.
        assert_eq!(
            [BlocksPerSm::ONE, BlocksPerSm(4), BlocksPerSm::MAX].map(BlocksPerSm::words),
            ["one block per SM", "4 blocks per SM", "as many blocks as fit"]
        );
    }

    /// The plain CUDA reference is swept in every preset as the lab's own
    /// kernels are: at two stages, at every tile of the stage sweep, each
    /// at every launch asked (by default one block per SM, 2, 4 and as
    /// many as fit), tile by tile after the lab's kernels; the stage sweep
    /// repeats at each blocks-per-SM count asked, one name per kernel;
    /// every kernel blurs at the run's vector width.
    #[test]
    fn every_preset_sweeps_the_plain_reference_over_tiles_and_launches() {
        for c in [KernelPipelineConfig::default(), KernelPipelineConfig::headline(), KernelPipelineConfig::quick(), KernelPipelineConfig::small()] {
            let v = c.variants();
            let plain: Vec<_> = v.iter().filter(|v| v.role == Role::PlainReference).collect();
            assert_eq!(plain.len(), c.sweep_tiles.len() * c.plain_blocks_per_sm.len());
            assert!(plain.iter().all(|v| v.kind == TileKind::Plain && v.shape.stages == 2 && v.shape.threads == c.threads), "{plain:?}");
            let launches: Vec<(u32, u32)> = plain.iter().map(|v| (v.shape.tile, v.blocks_per_sm)).collect();
            let want: Vec<(u32, u32)> = c.sweep_tiles.iter().flat_map(|&t| c.plain_blocks_per_sm.iter().map(move |b| (t, b.0))).collect();
            assert_eq!(launches, want);
            // After every kernel of the lab's own.
            let first = v.iter().position(|x| x.role == Role::PlainReference).unwrap();
            assert!(v[first..].iter().all(|x| x.role == Role::PlainReference));
            assert_eq!(c.plain_blocks_per_sm, [BlocksPerSm::ONE, BlocksPerSm(2), BlocksPerSm(4), BlocksPerSm::MAX]);
        }
        let c = KernelPipelineConfig::default();
        let names: Vec<String> = c.variants().into_iter().filter(|v| v.shape.tile == 4096 && v.role == Role::PlainReference).map(|v| v.name).collect();
        // Named as the recordings named the two launches they ran.
        assert_eq!(
            names,
            [
                "plain CUDA reference (2 stages), tile 4096",
                "plain CUDA reference (2 stages), tile 4096, 2 blocks per SM",
                "plain CUDA reference (2 stages), tile 4096, 4 blocks per SM",
                "plain CUDA reference (2 stages), tile 4096, as many blocks as fit"
            ]
        );
        let c = KernelPipelineConfig { sweep_blocks_per_sm: vec![BlocksPerSm::ONE, BlocksPerSm(2), BlocksPerSm::MAX], vector_width: 1, ..Default::default() };
        let v = c.variants();
        let sweep: Vec<_> = v.iter().filter(|x| x.role == Role::Sweep).collect();
        assert_eq!(sweep.len(), 3 * c.sweep_tiles.len() * c.stages.len());
        assert_eq!(sweep.iter().filter(|x| x.blocks_per_sm == u32::MAX).count(), c.sweep_tiles.len() * c.stages.len());
        assert!(v.iter().any(|x| x.name == "double-buffered (2 stages), tile 4096, 2 blocks per SM"), "{:?}", v.iter().map(|x| &x.name).collect::<Vec<_>>());
        assert!(v.iter().any(|x| x.name == "plain CUDA reference (2 stages), tile 8192, as many blocks as fit"));
        let names: std::collections::HashSet<_> = v.iter().map(|x| &x.name).collect();
        assert_eq!(names.len(), v.len(), "one name per kernel");
        assert!(v.iter().all(|x| x.vector_width == 1));
        assert!(KernelPipelineConfig::default().variants().iter().all(|x| x.vector_width == kernel::VEC_DEFAULT));
        assert_eq!(v.iter().find(|x| x.role == Role::PlainReference).unwrap().launch_words(), "tile 2048, one block per SM");
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
}
