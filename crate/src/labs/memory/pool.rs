//! The release threshold: what an allocate + free pair costs by size with
//! cuMemAlloc and with the stream-ordered pool at threshold 0 (it gives
//! its memory back at every synchronization) and at the maximum (it keeps
//! it), and a run of batches of varying size (a scratch buffer that grows,
//! as for variable sequence lengths) with each batch's time and what the
//! pool holds after it.

use super::MemoryConfig;
use crate::error::Result;
use crate::gpu::{Gpu, MemPool, PoolUsage, Stream};
use crate::measure::stats::Summary;
use crate::present::progress::Progress;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Where a batch's scratch memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Allocator {
    /// cuMemAlloc / cuMemFree.
    CuMemAlloc,
    /// cuMemAllocAsync / cuMemFreeAsync, release threshold 0 (the default).
    PoolThresholdZero,
    /// cuMemAllocAsync / cuMemFreeAsync, release threshold u64::MAX.
    PoolThresholdMax,
}

impl Allocator {
    pub const ALL: [Allocator; 3] = [Allocator::CuMemAlloc, Allocator::PoolThresholdZero, Allocator::PoolThresholdMax];
    pub fn label(self) -> &'static str {
        match self {
            Allocator::CuMemAlloc => "cuMemAlloc + cuMemFree",
            Allocator::PoolThresholdZero => "stream-ordered, release threshold 0",
            Allocator::PoolThresholdMax => "stream-ordered, release threshold max",
        }
    }
    fn threshold(self) -> Option<u64> {
        match self {
            Allocator::CuMemAlloc => None,
            Allocator::PoolThresholdZero => Some(0),
            Allocator::PoolThresholdMax => Some(u64::MAX),
        }
    }
}

/// One allocate + free pair (with the synchronization a batch ends with).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairPoint {
    pub allocator: Allocator,
    pub bytes: u64,
    /// Host time of allocate, free and stream synchronize, ms.
    pub ms: Summary,
}

/// One batch of the varying-size run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchPoint {
    pub bytes: u64,
    /// Host time of the batch (allocate, fill, free, synchronize), ms.
    pub ms: f64,
    /// What the pool holds after the batch's synchronization.
    pub after: PoolUsage,
}

/// The varying-size run with one allocator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchTrace {
    pub allocator: Allocator,
    pub batches: Vec<BatchPoint>,
}

impl BatchTrace {
    /// The batches' times after the first (which pays every first-time
    /// cost), ms.
    pub fn steady_ms(&self) -> Result<Summary> {
        let v: Vec<f64> = self.batches.iter().skip(1).map(|b| b.ms).collect();
        Summary::of(if v.is_empty() { &[f64::NAN][..] } else { &v })
    }
    /// The most the pool held reserved after any batch, bytes.
    pub fn most_reserved(&self) -> u64 {
        self.batches.iter().map(|b| b.after.reserved).max().unwrap_or(0)
    }
}

