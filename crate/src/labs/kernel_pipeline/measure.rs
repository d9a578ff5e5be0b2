//! Lab 7 on the GPU: each tile kernel (the plain CUDA reference's sweep
//! among them) run over the same data through the runner, timed by CUDA
//! events around it, verified against the CPU reference, beside the
//! device-memory ceiling (the fastest of device-to-device copies of the
//! input's size and larger) measured in the same run. One input and one
//! output buffer serve every kernel; the CPU reference and the check of
//! every output are spread over the host's cores.
//!
//! May use: `super::builds` (the kernels, built), `super::kernel`,
//! `super::settings`, `super::results`, `gpu`, `measure`, `pipeline`
//! (the runner's vocabulary), `present::progress`.

use super::builds;
use super::kernel::{blur_reference, TileKernel, BLUR_RADIUS};
use super::{CopyPoint, KernelPipelineConfig, KernelPipelineResults, Variant, VariantResult, LAB};
use crate::error::{LabError, Result};
use crate::gpu::{DeviceBuffer, Gpu, HostBuffer, PinnedBuffer, Runner, Stream, TimelineSource};
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::pipeline::issue::StreamRef;
use crate::pipeline::op::{Access, Link, OpId, OpKind};
use crate::pipeline::timeline::Timeline;
use crate::present::progress::{Progress, ProgressMode};

/// The device buffers and host staging every kernel of one run shares.
pub struct TileData {
    /// Outputs (a multiple of every tile size the run takes).
    pub n: usize,
    padded_host: PinnedBuffer,
    result_host: PinnedBuffer,
    padded: DeviceBuffer,
    output: DeviceBuffer,
    /// The CPU reference of the current input.
    reference: Vec<f32>,
    stream: Stream,
    gpu: Gpu,
}

impl TileData {
    /// Buffers for `n` outputs (`n` a multiple of 4).
    pub fn new(gpu: &Gpu, n: usize) -> Result<TileData> {
        if n == 0 || n % 4 != 0 {
            return Err(LabError::config(format!("lab 7's data: {n} elements must be a positive multiple of 4")));
        }
        let padded_bytes = (n + 2 * BLUR_RADIUS) * 4;
        gpu.ensure_free((padded_bytes + n * 4) as u64, "lab 7's input and output")?;
        Ok(TileData {
            n,
            padded_host: PinnedBuffer::new(gpu, padded_bytes)?,
            result_host: PinnedBuffer::new(gpu, n * 4)?,
            padded: gpu.alloc(padded_bytes)?,
            output: gpu.alloc(n * 4)?,
            reference: vec![0.0; n],
            stream: gpu.stream()?,
            gpu: gpu.clone(),
        })
    }

    /// Fresh random input (zero padding at both ends) on the device, and
    /// its CPU reference.
    pub fn refresh(&mut self) -> Result<()> {
        pattern::fill_f32(self.padded_host.words_mut(), pattern::fresh_seed());
        let padded = pattern::as_f32_mut(self.padded_host.words_mut());
        let len = padded.len();
        padded[..BLUR_RADIUS].fill(0.0);
        padded[len - BLUR_RADIUS..].fill(0.0);
        blur_reference(padded, &mut self.reference);
        self.stream.upload(&self.padded, &self.padded_host, len * 4)
    }

    /// The device-to-device copy of the n inputs into the output buffer
    /// (read n, write n: the same bytes as a kernel's useful traffic), ms.
    pub fn copy_ms(&self) -> Result<f64> {
        self.timed_alone("D2D copy of the input", |p, s| self.copy_op(p, s))
    }

    /// Poisons the output, runs `kernel` once and checks every output
    /// against the CPU reference of the current input.
    pub fn verified(&mut self, kernel: &TileKernel, what: &str) -> Result<()> {
        self.stream.fill_u32(&self.output, pattern::POISON as u32)?;
        self.timed(kernel)?;
        self.verify(what)
    }

