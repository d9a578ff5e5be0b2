//! The measured numbers behind a lab's headline rows, each with its
//! spread, so that two runs of a lab can be set side by side: what
//! `overlap-lab all` prints after each lab, this run against the
//! recording of the same GPU, and how long each lab takes ([`RunTimes`]),
//! so that `all` can say up front how long a preset takes and, as it
//! goes, what is left.
//!
//! May use: `error`, `measure` (summaries, recordings' files),
//! `lab_kit::check` (numbers for a learner).

use crate::error::{LabError, Result};
use crate::lab_kit::check::significant;
use crate::measure::stats::Summary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One measured number a headline row is made of.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadlineFigure {
    /// What it is, the same words in every run of the lab (a figure of
    /// another run is matched by them).
    pub what: String,
    pub unit: &'static str,
    pub value: Summary,
}

impl HeadlineFigure {
    pub fn new(what: impl Into<String>, unit: &'static str, value: Summary) -> Self {
        HeadlineFigure { what: what.into(), unit, value }
    }
}

/// Whether `run` agrees with `recorded`: their medians differ by no more
/// than the wider of their two spreads (max - min of each run's repeats).
pub fn within_spread(run: &Summary, recorded: &Summary) -> bool {
    (run.median - recorded.median).abs() <= run.spread().max(recorded.spread())
}

/// This run's figures beside a recording's, a line each, and how many
/// agree ([`within_spread`]); a figure the recording lacks is said so.
/// `(agreeing, compared, text)`.
pub fn beside(run: &[HeadlineFigure], recorded: &[HeadlineFigure], recording: &str) -> (usize, usize, String) {
    let mut s = String::new();
    let width = run.iter().map(|f| f.what.len()).max().unwrap_or(0).min(64);
    let _ = writeln!(s, "  {:<width$}  {:>22}  {:>22}  {:>8}", "headline figure", "this run (spread)", "recording (spread)", "");
    let (mut agree, mut compared) = (0, 0);
    let num = |v: &Summary, unit: &str| format!("{} {unit} ({})", significant(v.median, 4), significant(v.spread(), 4));
    for f in run {
        match recorded.iter().find(|r| r.what == f.what) {
            Some(r) => {
                compared += 1;
                let ok = within_spread(&f.value, &r.value);
                agree += ok as usize;
                let off = 100.0 * (f.value.median / r.value.median - 1.0);
                let _ = writeln!(
                    s,
                    "  {:<width$}  {:>22}  {:>22}  {:>+7.1}% {}",
                    f.what,
                    num(&f.value, f.unit),
                    num(&r.value, r.unit),
                    off,
                    if ok { "within spread" } else { "OUTSIDE spread" }
                );
            }
            None => {
                let _ = writeln!(s, "  {:<width$}  {:>22}  {:>22}", f.what, num(&f.value, f.unit), "not in the recording");
            }
        }
    }
    let _ = write!(s, "  {agree} of {compared} figures within spread of {recording}");
    (agree, compared, s)
}

/// How long each lab took in `all`, per GPU and preset, as measured:
/// `data/run-times.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunTimes {
    /// GPU name -> preset -> lab -> the latest run.
    pub gpus: BTreeMap<String, BTreeMap<String, BTreeMap<String, LabTime>>>,
}

/// One lab's wall time in one run of `all`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LabTime {
    pub seconds: f64,
    pub when: chrono::DateTime<chrono::Utc>,
}

/// Where the run times live in a data folder.
pub fn run_times_path(data_dir: &Path) -> PathBuf {
    data_dir.join("run-times.json")
}

impl RunTimes {
    /// The times in `data_dir` (none yet is no error).
    pub fn load(data_dir: &Path) -> Result<RunTimes> {
        let path = run_times_path(data_dir);
        if !path.is_file() {
            return Ok(RunTimes::default());
        }
        crate::measure::record::read_json(&path)
    }

    /// Notes one lab's time.
    pub fn note(&mut self, gpu: &str, preset: &str, lab: &str, seconds: f64) {
        self.gpus
            .entry(gpu.to_string())
            .or_default()
            .entry(preset.to_string())
            .or_default()
            .insert(lab.to_string(), LabTime { seconds: (seconds * 10.0).round() / 10.0, when: chrono::Utc::now() });
    }

