//! Exercises for lab 1 and their checkers.
//!
//! 1. Predict transfer times: write `predict_us(bytes)` for pinned copies as a
//!    fixed cost plus bytes over a bandwidth. The checker compares it with
//!    every measured size and says which term is off, and by what unit slip.
//! 2. When does pinning pay off? Write the rule for the number of copies
//!    after which a page-locked buffer, got one way ([`Acquisition`]), has
//!    repaid its extra cost, for any size and direction. The checker asks it
//!    at every size and direction priced, recognises the usual wrong
//!    formulas and names them ([`check_break_even_rule`]; one answer at one
//!    size: [`check_break_even`]).

use super::model::{self, Acquisition};
use super::{BandwidthResults, Direction};
use crate::error::Result;
use crate::gpu::HostMemoryKind;
use crate::lab_kit::check::{close, short, unit_slip, CheckReport};
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::measure::record::Record;
use crate::units::{fmt_ms, Bytes};
use std::path::Path;

/// The two exercises, as the course lists them (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[
    Exercise::in_cell("01-bandwidth/model", "a copy's time from latency and bandwidth", MODEL_HINTS, model_example, "bandwidth"),
    Exercise::in_cell("01-bandwidth/break-even", "when pinning pays off, as a rule", BREAK_EVEN_HINTS, break_even_example, "break-even"),
];

/// The first exercise answered on the recording in `dev`: the right
/// answer fits both terms from the pinned H2D series' smallest and largest
/// copies; the usual wrong one forgets the fixed cost and slips the
/// bandwidth's unit by a thousand.
fn model_example(dev: &Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Record<BandwidthResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    let bw = &rec.results;
    let (kind, d) = (HostMemoryKind::Pinned, Direction::H2d);
    let (Some(big), small) = (bw.largest_size(), bw.config.min_bytes) else { return Ok(None) };
    let (Some(big_point), Some(small_point)) = (bw.point(kind, d, big), bw.point(kind, d, small)) else { return Ok(None) };
    let gbps = big_point.gbps.median;
    let t0 = small_point.device_ms.median * 1e3 - small.0 as f64 / (gbps * 1e3);
    let (lat, rate) = if right { (t0, gbps) } else { (0.0, gbps * 1e3) };
    Ok(Some(check_transfer_model(bw, kind, d, |b| lat + b as f64 / (rate * 1e3))))
}

/// The second exercise answered on the recording in `dev`: the right rule
/// divides pinning's extra cost by what each copy saves; the usual wrong
/// one is off by a factor and a constant.
fn break_even_example(dev: &Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Record<BandwidthResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    let bw = &rec.results;
    let rule = |d, at| {
        let Some(c) = bw.pin_cost.iter().find(|c| c.bytes == at) else { return f64::NAN };
        let copy = |k| bw.point(k, d, at).map_or(f64::NAN, |p| p.device_ms.median);
        let saved = copy(HostMemoryKind::Pageable) - copy(HostMemoryKind::Pinned);
        let r = if saved <= 0.0 { f64::INFINITY } else { ((c.pinned_reused.total_ms() - c.pageable_reused.total_ms()) / saved).max(0.0) };
        if right {
            r
        } else {
            r * 3.0 + 5.0
        }
    };
    Ok(Some(check_break_even_rule(bw, Acquisition::EveryUse, rule)))
}

/// A prediction passes if it is within this fraction of every measured median.
pub const MODEL_TOLERANCE: f64 = 0.15;
/// A break-even answer passes within this fraction of the measured one, or
/// within [`BREAK_EVEN_ABS`] copies of it (near zero).
pub const BREAK_EVEN_TOLERANCE: f64 = 0.15;
pub const BREAK_EVEN_ABS: f64 = 0.5;

/// What the measurements say a series' two terms are: the fixed cost
/// (µs, from the smallest copy) and the rate (bytes of the copy's size per
/// µs, from the largest).
fn measured_terms(series: &[&super::TransferPoint]) -> (f64, f64) {
    let (small, big) = (series[0], series[series.len() - 1]);
    let (t_small, t_big) = (small.device_ms.median * 1e3, big.device_ms.median * 1e3);
    let rate = (big.bytes.0 - small.bytes.0) as f64 / (t_big - t_small).max(1e-9);
    ((t_small - small.bytes.0 as f64 / rate).max(0.0), rate)
}