    /// One timed run of `kernel`, ms (CUDA events).
    pub fn timed(&self, kernel: &TileKernel) -> Result<f64> {
        self.timed_alone("kernel", |p, s| self.kernel_op(p, s, "kernel", kernel))
    }

    /// The ops `add` puts on the data's stream, run alone through the
    /// runner: their device time by CUDA events around each, first start
    /// to last end, ms.
    fn timed_alone<'a>(&'a self, lane: &str, add: impl FnOnce(&mut Runner<'a>, StreamRef) -> Result<OpId>) -> Result<f64> {
        timed_alone(&self.gpu, &self.stream, lane, add)
    }

    /// The D2D copy of the input into the output as an op of `p` on `s`.
    fn copy_op<'a>(&'a self, p: &mut Runner<'a>, s: StreamRef) -> Result<OpId> {
        d2d_op(p, s, &self.gpu, (&self.padded, &self.output), self.n * 4, "D2D copy of the input", self.accesses())
    }

    /// `kernel` over the data as an op of `p` on `s`, labelled `name`.
    fn kernel_op<'a>(&'a self, p: &mut Runner<'a>, s: StreamRef, name: &str, kernel: &'a TileKernel) -> Result<OpId> {
        let (input, output, tiles) = (self.padded.span(), self.output.span(), self.tiles(kernel)?);
        // SAFETY: as for the copy.
        unsafe { p.op(s, OpKind::Kernel, name, self.accesses(), move |st| kernel.enqueue(st, input, output, tiles)) }
    }

    /// What the copy and every kernel read and write.
    fn accesses(&self) -> Vec<Access> {
        vec![Access::read("input", 0, self.n as u64), Access::write("output", 0, self.n as u64)]
    }

    /// One round as the stream runs it: the D2D copy of the input (device to
    /// device), then each of `kernels` (named), back to back, each op timed
    /// by CUPTI (by CUDA events where CUPTI is taken, as under Nsight).
    pub fn round_timeline(&self, gpu: &Gpu, kernels: &[(&str, &TileKernel)]) -> Result<Option<Timeline>> {
        let mut p = gpu.runner(TimelineSource::best(), kernels.len() + 1, true)?;
        let s = p.stream(&self.stream, "copy and kernels");
        self.copy_op(&mut p, s)?;
        for &(name, k) in kernels {
            self.kernel_op(&mut p, s, name, k)?;
        }
        let mut timeline = p.finish()?.timeline;
        if let Some(t) = &mut timeline {
            t.title = "one round: the D2D copy of the input, then every kernel".into();
        }
        Ok(timeline)
    }

    /// A kernel from `TileKernel::load_traced` run once on the current
    /// input, its outputs verified, and what block 0's warps did as a
    /// timeline titled `title`.
    pub fn warp_timeline(&mut self, gpu: &Gpu, kernel: &TileKernel, title: &str) -> Result<Timeline> {
        self.trace_window_fits(kernel, title)?;
        let tiles = self.tiles(kernel)?;
        self.stream.fill_u32(&self.output, pattern::POISON as u32)?;
        let trace = kernel.warp_trace(&self.stream, &self.padded, &self.output, tiles)?;
        self.verify(title)?;
        Ok(super::warps::warp_timeline(kernel.kind(), kernel.shape(), &trace, title, &gpu.label()))
    }

    /// Whether block 0 of `kernel` (traced or not: one block per SM either
    /// way) gets the tiles the warp timeline covers; if not, the error says
    /// what to change.
    pub fn trace_window_fits(&self, kernel: &TileKernel, title: &str) -> Result<()> {
        let (first, count) = (super::kernel::TRACE_FIRST, super::kernel::TRACE_TILES);
        let block0 = self.block0_tiles(kernel)?;
        if block0 < first + count {
            return Err(LabError::config(format!(
                "{title}: block 0 gets {block0} tiles and the warp timeline covers its tiles {first} to {}: give more --mib or a smaller --tile",
                first + count - 1
            )));
        }
        Ok(())
    }

    /// Tiles block 0 of `kernel` works on (the grid strides over them).
    pub fn block0_tiles(&self, kernel: &TileKernel) -> Result<u32> {
        Ok(self.tiles(kernel)?.div_ceil(kernel.resources().grid.max(1)))
    }

    fn tiles(&self, kernel: &TileKernel) -> Result<u32> {
        let tile = kernel.shape().tile as usize;
        if self.n % tile != 0 || self.n / tile > u32::MAX as usize {
            return Err(LabError::config(format!("{} outputs are not a whole number of {tile}-output tiles", self.n)));
        }
        Ok((self.n / tile) as u32)
    }

    /// After a failed [`TileData::verified`]: what the first wrong tile of
    /// `tile` outputs holds (from the outputs that check read back), for a
    /// grid of `grid` blocks.
    pub fn wrong_tile(&self, tile: usize, grid: usize) -> Option<WrongTile> {
        wrong_tile(pattern::as_f32(self.result_host.words()), &self.reference, tile, grid)
    }

    /// Every output against the reference, bit for bit, over the host's cores.
    fn verify(&mut self, what: &str) -> Result<()> {
        self.stream.download(&mut self.result_host, &self.output, self.n * 4)?;
        let got = pattern::as_f32(self.result_host.words());
        match first_difference(got, &self.reference) {
            None => Ok(()),
            Some(i) => Err(LabError::wrong_data(what.to_string(), i, format!("got {}, expected {} (the CPU reference)", got[i], self.reference[i]))),
        }
    }
}

