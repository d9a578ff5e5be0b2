//! Zero-copy: a kernel that reads mapped pinned host memory in place
//! against copy-then-compute (an upload, then the same kernel on device
//! memory), for data read once and read several times. Zero-copy pays the
//! host link on every read and saves the separate copy; reading once, it
//! streams the data through the kernel at about the link's speed, and
//! each further read pays the link again.

use super::MemoryConfig;
use crate::error::{LabError, Result};
use crate::gpu::kernels::reread_reference;
use crate::gpu::{DeviceBuffer, HostBuffer};
use crate::gpu::{Gpu, MappedBuffer, PinnedBuffer, ReadFrom, RereadKernel};
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
    /// The upload's part of copy-then-compute (each run's time less the
    /// kernel alone in the same round), over every read count, ms.
    pub upload_ms: Summary,
    pub points: Vec<ZeroCopyPoint>,
}

impl ZeroCopy {
    /// The model of a point: zero-copy reads the link once per pass (each
    /// pass at the upload's speed, or the kernel's if that is slower);
    /// copy-then-compute is the upload and then the kernel. (zero-copy, copy-then-compute), ms.
    pub fn model(&self, p: &ZeroCopyPoint) -> (f64, f64) {
        let per_pass = p.kernel_ms.median / p.passes as f64;
        (p.passes as f64 * self.upload_ms.median.max(per_pass), self.upload_ms.median + p.kernel_ms.median)
    }
    /// The largest read count at which zero-copy still wins, if any.
    pub fn wins_up_to(&self) -> Option<i32> {
        self.points.iter().filter(|p| p.ratio() < 1.0).map(|p| p.passes).max()
    }
}

/// Checks `out` against the CPU reference at about 4096 places and both ends.
fn verify(out: &PinnedBuffer, seed: u64, n: usize, passes: i32, what: &str) -> Result<()> {
    let got = pattern::as_f32(out.words());
    let step = (n / 4096).max(1);
    for i in (0..n).step_by(step).chain([n - 1]) {
        let want = reread_reference(pattern::f32_at(seed, i), passes);
        if got[i].to_bits() != want.to_bits() {
            return Err(LabError::wrong_data(format!("zero-copy, {what}, {passes} passes"), i, format!("got {}, expected {want}", got[i])));
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
    let timing = (gpu.timing_event()?, gpu.timing_event()?);
    let timing = (&timing.0, &timing.1);
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
    let mut upload = Vec::new();
    let mut points = Vec::new();
    for &passes in &cfg.passes {
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        // Each way in turn, sample by sample, after a warm-up of each.
        for rep in 0..=cfg.repeats {
            for (way, times) in t.iter_mut().enumerate() {
                let seed = fresh(&mut mapped, &mut pinned, &device_out)?;
                let ms = match way {
                    0 => kernel.run(&stream, None, ReadFrom::Mapped(&mapped), &device_out, n, passes, timing)?,
                    1 => kernel.run(&stream, Some(&pinned), ReadFrom::Device(&device_in), &device_out, n, passes, timing)?,
                    // The input is already on the device from the run before.
                    _ => kernel.run(&stream, None, ReadFrom::Device(&device_in), &device_out, n, passes, timing)?,
                };
                if way < 2 {
                    stream.download(&mut result, &device_out, bytes)?;
                    verify(&result, seed, n, passes, if way == 0 { "read in place" } else { "copied first" })?;
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
    Ok(ZeroCopy { elements: n, upload_ms: Summary::of(&upload)?, points })
}
