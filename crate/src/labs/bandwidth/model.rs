//! What the numbers mean: share of the PCIe link, pinned/pageable ratios, the
//! two clocks, and when pinning pays for itself.

use super::{BandwidthRecord, BandwidthResults, Direction, TransferPoint};
use crate::gpu::HostMemoryKind;
pub use crate::lab_kit::host_memory::Acquisition;
use crate::measure::fingerprint::Fingerprint;
use crate::units::{fmt_ms, Bytes};
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
/// copy has repaid the extra cost of getting page-locked memory.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakEven {
    pub acquisition: Acquisition,
    pub direction: Direction,
    pub bytes: Bytes,
    /// What getting (and giving back) the page-locked memory cost, ms.
    pub page_locked_ms: f64,
    /// What the pageable memory it replaces cost, ms.
    pub pageable_ms: f64,
    /// page_locked_ms - pageable_ms: negative when page-locked memory was
    /// cheaper to get, so it pays before its first copy.
    pub extra_cost_ms: f64,
    /// Time saved on every copy (pageable copy - page-locked copy), ms.
    pub saving_per_copy_ms: f64,
    /// None when page-locked copies save nothing at this size; 0 when it
    /// pays at once.
    pub copies: Option<f64>,
}

impl BreakEven {
    pub fn kind(&self) -> HostMemoryKind {
        self.acquisition.kind()
    }
    /// The verdict in words: "12.1 copies", "0.04 copies" (repaid during
    /// the first copy), "at once" (cheaper before any copy), "never".
    pub fn verdict(&self) -> String {
        match self.copies {
            None => "never".into(),
            Some(_) if self.extra_cost_ms <= 0.0 => "at once".into(),
            Some(c) if c < 0.01 => "< 0.01 copies".into(),
            Some(c) if c < 1.0 => format!("{c:.2} copies"),
            Some(c) => format!("{c:.1} copies"),
        }
    }
}

/// Break-even for each way of getting page-locked memory, at every size
/// whose cost was measured, both directions.
pub fn break_even(r: &BandwidthResults) -> Vec<BreakEven> {
    let mut out = Vec::new();
    for c in &r.pin_cost {
        for direction in [Direction::H2d, Direction::D2h] {
            for acquisition in Acquisition::ALL {
                let (Some(fast), Some(slow)) = (r.point(acquisition.kind(), direction, c.bytes), r.point(HostMemoryKind::Pageable, direction, c.bytes)) else {
                    continue;
                };
                let (page_locked_ms, pageable_ms) = acquisition.costs_ms(c);
                let extra = page_locked_ms - pageable_ms;
                let saving = slow.device_ms.median - fast.device_ms.median;
                let copies = if extra <= 0.0 { Some(0.0) } else { (saving > 0.0).then(|| extra / saving) };
                out.push(BreakEven {
                    acquisition,
                    direction,
                    bytes: c.bytes,
                    page_locked_ms,
                    pageable_ms,
                    extra_cost_ms: extra,
                    saving_per_copy_ms: saving,
                    copies,
                });
            }
        }
    }
    out
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
            let ratio = r.point(HostMemoryKind::Pageable, d, big).map_or("n/a".into(), |b| format!("{:.2}x", p.gbps.median / b.gbps.median));
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
    s + &plain_table(r)
}

/// How much above plain driver calls the lab's copies may cost (device
/// time, or the CPU's time in the call) before the lab says so.
pub const PLAIN_TOLERANCE: f64 = 0.15;

