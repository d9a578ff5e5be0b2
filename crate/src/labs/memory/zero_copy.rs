//! Zero-copy: a kernel that reads mapped pinned host memory in place
//! against copy-then-compute (an upload, then the same kernel on device
//! memory), for data read once and read several times. The kernel does
//! real work on every value it reads: before the sweep it is balanced so
//! that one read of the input on device memory takes
//! `--zero-copy-compute` x the upload's time. Reading in place, the link
//! and that compute overlap inside the kernel, so one read costs
//! max(link, compute) against copy-then-compute's upload + compute:
//! zero-copy wins for data read once. Each further read pays the link
//! again, so for data read several times copying first wins.
//!
//! The model, p reads (kernel = p reads' compute on device memory; link =
//! one read in place with no compute, measured, since a kernel reads
//! mapped memory somewhat slower than the copy engine uploads it):
//! zero-copy p·max(link, kernel/p), copy-then-compute upload + kernel.

use super::kernel::{reread_reference, ReadFrom, RereadKernel};
use super::MemoryConfig;
use crate::error::{LabError, Result};
use crate::gpu::{DeviceBuffer, HostBuffer};
use crate::gpu::{Gpu, MappedBuffer, PinnedBuffer, TimelineSource};
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::present::progress::Progress;
use serde::{Deserialize, Serialize};

/// One read count, both ways, device times (CUDA events), ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZeroCopyPoint {
    /// How many times the kernel reads its whole input.
    pub passes: i32,
    /// The kernel reading mapped host memory in place.
    pub zero_copy_ms: Summary,
    /// The upload, then the kernel on device memory.
    pub copy_then_compute_ms: Summary,
    /// The kernel alone on device memory (the compute part).
    pub kernel_ms: Summary,
}

impl ZeroCopyPoint {
    /// Zero-copy's time over copy-then-compute's (below 1: zero-copy wins).
    pub fn ratio(&self) -> f64 {
        self.zero_copy_ms.median / self.copy_then_compute_ms.median
    }
}

/// The zero-copy sweep's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZeroCopy {
    pub elements: usize,
    /// The kernel's time per read as a share of the upload's, as asked
    /// (`--zero-copy-compute`).
    pub compute_share: f64,
    /// The FMA chain per element per read that balancing chose for that
    /// share (0: one FMA per element per read).
    pub iterations: i32,
    /// The upload of the whole input alone, measured before the sweep to
    /// balance the kernel, ms.
    pub upload_alone_ms: Summary,
    /// The upload's part of copy-then-compute (each run's time less the
    /// kernel alone in the same round), over every read count, ms.
    pub upload_ms: Summary,
    /// One read in place with no compute (the kernel at 0 FMAs): the link
    /// as a kernel reads it, ms.
    pub link_in_place_ms: Summary,
    pub points: Vec<ZeroCopyPoint>,
}

/// The model for `passes` reads, given one read in place with no compute
/// (`link_ms`), the upload's time and the kernel's for all the reads on
/// device memory (ms): zero-copy reads the link once per read while the
/// compute of that read overlaps it inside the kernel, p·max(link,
/// kernel/p); copy-then-compute is upload + kernel.
/// (zero-copy, copy-then-compute), ms.
pub fn model_ms(passes: i32, link_ms: f64, upload_ms: f64, kernel_ms: f64) -> (f64, f64) {
    let p = passes as f64;
    (p * link_ms.max(kernel_ms / p), upload_ms + kernel_ms)
}

impl ZeroCopy {
    /// The model of a point (see [`model_ms`]), from the sweep's upload and
    /// the point's kernel: (zero-copy, copy-then-compute), ms.
    pub fn model(&self, p: &ZeroCopyPoint) -> (f64, f64) {
        model_ms(p.passes, self.link_in_place_ms.median, self.upload_ms.median, p.kernel_ms.median)
    }
    /// The largest read count at which zero-copy still wins, if any.
    pub fn wins_up_to(&self) -> Option<i32> {
        self.points.iter().filter(|p| p.ratio() < 1.0).map(|p| p.passes).max()
    }
    /// The largest read count at which the model has zero-copy win, if any.
    pub fn model_wins_up_to(&self) -> Option<i32> {
        self.points
            .iter()
            .filter(|p| {
                let (zc, cc) = self.model(p);
                zc < cc
            })
            .map(|p| p.passes)
            .max()
    }
    /// The kernel's time for one read over the upload's, as measured (the
    /// point with the fewest reads; NaN without points).
    pub fn measured_share(&self) -> f64 {
        self.points.iter().min_by_key(|p| p.passes).map_or(f64::NAN, |p| p.kernel_ms.median / p.passes as f64 / self.upload_ms.median)
    }
}

