//! The numbers behind a lab's headline rows, each measured with its
//! spread or predicted with its model's tolerance, so that two runs of a
//! lab can be set side by side by one rule ([`Agreement`]): what
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

/// One number a headline row is made of: measured (with its spread), or
/// a model's prediction (one number, with the model's tolerance).
#[derive(Clone, Debug, PartialEq)]
pub struct HeadlineFigure {
    /// What it is, the same words in every run of the lab (a figure of
    /// another run is matched by them).
    pub what: String,
    pub unit: &'static str,
    pub value: Summary,
    /// Where the figure is a model's prediction, not a measurement: the
    /// share by which two runs' predictions may differ and still agree
    /// (the lab's model tolerance).
    pub model_tolerance: Option<f64>,
}

impl HeadlineFigure {
    /// A measured figure.
    pub fn new(what: impl Into<String>, unit: &'static str, value: Summary) -> Self {
        HeadlineFigure { what: what.into(), unit, value, model_tolerance: None }
    }

    /// A model's prediction, judged within `tolerance` (a share: 0.10 is 10%).
    pub fn prediction(what: impl Into<String>, unit: &'static str, value: Summary, tolerance: f64) -> Self {
        HeadlineFigure { model_tolerance: Some(tolerance), ..Self::new(what, unit, value) }
    }
}

/// Two measured medians agree when they differ by less than this share,
/// whatever their spreads: run-to-run drift that small is no finding.
pub const MEDIANS_WITHIN: f64 = 0.03;

/// The tolerance of a prediction whose lab states none.
pub const DEFAULT_MODEL_TOLERANCE: f64 = 0.10;

/// Which rule judged a figure of this run against the recording's, and
/// whether the two agree by it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Agreement {
    /// Predictions: within the model's tolerance (a share) of each other.
    Model { tolerance: f64, agrees: bool },
    /// Measurements whose middle halves (25% to 75% of their runs) overlap.
    MiddleHalvesOverlap,
    /// Measurements whose medians differ by less than [`MEDIANS_WITHIN`]
    /// (`middle_halves`: whether both had a middle half to compare).
    Medians { agrees: bool, middle_halves: bool },
}

impl Agreement {
    /// How `run` stands against `recorded`, the same figure of another run.
    pub fn of(run: &HeadlineFigure, recorded: &HeadlineFigure) -> Agreement {
        // Equal medians (zeros among them) are no difference.
        let off = if run.value.median == recorded.value.median { 0.0 } else { (run.value.median / recorded.value.median - 1.0).abs() };
        if let Some(t) = run.model_tolerance.or(recorded.model_tolerance) {
            return Agreement::Model { tolerance: t, agrees: off <= t };
        }
        let (Some(a), Some(b)) = (middle_half(&run.value), middle_half(&recorded.value)) else {
            return Agreement::Medians { agrees: off < MEDIANS_WITHIN, middle_halves: false };
        };
        if a.0 <= b.1 && b.0 <= a.1 {
            Agreement::MiddleHalvesOverlap
        } else {
            Agreement::Medians { agrees: off < MEDIANS_WITHIN, middle_halves: true }
        }
    }

    pub fn agrees(self) -> bool {
        match self {
            Agreement::Model { agrees, .. } | Agreement::Medians { agrees, .. } => agrees,
            Agreement::MiddleHalvesOverlap => true,
        }
    }

    /// The rule, as the table prints it beside the figure.
    pub fn rule(self) -> String {
        match self {
            Agreement::Model { tolerance, .. } => format!("a prediction: within the model's {:.0}%", 100.0 * tolerance),
            Agreement::MiddleHalvesOverlap => "middle halves overlap".into(),
            Agreement::Medians { agrees, middle_halves } => format!(
                "{}; medians {} {:.0}% apart",
                if middle_halves { "middle halves apart" } else { "no middle half to compare" },
                if agrees { "under" } else { "over" },
                100.0 * MEDIANS_WITHIN
            ),
        }
    }
}

/// A measurement's middle half, where it has one of some width (a single
/// run, or a record made before quartiles were kept, has none).
fn middle_half(s: &Summary) -> Option<(f64, f64)> {
    s.middle.filter(|_| s.n > 1)
}

