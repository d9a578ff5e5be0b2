//! Median, spread and count of repeated samples.

use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
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
        Ok(Summary { median, min: s[0], max: s[n - 1], n })
    }

    /// Runs `f` `reps` times and summarises what it returned.
    pub fn of_runs(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<Summary> {
        let v = (0..reps).map(|_| f()).collect::<Result<Vec<_>>>()?;
        Summary::of(&v)
    }

    /// Applies a monotonically decreasing map (e.g. time -> bandwidth):
    /// min and max swap.
    pub fn map_decreasing(&self, f: impl Fn(f64) -> f64) -> Summary {
        Summary { median: f(self.median), min: f(self.max), max: f(self.min), n: self.n }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let e = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(e.median, 2.5);
        assert!((e.relative_spread() - 1.2).abs() < 1e-12);
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