/// Checks `out` against the CPU reference at about 4096 places and both ends.
fn verify(out: &PinnedBuffer, seed: u64, n: usize, passes: i32, iterations: i32, what: &str) -> Result<()> {
    let got = pattern::as_f32(out.words());
    let step = (n / 4096).max(1);
    for i in (0..n).step_by(step).chain([n - 1]) {
        let want = reread_reference(pattern::f32_at(seed, i), passes, iterations);
        if got[i].to_bits() != want.to_bits() {
            return Err(LabError::wrong_data(
                format!("zero-copy, {what}, {passes} passes of {iterations} FMAs"),
                i,
                format!("got {}, expected {want}", got[i]),
            ));
        }
    }
    Ok(())
}

/// The sweep over `cfg.passes`.
pub fn measure(gpu: &Gpu, cfg: &MemoryConfig, progress: &mut Progress) -> Result<ZeroCopy> {
    let n = cfg.zero_copy_elements;
    let bytes = n * 4;
    gpu.ensure_free(2 * bytes as u64, "zero-copy's device input and output")?;
    let kernel = RereadKernel::load(gpu)?;
    let stream = gpu.stream()?;
    let (mut mapped, mut pinned, mut result) = (MappedBuffer::new(gpu, bytes)?, PinnedBuffer::new(gpu, bytes)?, PinnedBuffer::new(gpu, bytes)?);
    let (device_in, device_out) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?);
    // Fresh random input in both host buffers, the output poisoned before each run.
    let fresh = |mapped: &mut MappedBuffer, pinned: &mut PinnedBuffer, device_out: &DeviceBuffer| -> Result<u64> {
        let seed = pattern::fresh_seed();
        pattern::fill_f32(mapped.words_mut(), seed);
        pattern::fill_f32(pinned.words_mut(), seed);
        stream.fill_u32(device_out, pattern::POISON as u32)?;
        Ok(seed)
    };
    // Balance: the upload alone, then the FMA chain that makes one read on
    // device memory take the asked share of it.
    pattern::fill_f32(pinned.words_mut(), pattern::fresh_seed());
    let upload_alone_ms = {
        // One H2D through the runner, timed from its call (no gate).
        let mut up = |reps| {
            Summary::of_runs(reps, || {
                let mut p = gpu.runner(TimelineSource::Off, 0, false)?.deferring()?;
                let (s, src, dst) = (p.stream(&stream, "upload"), p.host(&mut pinned, "pinned input"), p.device(&device_in, "device input"));
                p.h2d(s, dst, 0, src, 0, bytes, "H2D")?;
                Ok(p.finish()?.total_ms)
            })
        };
        up(1)?;
        up(5)?
    };
    let iterations = if cfg.zero_copy_compute > 0.0 {
        let once = |it: i32| kernel.run(gpu, &stream, None, ReadFrom::Device(&device_in), &device_out, n, 1, it);
        // The calibration stays within the kernel's limit (both are MAX_FMA_CHAIN).
        crate::lab_kit::calibrate_iterations(cfg.zero_copy_compute * upload_alone_ms.median, |it| Ok(Summary::of_runs(3, || once(it))?.median))?
    } else {
        0
    };
    // The link as the kernel reads it: one read in place, no compute.
    pattern::fill_f32(mapped.words_mut(), pattern::fresh_seed());
    let link_in_place_ms = {
        let read = || kernel.run(gpu, &stream, None, ReadFrom::Mapped(&mapped), &device_out, n, 1, 0);
        read()?;
        Summary::of_runs(5, read)?
    };
    // A note, not a step: measure.rs counts the lab's steps.
    progress.step_note(&format!(
        "zero-copy kernel balanced: {iterations} FMAs per element per read, for {:.2}x the upload alone ({:.3} ms)",
        cfg.zero_copy_compute, upload_alone_ms.median
    ));
    let mut upload = Vec::new();
    let mut points = Vec::new();
    for &passes in &cfg.passes {
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        // Each way in turn, sample by sample, after a warm-up of each.
        for rep in 0..=cfg.repeats {
            for (way, times) in t.iter_mut().enumerate() {
                let seed = fresh(&mut mapped, &mut pinned, &device_out)?;
                let ms = match way {
                    0 => kernel.run(gpu, &stream, None, ReadFrom::Mapped(&mapped), &device_out, n, passes, iterations)?,
                    1 => kernel.run(gpu, &stream, Some(&mut pinned), ReadFrom::Device(&device_in), &device_out, n, passes, iterations)?,
                    // The input is already on the device from the run before.
                    _ => kernel.run(gpu, &stream, None, ReadFrom::Device(&device_in), &device_out, n, passes, iterations)?,
                };
                if way < 2 {
                    stream.download(&mut result, &device_out, bytes)?;
                    verify(&result, seed, n, passes, iterations, if way == 0 { "read in place" } else { "copied first" })?;
                }
                if rep > 0 {
                    times.push(ms);
                }
            }
        }
        // The upload's share: copy-then-compute less the kernel, run by run.
        upload.extend(t[1].iter().zip(&t[2]).map(|(both, k)| both - k));
        let p = ZeroCopyPoint { passes, zero_copy_ms: Summary::of(&t[0])?, copy_then_compute_ms: Summary::of(&t[1])?, kernel_ms: Summary::of(&t[2])? };
        progress.step(&format!(
            "zero-copy, {passes} reads: in place {:.3} ms, copy then compute {:.3} ms ({:.2}x)",
            p.zero_copy_ms.median,
            p.copy_then_compute_ms.median,
            p.ratio()
        ));
        points.push(p);
    }
    Ok(ZeroCopy { elements: n, compute_share: cfg.zero_copy_compute, iterations, upload_alone_ms, upload_ms: Summary::of(&upload)?, link_in_place_ms, points })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flat;

    /// A sweep that follows the model exactly: an upload of 4 ms and a
    /// kernel of `share` x that per read.
    fn sweep(share: f64) -> ZeroCopy {
        let upload = 4.0;
        let points = [1, 2, 4, 8]
            .into_iter()
            .map(|passes| {
                let kernel = passes as f64 * share * upload;
                let (zc, cc) = model_ms(passes, upload, upload, kernel);
                ZeroCopyPoint { passes, zero_copy_ms: flat(zc), copy_then_compute_ms: flat(cc), kernel_ms: flat(kernel) }
            })
            .collect();
        ZeroCopy {
            elements: 1 << 20,
            compute_share: share,
            iterations: 0,
            upload_alone_ms: flat(upload),
            upload_ms: flat(upload),
            link_in_place_ms: flat(upload),
            points,
        }
    }

    #[test]
    fn zero_copy_wins_for_data_read_once_when_the_compute_hides_the_link() {
        let z = sweep(0.5);
        // 1 read: max(4, 2) = 4 against 4 + 2 = 6; 4 reads: 4·max(4, 2) = 16 against 4 + 8 = 12.
        assert_eq!(model_ms(1, 4.0, 4.0, 2.0), (4.0, 6.0));
        // A link read in place slower than the upload counts once per read.
        assert_eq!(model_ms(2, 5.0, 4.0, 4.0), (10.0, 8.0));
        assert_eq!(model_ms(4, 4.0, 4.0, 8.0), (16.0, 12.0));
        let (zc, cc) = z.model(&z.points[0]);
        assert!(zc < cc, "1 read: {zc} against {cc}");
        let (zc, cc) = z.model(&z.points[2]);
        assert!(zc > cc, "4 reads: {zc} against {cc}");
        // 2 reads: 8 against 8, a tie is no win.
        assert_eq!(z.model_wins_up_to(), Some(1));
        assert_eq!(z.wins_up_to(), Some(1));
        assert!((z.measured_share() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn with_no_compute_zero_copy_never_wins() {
        let z = sweep(0.0);
        for p in &z.points {
            let (zc, cc) = z.model(p);
            assert!(zc >= cc, "{} reads: {zc} against {cc}", p.passes);
        }
        assert_eq!(z.model_wins_up_to(), None);
        assert_eq!(z.wins_up_to(), None);
    }

    #[test]
    fn a_kernel_slower_than_the_link_sets_zero_copy_time() {
        // Compute 2x the upload per read: in place the kernel is the bottleneck
        // (p·2u), copying first adds the upload once (u + p·2u): zero-copy wins at every count.
        let z = sweep(2.0);
        assert_eq!(model_ms(8, 4.0, 4.0, 64.0), (64.0, 68.0));
        assert_eq!(z.model_wins_up_to(), Some(8));
    }
}