    /// Writes them to `data_dir`, whole.
    pub fn store(&self, data_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(data_dir).map_err(|e| LabError::io(format!("creating {}", data_dir.display()), e))?;
        let text = serde_json::to_string_pretty(self).map_err(|e| LabError::config(format!("run times do not serialize: {e}")))? + "\n";
        crate::measure::record::write_atomic(&run_times_path(data_dir), &text)
    }

    /// Each of `labs`' time for `preset`, from `gpu`'s runs if there are
    /// any, else from another GPU's (named): (GPU they come from, seconds
    /// per lab, None where that lab has none).
    pub fn estimate(&self, gpu: &str, preset: &str, labs: &[&str]) -> Option<(String, Vec<Option<f64>>)> {
        let of = |g: &str| self.gpus.get(g).and_then(|p| p.get(preset));
        let (from, times) = match of(gpu) {
            Some(t) => (gpu.to_string(), t),
            None => self.gpus.iter().find_map(|(g, p)| p.get(preset).map(|t| (g.clone(), t)))?,
        };
        Some((from, labs.iter().map(|l| times.get(*l).map(|t| t.seconds)).collect()))
    }
}

/// Seconds as a learner reads them: "45 s", "3 min 05 s".
pub fn fmt_duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flat;

    fn spread(median: f64, min: f64, max: f64) -> Summary {
        Summary { median, min, max, n: 5, middle: None }
    }

    #[test]
    fn figures_agree_within_the_wider_spread_and_missing_ones_are_named() {
        assert!(within_spread(&spread(10.0, 9.9, 10.1), &spread(10.15, 10.0, 10.3)));
        assert!(!within_spread(&spread(10.0, 9.95, 10.05), &spread(10.5, 10.4, 10.6)));
        // No spread at all: only the same number agrees.
        assert!(within_spread(&flat(3.0), &flat(3.0)) && !within_spread(&flat(3.0), &flat(3.01)));
        let run = [HeadlineFigure::new("pinned H2D 1 GiB", "GB/s", spread(55.0, 54.9, 55.1)), HeadlineFigure::new("new thing", "ms", flat(1.0))];
        let rec = [HeadlineFigure::new("pinned H2D 1 GiB", "GB/s", spread(54.0, 53.9, 54.1))];
        let (agree, compared, text) = beside(&run, &rec, "the H100 recording");
        assert_eq!((agree, compared), (0, 1), "{text}");
        assert!(
            text.contains("+1.9% OUTSIDE spread")
                && text.contains("not in the recording")
                && text.ends_with("0 of 1 figures within spread of the H100 recording"),
            "{text}"
        );
    }

    #[test]
    fn run_times_are_kept_per_gpu_and_preset_and_estimated_from_another_gpu_when_none() {
        let dir = crate::testing::temp_dir("run-times");
        assert!(RunTimes::load(&dir).unwrap().estimate("H100", "full", &["a"]).is_none());
        let mut t = RunTimes::load(&dir).unwrap();
        t.note("H200", "full", "a", 12.34);
        t.note("H200", "full", "b", 30.0);
        t.store(&dir).unwrap();
        let t = RunTimes::load(&dir).unwrap();
        assert_eq!(t.estimate("H100", "full", &["a", "b", "c"]), Some(("H200".to_string(), vec![Some(12.3), Some(30.0), None])));
        let mut t = RunTimes::load(&dir).unwrap();
        t.note("H100", "full", "a", 10.0);
        t.store(&dir).unwrap();
        let t = RunTimes::load(&dir).unwrap();
        assert_eq!(t.estimate("H100", "full", &["a"]), Some(("H100".to_string(), vec![Some(10.0)])));
        assert!(t.estimate("H100", "headline", &["a"]).is_none());
        assert_eq!((fmt_duration(45.4), fmt_duration(185.0)), ("45 s".to_string(), "3 min 05 s".to_string()));
    }
}