/// Checks a latency + bandwidth model of one series (kind, direction)
/// against every measured size. `predict_us` maps a copy's size in bytes
/// to microseconds (for bidirectional, each direction moves that size).
pub fn check_transfer_model(r: &BandwidthResults, kind: HostMemoryKind, direction: Direction, predict_us: impl Fn(u64) -> f64) -> CheckReport {
    let mut rep = CheckReport::new(&format!("predict {kind} {direction} copy times")).answering(EXERCISES[0].id);
    let series = r.series(kind, direction);
    if series.len() < 2 {
        rep.problem(format!("{kind} {direction} was not measured at two sizes or more in this run, so there is nothing to fit"));
        return rep;
    }
    let Some((pred, t0_yours)) = rep.learner("your predict_us", || Ok((series.iter().map(|p| predict_us(p.bytes.0)).collect::<Vec<f64>>(), predict_us(0))))
    else {
        return rep;
    };
    if let Some((p, v)) = series.iter().zip(&pred).find(|(_, v)| !v.is_finite() || **v <= 0.0) {
        rep.problem(format!("at {} your prediction is {} µs: a time must be a positive number of µs", p.bytes, short(*v)));
        return rep;
    }
    let (t0, rate) = measured_terms(&series);
    let big = series[series.len() - 1];
    let rate_yours = big.bytes.0 as f64 / (pred[pred.len() - 1] - t0_yours);
    // GB/s of the copy's size: what the learner's B is in.
    let (gbps, gbps_yours) = (rate / 1e3, rate_yours / 1e3);
    let errs: Vec<f64> = series.iter().zip(&pred).map(|(p, v)| v / (p.device_ms.median * 1e3) - 1.0).collect();
    let (worst, err) = errs.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).map(|(i, e)| (i, *e)).expect("two sizes or more");
    let bandwidth_slip = unit_slip(gbps_yours, gbps);
    if err.abs() <= MODEL_TOLERANCE && bandwidth_slip.is_none() {
        rep.note(format!(
            "every size within {:.0}% (worst {:+.1}% at {}); your t0 = {} µs and B = {} GB/s, the measurements say about {} µs and {} GB/s",
            MODEL_TOLERANCE * 100.0,
            err * 100.0,
            series[worst].bytes,
            short(t0_yours),
            short(gbps_yours),
            short(t0),
            short(gbps)
        ));
        return rep;
    }
    if err.abs() > MODEL_TOLERANCE {
        rep.problem(format!(
            "worst at {}: you predict {} µs, the GPU took {} µs ({:+.0}%; the target is within {:.0}% at every size)",
            series[worst].bytes,
            short(pred[worst]),
            short(series[worst].device_ms.median * 1e3),
            err * 100.0,
            MODEL_TOLERANCE * 100.0
        ));
    }
    let mut named = false;
    if !close(t0_yours, t0, 0.5, 1.0) {
        named = true;
        rep.problem(if t0_yours.abs() < 1e-9 {
            format!("your model has no fixed cost: a copy costs about {} µs however small (launch, DMA setup)", short(t0))
        } else {
            let slip = unit_slip(t0_yours, t0).map_or(String::new(), |s| format!(": {s}"));
            format!("your fixed cost t0 = {} µs, the smallest copies say about {} µs{slip}", short(t0_yours), short(t0))
        });
    }
    if !close(gbps_yours, gbps, 0.05, 0.0) {
        named = true;
        let both = if direction == Direction::Bidirectional { " (both directions at once: each moves the copy's size, so count the size once)" } else { "" };
        let slip = bandwidth_slip.map_or(String::new(), |s| format!(": {s}"));
        rep.problem(format!("your bandwidth term moves {} GB/s, the plateau of the chart is {} GB/s{both}{slip}", short(gbps_yours), short(gbps)));
    }
    if !named {
        rep.problem("both terms are about right but the shape is not: a copy's time is t0 + bytes / B, one fixed cost plus one rate");
    }
    rep
}

/// Checks an answer to "after how many copies of `bytes` in `direction`
/// has a page-locked buffer got by `how` repaid its extra cost?".
/// `f64::INFINITY` answers "never".
pub fn check_break_even(r: &BandwidthResults, how: Acquisition, direction: Direction, bytes: Bytes, answer: f64) -> CheckReport {
    judge_break_even(r, &model::break_even(r), how, direction, bytes, answer)
}

