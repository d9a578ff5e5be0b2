//! Median, spread and count of repeated samples.

use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// The 25th and 75th percentiles (nearest rank): the middle half of the
    /// samples, which a few stray runs do not move (None in records made
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub middle: Option<(f64, f64)>,
}

impl Summary {
    /// Summarises samples; NaN or an empty set is an error, not a silent number.
    pub fn of(samples: &[f64]) -> Result<Summary> {
        if samples.is_empty() {
            return Err(LabError::config("no samples to summarise"));
        }
        if samples.iter().any(|x| !x.is_finite()) {
            return Err(LabError::config("a sample is not a finite number"));
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        let rank = |p: f64| s[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Ok(Summary { median, min: s[0], max: s[n - 1], n, middle: Some((rank(0.25), rank(0.75))) })
    }

    /// Runs `f` `reps` times and summarises what it returned.
    pub fn of_runs(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<Summary> {
        let v = (0..reps).map(|_| f()).collect::<Result<Vec<_>>>()?;
        Summary::of(&v)
    }

    /// Applies a monotonically decreasing map (e.g. time -> bandwidth):
    /// min and max swap.
    pub fn map_decreasing(&self, f: impl Fn(f64) -> f64) -> Summary {
        Summary { median: f(self.median), min: f(self.max), max: f(self.min), n: self.n, middle: self.middle.map(|(a, b)| (f(b), f(a))) }
    }

    /// Every statistic times a positive `factor` (e.g. a total per op).
    pub fn scaled(&self, factor: f64) -> Summary {
        Summary {
            median: self.median * factor,
            min: self.min * factor,
            max: self.max * factor,
            n: self.n,
            middle: self.middle.map(|(a, b)| (a * factor, b * factor)),
        }
    }

    /// The ratio of two summaries, each end from the ends that make it
    /// widest (min over max, max over min): a ratio of two medians with the
    /// range the two runs' spreads allow it.
    pub fn over(&self, d: &Summary) -> Summary {
        let (lo, hi) = self.middle_range();
        let (dlo, dhi) = d.middle_range();
        Summary { median: self.median / d.median, min: self.min / d.max, max: self.max / d.min, n: self.n.min(d.n), middle: Some((lo / dhi, hi / dlo)) }
    }

    /// max - min: the spread of the runs, in their unit.
    pub fn spread(&self) -> f64 {
        self.max - self.min
    }

    /// The 25th and 75th percentiles, or min and max where they were not kept.
    pub fn middle_range(&self) -> (f64, f64) {
        self.middle.unwrap_or((self.min, self.max))
    }

    /// The fast end of a time's runs: its 25th percentile, the slowest of
    /// its fastest quarter (min in records made before quartiles were
    /// kept). Every bound is built from its parts' fast ends (see
    /// [`Efficiency`]).
    pub fn fast_end(&self) -> f64 {
        self.middle_range().0
    }

    /// The spread of the middle half of the runs (the interquartile range,
    /// 75th minus 25th percentile): what a difference must stand clear of
    /// to be more than noise, where a few stray runs in fifteen (a slow
    /// phase of the host) would stretch max - min.
    pub fn middle_spread(&self) -> f64 {
        let (lo, hi) = self.middle_range();
        hi - lo
    }

    /// (max - min) / median: how much the samples spread.
    pub fn relative_spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }
}

/// A measured curve `points` (x, y), sorted by x, made one that never
/// falls: a point below the one before it (the machine's noise, where
/// more of x can only give as much y or more) is read as that one.
pub fn never_falling(points: &mut [(f64, f64)]) {
    let mut most = f64::NEG_INFINITY;
    for point in points {
        most = most.max(point.1);
        point.1 = most;
    }
}

/// The curve `points` (x, y), x rising, read at `x` on the line between
/// the two nearest points; `None` outside its first and last x.
pub fn on_the_line(points: &[(f64, f64)], x: f64) -> Option<f64> {
    let (&first, &last) = (points.first()?, points.last()?);
    if !(first.0..=last.0).contains(&x) {
        return None;
    }
    if points.len() == 1 {
        return Some(first.1);
    }
    // The first point at x or past it, and the one before it.
    let i = points.partition_point(|p| p.0 < x).clamp(1, points.len() - 1);
    let ((x0, y0), (x1, y1)) = (points[i - 1], points[i]);
    Some(y0 + (y1 - y0) * (x - x0) / (x1 - x0).max(1e-9))
}

/// The middle of `samples` once sorted, `None` when there are none: one of
/// the samples itself, the upper of the two middle ones for an even count
/// (where [`Summary::median`] takes their mean). For a typical value that
/// must be one that happened, such as a call's duration in a trace.
pub fn upper_median(samples: &[f64]) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied()
}

/// How close a run came to the best its parts allow: bound / measured.
///
/// One rule for every lab that prints a share of a bound: the bound is
/// built from each part timed alone at its fast end (its fastest quarter,
/// [`Summary::fast_end`]), not at its median, since a bound is what the
/// hardware showed it can do and a part's slow runs (a slow phase of the
/// host) would lift it above a pipeline that ran at full speed; and the
/// share is printed with a range beside it: what the run's own middle half
/// reads against the bound, widened at its low end by how much the
/// bound itself is known (its parts' middle-half spread: the same parts
/// timed again read that much apart, and the link runs a little faster
/// while the GPU computes than alone). A share above 100% beyond that
/// range means the parts ran faster inside the pipeline than alone by
/// more than they vary; every table that prints one says so
/// ([`Efficiency::note`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Efficiency {
    /// The bound, ms: from the parts' fast ends.
    pub bound_ms: f64,
    /// bound / the run's median.
    pub ratio: f64,
    /// The shares the middle half of its runs reads: the bound less its
    /// parts' spread over the run's 75th percentile, the bound over its
    /// 25th (over max and min where a record kept no quartiles).
    pub range: (f64, f64),
    /// How much the bound is known: the largest middle-half spread of its
    /// parts, relative to their fast end (0.012: 1.2%).
    pub parts_spread: f64,
}