/// The lab's copies (made through the runner) against the same copies made
/// with plain driver calls in the same samples, where the lab checked it
/// (empty for a recording that did not).
pub fn plain_table(r: &BandwidthResults) -> String {
    let checked: Vec<(&TransferPoint, &super::PlainCopies)> = r.transfers.iter().filter_map(|p| p.plain.as_ref().map(|q| (p, q))).collect();
    if checked.is_empty() {
        return String::new();
    }
    let mut s = String::new();
    let _ = writeln!(s, "The lab's copies against the same copies made with plain driver calls, same samples (medians; lab / plain):");
    let _ = writeln!(s, "  {:>9} {:<14} {:<15} {:>23} {:>27}", "size", "direction", "memory", "device time", "CPU blocked");
    // The worst of each clock over the points, by the ratio of medians.
    let (mut worst_device, mut worst_host) = ((0.0f64, String::new()), (0.0f64, String::new()));
    for (p, q) in &checked {
        let (d, h) = (p.device_ms.median / q.device_ms.median, p.host_call_ms.median / q.host_call_ms.median);
        let at = format!("{} {} {}", p.bytes, p.direction.label(), p.kind.label());
        if d > worst_device.0 {
            worst_device = (d, at.clone());
        }
        if h > worst_host.0 {
            worst_host = (h, at);
        }
        let _ = writeln!(
            s,
            "  {:>9} {:<14} {:<15} {:>23} {:>27}",
            p.bytes.to_string(),
            p.direction.label(),
            p.kind.label(),
            format!("{d:.3}x ({} / {})", fmt_ms(p.device_ms.median), fmt_ms(q.device_ms.median)),
            format!("{h:.2}x ({} / {})", fmt_ms(p.host_call_ms.median), fmt_ms(q.host_call_ms.median)),
        );
    }
    // A point costs more than plain calls where even the lab's faster
    // quarter of samples is more than the tolerance above plain calls'
    // slower quarter: beyond what the samples themselves vary.
    let beyond =
        |lab: &crate::measure::stats::Summary, plain: &crate::measure::stats::Summary| lab.middle_range().0 > (1.0 + PLAIN_TOLERANCE) * plain.middle_range().1;
    let over: Vec<String> = checked
        .iter()
        .flat_map(|(p, q)| {
            let at = format!("{} {} {}", p.bytes, p.direction.label(), p.kind.label());
            let device = beyond(&p.device_ms, &q.device_ms).then(|| format!("device time at {at}"));
            let host = beyond(&p.host_call_ms, &q.host_call_ms).then(|| format!("CPU blocked at {at}"));
            device.into_iter().chain(host)
        })
        .collect();
    let _ = writeln!(s, "  highest ratio: device time {:.3}x at {}; CPU blocked {:.2}x at {}", worst_device.0, worst_device.1, worst_host.0, worst_host.1);
    let _ = if over.is_empty() {
        writeln!(s, "  the lab's copies cost at most {:.0}% more than plain driver calls beyond the samples' spread, at every point", 100.0 * PLAIN_TOLERANCE)
    } else {
        writeln!(
            s,
            "  the lab's copies cost more than {:.0}% over plain driver calls, beyond the samples' spread: {}",
            100.0 * PLAIN_TOLERANCE,
            over.join(", ")
        )
    };
    s
}

/// The lab's headline numbers, as (what, value) rows for the report's
/// table of GPUs side by side.
pub fn headline(r: &BandwidthResults) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let Some(big) = r.largest_size() else {
        return rows;
    };
    let gbps = |k, d| r.point(k, d, big).map_or("-".to_string(), |p| format!("{:.1}", p.gbps.median));
    for (k, what) in [(HostMemoryKind::Pinned, "pinned"), (HostMemoryKind::Pageable, "pageable")] {
        rows.push((format!("{what} H2D / D2H, largest copy (GB/s)"), format!("{} / {} ({big})", gbps(k, Direction::H2d), gbps(k, Direction::D2h))));
    }
    rows.push(("pinned, both ways at once (GB/s)".into(), format!("{} ({big})", gbps(HostMemoryKind::Pinned, Direction::Bidirectional))));
    let blocked = |k| r.point(k, Direction::H2d, big).map_or("-".to_string(), |p| fmt_ms(p.host_call_ms.median));
    rows.push((
        "CPU blocked by one async H2D: pinned / pageable".into(),
        format!("{} / {} ({big})", blocked(HostMemoryKind::Pinned), blocked(HostMemoryKind::Pageable)),
    ));
    if let Some(b) = break_even(r).into_iter().find(|b| b.acquisition == Acquisition::Once && b.direction == Direction::D2h && b.bytes == Bytes(1 << 20)) {
        rows.push(("pinning pays off, D2H 1 MiB, allocated once".into(), b.verdict()));
    }
    rows
}