/// [`check_break_even`] with the run's break-evens (`all`) worked out once.
fn judge_break_even(r: &BandwidthResults, all: &[model::BreakEven], how: Acquisition, direction: Direction, bytes: Bytes, answer: f64) -> CheckReport {
    let mut rep = CheckReport::new(&format!("break-even of page-locked memory {} for {direction} copies of {bytes}", how.label()));
    let find = |how: Acquisition, direction: Direction| all.iter().find(|b| b.acquisition == how && b.direction == direction && b.bytes == bytes);
    let Some(b) = find(how, direction) else {
        let sizes: Vec<String> = r.pin_cost.iter().map(|c| c.bytes.to_string()).collect();
        rep.problem(format!("pinning cost was not measured at {bytes} for {direction}; measured sizes: {}", sizes.join(", ")));
        return rep;
    };
    let Some(truth) = b.copies else {
        if answer == f64::INFINITY {
            rep.note(format!(
                "right: page-locked {direction} copies of {bytes} are no faster ({} saved per copy), so it never pays off",
                fmt_ms(b.saving_per_copy_ms)
            ));
        } else {
            rep.problem(format!(
                "page-locked {direction} copies of {bytes} save nothing here ({} per copy), so it never pays off, and your answer says it does",
                fmt_ms(b.saving_per_copy_ms)
            ));
        }
        return rep;
    };
    if answer == f64::INFINITY {
        rep.problem(format!("it does pay off here, after a finite number of copies: each copy saves {}", fmt_ms(b.saving_per_copy_ms)));
        return rep;
    }
    let Some(answer) = rep.number("your answer", answer, "copies", 0.0..=1e12) else {
        return rep;
    };
    let why = format!(
        "page-locked memory cost {} more to get ({} against {}), each copy saves {}",
        fmt_ms(b.extra_cost_ms),
        fmt_ms(b.page_locked_ms),
        fmt_ms(b.pageable_ms),
        fmt_ms(b.saving_per_copy_ms)
    );
    // Honest forms: the fraction, whole copies (rounded up), or "within the
    // first copy" when it pays before one whole copy.
    if close(answer, truth, BREAK_EVEN_TOLERANCE, BREAK_EVEN_ABS) || answer == truth.ceil() || (truth < 1.0 && answer <= 1.0) {
        rep.note(if truth == 0.0 {
            format!(
                "right: page-locked memory was {} cheaper to get here ({} against {}), so it pays from the first copy",
                fmt_ms(-b.extra_cost_ms),
                fmt_ms(b.page_locked_ms),
                fmt_ms(b.pageable_ms)
            )
        } else {
            format!("right: {} copies against {truth:.2} measured: {why}", short(answer))
        });
        return rep;
    }
    if truth == 0.0 {
        rep.problem(format!(
            "here it pays from the first copy: page-locked memory took {}, the pageable memory it replaces {}: it was {} cheaper before any copy, so no number of copies is needed to repay it",
            fmt_ms(b.page_locked_ms),
            fmt_ms(b.pageable_ms),
            fmt_ms(-b.extra_cost_ms)
        ));
        return rep;
    }
    // The usual wrong formulas, each with what it mixes up.
    let wrong = mistakes(r, all, how, b);
    // A slip that is also the truth (two costs that happen to agree) is no slip.
    if let Some(m) = wrong.iter().find(|m| m.matches(answer, truth)) {
        let msg = &m.what;
        rep.problem(format!("{} copies: {msg}", short(answer)));
    } else {
        let slip = unit_slip(answer, truth).map_or(String::new(), |s| format!("; {s}"));
        rep.problem(format!("{} copies is {:+.0}% from the measured break-even at {bytes}{slip}", short(answer), 100.0 * (answer / truth - 1.0)));
    }
    rep
}

/// A wrong formula for a break-even: `key` names it the same at every
/// size, `copies` is what it gives there, `what` says what it mixes up.
struct Mistake {
    key: String,
    copies: f64,
    what: String,
}

impl Mistake {
    /// `answer` is this mistake's number and not also the truth's (two
    /// costs that happen to agree make no slip).
    fn matches(&self, answer: f64, truth: f64) -> bool {
        self.copies.is_finite() && close(answer, self.copies, 0.03, 0.05) && !close(self.copies, truth, BREAK_EVEN_TOLERANCE, BREAK_EVEN_ABS)
    }
}

/// The calls that get and give back page-locked memory got `how`.
fn page_locked_calls(how: Acquisition) -> (&'static str, &'static str) {
    match how {
        Acquisition::Register => ("cuMemHostRegister", "cuMemHostUnregister"),
        _ => ("cuMemHostAlloc", "cuMemFreeHost"),
    }
}

