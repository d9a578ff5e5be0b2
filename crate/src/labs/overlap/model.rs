//! The closed-form bounds of a chunked pipeline (as simpleMultiCopy prints
//! them) and what the measurement makes of them.

use super::{ChunkTask, IntensityResults, OverlapPoint, Parts};
use crate::error::Result;
use crate::measure::stats::Efficiency;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::op::OpKind;

/// Per point, efficiency against its own bound (best first).
pub fn efficiency_table(r: &IntensityResults, copy_engines: u32) -> String {
    let mut pts: Vec<&OverlapPoint> = r.points.iter().collect();
    pts.sort_by(|a, b| a.total_ms.median.total_cmp(&b.total_ms.median));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>6} {:>7} {:<16} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>9} {:>20}",
        "chunks", "streams", "order", "measured", "model", "H", "K", "D", "H|D", "bound", "eff."
    );
    let mut effs = Vec::new();
    for p in pts {
        let e = efficiency(p, copy_engines);
        effs.push(e);
        let _ = writeln!(
            s,
            "{:>6} {:>7} {:<16} {:>9.3} {:>9.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>9.3} {:>20}",
            p.chunks,
            p.streams,
            p.order.label(),
            p.total_ms.median,
            predicted_ms(p, copy_engines).unwrap_or(f64::NAN),
            p.parts.h2d_ms.median,
            p.parts.kernel_ms.median,
            p.parts.d2h_ms.median,
            p.parts.both_copies_ms.median,
            e.bound_ms,
            e.cell()
        );
    }
    let _ = writeln!(
        s,
        "model: the queue model's time for the same issue order, each operation its share of the parts (H, K, D timed alone with the point's chunks); bound: from each part at its fastest quarter; eff.: bound / measured (the middle half of the runs)"
    );
    if let Some(why) = Efficiency::note(&effs) {
        let _ = writeln!(s, "{why}");
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
    /// The bound from each part alone at its fast end (its fastest
    /// quarter, the rule of every bound: see [`Efficiency`]): a lower limit
    /// is built from what the hardware showed it can do (a part's slow
    /// runs would otherwise lift the bound above a pipeline that ran at
    /// full speed).
    pub fn of(parts: &Parts, chunks: usize) -> Bounds {
        Bounds::new(parts.h2d_ms.fast_end(), parts.kernel_ms.fast_end(), parts.d2h_ms.fast_end(), parts.both_copies_ms.fast_end(), chunks)
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

/// The queue model's time for a point (ms): the lab's own issue loop for
/// its order, chunks and streams run on the model, each operation lasting
/// its byte share of the point's parts.
pub fn predicted_ms(p: &OverlapPoint, copy_engines: u32) -> Result<f64> {
    // The shares, not the size, set the times: a small stand-in keeps the
    // model's per-element bookkeeping cheap.
    let elements = 4096 * p.chunks;
    let mut m = DryRun::new();
    let task = ChunkTask {
        elements,
        chunks: p.chunks,
        streams: (0..p.order.streams_used(p.streams)).map(|_| m.stream()).collect(),
        host_in: m.host("host in", elements, true),
        host_out: m.host("host out", elements, false),
        dev_in: m.device("device in", elements),
        dev_out: m.device("device out", elements),
    };
    p.order.issue(&mut m, &task, &OpKind::STAGES)?;
    let times = crate::pipeline::predict::predict(&m.schedule, p.parts.machine(copy_engines), |op| p.parts.op_ms(op, elements));
    Ok(times.iter().map(|t| t.1).fold(0.0, f64::max))
}

/// bound / measured, the bound from the stages measured alone with the same
/// chunks and streams: 1.0 means the stages overlap perfectly.
pub fn efficiency(p: &OverlapPoint, copy_engines: u32) -> Efficiency {
    let parts = &p.parts;
    Efficiency::new(
        Bounds::of(parts, p.chunks).for_engines(copy_engines),
        &[&parts.h2d_ms, &parts.kernel_ms, &parts.d2h_ms, &parts.both_copies_ms],
        &p.total_ms,
    )
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
/// (H + K + D) / max(H, K, D) of one launch and one copy each way, the
/// ceiling with the best point's own parts, and what was measured; where
/// the measurement beats the classic ceiling, which part made it possible.
pub fn speedup_limits(rs: &[IntensityResults], copy_engines: u32) -> String {
    let mut s = String::new();
    for r in rs {
        let (h, k, d) = (r.parts.h2d_ms.median, r.parts.kernel_ms.median, r.parts.d2h_ms.median);
        let classic = (h + k + d) / h.max(k).max(d);
        let Some((best, sp)) = r.best().and_then(|b| Some((b, speedup(r, b)?))) else { continue };
        let own = speedup_ceiling(r, copy_engines).unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "{:<14} K = {:>4.1} x H: ceiling (H+K+D)/max(H,K,D) = {classic:.2}x with one launch; {own:.2}x with the points' own parts (the summary's ceiling); measured best {sp:.2}x",
            r.intensity.label(),
            k / h,
        );
        if sp > classic * 1.005 {
            // Which stage ran faster in the best point's chunks than whole?
            let q = &best.parts;
            let (name, alone, chunked) = [("kernels", k, q.kernel_ms.median), ("uploads", h, q.h2d_ms.median), ("downloads", d, q.d2h_ms.median)]
                .into_iter()
                .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))
                .expect("three stages");
            let _ = writeln!(
                s,
                "{:<14} measured above the one-launch ceiling: in {} chunks on {} streams the {name} took {chunked:.2} ms, {:.1}% less than the whole data at once ({alone:.2} ms), which the classic formula cannot know",
                "",
                best.chunks,
                best.streams,
                100.0 * (1.0 - chunked / alone)
            );
        }
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
        rows.push((format!("{}: best point against its bound", ir.intensity.label()), format!("{:.1}%", 100.0 * efficiency(best, r.copy_engines).ratio)));
    }
    rows.push(("timeline overhead, median of pairs".into(), format!("{:+.2}% ({})", r.timeline_overhead_pct, r.timeline_source)));
    rows
}