/// This run's figures beside a recording's, a line each with the rule
/// that judged it ([`Agreement`]), and how many agree; a figure the
/// recording lacks is said so. `(agreeing, compared, text)`.
pub fn beside(run: &[HeadlineFigure], recorded: &[HeadlineFigure], recording: &str) -> (usize, usize, String) {
    let mut s = String::new();
    let width = run.iter().map(|f| f.what.len()).max().unwrap_or(0).min(64);
    let _ = writeln!(s, "  {:<width$}  {:>26}  {:>26}  {:>7}  agreement (rule)", "headline figure", "this run (middle half)", "recording (middle half)", "off");
    let (mut agree, mut compared) = (0, 0);
    let num = |f: &HeadlineFigure| match (f.model_tolerance, f.value.middle) {
        (Some(_), _) => format!("{} {} (model)", significant(f.value.median, 4), f.unit),
        (None, Some((lo, hi))) if f.value.n > 1 => format!("{} {} ({}..{})", significant(f.value.median, 4), f.unit, significant(lo, 3), significant(hi, 3)),
        (None, _) => format!("{} {} (n={})", significant(f.value.median, 4), f.unit, f.value.n),
    };
    for f in run {
        match recorded.iter().find(|r| r.what == f.what) {
            Some(r) => {
                compared += 1;
                let a = Agreement::of(f, r);
                agree += a.agrees() as usize;
                let off = 100.0 * (f.value.median / r.value.median - 1.0);
                let verdict = if a.agrees() { "agrees" } else { "DIFFERS" };
                let _ = writeln!(s, "  {:<width$}  {:>26}  {:>26}  {:>+6.1}%  {verdict} ({})", f.what, num(f), num(r), off, a.rule());
            }
            None => {
                let _ = writeln!(s, "  {:<width$}  {:>26}  {:>26}", f.what, num(f), "not in the recording");
            }
        }
    }
    let _ = write!(s, "  {agree} of {compared} figures agree with {recording}");
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

    #[test]
    fn measurements_agree_when_middle_halves_overlap_or_medians_are_close_and_predictions_by_their_tolerance() {
        let m = |median: f64, lo: f64, hi: f64| HeadlineFigure::new("x", "ms", Summary { median, min: lo, max: hi, n: 9, middle: Some((lo, hi)) });
        // Overlapping middle halves agree, however far the medians.
        assert_eq!(Agreement::of(&m(10.0, 9.0, 10.5), &m(11.0, 10.4, 12.0)), Agreement::MiddleHalvesOverlap);
        // Apart, but medians 0.3% apart: agree (the old rule called this OUTSIDE).
        let a = Agreement::of(&m(10.0, 9.999, 10.001), &m(10.03, 10.029, 10.031));
        assert!(a.agrees() && a.rule().contains("medians under 3% apart"), "{a:?}");
        // Apart and 5% apart: differ.
        assert!(!Agreement::of(&m(10.0, 9.99, 10.01), &m(10.5, 10.49, 10.51)).agrees());
        // A recording with no middle half (one run): the 3% alone.
        let one = HeadlineFigure::new("x", "ms", flat(10.2));
        let a = Agreement::of(&m(10.0, 9.0, 11.0), &one);
        assert!(a.agrees() && a.rule().starts_with("no middle half"), "{a:?}");
        assert!(!Agreement::of(&m(10.0, 9.0, 11.0), &HeadlineFigure::new("x", "ms", flat(10.4))).agrees());
        // Predictions: the model's tolerance, not a spread they do not have.
        let p = |v: f64| HeadlineFigure::prediction("x", "ms", flat(v), 0.10);
        assert!(Agreement::of(&p(18.80), &p(18.75)).agrees() && Agreement::of(&p(10.0), &p(10.9)).agrees());
        assert!(!Agreement::of(&p(10.0), &p(11.5)).agrees());
        assert!(Agreement::of(&p(10.0), &p(10.0)).rule().contains("model's 10%"));
        // Two zeros are the same number, whatever the rule.
        assert!(
            Agreement::of(&p(0.0), &p(0.0)).agrees()
                && Agreement::of(&HeadlineFigure::new("x", "ms", flat(0.0)), &HeadlineFigure::new("x", "ms", flat(0.0))).agrees()
        );
    }

    #[test]
    fn beside_names_the_rule_of_each_row_and_a_figure_the_recording_lacks() {
        let run = [
            HeadlineFigure::new("pinned H2D 1 GiB", "GB/s", Summary { median: 55.0, min: 54.9, max: 55.1, n: 5, middle: Some((54.95, 55.05)) }),
            HeadlineFigure::new("new thing", "ms", flat(1.0)),
        ];
        let rec = [HeadlineFigure::new("pinned H2D 1 GiB", "GB/s", Summary { median: 52.0, min: 51.9, max: 52.1, n: 5, middle: Some((51.95, 52.05)) })];
        let (agree, compared, text) = beside(&run, &rec, "the H100 recording");
        assert_eq!((agree, compared), (0, 1), "{text}");
        assert!(
            text.contains("+5.8%  DIFFERS (middle halves apart; medians over 3% apart)")
                && text.contains("not in the recording")
                && text.ends_with("0 of 1 figures agree with the H100 recording"),
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
