//! Exercises for lab 1 and their checkers.
//!
//! 1. Predict transfer times: write `predict_us(bytes)` for pinned copies as a
//!    fixed cost plus bytes over a bandwidth. The checker compares it with
//!    every measured size and says which term is off.
//! 2. When does pinning pay off? Give the number of copies after which
//!    allocating pinned memory beats pageable memory at one size.

use super::model::{self, Acquisition};
use super::{BandwidthResults, Direction};
use crate::check::CheckReport;
use crate::gpu::HostMemoryKind;
use crate::units::Bytes;

/// A prediction passes if it is within this fraction of every measured median.
pub const MODEL_TOLERANCE: f64 = 0.15;
/// A break-even answer passes within this fraction of the measured one.
pub const BREAK_EVEN_TOLERANCE: f64 = 0.15;

/// Checks a latency + bandwidth model of one series (kind, direction)
/// against every measured size. `predict_us` maps bytes to microseconds.
pub fn check_transfer_model(
    r: &BandwidthResults,
    kind: HostMemoryKind,
    direction: Direction,
    predict_us: impl Fn(u64) -> f64,
) -> CheckReport {
    let mut rep = CheckReport::new(&format!("predict {kind} {direction} copy times"));
    let series = r.series(kind, direction);
    if series.is_empty() {
        rep.problem(format!("no measurements of {kind} {direction} in this run: pick a series that was measured"));
        return rep;
    }
    let mut worst: Option<(f64, Bytes, f64, f64)> = None;
    let mut small_low = 0;
    let mut large_off = Vec::new();
    let half = series.len() / 2;
    for (i, p) in series.iter().enumerate() {
        let measured = p.device_ms.median * 1e3;
        let predicted = predict_us(p.bytes.0);
        if !predicted.is_finite() || predicted <= 0.0 {
            rep.problem(format!("at {} the prediction is {predicted}: a time must be a positive number of µs", p.bytes));
            return rep;
        }
        let err = (predicted - measured) / measured;
        if err.abs() > MODEL_TOLERANCE {
            if i < half && predicted < measured {
                small_low += 1;
            }
            if i >= half {
                large_off.push(predicted / measured);
            }
        }
        if worst.is_none_or(|w| err.abs() > w.0.abs()) {
            worst = Some((err, p.bytes, predicted, measured));
        }
    }
    let (err, at, pred, meas) = worst.expect("series is not empty");
    if err.abs() <= MODEL_TOLERANCE {
        rep.note(format!(
            "every size within {:.0}% (worst {:+.1}% at {at}: {pred:.1} µs predicted, {meas:.1} µs measured)",
            MODEL_TOLERANCE * 100.0,
            err * 100.0
        ));
        return rep;
    }
    rep.problem(format!(
        "worst at {at}: you predict {pred:.1} µs, the GPU took {meas:.1} µs ({:+.0}%; the target is within {:.0}% at every size)",
        err * 100.0,
        MODEL_TOLERANCE * 100.0
    ));
    if small_low > 0 {
        rep.problem(format!(
            "{small_low} small size(s) are predicted too fast: a copy has a fixed cost (launch, DMA setup) that does not shrink with size; is your latency term there, and in µs?"
        ));
    }
    if !large_off.is_empty() {
        let f = large_off.iter().sum::<f64>() / large_off.len() as f64;
        let hint = if (f - 1000.0).abs() < 300.0 || (f - 0.001).abs() < 0.0003 {
            " That is about a factor 1000: check units (1 GB/s = 1000 bytes per µs)."
        } else {
            ""
        };
        rep.problem(format!(
            "large copies are off by {:.2}x on average: the bandwidth term sets them; read the plateau of the bandwidth chart.{hint}",
            f
        ));
    }
    rep
}