/// One batch's work with `allocator`: allocate `bytes`, fill them (the
/// batch's use), free, synchronize; its host time, ms.
fn batch(stream: &Stream, allocator: Allocator, bytes: usize) -> Result<f64> {
    let t = Instant::now();
    match allocator {
        Allocator::CuMemAlloc => {
            let b = stream.gpu().alloc(bytes)?;
            stream.fill_u32(&b, 0)?;
            drop(b);
        }
        _ => {
            let b = stream.alloc_async(bytes)?;
            b.fill_u32(0)?;
            b.free()?;
            stream.synchronize()?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// One pair with `allocator`, nothing between: its host time, ms.
fn pair(stream: &Stream, allocator: Allocator, bytes: usize) -> Result<f64> {
    let t = Instant::now();
    match allocator {
        Allocator::CuMemAlloc => drop(stream.gpu().alloc(bytes)?),
        _ => stream.alloc_async(bytes)?.free()?,
    }
    stream.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Readies the pool for `allocator`'s next sample: its threshold, and
/// what a program that ran this way for a while would hold: nothing at
/// threshold 0, a block of `bytes` at the maximum (one untimed pair).
fn settle(pool: &MemPool, stream: &Stream, allocator: Allocator, bytes: usize) -> Result<()> {
    if let Some(t) = allocator.threshold() {
        pool.set_release_threshold(t)?;
    }
    stream.synchronize()?;
    pool.trim()?;
    if allocator == Allocator::PoolThresholdMax {
        pair(stream, allocator, bytes)?;
    }
    Ok(())
}

/// The sizes of the varying-size run's batches: a scratch buffer for a
/// sequence whose length grows from `base` to 16 x `base` and jumps about
/// (a fixed pseudo-random walk, the same for every allocator), bytes.
pub fn trace_sizes(base: usize, batches: usize) -> Vec<usize> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..batches)
        .map(|b| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let grown = 1.0 + 15.0 * b as f64 / (batches.max(2) - 1) as f64;
            let jitter = 0.6 + 0.4 * (x % 1000) as f64 / 1000.0;
            (((base as f64 * grown * jitter) as usize).max(4096) + 4095) & !4095
        })
        .collect()
}

/// Both sweeps. The pool's threshold is put back afterwards.
pub fn measure(gpu: &Gpu, cfg: &MemoryConfig, progress: &mut Progress) -> Result<(Vec<PairPoint>, Vec<BatchTrace>)> {
    let pool = MemPool::default_of(gpu)?;
    let _restore = pool.threshold_for_now(pool.release_threshold()?)?;
    let stream = gpu.stream()?;
    let biggest = cfg.sizes_mib.iter().max().copied().unwrap_or(1) << 20;
    gpu.ensure_free(2 * biggest as u64, "the allocation sweep's largest size (twice, for the pool)")?;
    let mut pairs = Vec::new();
    for &mib in &cfg.sizes_mib {
        let bytes = mib << 20;
        // The allocators take turns, sample by sample (a slow phase of the
        // host lands on all of them), after one warm-up each.
        let mut t = vec![Vec::with_capacity(cfg.repeats); Allocator::ALL.len()];
        for rep in 0..=cfg.repeats {
            for (i, &a) in Allocator::ALL.iter().enumerate() {
                settle(&pool, &stream, a, bytes)?;
                let ms = pair(&stream, a, bytes)?;
                if rep > 0 {
                    t[i].push(ms);
                }
            }
        }
        for (i, &a) in Allocator::ALL.iter().enumerate() {
            pairs.push(PairPoint { allocator: a, bytes: bytes as u64, ms: Summary::of(&t[i])? });
        }
        progress.step(&format!(
            "allocate + free {mib} MiB: {}",
            Allocator::ALL
                .iter()
                .zip(&t)
                .map(|(a, v)| format!("{} {:.3} ms", a.label(), Summary::of(v).map_or(f64::NAN, |s| s.median)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let sizes = trace_sizes(cfg.trace_base_mib << 20, cfg.trace_batches);
    let most = sizes.iter().max().copied().unwrap_or(0);
    gpu.ensure_free(2 * most as u64, "the varying-size run's largest batch")?;
    let mut traces = Vec::new();
    for a in Allocator::ALL {
        settle(&pool, &stream, a, 4096)?;
        pool.trim()?;
        let mut batches = Vec::with_capacity(sizes.len());
        for &bytes in &sizes {
            let ms = batch(&stream, a, bytes)?;
            batches.push(BatchPoint { bytes: bytes as u64, ms, after: pool.usage()? });
        }
        let t = BatchTrace { allocator: a, batches };
        progress.step(&format!(
            "{} batches of varying size, {}: {:.3} ms a batch (median), pool holds at most {}",
            sizes.len(),
            a.label(),
            t.steady_ms().map_or(f64::NAN, |s| s.median),
            crate::Bytes(t.most_reserved())
        ));
        traces.push(t);
    }
    stream.synchronize()?;
    pool.trim()?;
    Ok((pairs, traces))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_varying_sizes_grow_jump_about_and_are_whole_pages() {
        let s = trace_sizes(16 << 20, 48);
        assert_eq!(s.len(), 48);
        assert!(s.iter().all(|b| b % 4096 == 0 && *b >= 4096));
        let (first, last) = (s[..8].iter().sum::<usize>(), s[40..].iter().sum::<usize>());
        assert!(last > 4 * first, "grows: {first} -> {last}");
        assert!(s.windows(2).any(|w| w[1] < w[0]), "and jumps about: {s:?}");
        assert_eq!(s, trace_sizes(16 << 20, 48), "the same for every allocator");
        assert_eq!(trace_sizes(1, 1), vec![4096]);
    }
}
