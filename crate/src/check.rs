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
