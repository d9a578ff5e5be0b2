//! Runs lab 1 on a GPU. Every sample: fresh random source, poisoned
//! destination, timed copies, then (untimed) verification of every word.

use super::{BandwidthConfig, BandwidthResults, Direction, PlainCopies, TransferPoint};
use crate::error::{LabError, Result};
use crate::gpu::trace;
use crate::gpu::{alloc_host, plain_copies, DeviceBuffer, Gpu, HostBuffer, HostMemoryKind, PinnedBuffer, PlainLane, PlainTiming, Run, Stream, TimelineSource};
use crate::lab_kit::host_memory;
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::present::progress::{Progress, ProgressMode};
use crate::units::Bytes;

/// Device buffers, a pinned check buffer and streams shared by every point.
struct Bench {
    gpu: Gpu,
    /// One stream per direction of the timed copies.
    up: Stream,
    down: Stream,
    /// Fills, poisons and verification copies (untimed).
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

    let mut bench = Bench {
        gpu: gpu.clone(),
        up: gpu.stream()?,
        down: gpu.stream()?,
        aux: gpu.stream()?,
        up_dst: gpu.alloc(max)?,
        down_src: gpu.alloc(max)?,
        check: PinnedBuffer::new(gpu, max)?,
    };
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
    let mut gated = kind.is_page_locked();
    let (mut device, mut host, mut gbps) = (Vec::new(), Vec::new(), Vec::new());
    let check_plain = cfg.plain_sizes().contains(&bytes);
    let (mut plain_device, mut plain_host) = (Vec::new(), Vec::new());
    let mut verified = 0;
    for sample in 0..cfg.warmup + cfg.repeats {
        // Fresh inputs for every sample, written before the timed region.
        let up_seed = pattern::fresh_seed();
        let down_seed = pattern::fresh_seed();
        {
            let _f = trace::range("fill and poison");
            if direction.uploads() {
                pattern::fill(&mut bufs.src.words_mut()[..words], up_seed);
            }
            if direction.downloads() {
                pattern::fill(&mut b.check.words_mut()[..words], down_seed);
                b.aux.upload(&b.down_src, &b.check, n)?;
            }
            poison(b, bufs, direction, n)?;
        }
        // The lab's copies and the plain calls run on the same fresh input,
        // each on fresh poison and verified. Whichever goes first finds the
        // input just written (warm in the CPU's caches, which speeds a
        // pageable copy's staging), so they take turns going first.
        let plain_first = check_plain && sample % 2 == 1;
        let mut plain_timing = None;
        if plain_first {
            plain_timing = Some(plain_sample(b, bufs, kind, direction, n, copies, (sample, up_seed, down_seed))?);
            poison(b, bufs, direction, n)?;
        }
        let run = {
            let _t = trace::range("timed copies");
            timed_copies(b, bufs, direction, n, copies, kind.is_page_locked())?
        };
        gated &= run.gated;
        verify(b, bufs, kind, direction, n, &format!("{kind} {bytes} sample {sample}"), (up_seed, down_seed))?;
        verified += 1;
        if check_plain && !plain_first {
            poison(b, bufs, direction, n)?;
            plain_timing = Some(plain_sample(b, bufs, kind, direction, n, copies, (sample, up_seed, down_seed))?);
        }
        if sample >= cfg.warmup {
            let per_copy = run.total_ms / copies as f64;
            device.push(per_copy);
            // The CPU thread that was blocked longest (each direction has its own).
            host.push(run.issue_ms_by_thread.iter().copied().fold(0.0, f64::max) / copies as f64);
            gbps.push(direction.bytes_moved(bytes.0) as f64 / (per_copy * 1e-3) / 1e9);
            if let Some(t) = plain_timing {
                plain_device.push(t.device_ms);
                plain_host.push(t.host_call_ms);
            }
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
        plain: if check_plain { Some(PlainCopies { device_ms: Summary::of(&plain_device)?, host_call_ms: Summary::of(&plain_host)? }) } else { None },
    })
}