/// The first place where `got` and `want` differ bit for bit, over the
/// host's cores: chunks of 64 Ki floats, a plain loop each (as
/// `gpu::plan`'s check does; per element, rayon's bookkeeping would cost
/// more than the comparison).
pub fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let n = got.len().min(want.len());
    got[..n]
        .par_chunks(CHUNK)
        .zip(want[..n].par_chunks(CHUNK))
        .enumerate()
        .find_map_first(|(c, (g, w))| g.iter().zip(w).position(|(a, b)| a.to_bits() != b.to_bits()).map(|k| c * CHUNK + k))
}

/// What the first wrong tile of a kernel's outputs holds: tile `tile` is
/// the `k`-th tile of block `block` (the grid strides over the tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrongTile {
    pub tile: usize,
    pub block: usize,
    pub k: usize,
    pub holds: TileHolds,
}

/// What a wrong tile holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileHolds {
    /// `outputs` of them never written (still the poison), the rest right.
    Unwritten { outputs: usize },
    /// Exactly tile `other`'s results: the block blurred that tile's data.
    Another { other: usize },
    /// `wrong` of its outputs wrong, the rest right.
    Part { wrong: usize },
    /// Every output wrong, and not another tile's results.
    Whole,
}

/// The first tile (of `tile` outputs) of `got` that differs from `want`,
/// bit for bit, and what it holds; `grid`: the blocks the kernel ran.
/// Another tile's results are looked for among the tiles its block worked
/// on near it (8 either side) and its neighbours.
fn wrong_tile(got: &[f32], want: &[f32], tile: usize, grid: usize) -> Option<WrongTile> {
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let tiles = got.len().min(want.len()) / tile.max(1);
    let at = |t: usize| t * tile..(t + 1) * tile;
    let t = (0..tiles).find(|&t| !same(&got[at(t)], &want[at(t)]))?;
    let (mine, grid) = (&got[at(t)], grid.max(1));
    let wrong = mine.iter().zip(&want[at(t)]).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    let poison = pattern::POISON as u32;
    let unwritten = mine.iter().filter(|x| x.to_bits() == poison).count();
    let nearby = (1..=8).flat_map(|j| [t.checked_sub(j * grid), Some(t + j * grid)]).chain([t.checked_sub(1), Some(t + 1)]);
    let other = nearby.flatten().filter(|&u| u < tiles && u != t).find(|&u| same(mine, &want[at(u)]));
    let holds = match other {
        _ if unwritten == wrong => TileHolds::Unwritten { outputs: unwritten },
        Some(other) => TileHolds::Another { other },
        None if wrong == tile => TileHolds::Whole,
        None => TileHolds::Part { wrong },
    };
    Some(WrongTile { tile: t, block: t % grid, k: t / grid, holds })
}