/// The measured numbers behind [`headline`]: at the largest copy, each
/// kind's rate each way and the CPU's blocked time of one H2D.
pub fn headline_figures(r: &BandwidthResults) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
    let mut v = Vec::new();
    let Some(big) = r.largest_size() else {
        return v;
    };
    for k in r.kinds() {
        for d in Direction::ALL {
            if let Some(p) = r.point(k, d, big) {
                v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{k} {d} {big}"), "GB/s", p.gbps));
            }
        }
        if let Some(p) = r.point(k, Direction::H2d, big) {
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{k} H2D {big}: CPU blocked"), "ms", p.host_call_ms));
        }
    }
    v
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
            let _ =
                writeln!(s, "  {:<27} {:<15} {:>13} {:>13} {:>8.0}%", d.label(), k.label(), fmt_ms(p.host_call_ms.median), fmt_ms(p.device_ms.median), share);
        }
    }
    s
}

/// Break-even copies per size and direction for each way of getting
/// page-locked memory, then the numbers behind every "at once".
pub fn break_even_table(r: &BandwidthResults) -> String {
    let rows = break_even(r);
    let mut s = String::new();
    let _ = writeln!(s, "Break-even: copies of one size until page-locked memory has repaid its extra cost (extra cost / time saved per copy)");
    let _ = write!(s, "{:>9} {:<4}", "size", "dir");
    for a in Acquisition::ALL {
        let _ = write!(s, " {:>18}", a.label());
    }
    let _ = writeln!(s);
    let mut at_once = Vec::new();
    for c in &r.pin_cost {
        for d in [Direction::H2d, Direction::D2h] {
            let _ = write!(s, "{:>9} {:<4}", c.bytes.to_string(), d.label());
            for a in Acquisition::ALL {
                let cell = rows.iter().find(|b| b.bytes == c.bytes && b.direction == d && b.acquisition == a);
                let _ = write!(s, " {:>18}", cell.map_or("-".into(), BreakEven::verdict));
                // The costs behind "at once" do not depend on the direction: explained once.
                if let Some(b) = cell.filter(|b| b.copies == Some(0.0) && !at_once.iter().any(|o: &BreakEven| o.bytes == b.bytes && o.acquisition == a)) {
                    at_once.push(b.clone());
                }
            }
            let _ = writeln!(s);
        }
    }
    for b in at_once {
        let (locked, pageable) = match b.acquisition {
            Acquisition::Once => ("its first cuMemHostAlloc + free", "fresh pageable pages faulted in + unmapped"),
            Acquisition::EveryUse => ("cuMemHostAlloc + free again", "malloc + write + free in a loop"),
            Acquisition::Register => ("register + unregister", "nothing"),
        };
        let _ = writeln!(
            s,
            "at once ({}, {}): {locked} took {}, {pageable} {}, so page-locked memory cost {} less before its first copy.",
            b.bytes,
            b.acquisition.label(),
            fmt_ms(b.page_locked_ms),
            fmt_ms(b.pageable_ms),
            fmt_ms(-b.extra_cost_ms)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fingerprint;

    #[test]
    fn the_plain_driver_calls_line_names_the_worst_point_and_whether_it_is_within_the_tolerance() {
        let mut r = crate::labs::bandwidth::fixture::results();
        assert_eq!(plain_table(&r), "", "a recording without plain copies prints nothing");
        let mib = Bytes(1 << 20);
        let at = |r: &mut BandwidthResults, k, d| r.transfers.iter().position(|p| p.kind == k && p.direction == d && p.bytes == mib).unwrap();
        // The lab's copies as fast as plain calls, then one whose CPU call costs 1.3x.
        let i = at(&mut r, HostMemoryKind::Pinned, Direction::H2d);
        let p = r.transfers[i].clone();
        r.transfers[i].plain = Some(super::super::PlainCopies { device_ms: p.device_ms, host_call_ms: p.host_call_ms });
        let t = plain_table(&r);
        assert!(t.contains("1.000x") && t.contains("device time 1.000x at 1 MiB H2D pinned") && t.contains("at most 15% more"), "{t}");
        let j = at(&mut r, HostMemoryKind::Pageable, Direction::D2h);
        let q = r.transfers[j].clone();
        let slower = crate::testing::flat(q.host_call_ms.median / 1.3);
        r.transfers[j].plain = Some(super::super::PlainCopies { device_ms: q.device_ms, host_call_ms: slower });
        let t = plain_table(&r);
        assert!(t.contains("CPU blocked 1.30x at 1 MiB D2H pageable") && t.contains("beyond the samples' spread: CPU blocked at 1 MiB D2H pageable"), "{t}");
        assert!(summary_table(&crate::measure::record::Record::new(super::super::LAB, fingerprint(), r.clone())).contains("more than 15% over plain"));
        // Within 15% where the samples spread that far: not a cost of the lab's.
        let noisy = crate::measure::stats::Summary { middle: Some((q.host_call_ms.median / 1.3, q.host_call_ms.median)), ..slower };
        r.transfers[j].plain.as_mut().unwrap().host_call_ms = noisy;
        assert!(plain_table(&r).contains("at most 15% more"), "{}", plain_table(&r));
    }

    #[test]
    fn link_share_and_ratio() {
        let r = crate::labs::bandwidth::fixture::results();
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
        let r = crate::labs::bandwidth::fixture::results();
        let b = break_even(&r);
        let find = |a: Acquisition| b.iter().find(|b| b.acquisition == a && b.direction == Direction::H2d && b.bytes == Bytes(1 << 30)).unwrap();
        // synthetic: pinned first 300+30 ms vs new pageable 100+10 ms => 220 ms extra;
        // copies: pageable 1 GiB at 10 GB/s, pinned at 50 GB/s.
        let gib = (1u64 << 30) as f64;
        let saving = (0.010 + gib / 10e9 * 1e3) - (0.005 + gib / 50e9 * 1e3);
        let once = find(Acquisition::Once);
        assert_eq!(once.kind(), HostMemoryKind::Pinned);
        assert!((once.extra_cost_ms - 220.0).abs() < 1e-9 && once.page_locked_ms == 330.0 && once.pageable_ms == 110.0);
        assert!((once.copies.unwrap() - 220.0 / saving).abs() < 1e-6);
        // Per use: pinned again 280+30 vs malloc loop 1+0.1.
        assert!((find(Acquisition::EveryUse).extra_cost_ms - 308.9).abs() < 1e-9);
        let reg = find(Acquisition::Register);
        assert_eq!(reg.kind(), HostMemoryKind::Registered);
        assert!((reg.extra_cost_ms - 60.0).abs() < 1e-9);
    }

    #[test]
    fn break_even_table_scales_units_and_explains_at_once_with_its_numbers() {
        let mut r = crate::labs::bandwidth::fixture::results();
        // Fresh pageable pages cost more than pinning (page faults): pays at once.
        r.pin_cost[0].pageable_first.acquire_ms.median = 334.36;
        let t = break_even_table(&r);
        assert!(t.contains("at once") && t.contains("copies") && t.contains("allocated per use"), "{t}");
        // 330 ms pinned vs 344.36 ms pageable: 14.36 ms less, in ms, not µs.
        assert!(t.contains("at once (1 GiB, allocated once): its first cuMemHostAlloc + free took 330.00 ms, fresh pageable pages faulted in + unmapped 344.36 ms, so page-locked memory cost 14.36 ms less"), "{t}");
        assert!(!t.contains("14360"), "{t}");
        assert_eq!(t.matches("at once (").count(), 1, "explained once, not per direction: {t}");
        let mut b = break_even(&r).remove(0);
        for (extra, copies, shown) in [
            (1.0, Some(12.07), "12.1 copies"),
            (1.0, Some(0.04), "0.04 copies"),
            (1e-6, Some(1e-4), "< 0.01 copies"),
            (-1.0, Some(0.0), "at once"),
            (1.0, None, "never"),
        ] {
            (b.extra_cost_ms, b.copies) = (extra, copies);
            assert_eq!(b.verdict(), shown);
        }
        let c = crate::lab_kit::host_memory::cost_table(&r.pin_cost);
        assert!(c.contains("344.36 ms") && c.contains("310.00 ms") && c.contains("60.00 ms"), "{c}");
    }

    #[test]
    fn tables_mention_every_series() {
        let r = crate::labs::bandwidth::fixture::results();
        let rec = crate::measure::record::Record::new("bandwidth", fingerprint(), r);
        let t = summary_table(&rec);
        assert!(t.contains("H2D") && t.contains("pinned") && t.contains("5.00x"), "{t}");
        assert!(t.contains("PCIe Gen5 x16"));
        let c = two_clocks_table(&rec.results, Bytes(1 << 20));
        assert!(c.contains("pageable") && c.contains("100%"), "{c}");
        let b = break_even_table(&rec.results);
        assert!(b.contains("copies"), "{b}");
    }
}