/// Checks an answer to "after how many copies of `bytes` in `direction` does
/// allocating pinned memory (instead of pageable) pay off?".
pub fn check_break_even(r: &BandwidthResults, direction: Direction, bytes: Bytes, answer: f64) -> CheckReport {
    let mut rep = CheckReport::new(&format!("break-even for pinned {direction} copies of {bytes}"));
    let all = model::break_even(r);
    let Some(b) = all.iter().find(|b| b.acquisition == Acquisition::Once && b.direction == direction && b.bytes == bytes) else {
        let sizes: Vec<String> = r.pin_cost.iter().map(|c| c.bytes.to_string()).collect();
        rep.problem(format!("pinning cost was not measured at {bytes} for {direction}; measured sizes: {}", sizes.join(", ")));
        return rep;
    };
    let Some(truth) = b.copies else {
        rep.note("pinned copies save nothing at this size, so pinning never pays off".to_string());
        if answer.is_finite() {
            rep.problem(format!("you answered {answer}, but it never pays off here (answer f64::INFINITY)"));
        }
        return rep;
    };
    if !answer.is_finite() || answer < 0.0 {
        rep.problem(format!("{answer} is not a number of copies (it does pay off, after a finite number)"));
        return rep;
    }
    if truth == 0.0 {
        if answer < 1.0 {
            rep.note(format!(
                "right: pinned memory was {} cheaper to get than new pageable memory here ({} against {}), so it pays from the first copy",
                crate::units::fmt_ms(-b.extra_cost_ms),
                crate::units::fmt_ms(b.page_locked_ms),
                crate::units::fmt_ms(b.pageable_ms)
            ));
        } else {
            rep.problem(format!(
                "here pinning pays from the first copy: cuMemHostAlloc + free of {bytes} took {}, fresh pageable memory + its first touch {}: it was {} cheaper before any copy; compare both costs before dividing",
                crate::units::fmt_ms(b.page_locked_ms),
                crate::units::fmt_ms(b.pageable_ms),
                crate::units::fmt_ms(-b.extra_cost_ms)
            ));
        }
        return rep;
    }
    let rel = (answer - truth) / truth;
    if rel.abs() <= BREAK_EVEN_TOLERANCE {
        rep.note(format!(
            "{answer:.1} copies vs {truth:.1} measured: pinning costs {:.2} ms more, each copy saves {:.3} ms",
            b.extra_cost_ms, b.saving_per_copy_ms
        ));
        return rep;
    }
    rep.problem(format!("{answer:.1} copies is {:+.0}% from the measured break-even", rel * 100.0));
    let pinned_total = b.page_locked_ms;
    let pinned_copy = r.point(HostMemoryKind::Pinned, direction, bytes).map_or(f64::NAN, |p| p.device_ms.median);
    let near = |x: f64| (answer - x).abs() <= BREAK_EVEN_TOLERANCE * x.abs();
    if near(pinned_total / b.saving_per_copy_ms) {
        rep.problem("you charged pinning its whole cost: pageable memory is not free either (malloc + touching every page); use the difference");
    } else if near(b.extra_cost_ms / pinned_copy) {
        rep.problem("you divided by the pinned copy time; divide by the time each copy saves (pageable − pinned)");
    } else {
        rep.problem("break-even = (pinned first alloc+free − new pageable alloc+touch+free) / (pageable copy − pinned copy), all at this size");
    }
    rep
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::labs::bandwidth::{AcquireCost, BandwidthConfig, PinCostPoint, TransferPoint};
    use crate::stats::Summary;

    fn s(v: f64) -> Summary {
        Summary { median: v, min: v, max: v, n: 1 }
    }

    /// A synthetic sweep: pinned = 5 µs + bytes/50 GB/s, pageable = 10 µs + bytes/10 GB/s.
    pub(crate) fn synthetic() -> BandwidthResults {
        let cfg = BandwidthConfig::default();
        let mut transfers = Vec::new();
        for bytes in cfg.sizes() {
            for (kind, lat_us, gbps) in [(HostMemoryKind::Pinned, 5.0, 50.0), (HostMemoryKind::Pageable, 10.0, 10.0), (HostMemoryKind::Registered, 5.0, 50.0)] {
                for direction in [Direction::H2d, Direction::D2h] {
                    let ms = lat_us * 1e-3 + bytes.0 as f64 / (gbps * 1e9) * 1e3;
                    transfers.push(TransferPoint {
                        kind,
                        direction,
                        bytes,
                        copies_per_sample: 1,
                        device_ms: s(ms),
                        host_call_ms: s(if kind == HostMemoryKind::Pageable { ms } else { 0.005 }),
                        gbps: s(bytes.0 as f64 / (ms * 1e-3) / 1e9),
                        gated: kind != HostMemoryKind::Pageable,
                        verified_samples: 1,
                    });
                }
            }
        }
        let cost = |acquire: f64, release: f64| AcquireCost { acquire_ms: s(acquire), release_ms: s(release) };
        let pin_cost = vec![PinCostPoint {
            bytes: Bytes(1 << 30),
            pageable_first: cost(100.0, 10.0),
            pageable_reused: cost(90.0, 10.0),
            pinned_first: cost(300.0, 30.0),
            pinned_reused: cost(280.0, 30.0),
            registered: cost(50.0, 10.0),
        }];
        BandwidthResults { config: cfg, transfers, pin_cost }
    }

    #[test]
    fn the_solution_passes() {
        let r = synthetic();
        let rep = check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |b| 5.0 + b as f64 / 50e3);
        assert!(rep.passed, "{rep}");
        assert!(rep.to_string().starts_with("[PASSED]"));
    }

    #[test]
    fn a_missing_latency_term_is_named() {
        let r = synthetic();
        let rep = check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |b| b as f64 / 50e3);
        assert!(!rep.passed);
        assert!(rep.to_string().contains("fixed cost"), "{rep}");
    }

    #[test]
    fn unit_errors_are_named() {
        let r = synthetic();
        let rep = check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |b| 5.0 + b as f64 / 50.0);
        assert!(!rep.passed);
        assert!(rep.to_string().contains("factor 1000"), "{rep}");
        let slow = check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |b| 5.0 + b as f64 / 25e3);
        assert!(!slow.passed && slow.to_string().contains("large copies are off by 1.9"), "{slow}");
    }

    #[test]
    fn nonsense_predictions_fail_cleanly() {
        let r = synthetic();
        assert!(!check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |_| f64::NAN).passed);
        assert!(!check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |_| -1.0).passed);
        let none = check_transfer_model(&r, HostMemoryKind::WriteCombined, Direction::H2d, |_| 1.0);
        assert!(!none.passed && none.to_string().contains("no measurements"));
    }

    #[test]
    fn break_even_answers() {
        let r = synthetic();
        let truth = model::break_even(&r)
            .into_iter()
            .find(|b| b.acquisition == Acquisition::Once && b.direction == Direction::H2d)
            .unwrap();
        let n = truth.copies.unwrap();
        assert!(check_break_even(&r, Direction::H2d, Bytes(1 << 30), n).passed);
        let whole = check_break_even(&r, Direction::H2d, Bytes(1 << 30), 330.0 / truth.saving_per_copy_ms);
        assert!(!whole.passed && whole.to_string().contains("whole cost"), "{whole}");
        let pinned_copy = r.point(HostMemoryKind::Pinned, Direction::H2d, Bytes(1 << 30)).unwrap().device_ms.median;
        let wrong_div = check_break_even(&r, Direction::H2d, Bytes(1 << 30), 220.0 / pinned_copy);
        assert!(!wrong_div.passed && wrong_div.to_string().contains("divided by the pinned"), "{wrong_div}");
        let mut cheap = r.clone();
        cheap.pin_cost[0].pinned_first.acquire_ms.median = 50.0;
        assert!(check_break_even(&cheap, Direction::H2d, Bytes(1 << 30), 0.0).passed);
        let e = check_break_even(&cheap, Direction::H2d, Bytes(1 << 30), 12.0);
        assert!(!e.passed && e.to_string().contains("first copy"), "{e}");
        let missing = check_break_even(&r, Direction::H2d, Bytes(4096), 3.0);
        assert!(!missing.passed && missing.to_string().contains("not measured"));
    }
}