/// A D2D copy of `bytes` from `src` to `dst` (`(src, dst)`) as an op of
/// `p` on `s`, labelled `label`; `accesses` name what it reads and writes.
fn d2d_op<'a>(
    p: &mut Runner<'a>,
    s: StreamRef,
    gpu: &Gpu,
    (src, dst): (&'a DeviceBuffer, &'a DeviceBuffer),
    bytes: usize,
    label: &str,
    accesses: Vec<Access>,
) -> Result<OpId> {
    let (input, output) = (src.span(), dst.span());
    let within = Link::between(gpu.ordinal(), gpu.ordinal()).ok_or_else(|| crate::LabError::config("GPUs past 255 are not numbered"))?;
    // SAFETY: the copy touches only `src` and `dst`, borrowed for the
    // runner's life (it synchronizes before it ends), and `accesses` name both.
    unsafe { p.op(s, OpKind::D2d(within), label, accesses, move |st| st.enqueue_copy_on_device(output, input, bytes)) }
}

/// The ops `add` puts on `stream`, run alone through a runner on `gpu`:
/// their device time by CUDA events around each, first start to last end, ms.
fn timed_alone<'a>(gpu: &Gpu, stream: &'a Stream, lane: &str, add: impl FnOnce(&mut Runner<'a>, StreamRef) -> Result<OpId>) -> Result<f64> {
    let mut p = gpu.runner(TimelineSource::Events, 1, false)?;
    let s = p.stream(stream, lane);
    add(&mut p, s)?;
    p.finish()?.ops_ms()
}

pub use super::settings::CEILING_SWEEP_MAX_MIB;

/// D2D copies of twice the lab's size, then twice that, up to `max_mib`
/// or the largest pair of buffers the free memory holds, each timed
/// `repeats` times after one untimed: a bigger copy amortizes its start
/// and end over more bytes, so the lab's own size may not reach what the
/// memory does. (No early stop: successive sizes differ by about as much
/// as one size's runs, so a stop rule would end on noise.)
fn ceiling_sweep(gpu: &Gpu, lab_mib: usize, max_mib: usize, repeats: usize) -> Result<Vec<CopyPoint>> {
    let stream = gpu.stream()?;
    let mut points = Vec::new();
    let mut mib = lab_mib * 2;
    while mib <= max_mib {
        let bytes = mib << 20;
        let (free, _) = gpu.memory_info()?;
        if 2 * bytes as u64 + (256 << 20) > free {
            break;
        }
        let (src, dst) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?);
        // Copied memory is written first (what it holds does not matter to
        // the copy's speed, but a copy of memory never written is a read of
        // uninitialized memory to compute-sanitizer's initcheck).
        stream.fill_u32(&src, 0)?;
        let label = format!("D2D copy of {mib} MiB");
        let accesses = || vec![Access::read("copy source", 0, bytes as u64), Access::write("copy destination", 0, bytes as u64)];
        let mut ms = Vec::with_capacity(repeats);
        for rep in 0..=repeats {
            let t = timed_alone(gpu, &stream, "ceiling sweep", |p, s| d2d_op(p, s, gpu, (&src, &dst), bytes, &label, accesses()))?;
            if rep > 0 {
                ms.push(t);
            }
        }
        points.push(CopyPoint { mib, ms: Summary::of(&ms)? });
        mib *= 2;
    }
    Ok(points)
}

pub use super::results::gbps;

