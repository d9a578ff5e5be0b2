//! What the numbers mean: share of the PCIe link, pinned/pageable ratios, the
//! two clocks, and when pinning pays for itself.

use super::{BandwidthRecord, BandwidthResults, Direction, TransferPoint};
use crate::gpu::{Fingerprint, HostMemoryKind};
use crate::units::Bytes;
use std::fmt::Write;

/// Theoretical GB/s for a direction: the link rate, twice it both ways.
pub fn link_gbps(fp: &Fingerprint, direction: Direction) -> Option<f64> {
    let per_dir = fp.pcie.as_ref()?.theoretical_gbps;
    Some(if direction == Direction::Bidirectional { 2.0 * per_dir } else { per_dir })
}

/// Median bandwidth as a percentage of the link's theoretical rate.
pub fn pct_of_link(fp: &Fingerprint, p: &TransferPoint) -> Option<f64> {
    link_gbps(fp, p.direction).map(|l| 100.0 * p.gbps.median / l)
}

/// Median bandwidth of `kind` over pageable at each size both measured.
pub fn ratio_to_pageable(r: &BandwidthResults, kind: HostMemoryKind, direction: Direction) -> Vec<(Bytes, f64)> {
    r.series(kind, direction)
        .into_iter()
        .filter_map(|p| {
            let base = r.point(HostMemoryKind::Pageable, direction, p.bytes)?;
            Some((p.bytes, p.gbps.median / base.gbps.median))
        })
        .collect()
}

/// The break-even point: after how many copies of `bytes` the time saved per
/// copy has repaid the extra cost of obtaining page-locked memory.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakEven {
    pub kind: HostMemoryKind,
    pub direction: Direction,
    pub bytes: Bytes,
    /// Extra one-time cost over plain pageable memory, ms.
    pub extra_cost_ms: f64,
    /// Time saved on every copy, ms.
    pub saving_per_copy_ms: f64,
    /// None when page-locked copies save nothing at this size.
    pub copies: Option<f64>,
}

/// Break-even for freshly allocated pinned memory (vs malloc + first touch)
/// and for registering memory that already exists (its cost is all extra).
pub fn break_even(r: &BandwidthResults) -> Vec<BreakEven> {
    let mut out = Vec::new();
    for c in &r.pin_cost {
        let pageable = c.pageable_acquire_ms.median + c.pageable_release_ms.median;
        let candidates = [
            (HostMemoryKind::Pinned, c.pinned_acquire_ms.median + c.pinned_release_ms.median - pageable),
            (HostMemoryKind::Registered, c.register_ms.median + c.unregister_ms.median),
        ];
        for direction in [Direction::H2d, Direction::D2h] {
            for (kind, extra) in candidates {
                let (Some(fast), Some(slow)) =
                    (r.point(kind, direction, c.bytes), r.point(HostMemoryKind::Pageable, direction, c.bytes))
                else {
                    continue;
                };
                let saving = slow.device_ms.median - fast.device_ms.median;
                // Negative extra cost: page-locked memory was cheaper to get
                // than pageable (large mallocs fault every page in): it pays at once.
                let copies = if extra <= 0.0 { Some(0.0) } else { (saving > 0.0).then(|| extra / saving) };
                out.push(BreakEven {
                    kind,
                    direction,
                    bytes: c.bytes,
                    extra_cost_ms: extra,
                    saving_per_copy_ms: saving,
                    copies,
                });
            }
        }
    }
    out
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.1} µs", ms * 1e3)
    }
}

/// The lab's headline table: bandwidth at the largest size per direction and
/// kind, share of the link, ratio to pageable, and the two clocks.
pub fn summary_table(rec: &BandwidthRecord) -> String {
    let r = &rec.results;
    let mut s = String::new();
    let Some(big) = r.largest_size() else {
        return "no transfers recorded\n".into();
    };
    let _ = writeln!(s, "Bandwidth at {big} (median of {} samples; device time by CUDA events)", r.config.repeats);
    let _ = writeln!(s, "{:<14} {:<15} {:>9} {:>8} {:>11} {:>13} {:>13}", "direction", "memory", "GB/s", "% link", "x pageable", "CPU blocked", "device time");
    for d in r.directions() {
        for k in r.kinds() {
            let Some(p) = r.point(k, d, big) else { continue };
            let pct = pct_of_link(&rec.fingerprint, p).map_or("n/a".into(), |v| format!("{v:.1}%"));
            let ratio = r
                .point(HostMemoryKind::Pageable, d, big)
                .map_or("n/a".into(), |b| format!("{:.2}x", p.gbps.median / b.gbps.median));
            let _ = writeln!(
                s,
                "{:<14} {:<15} {:>9.1} {:>8} {:>11} {:>13} {:>13}",
                d.label(),
                k.label(),
                p.gbps.median,
                pct,
                ratio,
                fmt_ms(p.host_call_ms.median),
                fmt_ms(p.device_ms.median)
            );
        }
    }
    if let Some(l) = &rec.fingerprint.pcie {
        let _ = writeln!(s, "Link: PCIe Gen{} x{} = {:.1} GB/s per direction in theory.", l.max_generation, l.max_width, l.theoretical_gbps);
    }
    s
}

