//! The closed-form bounds of a chunked pipeline (as simpleMultiCopy prints
//! them) and what the measurement makes of them.

use super::{IntensityResults, OverlapPoint, Parts};

/// Per point, efficiency against its own bound (best first).
pub fn efficiency_table(r: &IntensityResults, copy_engines: u32) -> String {
    let mut pts: Vec<&OverlapPoint> = r.points.iter().collect();
    pts.sort_by(|a, b| a.total_ms.median.total_cmp(&b.total_ms.median));
    let mut s = String::new();
    let _ = writeln!(s, "{:>6} {:>7} {:<16} {:>9} {:>7} {:>7} {:>7} {:>7} {:>9} {:>6}", "chunks", "streams", "order", "measured", "H", "K", "D", "H|D", "bound", "eff.");
    for p in pts {
        let b = Bounds::of(&p.parts, p.chunks).for_engines(copy_engines);
        let _ = writeln!(
            s,
            "{:>6} {:>7} {:<16} {:>9.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>9.3} {:>5.1}%",
            p.chunks,
            p.streams,
            p.order.label(),
            p.total_ms.median,
            p.parts.h2d_ms.median,
            p.parts.kernel_ms.median,
            p.parts.d2h_ms.median,
            p.parts.both_copies_ms.median,
            b,
            100.0 * b / p.total_ms.median
        );
    }
    s
}
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// H + K + D: nothing overlaps.
    pub serial: f64,
    /// max(H + D, K): one copy engine shared by both directions.
    pub one_engine: f64,
    /// Two or more engines, the larger of two lower bounds:
    /// max(H, K, D) + the other stages of one chunk (pipeline fill), and the
    /// link: the first upload and the last download overlap no copy the other
    /// way; the rest at best moves at the both-ways rate (H|D).
    pub two_engines: f64,
}

impl Bounds {
    /// `both`: H2D and D2H of the whole data at once (at least max(H, D)).
    pub fn new(h: f64, k: f64, d: f64, both: f64, chunks: usize) -> Bounds {
        let c = chunks.max(1) as f64;
        let m = h.max(k).max(d);
        let stages = m + (h + k + d - m) / c;
        let link = (h + d) / c + (c - 1.0) / c * both.max(h.max(d));
        Bounds { serial: h + k + d, one_engine: (h + d).max(k) + (h + d).min(k) / c, two_engines: stages.max(link).min(h + k + d) }
    }
    pub fn of(parts: &Parts, chunks: usize) -> Bounds {
        Bounds::new(parts.h2d_ms.median, parts.kernel_ms.median, parts.d2h_ms.median, parts.both_copies_ms.median, chunks)
    }
    /// The bound that applies to a device with `copy_engines` engines.
    pub fn for_engines(&self, copy_engines: u32) -> f64 {
        if copy_engines >= 2 {
            self.two_engines
        } else {
            self.one_engine
        }
    }
}

/// bound / measured, the bound from the stages measured alone with the same
/// chunks and streams: 1.0 means the stages overlap perfectly.
pub fn efficiency(p: &OverlapPoint, copy_engines: u32) -> f64 {
    Bounds::of(&p.parts, p.chunks).for_engines(copy_engines) / p.total_ms.median
}

/// The best any overlap can do: (H + K + D) / max(H, K, D, both copies at once).
pub fn max_speedup(parts: &Parts) -> f64 {
    let (h, k, d) = (parts.h2d_ms.median, parts.kernel_ms.median, parts.d2h_ms.median);
    (h + k + d) / h.max(k).max(d).max(parts.both_copies_ms.median)
}

/// The speed-up the points' own bounds allow: serial time over the smallest
/// bound among them. Can exceed [`max_speedup`] when chunked kernels on
/// several streams run faster together than one launch over all the data.
pub fn speedup_ceiling(r: &IntensityResults, copy_engines: u32) -> Option<f64> {
    let serial = r.serial()?.total_ms.median;
    let best = r.points.iter().map(|p| Bounds::of(&p.parts, p.chunks).for_engines(copy_engines)).fold(f64::INFINITY, f64::min);
    best.is_finite().then(|| serial / best)
}

/// Why overlap gains what it gains: per intensity, the classic ceiling
/// (H + K + D) / max(H, K, D) next to what was measured.
pub fn speedup_limits(rs: &[IntensityResults]) -> String {
    let mut s = String::new();
    for r in rs {
        let (h, k, d) = (r.parts.h2d_ms.median, r.parts.kernel_ms.median, r.parts.d2h_ms.median);
        let best = r.best().and_then(|b| speedup(r, b)).unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "{:<14} K = {:>4.1} x H: ceiling (H+K+D)/max(H,K,D) = {:.2}x, measured best {:.2}x",
            r.intensity.label(),
            k / h,
            (h + k + d) / h.max(k).max(d),
            best
        );
    }
    let _ = writeln!(s, "A kernel 10x the copies has ceiling (1+10+1)/10 = 1.20x: a 1.17x gain there is 97% of all there is.");
    let _ = writeln!(s, "2-3x needs H ~ K ~ D: then max(H,K,D) is a third of H+K+D.");
    s
}