impl Efficiency {
    /// `measured` against `bound_ms`, a bound built from the fast ends of
    /// `parts` (the parts timed alone; none where the bound is a formula).
    pub fn new(bound_ms: f64, parts: &[&Summary], measured: &Summary) -> Efficiency {
        let parts_spread = parts.iter().map(|p| if p.fast_end() > 0.0 { p.middle_spread() / p.fast_end() } else { 0.0 }).fold(0.0, f64::max);
        let (fast, slow) = measured.middle_range();
        Efficiency { bound_ms, ratio: bound_ms / measured.median, range: (bound_ms * (1.0 - parts_spread) / slow, bound_ms / fast), parts_spread }
    }
    /// Whether the median run reads above 100% of the bound.
    pub fn above_bound(&self) -> bool {
        self.ratio > 1.0 + ABOVE
    }
    /// Whether even the slow end of the run's middle half reads above 100%:
    /// above the bound by more than the runs vary.
    pub fn beyond_spread(&self) -> bool {
        self.range.0 > 1.0 + ABOVE
    }
    /// "95.8% (95.1..96.2)": the share and, beside it, the shares the
    /// middle half of the runs read; "101.2%* (99.5..101.9)" where the
    /// median reads above 100% (see [`Efficiency::note`]).
    pub fn cell(&self) -> String {
        if !self.ratio.is_finite() || !self.range.0.is_finite() || !self.range.1.is_finite() {
            return "n/a".into();
        }
        format!("{:.1}%{} ({:.1}..{:.1})", 100.0 * self.ratio, if self.above_bound() { "*" } else { "" }, 100.0 * self.range.0, 100.0 * self.range.1)
    }
    /// Why the highest of `effs` reads above 100%, or `None` when none does.
    pub fn note<'a>(effs: impl IntoIterator<Item = &'a Efficiency>) -> Option<String> {
        let worst = effs.into_iter().filter(|e| e.above_bound()).max_by(|a, b| a.ratio.total_cmp(&b.ratio))?;
        let over = 100.0 * (worst.ratio - 1.0);
        let (lo, hi) = (100.0 * worst.range.0, 100.0 * worst.range.1);
        Some(if worst.beyond_spread() {
            format!(
                "* above 100%: a run beat the bound made from its parts at their fastest quarter alone by {over:.1}%, beyond the spread of its runs \
                 and of the parts (their middle half read {lo:.1}% to {hi:.1}%): the parts ran faster inside the pipeline than alone, so the bound is pessimistic there"
            )
        } else {
            format!(
                "* above 100%: a run beat the bound made from its parts at their fastest quarter alone by up to {over:.1}%, within the spread of its runs \
                 and of the parts (their middle half read {lo:.1}% to {hi:.1}%, the parts {parts:.1}% apart): overlap at the bound within noise, not better than perfect",
                parts = 100.0 * worst.parts_spread
            )
        })
    }
}