/// Runs the lab: every variant built (each distinct build compiled once,
/// all at once over the host's cores, and loaded once: `builds`; those
/// this GPU cannot run are kept with the reason, as are launches of the
/// plain reference's sweep that would repeat another), verified on fresh
/// random input, then timed in rounds, each round a D2D copy of the input
/// and then every kernel once (so drift of the host or the GPU's clocks
/// hits them alike), then verified again on new input; then larger copies
/// until the device-memory ceiling is reached (`ceiling_sweep`). The
/// traced builds of the warp timelines are compiled with the rest.
pub fn run(gpu: &Gpu, cfg: &KernelPipelineConfig, progress: ProgressMode) -> Result<KernelPipelineResults> {
    cfg.validate()?;
    let variants = cfg.variants();
    let mut progress = Progress::new(progress, variants.len() as u64 + 7, LAB);
    let mut data = TileData::new(gpu, cfg.elements())?;
    // Traced builds only where block 0 gets the window (at one block per SM).
    let sms = gpu.fingerprint()?.sm_count;
    let to_trace: Vec<Variant> = cfg.diagram_variants().into_iter().filter(|v| builds::trace_window_fits(data.n, v.shape.tile, sms)).collect();
    let built = {
        let _range = crate::gpu::trace::range("compile and load every build");
        builds::build_all(gpu, variants, &to_trace)?
    };
    progress.step(&format!(
        "{} kernels and {} traced builds from {} builds, compiled by NVRTC on {} threads and loaded in {:.1} s",
        built.results.len(),
        built.traced.len(),
        built.builds,
        built.threads,
        built.seconds
    ));
    let (mut results, kernels, mut traced) = (built.results, built.kernels, built.traced);
    for r in &results {
        progress.step(&match (&r.resources, &r.skipped) {
            (Some(res), _) => format!("{}: {} registers, {} blocks per SM", r.variant.name, res.registers, res.blocks_per_sm),
            (_, Some(why)) => format!("{}: skipped: {why}", r.variant.name),
            _ => r.variant.name.clone(),
        });
    }
    let verify_all = |data: &mut TileData, results: &[VariantResult], kernels: &[Option<TileKernel>]| -> Result<()> {
        data.refresh()?;
        for (r, k) in results.iter().zip(kernels) {
            if let Some(k) = k {
                data.verified(k, &r.variant.name)?;
            }
        }
        Ok(())
    };
    verify_all(&mut data, &results, &kernels)?;
    progress.step("every kernel verified against the CPU reference on fresh random input");
    let mut copy = Vec::new();
    let mut times = vec![Vec::new(); kernels.len()];
    // A warm-up round, then the timed ones.
    for round in 0..=cfg.repeats {
        let _range = crate::gpu::trace::range(&format!("round {round}"));
        let c = data.copy_ms()?;
        for (t, k) in times.iter_mut().zip(&kernels) {
            if let Some(k) = k {
                let ms = data.timed(k)?;
                if round > 0 {
                    t.push(ms);
                }
            }
        }
        if round > 0 {
            copy.push(c);
        }
    }
    progress.step(&format!("{} rounds of the lab's copy and every kernel", cfg.repeats));
    let copy_ms = Summary::of(&copy)?;
    let ceiling_sweep = ceiling_sweep(gpu, cfg.mib, cfg.ceiling_max_mib, cfg.repeats)?;
    progress.step(&format!(
        "larger copies for the ceiling: {}",
        ceiling_sweep.iter().map(|p| format!("{} MiB {:.0} GB/s", p.mib, p.gbps())).collect::<Vec<_>>().join(", ")
    ));
    verify_all(&mut data, &results, &kernels)?;
    progress.step("every kernel verified again on new input");
    let named: Vec<(&str, &TileKernel)> = results.iter().zip(&kernels).filter_map(|(r, k)| k.as_ref().map(|k| (r.variant.name.as_str(), k))).collect();
    let round = data.round_timeline(gpu, &named)?;
    progress.step("one round on the timeline");
    let mut warps = Vec::new();
    let mut too_few = None;
    let diagram = cfg.diagram_variants();
    for (r, k) in results.iter().zip(&kernels) {
        let (v, Some(untraced)) = (&r.variant, k) else { continue };
        if !diagram.contains(v) {
            continue;
        }
        // A small run (the sanitizers' preset) has too few tiles a block:
        // said, and nothing compiled for it.
        if let Err(LabError::Config(why)) = data.trace_window_fits(untraced, &v.name) {
            too_few = Some(why);
            break;
        }
        let _range = crate::gpu::trace::range(&format!("warp timeline {}", v.name));
        let at = traced.iter().position(|(t, _)| t == v).ok_or_else(|| LabError::Kernel(format!("{}: no traced build", v.name)))?;
        let kernel = traced.swap_remove(at).1?;
        warps.push(data.warp_timeline(gpu, &kernel, &v.name)?);
    }
    progress.step(&match too_few {
        Some(why) => format!("warp timelines skipped: {why}"),
        None => format!("block 0's warps traced in {} kernels (a traced build, outputs verified)", warps.len()),
    });
    for (r, t) in results.iter_mut().zip(&times) {
        if !t.is_empty() {
            r.ms = Some(Summary::of(t)?);
        }
    }
    progress.finish();
    Ok(KernelPipelineResults { config: cfg.clone(), copy_ms, ceiling_sweep, variants: results, round, warps })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check over the cores finds the first difference, bit for bit
    /// (a -0.0 for a 0.0 too), across its chunks' edges.
    #[test]
    fn the_first_difference_is_found_across_chunks() {
        let want: Vec<f32> = (0..3 * (1 << 16) + 7).map(|i| i as f32).collect();
        assert_eq!(first_difference(&want, &want), None);
        for at in [0, (1 << 16) - 1, 1 << 16, 2 * (1 << 16) + 3, want.len() - 1] {
            let mut got = want.clone();
            got[at] = -got[at] - 1.0;
            got[want.len() - 1] = 0.5;
            assert_eq!(first_difference(&got, &want), Some(at));
        }
        let mut zero = vec![0.0f32; 8];
        zero[5] = -0.0;
        assert_eq!(first_difference(&zero, &[0.0; 8]), Some(5));
    }

    /// Twelve tiles of four outputs over a grid of three blocks: the first
    /// wrong tile, its block and place, and what it holds.
    #[test]
    fn a_wrong_tile_is_found_and_what_it_holds_is_told_apart() {
        let want: Vec<f32> = (0..48).map(|i| i as f32).collect();
        let with = |f: &dyn Fn(&mut [f32])| {
            let mut got = want.clone();
            f(&mut got);
            wrong_tile(&got, &want, 4, 3)
        };
        assert_eq!(with(&|_| ()), None);
        let poison = f32::from_bits(pattern::POISON as u32);
        // Tile 7 (block 1's tile 2) partly never written, partly wrong, all another's.
        let at = |tile, holds| Some(WrongTile { tile, block: tile % 3, k: tile / 3, holds });
        assert_eq!(with(&|g| g[29..31].fill(poison)), at(7, TileHolds::Unwritten { outputs: 2 }));
        assert_eq!(with(&|g| g[29] = 0.5), at(7, TileHolds::Part { wrong: 1 }));
        // Tile 7 holds tile 4's results (the same block's tile before), or tile 8's (its neighbour).
        assert_eq!(with(&|g| g.copy_within(16..20, 28)), at(7, TileHolds::Another { other: 4 }));
        assert_eq!(with(&|g| g.copy_within(32..36, 28)), at(7, TileHolds::Another { other: 8 }));
        assert_eq!(with(&|g| g[28..32].fill(-1.0)), at(7, TileHolds::Whole));
        // Only the first wrong tile is told.
        assert_eq!(
            with(&|g| {
                g[5] = 0.25;
                g[40] = 0.25;
            }),
            at(1, TileHolds::Part { wrong: 1 })
        );
    }
}