/// The usual wrong formulas for the break-even `b` (memory got `how`),
/// one of the run's break-evens `all`.
fn mistakes(r: &BandwidthResults, all: &[model::BreakEven], how: Acquisition, b: &model::BreakEven) -> Vec<Mistake> {
    let (direction, bytes) = (b.direction, b.bytes);
    let find = |how: Acquisition, direction: Direction| all.iter().find(|b| b.acquisition == how && b.direction == direction && b.bytes == bytes);
    let m = |key: &str, copies: f64, what: String| Mistake { key: key.into(), copies, what };
    let copy_ms = |k, d| r.point(k, d, bytes).map_or(f64::NAN, |p| p.device_ms.median);
    let (pinned_copy, pageable_copy) = (copy_ms(how.kind(), direction), copy_ms(HostMemoryKind::Pageable, direction));
    let mut wrong = vec![
        m("extra ms", b.extra_cost_ms, "that is the extra cost in ms, not a number of copies".into()),
        m("extra µs", b.extra_cost_ms * 1e3, "that is the extra cost in µs, not a number of copies".into()),
        m(
            "whole cost",
            b.page_locked_ms / b.saving_per_copy_ms,
            format!("you charged page-locked memory its whole cost; the pageable memory it replaces is not free either ({})", fmt_ms(b.pageable_ms)),
        ),
        m("by page-locked copy", b.extra_cost_ms / pinned_copy, "you divided by the page-locked copy's time, which is not what each copy saves".into()),
        m("by pageable copy", b.extra_cost_ms / pageable_copy, "you divided by the pageable copy's time, which is not what each copy saves".into()),
    ];
    // The costs without giving the memory back: both frees, or one of them, left out.
    if let Some(c) = r.pin_cost.iter().find(|c| c.bytes == bytes) {
        let (locked, pageable) = how.costs(c);
        let (get, give_back) = page_locked_calls(how);
        let (p_get, p_free) = pageable.map_or((0.0, 0.0), |p| (p.acquire_ms.median, p.release_ms.median));
        let per_copy = |extra: f64| extra / b.saving_per_copy_ms;
        let (l_get, l_free) = (locked.acquire_ms.median, locked.release_ms.median);
        if pageable.is_some() {
            wrong.push(m(
                "no frees",
                per_copy(l_get - p_get),
                format!(
                    "you counted only getting the memory ({get} against malloc and the first writes); giving it back ({give_back} against free, {} against {}) is part of each buffer's cost too",
                    fmt_ms(l_free),
                    fmt_ms(p_free)
                ),
            ));
            wrong.push(m(
                "no pageable free",
                per_copy(l_get + l_free - p_get),
                format!("you counted {give_back} ({}) but not the free of the pageable memory it replaces ({})", fmt_ms(l_free), fmt_ms(p_free)),
            ));
        }
        wrong.push(m(
            "no page-locked free",
            per_copy(l_get - p_get - p_free),
            format!("you left out what {give_back} costs ({}): giving the page-locked memory back is part of its cost", fmt_ms(l_free)),
        ));
    }
    for other in Acquisition::ALL.into_iter().filter(|&a| a != how) {
        if let Some(c) = find(other, direction).and_then(|o| o.copies) {
            wrong.push(m(other.label(), c, format!("that is the break-even of memory {}; here it is {}", other.label(), how.label())));
        }
    }
    for other in [Direction::H2d, Direction::D2h].into_iter().filter(|&d| d != direction) {
        if let Some(c) = find(how, other).and_then(|o| o.copies) {
            wrong.push(m("other direction", c, format!("you used the {other} copy times; this buffer is copied {direction}")));
        }
    }
    wrong
}

/// Checks a rule for exercise 2: `rule(direction, bytes)` is the learner's
/// number of copies after which page-locked memory got `how` has repaid
/// its extra cost (`f64::INFINITY`: never), asked at every size and
/// direction the run priced. One number at one size cannot tell a right
/// formula from a wrong one that lands near it there (on an H100 two do at
/// 16 MiB D2H); across the sizes they part. The verdict names the sizes
/// that are wrong and, at one of them, the mistake.
pub fn check_break_even_rule(r: &BandwidthResults, how: Acquisition, rule: impl Fn(Direction, Bytes) -> f64) -> CheckReport {
    let mut rep = CheckReport::new(&format!("break-even of page-locked memory {} at every size and direction", how.label())).answering(EXERCISES[1].id);
    let all = model::break_even(r);
    let cases: Vec<&model::BreakEven> = all.iter().filter(|b| b.acquisition == how).collect();
    if cases.is_empty() {
        rep.problem(format!("this run priced no page-locked memory {}: nothing to check the rule against", how.label()));
        return rep;
    }
    let Some(answers) = rep.learner("your break-even rule", || Ok(cases.iter().map(|b| rule(b.direction, b.bytes)).collect::<Vec<f64>>())) else {
        return rep;
    };
    let verdicts: Vec<CheckReport> = cases.iter().zip(&answers).map(|(b, &answer)| judge_break_even(r, &all, how, b.direction, b.bytes, answer)).collect();
    let wrong: Vec<usize> = (0..verdicts.len()).filter(|&k| !verdicts[k].passed).collect();
    if wrong.is_empty() {
        rep.note(format!("right at all {} sizes and directions priced", cases.len()));
        // The case the notebook discusses, or the largest one.
        let k = cases.iter().position(|b| b.direction == Direction::D2h && b.bytes == Bytes(16 << 20)).unwrap_or(cases.len() - 1);
        rep.note(format!("at {} {}: {}", cases[k].bytes, cases[k].direction, verdicts[k].findings.join("; ")));
        return rep;
    }
    let mut sizes: Vec<String> = wrong.iter().take(4).map(|&k| format!("{} {}", cases[k].bytes, cases[k].direction)).collect();
    if wrong.len() > 4 {
        sizes.push(format!("and {} more", wrong.len() - 4));
    }
    rep.problem(format!("wrong at {} of {} sizes and directions: {}", wrong.len(), cases.len(), sizes.join(", ")));
    // A mistake is named where it explains the rule: it is the rule's number
    // at most of the wrong sizes (at one size a wrong number can land on any
    // formula's by chance).
    let mut explained: Vec<(String, Vec<usize>, String)> = Vec::new();
    for &k in &wrong {
        let Some(truth) = cases[k].copies else { continue };
        for m in mistakes(r, &all, how, cases[k]).into_iter().filter(|m| m.matches(answers[k], truth)) {
            match explained.iter_mut().find(|e| e.0 == m.key) {
                Some(e) => e.1.push(k),
                None => explained.push((m.key, vec![k], m.what)),
            }
        }
    }
    let best = explained.into_iter().max_by_key(|e| e.1.len()).filter(|e| e.1.len() >= 2 && 2 * e.1.len() >= wrong.len());
    // Else the first wrong size where a finite number of copies was due
    // (a slip of units shows there), or the first wrong size.
    let regular = |k: &usize| cases[*k].copies.is_some_and(|c| c > 0.0);
    match best {
        Some((_, at, what)) => {
            let k = at[0];
            rep.problem(format!(
                "at {} {}: {} copies: {what} (the same mistake at {} of the wrong sizes)",
                cases[k].bytes,
                cases[k].direction,
                short(answers[k]),
                at.len()
            ))
        }
        None => {
            let k = wrong.iter().copied().find(regular).unwrap_or(wrong[0]);
            rep.problem(format!("at {} {}: {}", cases[k].bytes, cases[k].direction, verdicts[k].findings.join("; ")));
        }
    }
    rep
}