/// How far above 1 a share must read to count as above the bound (not a
/// rounding of 100.0%).
const ABOVE: f64 = 0.0005;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measured_curve_never_falls_and_is_read_on_the_line_between_its_points() {
        let mut curve = vec![(0.0, 2.0), (1.0, 1.0), (2.0, 4.0), (4.0, 3.0)];
        never_falling(&mut curve);
        assert_eq!(curve, vec![(0.0, 2.0), (1.0, 2.0), (2.0, 4.0), (4.0, 4.0)], "a point below the one before it is read as that one");
        assert_eq!(on_the_line(&curve, 1.5), Some(3.0));
        assert_eq!(on_the_line(&curve, 0.0), Some(2.0));
        assert_eq!(on_the_line(&curve, 4.0), Some(4.0));
        assert_eq!(on_the_line(&curve, 4.5), None, "past the last point");
        assert_eq!(on_the_line(&curve, -0.5), None, "before the first");
        assert_eq!(on_the_line(&curve, f64::NAN), None);
        assert_eq!(on_the_line(&[(1.0, 7.0)], 1.0), Some(7.0), "one point");
        assert_eq!(on_the_line(&[], 1.0), None);
    }

    #[test]
    fn a_ratio_spans_what_the_two_spreads_allow() {
        let a = Summary::of(&[10.0, 11.0, 12.0]).unwrap();
        let b = Summary::of(&[4.0, 5.0]).unwrap();
        let r = a.over(&b);
        assert_eq!((r.median, r.min, r.max, r.n), (11.0 / 4.5, 10.0 / 5.0, 12.0 / 4.0, 2));
        assert!(r.min <= r.median && r.median <= r.max);
    }

    #[test]
    fn the_middle_half_ignores_a_few_stray_runs() {
        let mut runs: Vec<f64> = (0..15).map(|i| i as f64).collect();
        runs[7] = 100.0;
        runs[8] = 90.0;
        let s = Summary::of(&runs).unwrap();
        assert_eq!((s.min, s.max), (0.0, 100.0));
        assert_eq!(s.middle, Some((3.0, 13.0)), "nearest rank: the 4th and the 12th of 15 (7 and 8 went stray)");
        assert_eq!((s.middle_spread(), s.spread()), (10.0, 100.0));
        let seven = Summary::of(&[3.0, 1.0, 2.0, 7.0, 5.0, 4.0, 6.0]).unwrap();
        assert_eq!(seven.middle, Some((2.0, 6.0)));
        let time = Summary::of(&[1.0, 2.0, 4.0]).unwrap().map_decreasing(|t| 1.0 / t);
        assert_eq!(time.middle, Some((0.25, 1.0)));
        let old: Summary = serde_json::from_str(r#"{"median":2.0,"min":1.0,"max":3.0,"n":3}"#).unwrap();
        assert_eq!((old.middle, old.middle_spread()), (None, 2.0), "records made before fall back to min..max");
    }

    #[test]
    fn efficiency_above_the_bound_is_marked_and_explained() {
        let run = |median: f64, (q25, q75): (f64, f64)| Summary { median, min: q25 - 1.0, max: q75 + 1.0, n: 9, middle: Some((q25, q75)) };
        let under = Efficiency::new(95.0, &[], &run(100.0, (99.0, 101.0)));
        assert_eq!(under.cell(), "95.0% (94.1..96.0)");
        assert_eq!(Efficiency::note([&under]), None);
        assert!(!under.above_bound() && !under.beyond_spread());
        // Above 100% at the median, not at the slow end of the middle half.
        let noise = Efficiency::new(103.0, &[], &run(100.0, (98.0, 104.0)));
        assert_eq!(noise.cell(), "103.0%* (99.0..105.1)");
        assert!(noise.above_bound() && !noise.beyond_spread());
        let why = Efficiency::note([&under, &noise]).unwrap();
        assert!(why.contains("by up to 3.0%") && why.contains("read 99.0% to 105.1%") && why.contains("within noise"), "{why}");
        // Above 100% even at the slow end: the bound is pessimistic.
        let real = Efficiency::new(120.0, &[], &run(100.0, (99.0, 101.0)));
        assert!(real.beyond_spread());
        assert!(Efficiency::note([&noise, &real]).unwrap().contains("pessimistic"), "the worst one is explained");
        assert_eq!(Efficiency::new(1.0, &[], &run(0.0, (0.0, 0.0))).cell(), "n/a");
        // A record made before quartiles were kept: its runs' min and max.
        let old = Summary { median: 10.0, min: 9.0, max: 12.5, n: 5, middle: None };
        let e = Efficiency::new(10.0, &[], &old);
        assert_eq!((e.ratio, e.range), (1.0, (0.8, 10.0 / 9.0)));
        assert_eq!(old.fast_end(), 9.0);
        // A bound known within its parts' spread: 1% above the runs' slow
        // end reads within it where the parts are 2% apart, not where they agree.
        let tight = run(100.0, (100.0, 100.0));
        let part = Summary { median: 1.01, min: 1.0, max: 1.05, n: 9, middle: Some((1.0, 1.02)) };
        let known = Efficiency::new(101.0, &[&part], &tight);
        assert!(known.above_bound() && !known.beyond_spread(), "{}", known.cell());
        assert_eq!(known.cell(), "101.0%* (99.0..101.0)");
        assert!(Efficiency::note([&known]).unwrap().contains("the parts 2.0% apart"));
        assert!(Efficiency::new(101.0, &[], &tight).beyond_spread());
        assert_eq!(Summary::of(&[5.0, 1.0, 2.0, 3.0, 4.0]).unwrap().fast_end(), 2.0, "nearest rank: the 2nd of 5");
    }

    #[test]
    fn median_min_max() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let e = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(e.median, 2.5);
        assert!((e.relative_spread() - 1.2).abs() < 1e-12);
    }

    #[test]
    fn the_upper_median_is_a_sample_the_upper_middle_one_of_an_even_count() {
        assert_eq!(upper_median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(upper_median(&[4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(upper_median(&[]), None);
    }

    #[test]
    fn of_runs_summarises_each_run_and_passes_errors_on() {
        let mut k = 0.0;
        let s = Summary::of_runs(3, || {
            k += 1.0;
            Ok(k)
        })
        .unwrap();
        assert_eq!((s.median, s.n), (2.0, 3));
        assert!(Summary::of_runs(2, || Err(LabError::config("boom"))).is_err());
    }

    #[test]
    fn rejects_empty_and_nan() {
        assert!(Summary::of(&[]).is_err());
        assert!(Summary::of(&[1.0, f64::NAN]).is_err());
    }

    #[test]
    fn decreasing_map_swaps_bounds() {
        let t = Summary::of(&[1.0, 2.0, 4.0]).unwrap();
        let bw = t.map_decreasing(|ms| 8.0 / ms);
        assert_eq!((bw.median, bw.min, bw.max), (4.0, 2.0, 8.0));
    }
}
