//! What an exercise checker returns: a verdict and the specific findings a
//! learner can act on. Printing it never looks like an error to a notebook
//! runner (no "Error:" or "panicked"), so a failing attempt is feedback, not a
//! crashed cell.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub exercise: String,
    pub passed: bool,
    pub findings: Vec<String>,
}

impl CheckReport {
    pub fn new(exercise: &str) -> Self {
        CheckReport { exercise: exercise.to_string(), passed: true, findings: vec![] }
    }
    /// Records a problem; the report fails.
    pub fn problem(&mut self, msg: impl Into<String>) {
        self.passed = false;
        self.findings.push(msg.into());
    }
    /// Records an observation that does not fail the check.
    pub fn note(&mut self, msg: impl Into<String>) {
        self.findings.push(msg.into());
    }
    /// A pipeline's time against its bound and its time without overlap
    /// (`serial`, named `serial_label` in the note): noted, and a problem if
    /// it is within 5% of no overlap (`no_overlap` says what to do) or under
    /// `target` efficiency.
    pub fn judge_overlap(&mut self, how: &str, measured: f64, (serial_label, serial): (&str, f64), bound: f64, target: f64, no_overlap: &str) {
        let eff = bound / measured;
        self.note(format!("{how}: {measured:.2} ms; {serial_label} {serial:.2} ms; bound {bound:.2} ms; efficiency {:.1}% (target {:.0}%)", 100.0 * eff, 100.0 * target));
        if measured > 0.95 * serial {
            self.problem(format!("no overlap: {no_overlap}"));
        } else if eff < target {
            self.problem(format!("efficiency {:.1}% is under the target {:.0}%", 100.0 * eff, 100.0 * target));
        }
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "PASSED" } else { "NOT YET" };
        writeln!(f, "[{verdict}] {}", self.exercise)?;
        for x in &self.findings {
            writeln!(f, "  - {x}")?;
        }
        Ok(())
    }
}