/// Hints for exercise 1 (predict_us), one at a time ([`hint_model`]).
pub const MODEL_HINTS: &[&str] = &[
    "A copy's time has two parts: a fixed cost that every copy pays however small it is, and a part that grows with its bytes.",
    "Read the fixed cost off the smallest copies and the rate off the plateau of the bandwidth chart: `run.record.results.point(kind, direction, size)` gives a size's measured median.",
    "Mind the units: the check hands your function bytes and wants microseconds back, and 1 GB/s is 1000 bytes per microsecond.",
];

/// Hint `k` (from 1) for exercise 1 (predict_us): `hint_model(1)`, then `hint_model(2)` if still stuck.
pub fn hint_model(k: usize) -> String {
    crate::lab_kit::check::hint(MODEL_HINTS, k)
}

/// Hints for exercise 2 (the break-even rule), one at a time ([`hint_break_even`]).
pub const BREAK_EVEN_HINTS: &[&str] = &[
    "Pinning pays off once what it saves over the copies outweighs what it costs extra to get the buffer.",
    "Two quantities at each size: the extra cost per batch, from the pinning-cost table (`pin_cost`: `pinned_reused` and `pageable_reused`, each with `total_ms()`), and what each copy saves, from the copy times (`run.copy_time_us`).",
    "Compare like with like: a pinned allocation in the loop against the pageable buffer's cost in the same loop, one unit for both times, and decide what to return where a pinned copy saves nothing.",
];