/// One sample of the same copies made with plain driver calls (on the
/// lab's streams and buffers, whose destinations the caller poisoned),
/// verified like the lab's own.
fn plain_sample(
    b: &mut Bench,
    bufs: &mut KindBuffers,
    kind: HostMemoryKind,
    direction: Direction,
    n: usize,
    copies: usize,
    (sample, up_seed, down_seed): (usize, u64, u64),
) -> Result<PlainTiming> {
    let mut lanes = Vec::with_capacity(2);
    if direction.uploads() {
        lanes.push(PlainLane { stream: &b.up, up: true, host: bufs.src.as_mut(), device: &b.up_dst });
    }
    if direction.downloads() {
        lanes.push(PlainLane { stream: &b.down, up: false, host: bufs.dst.as_mut(), device: &b.down_src });
    }
    let t = plain_copies(&b.gpu, &mut lanes, n, copies, kind.is_page_locked())?;
    verify(b, bufs, kind, direction, n, &format!("{kind} {} sample {sample}, plain driver calls", Bytes(n as u64)), (up_seed, down_seed))?;
    Ok(t)
}

/// Poisons what the copies write: the device destination of an upload,
/// the host destination of a download.
fn poison(b: &Bench, bufs: &mut KindBuffers, direction: Direction, n: usize) -> Result<()> {
    let _f = trace::range("poison");
    if direction.uploads() {
        b.aux.fill_u32(&b.up_dst, 0xDEAD_BEEF)?;
    }
    if direction.downloads() {
        pattern::poison(&mut bufs.dst.words_mut()[..n / 8]);
    }
    Ok(())
}

/// Checks every word the copies wrote against what was written before
/// them (`seeds`: the upload's and the download's); `what` names the sample.
fn verify(b: &mut Bench, bufs: &KindBuffers, kind: HostMemoryKind, direction: Direction, n: usize, what: &str, seeds: (u64, u64)) -> Result<()> {
    let _v = trace::range("verify");
    let words = n / 8;
    if direction.uploads() {
        b.aux.download(&mut b.check, &b.up_dst, n)?;
        pattern::verify(&b.check.words()[..words], seeds.0, &format!("H2D {what}"))?;
    }
    if direction.downloads() {
        if kind.cpu_readable() {
            pattern::verify(&bufs.dst.words()[..words], seeds.1, &format!("D2H {what}"))?;
        } else {
            // CPU reads of write-combined memory are uncached and very
            // slow: bounce it through the GPU into cached pinned memory.
            b.aux.upload(&b.up_dst, bufs.dst.as_ref(), n)?;
            b.aux.download(&mut b.check, &b.up_dst, n)?;
            pattern::verify(&b.check.words()[..words], seeds.1, &format!("D2H {what}"))?;
        }
    }
    Ok(())
}

/// `copies` copies of the first `n` bytes back to back in each direction
/// `direction` moves, through the runner: each direction on its own stream,
/// issued by its own CPU thread (so a copy from pageable memory, which
/// blocks its caller, does not hold up the other direction's calls), the
/// streams held behind the start gate until every copy is issued where the
/// memory is page-locked (`gated`: a pageable copy would wait for a GPU
/// that never starts). The run's time is device time, first copy to last.
fn timed_copies(b: &Bench, bufs: &mut KindBuffers, direction: Direction, n: usize, copies: usize, gated: bool) -> Result<Run> {
    let mut p = b.gpu.runner(TimelineSource::Off, 0, gated)?.deferring()?.threads_at_once()?;
    let mut thread = 0;
    if direction.uploads() {
        let (s, src, dst) = (p.stream(&b.up, "H2D stream"), p.host(bufs.src.as_mut(), "host source"), p.device(&b.up_dst, "device destination"));
        for _ in 0..copies {
            p.h2d(s, dst, 0, src, 0, n, "H2D")?;
        }
        thread += 1;
    }
    if direction.downloads() {
        let (s, src, dst) = (p.stream(&b.down, "D2H stream"), p.device(&b.down_src, "device source"), p.host(bufs.dst.as_mut(), "host destination"));
        p.issue_from(thread)?;
        for _ in 0..copies {
            p.d2h(s, dst, 0, src, 0, n, "D2H")?;
        }
    }
    p.finish()
}