/// The measured numbers behind [`headline`]: per intensity, one chunk on
/// one stream and the best point of the sweep (whichever it is).
pub fn headline_figures(r: &super::OverlapResults) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
    let mut v = Vec::new();
    for ir in &r.intensities {
        if let Some(s) = ir.serial() {
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{}: one chunk, one stream", ir.intensity.label()), "ms", s.total_ms));
        }
        if let Some(b) = ir.best() {
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{}: best point", ir.intensity.label()), "ms", b.total_ms));
        }
    }
    v
}

/// One line per intensity: parts, the best point, its speed-up and its
/// efficiency against the bound, next to the best speed-up possible.
pub fn summary_table(rs: &[IntensityResults], copy_engines: u32) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9} {:>22} {:>9} {:>9} {:>20}",
        "intensity", "FMAs", "H ms", "K ms", "D ms", "H|D ms", "serial", "best (chunks/streams)", "speed-up", "ceiling", "eff."
    );
    let mut effs = Vec::new();
    for r in rs {
        let Some(best) = r.best() else { continue };
        let sp = speedup(r, best).unwrap_or(f64::NAN);
        let e = efficiency(best, copy_engines);
        effs.push(e);
        let _ = writeln!(
            s,
            "{:<14} {:>6} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>9.2} {:>8.2} ms ({:>2}/{} {:<2}) {:>8.2}x {:>8.2}x {:>20}",
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
            e.cell()
        );
    }
    let _ = writeln!(s, "H, K, D, H|D: the whole data in one copy or launch. serial: one chunk on one stream. ceiling: serial over the smallest bound of any point (its parts timed with its own chunks)");
    let _ = writeln!(
        s,
        "bound with {copy_engines} copy engine(s), each part at its fastest quarter: {}",
        if copy_engines >= 2 {
            "max of max(H, K, D) + one chunk's other stages, and (H + D)/C + (C-1)/C x H|D (H|D: both copies at once, in the point's chunks)"
        } else {
            "max(H + D, K) + fill"
        }
    );
    if let Some(why) = Efficiency::note(&effs) {
        let _ = writeln!(s, "{why}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flat;

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
        let p = Parts { h2d_ms: flat(1.0), kernel_ms: flat(10.0), d2h_ms: flat(1.0), both_copies_ms: flat(1.1) };
        assert!((max_speedup(&p) - 1.2).abs() < 1e-12);
        let balanced = Parts { h2d_ms: flat(1.0), kernel_ms: flat(1.0), d2h_ms: flat(1.0), both_copies_ms: flat(1.1) };
        assert!((max_speedup(&balanced) - 3.0 / 1.1).abs() < 1e-12);
    }
}