/// Hint `k` (from 1) for exercise 2 (the break-even rule): `hint_break_even(1)`, then `hint_break_even(2)` if still stuck.
pub fn hint_break_even(k: usize) -> String {
    crate::lab_kit::check::hint(BREAK_EVEN_HINTS, k)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::labs::bandwidth::TransferPoint;

    fn model(t0: f64, gbps: f64) -> impl Fn(u64) -> f64 {
        move |b| t0 + b as f64 / (gbps * 1e3)
    }

    fn verdict(r: &CheckReport) -> (bool, String) {
        (r.passed, r.to_string())
    }

    #[test]
    fn honest_transfer_models_pass() {
        let r = crate::labs::bandwidth::fixture::results();
        for rep in [
            check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, model(5.0, 50.0)),
            // The notebook's way: t0 from the smallest copy, B from the plateau (a bit under the true rate).
            check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, model(5.0, 49.2)),
            // Seconds computed, then converted.
            check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |b| (5e-6 + b as f64 / 50e9) * 1e6),
            check_transfer_model(&r, HostMemoryKind::Pageable, Direction::D2h, model(10.0, 15.0)),
        ] {
            assert!(rep.passed, "{rep}");
        }
    }

    /// Wrong answers a student gives, each with the words its message must hold.
    #[test]
    fn wrong_transfer_models_fail_naming_the_mistake() {
        let r = crate::labs::bandwidth::fixture::results();
        let gib_per_s = 50e9 / (1u64 << 30) as f64;
        type Model = Box<dyn Fn(u64) -> f64>;
        let cases: Vec<(&str, Model, &[&str])> = vec![
            ("no fixed cost", Box::new(model(0.0, 50.0)), &["no fixed cost", "however small"]),
            ("t0 in ms", Box::new(model(0.005, 50.0)), &["fixed cost t0 = 0.00500 µs", "factor 1000 too small"]),
            ("t0 in ns", Box::new(model(5000.0, 50.0)), &["fixed cost t0 = 5000 µs", "factor 1000 too large"]),
            ("B in bytes per s", Box::new(|b| 5.0 + b as f64 / 50e9), &["bandwidth term", "a million"]),
            ("B as GB/s without x1000", Box::new(|b| 5.0 + b as f64 / 50.0), &["bandwidth term", "factor 1000"]),
            ("GiB/s for GB/s", Box::new(model(5.0, gib_per_s)), &["GiB against GB"]),
            ("bits", Box::new(model(5.0, 400.0)), &["bits against bytes"]),
            ("pageable rate for pinned", Box::new(model(5.0, 10.0)), &["bandwidth term moves 10.0 GB/s", "plateau of the chart is 50.0 GB/s"]),
            ("zero", Box::new(|_| 0.0), &["positive number of µs"]),
            ("NaN", Box::new(|_| f64::NAN), &["positive number of µs"]),
            ("negative", Box::new(|_| -1.0), &["positive number of µs"]),
            ("panics", Box::new(|b| if b > 1 << 20 { panic!("my bug at {b}") } else { 5.0 }), &["your predict_us panicked: my bug at"]),
            ("not linear", Box::new(|b| 5.0 + (b as f64).sqrt()), &["worst at"]),
        ];
        for (what, f, words) in cases {
            let (ok, text) = verdict(&check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, f));
            assert!(!ok, "{what} passed: {text}");
            for w in words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
        }
        let none = check_transfer_model(&r, HostMemoryKind::WriteCombined, Direction::H2d, model(5.0, 50.0));
        assert!(!none.passed && none.to_string().contains("was not measured"));
    }

    #[test]
    fn bidirectional_models_count_the_copy_size_once() {
        let mut r = crate::labs::bandwidth::fixture::results();
        // Both ways at once: each direction moves `bytes` in the time of one.
        for p in r.transfers.clone().iter().filter(|p| p.direction == Direction::H2d && p.kind == HostMemoryKind::Pinned) {
            let gbps = crate::testing::flat(2.0 * p.bytes.0 as f64 / (p.device_ms.median * 1e-3) / 1e9);
            r.transfers.push(TransferPoint { direction: Direction::Bidirectional, gbps, ..p.clone() });
        }
        assert!(check_transfer_model(&r, HostMemoryKind::Pinned, Direction::Bidirectional, model(5.0, 50.0)).passed);
        let twice = check_transfer_model(&r, HostMemoryKind::Pinned, Direction::Bidirectional, model(5.0, 100.0));
        assert!(!twice.passed && twice.to_string().contains("count the size once"), "{twice}");
    }

    fn truth(r: &BandwidthResults, how: Acquisition, d: Direction) -> model::BreakEven {
        model::break_even(r).into_iter().find(|b| b.acquisition == how && b.direction == d).unwrap()
    }

    #[test]
    fn honest_break_even_answers_pass_in_every_form() {
        let r = crate::labs::bandwidth::fixture::results();
        let gib = Bytes(1 << 30);
        let b = truth(&r, Acquisition::Once, Direction::D2h);
        let n = b.copies.unwrap();
        for answer in [n, n * 1.1, n.ceil(), (b.extra_cost_ms / b.saving_per_copy_ms)] {
            let rep = check_break_even(&r, Acquisition::Once, Direction::D2h, gib, answer);
            assert!(rep.passed, "{answer}: {rep}");
        }
        // A true answer of 0 (cheaper before any copy): 0, a fraction, or "the first copy".
        let mut cheap = r.clone();
        cheap.pin_cost[0].pinned_first.acquire_ms.median = 50.0;
        for answer in [0.0, 0.3, 1.0] {
            let rep = check_break_even(&cheap, Acquisition::Once, Direction::D2h, gib, answer);
            assert!(rep.passed && rep.to_string().contains("pays from the first copy"), "{answer}: {rep}");
        }
        // Never: infinity is the answer, and the only one.
        let mut slow = r.clone();
        for p in slow.transfers.iter_mut().filter(|p| p.kind == HostMemoryKind::Pinned) {
            p.device_ms.median *= 100.0;
        }
        assert!(check_break_even(&slow, Acquisition::Once, Direction::D2h, gib, f64::INFINITY).passed);
        let never = check_break_even(&slow, Acquisition::Once, Direction::D2h, gib, 12.0);
        assert!(!never.passed && never.to_string().contains("never pays off, and your answer says it does"), "{never}");
    }

    #[test]
    fn wrong_break_even_answers_fail_naming_the_mistake() {
        let r = crate::labs::bandwidth::fixture::results();
        let gib = Bytes(1 << 30);
        let b = truth(&r, Acquisition::Once, Direction::D2h);
        let (n, extra, saving) = (b.copies.unwrap(), b.extra_cost_ms, b.saving_per_copy_ms);
        let pinned_copy = r.point(HostMemoryKind::Pinned, Direction::D2h, gib).unwrap().device_ms.median;
        let pageable_copy = r.point(HostMemoryKind::Pageable, Direction::D2h, gib).unwrap().device_ms.median;
        let cases: Vec<(&str, f64, &[&str])> = vec![
            ("the extra cost, a time", extra, &["extra cost in ms, not a number of copies"]),
            ("the whole pinned cost", b.page_locked_ms / saving, &["whole cost", "not free either"]),
            ("divided by the pinned copy", extra / pinned_copy, &["divided by the page-locked copy's time"]),
            ("divided by the pageable copy", extra / pageable_copy, &["divided by the pageable copy's time"]),
            (
                "per-use costs for a buffer allocated once",
                truth(&r, Acquisition::EveryUse, Direction::D2h).copies.unwrap(),
                &["break-even of memory allocated per use; here it is allocated once"],
            ),
            ("H2D times for a D2H buffer", truth(&r, Acquisition::Once, Direction::H2d).copies.unwrap(), &["used the H2D copy times"]),
            ("ms over µs", n * 1000.0, &["factor 1000 too large"]),
            ("negative", -n, &["out of range"]),
            ("NaN", f64::NAN, &["finite number of copies"]),
            ("never", f64::INFINITY, &["it does pay off"]),
            ("a guess", n * 3.0 + 5.0, &["from the measured break-even at 1 GiB"]),
        ];
        for (what, answer, words) in cases {
            let (ok, text) = verdict(&check_break_even(&r, Acquisition::Once, Direction::D2h, gib, answer));
            assert!(!ok, "{what} ({answer}) passed: {text}");
            for w in words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
        }
        let mut cheap = r.clone();
        cheap.pin_cost[0].pinned_first.acquire_ms.median = 50.0;
        let e = check_break_even(&cheap, Acquisition::Once, Direction::D2h, gib, 12.0);
        assert!(!e.passed && e.to_string().contains("pays from the first copy") && e.to_string().contains("ms"), "{e}");
        let missing = check_break_even(&r, Acquisition::Once, Direction::H2d, Bytes(4096), 3.0);
        assert!(!missing.passed && missing.to_string().contains("not measured"));
    }

    /// Where giving memory back costs something, an answer that leaves
    /// out the frees (both, or either) fails naming what it left out.
    #[test]
    fn a_break_even_without_the_frees_is_named() {
        let mut r = crate::labs::bandwidth::fixture::results();
        r.pin_cost[0].pinned_first.release_ms = crate::testing::flat(150.0);
        r.pin_cost[0].pageable_first.release_ms = crate::testing::flat(80.0);
        let c = &r.pin_cost[0];
        let saving = truth(&r, Acquisition::Once, Direction::D2h).saving_per_copy_ms;
        let (l_get, p_get) = (c.pinned_first.acquire_ms.median, c.pageable_first.acquire_ms.median);
        let cases: [(&str, f64, &str); 3] = [
            ("both frees", (l_get - p_get) / saving, "you counted only getting the memory (cuMemHostAlloc against malloc and the first writes); giving it back (cuMemFreeHost against free, 150.00 ms against 80.00 ms)"),
            ("cuMemFreeHost", (l_get - c.pageable_first.total_ms()) / saving, "you left out what cuMemFreeHost costs (150.00 ms)"),
            ("the pageable free", (c.pinned_first.total_ms() - p_get) / saving, "you counted cuMemFreeHost (150.00 ms) but not the free of the pageable memory it replaces (80.00 ms)"),
        ];
        for (left_out, answer, words) in cases {
            let (ok, text) = verdict(&check_break_even(&r, Acquisition::Once, Direction::D2h, Bytes(1 << 30), answer));
            assert!(!ok && text.contains(words), "{left_out} left out ({answer}): {text}");
        }
    }

    /// Exercise 2 as the notebook asks it (a rule for memory allocated per
    /// use, asked at every size and direction priced), on every recording a
    /// learner with no GPU meets: the notebook's solution passes; its
    /// starting rule and every usual wrong formula fail on every recording,
    /// each naming its mistake, including the two that land within the
    /// tolerance of the truth at 16 MiB D2H on the H100.
    #[test]
    fn break_even_rules_are_judged_at_every_size_on_every_recording() {
        let how = Acquisition::EveryUse;
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let found = crate::measure::record::find_recordings::<BandwidthResults>(&data, super::super::LAB).unwrap();
        assert!(found.len() >= 2, "the H100's and the H200's recordings");
        for (path, rec) in found {
            let r = &rec.results;
            let at = path.display();
            let cost = |b: Bytes| r.pin_cost.iter().find(|c| c.bytes == b).unwrap();
            let copy = |k, d, b| r.point(k, d, b).unwrap().device_ms.median;
            let extra = |b: Bytes| cost(b).pinned_reused.total_ms() - cost(b).pageable_reused.total_ms();
            let saved = |d, b| copy(HostMemoryKind::Pageable, d, b) - copy(HostMemoryKind::Pinned, d, b);
            let flip = |d| if d == Direction::H2d { Direction::D2h } else { Direction::H2d };
            // The notebook's solution, as written there.
            let solution = |d: Direction, b: Bytes| {
                let saved_us = saved(d, b) * 1e3;
                if saved_us <= 0.0 {
                    f64::INFINITY
                } else {
                    (extra(b) * 1e3 / saved_us).max(0.0)
                }
            };
            let rep = check_break_even_rule(r, how, solution);
            assert!(rep.passed && rep.to_string().contains("right at all"), "{at}: the notebook's solution: {rep}");
            // Whole copies, rounded up, pass too.
            let rep = check_break_even_rule(r, how, |d, b| solution(d, b).ceil());
            assert!(rep.passed, "{at}: whole copies: {rep}");
            type Rule<'a> = Box<dyn Fn(Direction, Bytes) -> f64 + 'a>;
            let cases: Vec<(&str, Rule, &str)> = vec![
                ("the notebook's starting rule", Box::new(|_, _| 1.0), "from the measured break-even"),
                ("the extra cost, a time", Box::new(|_, b| extra(b)), "that is the extra cost in ms, not a number of copies"),
                ("the extra cost in µs", Box::new(|_, b| extra(b) * 1e3), "that is the extra cost in µs"),
                (
                    "the whole page-locked cost",
                    Box::new(|d, b| cost(b).pinned_reused.total_ms() / saved(d, b)),
                    "you charged page-locked memory its whole cost",
                ),
                (
                    "divided by the page-locked copy",
                    Box::new(|d, b| extra(b) / copy(HostMemoryKind::Pinned, d, b)),
                    "you divided by the page-locked copy's time",
                ),
                ("divided by the pageable copy", Box::new(|d, b| extra(b) / copy(HostMemoryKind::Pageable, d, b)), "you divided by the pageable copy's time"),
                (
                    "the costs of memory allocated once",
                    Box::new(|d, b| (cost(b).pinned_first.total_ms() - cost(b).pageable_first.total_ms()) / saved(d, b)),
                    "that is the break-even of memory allocated once",
                ),
                ("the other direction's copy times", Box::new(|d, b| extra(b) / saved(flip(d), b)), "copy times; this buffer is copied"),
                (
                    "the frees left out",
                    Box::new(|d, b| (cost(b).pinned_reused.acquire_ms.median - cost(b).pageable_reused.acquire_ms.median) / saved(d, b)),
                    "you counted only getting the memory (cuMemHostAlloc against malloc and the first writes); giving it back (cuMemFreeHost against free",
                ),
                (
                    "cuMemFreeHost left out",
                    Box::new(|d, b| (cost(b).pinned_reused.acquire_ms.median - cost(b).pageable_reused.total_ms()) / saved(d, b)),
                    "you left out what cuMemFreeHost costs",
                ),
                (
                    "the pageable free left out",
                    Box::new(|d, b| (cost(b).pinned_reused.total_ms() - cost(b).pageable_reused.acquire_ms.median) / saved(d, b)),
                    "but not the free of the pageable memory it replaces",
                ),
                ("the saving in µs against the cost in ms", Box::new(|d, b| extra(b) / (saved(d, b) * 1e-3)), "factor 1000 too large"),
                ("never", Box::new(|_, _| f64::INFINITY), "it does pay off"),
                ("the saving the wrong way round", Box::new(|d, b| extra(b) / -saved(d, b)), "out of range"),
                ("a panic", Box::new(|_, b| if b > Bytes(1 << 20) { panic!("no cost at {b}") } else { 1.0 }), "your break-even rule panicked: no cost at"),
            ];
            for (what, rule, words) in cases {
                let rep = check_break_even_rule(r, how, rule);
                let text = rep.to_string();
                assert!(!rep.passed, "{at}: {what} passed: {text}");
                assert!(text.contains(words), "{at}: {what}: no '{words}' in {text}");
                // The message names the mistake; the fix is the hints' to give.
                for fix in ["divide it", "divide by", "divide the", "Break-even =", "answer f64::INFINITY", "use the costs"] {
                    assert!(!text.contains(fix), "{at}: {what}: the message dictates the fix ('{fix}'): {text}");
                }
            }
        }
    }

    #[test]
    fn absurd_answers_are_judged_not_crashed() {
        let r = crate::labs::bandwidth::fixture::results();
        for answer in [0.0, 1e300, -1e300, f64::NAN, f64::NEG_INFINITY, 1e-300] {
            assert!(!check_break_even(&r, Acquisition::Once, Direction::D2h, Bytes(1 << 30), answer).passed, "{answer}");
            assert!(!check_transfer_model(&r, HostMemoryKind::Pinned, Direction::H2d, |_| answer).passed, "{answer}");
        }
    }
}