/// The two clocks at one size: how long the copy call held the CPU against
/// how long the device worked, for each kind and direction measured there.
pub fn two_clocks_table(r: &BandwidthResults, bytes: Bytes) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "cuMemcpy*Async of {bytes}: {:<15} {:>13} {:>13} {:>9}", "memory", "CPU blocked", "device busy", "blocked");
    for d in [Direction::H2d, Direction::D2h] {
        for k in r.kinds() {
            let Some(p) = r.point(k, d, bytes) else { continue };
            let share = 100.0 * p.host_call_ms.median / p.device_ms.median;
            let _ = writeln!(s, "  {:<27} {:<15} {:>13} {:>13} {:>8.0}%", d.label(), k.label(), fmt_ms(p.host_call_ms.median), fmt_ms(p.device_ms.median), share);
        }
    }
    s
}

/// Break-even copies per size, one line per (direction, kind).
pub fn break_even_table(r: &BandwidthResults) -> String {
    let rows = break_even(r);
    let mut s = String::new();
    let _ = writeln!(s, "{:<5} {:<11} {:>10} {:>13} {:>15} {:>12}", "dir", "memory", "size", "extra cost", "saved per copy", "break-even");
    for b in rows {
        let copies = match b.copies {
            None => "never".to_string(),
            Some(_) if b.extra_cost_ms <= 0.0 => "at once".to_string(),
            Some(c) => format!("{c:.1} copies"),
        };
        let _ = writeln!(
            s,
            "{:<5} {:<11} {:>10} {:>13} {:>15} {:>12}",
            b.direction.label(),
            b.kind.label(),
            b.bytes.to_string(),
            fmt_ms(b.extra_cost_ms),
            fmt_ms(b.saving_per_copy_ms),
            copies
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fingerprint;

    #[test]
    fn link_share_and_ratio() {
        let r = crate::labs::bandwidth::exercise::tests::synthetic();
        let fp = fingerprint();
        let p = r.point(HostMemoryKind::Pinned, Direction::H2d, Bytes(1 << 30)).unwrap();
        let pct = pct_of_link(&fp, p).unwrap();
        assert!((pct - 100.0 * 50.0 / 63.015).abs() < 0.1, "{pct}");
        let ratios = ratio_to_pageable(&r, HostMemoryKind::Pinned, Direction::H2d);
        let last = ratios.last().unwrap();
        assert!((last.1 - 5.0).abs() < 0.05, "{last:?}");
        assert_eq!(link_gbps(&fp, Direction::Bidirectional).unwrap(), 2.0 * link_gbps(&fp, Direction::H2d).unwrap());
    }

    #[test]
    fn break_even_divides_extra_cost_by_saving() {
        let r = crate::labs::bandwidth::exercise::tests::synthetic();
        let b = break_even(&r);
        let pinned = b.iter().find(|b| b.kind == HostMemoryKind::Pinned && b.direction == Direction::H2d && b.bytes == Bytes(1 << 30)).unwrap();
        // synthetic: pinned 300+30 ms vs pageable 100+10 ms => 220 ms extra;
        // copies: pageable 1 GiB at 10 GB/s, pinned at 50 GB/s.
        let gib = (1u64 << 30) as f64;
        let saving = (0.010 + gib / 10e9 * 1e3) - (0.005 + gib / 50e9 * 1e3);
        assert!((pinned.extra_cost_ms - 220.0).abs() < 1e-9);
        assert!((pinned.copies.unwrap() - 220.0 / saving).abs() < 1e-6);
        let reg = b.iter().find(|b| b.kind == HostMemoryKind::Registered && b.direction == Direction::H2d && b.bytes == Bytes(1 << 30)).unwrap();
        assert!((reg.extra_cost_ms - 60.0).abs() < 1e-9);
    }

    #[test]
    fn tables_mention_every_series() {
        let r = crate::labs::bandwidth::exercise::tests::synthetic();
        let rec = crate::record::Record::new("bandwidth", fingerprint(), r);
        let t = summary_table(&rec);
        assert!(t.contains("H2D") && t.contains("pinned") && t.contains("5.00x"), "{t}");
        assert!(t.contains("PCIe Gen5 x16"));
        let c = two_clocks_table(&rec.results, Bytes(1 << 20));
        assert!(c.contains("pageable") && c.contains("100%"), "{c}");
        let b = break_even_table(&rec.results);
        assert!(b.contains("copies"), "{b}");
    }
}
