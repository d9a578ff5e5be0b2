//! Runs lab 1 on a GPU. Every sample: fresh random source, poisoned
//! destination, timed copies, then (untimed) verification of every word.

use super::{BandwidthConfig, BandwidthResults, Direction, TransferPoint};
use crate::error::{LabError, Result};
use crate::gpu::trace;
use crate::gpu::{alloc_host, CopyOp, CopyTimer, DeviceBuffer, Gpu, HostBuffer, HostMemoryKind, PinnedBuffer, Stream};
use crate::lab_kit::host_memory;
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::present::progress::{Progress, ProgressMode};
use crate::units::Bytes;

/// Device buffers, a pinned check buffer and streams shared by every point.
struct Bench {
    timer: CopyTimer,
    aux: Stream,
    up_dst: DeviceBuffer,
    down_src: DeviceBuffer,
    check: PinnedBuffer,
}

/// The host buffers of one memory kind.
struct KindBuffers {
    src: Box<dyn HostBuffer>,
    dst: Box<dyn HostBuffer>,
}

fn mem_available_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Runs the sweep and the pinning-cost part.
pub fn run(gpu: &Gpu, cfg: &BandwidthConfig, progress: ProgressMode) -> Result<BandwidthResults> {
    cfg.validate()?;
    let max = cfg.max_bytes.as_usize();
    // Two device buffers of the largest size, with 64 MiB headroom for the context.
    gpu.ensure_free(2 * max as u64 + (64 << 20), &format!("a sweep up to {}", cfg.max_bytes))?;
    if let Some(avail) = mem_available_bytes() {
        let need = 3 * max as u64;
        if need > avail {
            return Err(LabError::config(format!("a sweep up to {} needs {} of host memory, {} is available", cfg.max_bytes, Bytes(need), Bytes(avail))));
        }
    }
    let sizes = cfg.sizes();
    let pin_sizes = if cfg.pin_cost_repeats > 0 { cfg.pin_cost_sizes() } else { vec![] };
    let steps = (cfg.kinds.len() * cfg.directions.len() * sizes.len() + pin_sizes.len()) as u64;
    let mut progress = Progress::new(progress, steps, "bandwidth");
    let _lab = trace::range("lab 1: pinned vs pageable");

    let mut bench =
        Bench { timer: CopyTimer::new(gpu, 2)?, aux: gpu.stream()?, up_dst: gpu.alloc(max)?, down_src: gpu.alloc(max)?, check: PinnedBuffer::new(gpu, max)? };
    let mut transfers = Vec::new();
    for &kind in &cfg.kinds {
        let _r = trace::range(&format!("allocate {kind} buffers"));
        let mut bufs = KindBuffers { src: alloc_host(gpu, kind, max)?, dst: alloc_host(gpu, kind, max)? };
        drop(_r);
        for &direction in &cfg.directions {
            for &bytes in &sizes {
                let point = measure_point(&mut bench, &mut bufs, cfg, kind, direction, bytes)?;
                progress.step(&format!("{direction} {kind} {bytes}: {:.1} GB/s", point.gbps.median));
                transfers.push(point);
            }
        }
    }
    drop(bench);
    let mut pin_cost = Vec::new();
    for &bytes in &pin_sizes {
        pin_cost.push(host_memory::price(gpu, bytes, cfg.pin_cost_repeats)?);
        progress.step(&format!("pinning cost {bytes}"));
    }
    progress.finish();
    Ok(BandwidthResults { config: cfg.clone(), transfers, pin_cost })
}

fn measure_point(
    b: &mut Bench,
    bufs: &mut KindBuffers,
    cfg: &BandwidthConfig,
    kind: HostMemoryKind,
    direction: Direction,
    bytes: Bytes,
) -> Result<TransferPoint> {
    let _r = trace::range(&format!("bandwidth {direction} {kind} {bytes}"));
    let n = bytes.as_usize();
    let words = n / 8;
    let copies = cfg.copies_per_sample(bytes);
    let gated = kind.is_page_locked() && b.timer.has_gate();
    let (mut device, mut host, mut gbps) = (Vec::new(), Vec::new(), Vec::new());
    let mut verified = 0;
    for sample in 0..cfg.warmup + cfg.repeats {
        // Fresh inputs for every sample, written before the timed region.
        let up_seed = pattern::fresh_seed();
        let down_seed = pattern::fresh_seed();
        {
            let _f = trace::range("fill and poison");
            if direction.uploads() {
                pattern::fill(&mut bufs.src.words_mut()[..words], up_seed);
                b.aux.fill_u32(&b.up_dst, 0xDEAD_BEEF)?;
            }
            if direction.downloads() {
                pattern::fill(&mut b.check.words_mut()[..words], down_seed);
                b.aux.upload(&b.down_src, &b.check, n)?;
                pattern::poison(&mut bufs.dst.words_mut()[..words]);
            }
        }
        let timing = {
            let _t = trace::range("timed copies");
            let mut ops = Vec::with_capacity(2);
            if direction.uploads() {
                ops.push(CopyOp::HostToDevice { src: bufs.src.as_ref(), dst: &b.up_dst, bytes: n });
            }
            if direction.downloads() {
                ops.push(CopyOp::DeviceToHost { src: &b.down_src, dst: bufs.dst.as_mut(), bytes: n });
            }
            b.timer.run(&mut ops, copies, gated)?
        };
        {
            let _v = trace::range("verify");
            let what = |d: &str| format!("{d} {kind} {bytes} sample {sample}");
            if direction.uploads() {
                b.aux.download(&mut b.check, &b.up_dst, n)?;
                pattern::verify(&b.check.words()[..words], up_seed, &what("H2D"))?;
            }
            if direction.downloads() {
                if kind.cpu_readable() {
                    pattern::verify(&bufs.dst.words()[..words], down_seed, &what("D2H"))?;
                } else {
                    // CPU reads of write-combined memory are uncached and very
                    // slow: bounce it through the GPU into cached pinned memory.
                    b.aux.upload(&b.up_dst, bufs.dst.as_ref(), n)?;
                    b.aux.download(&mut b.check, &b.up_dst, n)?;
                    pattern::verify(&b.check.words()[..words], down_seed, &what("D2H"))?;
                }
            }
            verified += 1;
        }
        if sample >= cfg.warmup {
            let per_copy = timing.device_ms / copies as f64;
            device.push(per_copy);
            host.push(timing.host_call_ms);
            gbps.push(direction.bytes_moved(bytes.0) as f64 / (per_copy * 1e-3) / 1e9);
        }
    }
    Ok(TransferPoint {
        kind,
        direction,
        bytes,
        copies_per_sample: copies,
        device_ms: Summary::of(&device)?,
        host_call_ms: Summary::of(&host)?,
        gbps: Summary::of(&gbps)?,
        gated,
        verified_samples: verified,
    })
}