/// Speed-up of `p` over one chunk on one stream.
pub fn speedup(r: &IntensityResults, p: &OverlapPoint) -> Option<f64> {
    r.serial().map(|s| s.total_ms.median / p.total_ms.median)
}

/// The lab's headline numbers, as (what, value) rows for the report's
/// table of GPUs side by side.
pub fn headline(r: &super::OverlapResults) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for ir in &r.intensities {
        let Some(best) = ir.best() else { continue };
        rows.push((
            format!("{}: best speed-up over one stream (chunks/streams order)", ir.intensity.label()),
            format!("{:.2}x ({}/{} {})", speedup(ir, best).unwrap_or(f64::NAN), best.chunks, best.streams, best.order.short()),
        ));
        rows.push((format!("{}: best point against its bound", ir.intensity.label()), format!("{:.1}%", 100.0 * efficiency(best, r.copy_engines))));
    }
    rows.push(("timeline overhead, median of pairs".into(), format!("{:+.2}% ({})", r.timeline_overhead_pct, r.timeline_source)));
    rows
}

/// One line per intensity: parts, the best point, its speed-up and its
/// efficiency against the bound, next to the best speed-up possible.
pub fn summary_table(rs: &[IntensityResults], copy_engines: u32) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<14} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9} {:>22} {:>9} {:>9} {:>9}", "intensity", "FMAs", "H ms", "K ms", "D ms", "H|D ms", "serial", "best (chunks/streams)", "speed-up", "ceiling", "eff.");
    for r in rs {
        let Some(best) = r.best() else { continue };
        let sp = speedup(r, best).unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "{:<14} {:>6} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>9.2} {:>8.2} ms ({:>2}/{} {:<2}) {:>8.2}x {:>8.2}x {:>8.1}%",
            r.intensity.label(),
            r.iterations,
            r.parts.h2d_ms.median,
            r.parts.kernel_ms.median,
            r.parts.d2h_ms.median,
            r.parts.both_copies_ms.median,
            r.serial().map_or(f64::NAN, |p| p.total_ms.median),
            best.total_ms.median,
            best.chunks,
            best.streams,
            best.order.short(),
            sp,
            speedup_ceiling(r, copy_engines).unwrap_or(f64::NAN),
            100.0 * efficiency(best, copy_engines)
        );
    }
    let _ = writeln!(s, "bound with {copy_engines} copy engine(s): {}", if copy_engines >= 2 { "max of max(H, K, D) + one chunk's other stages, and (H + D)/C + (C-1)/C x H|D (H|D: both copies at once, in the point's chunks)" } else { "max(H + D, K) + fill" });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Summary;

    fn s(v: f64) -> Summary {
        Summary { median: v, min: v, max: v, n: 1 }
    }

    #[test]
    fn bounds_match_simple_multicopy() {
        let b = Bounds::new(2.0, 3.0, 2.0, 2.0, 1);
        assert_eq!(b.serial, 7.0);
        // One chunk: nothing can overlap, every bound is the serial time.
        assert_eq!(b.two_engines, 7.0);
        let b = Bounds::new(2.0, 3.0, 2.0, 2.0, 4);
        assert_eq!(b.two_engines, 3.0 + 4.0 / 4.0);
        assert_eq!(b.one_engine, 4.0 + 3.0 / 4.0);
        assert_eq!(b.for_engines(1), b.one_engine);
        // A link that moves both directions at once more slowly than one:
        // the copies, not the kernel, set the steady state.
        let shared = Bounds::new(2.0, 2.0, 2.0, 2.4, 8);
        assert!((shared.two_engines - (4.0 / 8.0 + 7.0 / 8.0 * 2.4)).abs() < 1e-12);
        // Few chunks: the stage fill dominates, the link term cannot exceed it.
        let two = Bounds::new(2.0, 2.0, 2.0, 2.4, 2);
        assert_eq!(two.two_engines, 2.0 + 4.0 / 2.0);
    }

    #[test]
    fn compute_heavy_pipelines_cannot_gain_much() {
        // K = 10 H: at most 12/10 = 1.2x, whatever the streams (the "1.17x" case).
        let p = Parts { h2d_ms: s(1.0), kernel_ms: s(10.0), d2h_ms: s(1.0), both_copies_ms: s(1.1) };
        assert!((max_speedup(&p) - 1.2).abs() < 1e-12);
        let balanced = Parts { h2d_ms: s(1.0), kernel_ms: s(1.0), d2h_ms: s(1.0), both_copies_ms: s(1.1) };
        assert!((max_speedup(&balanced) - 3.0 / 1.1).abs() < 1e-12);
    }
}
