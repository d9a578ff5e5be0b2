//! What every exercise checker shares: a verdict with the findings a learner
//! can act on ([`CheckReport`]), and one way to take a learner's answer —
//! run their code so a panic or an error becomes a failed check, never a
//! crash ([`CheckReport::learner`]); refuse numbers and sizes that cannot be
//! right before using them ([`CheckReport::number`], [`CheckReport::count`]);
//! compare with a tolerance that also works near zero ([`close`]); and name
//! the classic unit slips ([`unit_slip`]). Printing a report never looks
//! like an error to a notebook runner (no "Error:" or "panicked at").
//! An exercise's hints are shown one at a time, on request ([`hint`]).
//!
//! May use: `error`, `units`. Used by every lab's `exercise`.

use crate::error::Result;
use std::fmt;
use std::ops::RangeInclusive;

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// What was checked, and where (queue model or live).
    pub exercise: String,
    /// The course's exercise it answers ([`crate::lab_kit::progress::Exercise::id`]),
    /// where it answers one: what `save_progress` (in `progress`) saves it as.
    pub exercise_id: Option<&'static str>,
    pub passed: bool,
    /// Problems and notes, in the order a learner reads them.
    pub findings: Vec<String>,
    /// Which of the findings are problems (the rest are notes).
    is_problem: Vec<bool>,
}

impl CheckReport {
    pub fn new(exercise: &str) -> Self {
        CheckReport { exercise: exercise.to_string(), exercise_id: None, passed: true, findings: vec![], is_problem: vec![] }
    }
    /// The same report, as the verdict on exercise `id`.
    pub fn answering(mut self, id: &'static str) -> Self {
        self.exercise_id = Some(id);
        self
    }
    /// Records a problem; the report fails.
    pub fn problem(&mut self, msg: impl Into<String>) {
        let at = self.findings.len();
        self.problem_at(at, msg);
    }
    /// Records a problem before the finding at `at` (one the findings
    /// after it follow from); the report fails.
    pub fn problem_at(&mut self, at: usize, msg: impl Into<String>) {
        let msg = msg.into();
        // Every problem the crate's own tests provoke is held to the rule.
        if cfg!(test) {
            assert!(dictated_fix(&msg).is_none(), "a problem dictates the fix ({:?}): {msg}", dictated_fix(&msg));
        }
        self.passed = false;
        let at = at.min(self.findings.len());
        self.findings.insert(at, msg);
        self.is_problem.insert(at, true);
    }
    /// The problems alone, in the order a learner reads them.
    pub fn problems(&self) -> impl Iterator<Item = &str> {
        self.findings.iter().zip(&self.is_problem).filter(|(_, &p)| p).map(|(f, _)| f.as_str())
    }

    /// Records an observation that does not fail the check.
    pub fn note(&mut self, msg: impl Into<String>) {
        self.findings.push(msg.into());
        self.is_problem.push(false);
    }

    /// Appends the findings of `part` (a check of one part of the
    /// answer) in its order, each after `prefix`; where it failed, this
    /// report fails too.
    pub fn absorb(&mut self, part: CheckReport, prefix: &str) {
        self.passed &= part.passed;
        for (finding, problem) in part.findings.into_iter().zip(part.is_problem) {
            self.passed &= !problem;
            self.findings.push(format!("{prefix}{finding}"));
            self.is_problem.push(problem);
        }
    }

    /// Runs the learner's code (`what` names it: "your issue loop"). A
    /// panic becomes a problem quoting the panic and where it happened; an
    /// error becomes a problem quoting the error once. `None` then.
    pub fn learner<T>(&mut self, what: &str, f: impl FnOnce() -> Result<T>) -> Option<T> {
        match crate::error::catch_quietly(f) {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.problem(format!("{what} stopped with: {e}"));
                None
            }
            Err(panic) => {
                self.problem(format!("{what} panicked: {panic}"));
                None
            }
        }
    }

    /// A number the learner gave: `Some` if it is finite and in `range`,
    /// else a problem that names it, its unit and the range.
    pub fn number(&mut self, what: &str, value: f64, unit: &str, range: RangeInclusive<f64>) -> Option<f64> {
        if !value.is_finite() {
            self.problem(format!("{what} is {value}: it must be a finite number of {unit}"));
            None
        } else if !range.contains(&value) {
            self.problem(format!(
                "{what} = {} {unit} is out of range: it must lie between {} and {} {unit}",
                short(value),
                short(*range.start()),
                short(*range.end())
            ));
            None
        } else {
            Some(value)
        }
    }

    /// A count the learner chose (chunks, streams, batches): true if it is
    /// in `range`, else a problem that says so (checked before anything is
    /// built from it, so an absurd size is refused at once).
    pub fn count(&mut self, what: &str, value: usize, range: RangeInclusive<usize>) -> bool {
        if range.contains(&value) {
            return true;
        }
        self.problem(format!("{value} {what} is out of range: this exercise takes {} to {}", range.start(), range.end()));
        false
    }

    /// A pipeline's time against its bound and its time without overlap
    /// (`serial`, named `serial_label` in the note): noted, and a problem if
    /// it is within 5% of no overlap (`no_overlap` says why it does not overlap) or under
    /// `target` efficiency.
    pub fn judge_overlap(&mut self, how: &str, measured: f64, (serial_label, serial): (&str, f64), bound: f64, target: f64, no_overlap: &str) {
        let eff = bound / measured;
        self.note(format!(
            "{how}: {measured:.3} ms; {serial_label} {serial:.3} ms; bound {bound:.3} ms; efficiency {} (target {:.0}%)",
            pct(eff),
            100.0 * target
        ));
        if measured > 0.95 * serial {
            self.problem(format!("no overlap: {no_overlap}"));
        } else if eff < target {
            self.problem(format!("efficiency {} is {:.1} points under the target {:.0}%", pct(eff), 100.0 * (target - eff), 100.0 * target));
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

/// Verbs that open an instruction: a problem that starts a clause with
/// one tells the learner what to do instead of what is wrong.
pub const FIX_VERBS: &[&str] = &[
    "add", "allocate", "answer", "call", "check", "compare", "copy", "divide", "free", "give", "issue", "keep", "let", "make", "move", "order", "pick", "put",
    "record", "remove", "replace", "set", "split", "spread", "take", "use", "wait",
];

/// The instruction a checker's message gives, if it gives one: a clause
/// (the message's first, or one after a full stop, colon or semicolon
/// and a space: `p.record(e, s)` is not split) that opens with a verb of
/// [`FIX_VERBS`]. Problems name the fault and where; the fix is the hints'
/// to give (an exercise's `hint(k)`), one at a time.
pub fn dictated_fix(msg: &str) -> Option<&'static str> {
    let mut clauses = vec![msg];
    for sep in [". ", ": ", "; ", ".\n", ":\n"] {
        clauses = clauses.iter().flat_map(|c| c.split(sep)).collect();
    }
    clauses.into_iter().find_map(|clause| {
        let first = clause.trim_start().split(|c: char| !c.is_ascii_alphabetic()).next()?.to_ascii_lowercase();
        FIX_VERBS.iter().copied().find(|&v| v == first)
    })
}

/// Whether `answer` matches `truth` within `rel` of it, or within `abs`
/// where `truth` is near zero (a relative tolerance alone fails every
/// answer to a true value of 0).
pub fn close(answer: f64, truth: f64, rel: f64, abs: f64) -> bool {
    answer.is_finite() && (answer - truth).abs() <= (rel * truth.abs()).max(abs)
}

/// A ratio as a percentage for a learner: "97.2%", or "n/a" when it is
/// not a finite number (never "inf%").
pub fn pct(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{:.1}%", 100.0 * ratio)
    } else {
        "n/a".into()
    }
}

/// A number with 3 significant digits, never a 17-digit float.
pub fn short(x: f64) -> String {
    significant(x, 3)
}

/// A number with `digits` significant digits (at least 1), in exponent
/// form outside 0.001 to a million.
pub fn significant(x: f64, digits: usize) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    let digits = digits.max(1);
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{x:.*e}", digits - 1)
    } else {
        let decimals = (digits as i32 - 1 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    }
}

/// When `got` is off from `want` by a factor typical of a unit slip, the
/// slip in words: powers of 1000 (ms/µs/ns, GB/MB/KB), GiB vs GB
/// (1.074), bits vs bytes (8).
pub fn unit_slip(got: f64, want: f64) -> Option<String> {
    if !(got.is_finite() && want.is_finite()) || got == 0.0 || want == 0.0 || got.signum() != want.signum() {
        return None;
    }
    let f = got / want;
    let near = |x: f64, tol: f64| (f / x - 1.0).abs() < tol;
    for (k, name) in [(1, "1000"), (2, "a million"), (3, "a billion")] {
        let p = 1000f64.powi(k);
        if near(p, 0.3) || near(1.0 / p, 0.3) {
            return Some(format!(
                "that is a factor {name} {}: a unit slip (1 GB/s = 1000 bytes per µs; 1 ms = 1000 µs)",
                if f > 1.0 { "too large" } else { "too small" }
            ));
        }
    }
    let gib = (1u64 << 30) as f64 / 1e9;
    if near(gib, 0.012) || near(1.0 / gib, 0.012) {
        return Some("that is a factor 1.074, GiB against GB: 1 GiB = 2^30 bytes, 1 GB = 10^9 bytes, and GB/s counts 10^9".into());
    }
    if near(8.0, 0.05) || near(1.0 / 8.0, 0.05) {
        return Some("that is a factor 8, bits against bytes".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LabError;

    #[test]
    fn a_message_that_tells_the_fix_is_caught() {
        for fix in [
            "every operation is on one stream; spread the chunks over the streams",
            "no stage ran: call t.stage1 and t.stage2 for every micro-batch",
            "the block waits for each copy. Issue the copies of the next tiles first",
            "cuMemFree waits: take the scratch from the pool",
            "Put the hand-off on the callback stream",
        ] {
            assert!(dictated_fix(fix).is_some(), "{fix}");
        }
        for fault in [
            "every operation is on one stream, so each waits for the one before",
            "your loop takes 7.285 ms, 63% more than the fix (4.477 ms): something still waits",
            "host synchronization in the loop: p.host_sync(t.streams[0]) after chunk 0 makes the CPU wait",
            "slot 0 was reused too early: iteration 3's D2H may overwrite it",
            "p.record(done, t.copy) comes after the wait on it: l.take_slot(t) reused",
        ] {
            assert_eq!(dictated_fix(fault), None, "{fault}");
        }
    }

    #[test]
    fn learner_code_that_panics_or_fails_is_a_failed_check_not_a_crash() {
        let mut rep = CheckReport::new("t");
        let v: Option<u32> = rep.learner("your loop", || {
            let v: Vec<u32> = vec![];
            Ok(v[3])
        });
        assert!(v.is_none() && !rep.passed);
        let text = rep.to_string();
        assert!(text.contains("your loop panicked: index out of bounds") && text.contains("(at "), "{text}");
        assert!(!text.contains("panicked at"), "a runner must not take it for a crash: {text}");
        let mut rep = CheckReport::new("t");
        assert_eq!(rep.learner("your loop", || Err::<(), _>(LabError::schedule("a race"))), None);
        assert_eq!(rep.findings, ["your loop stopped with: schedule error: a race"]);
        let mut rep = CheckReport::new("t");
        assert_eq!(rep.learner("your loop", || Ok(7)), Some(7));
        assert!(rep.passed);
        // Nested: a checker inside learner code inside a checker.
        let mut outer = CheckReport::new("outer");
        outer.learner("outer code", || -> Result<()> {
            let mut inner = CheckReport::new("inner");
            inner.learner("inner code", || -> Result<()> { panic!("inner boom") });
            assert!(inner.to_string().contains("inner boom"));
            panic!("outer boom")
        });
        assert!(outer.to_string().contains("outer code panicked: outer boom"), "{outer}");
    }

    #[test]
    fn numbers_and_counts_are_refused_with_their_unit_and_range() {
        let mut rep = CheckReport::new("t");
        assert_eq!(rep.number("your answer", f64::NAN, "copies", 0.0..=1e9), None);
        assert_eq!(rep.number("your answer", -3.0, "copies", 0.0..=1e9), None);
        assert_eq!(rep.number("your answer", 2.5, "copies", 0.0..=1e9), Some(2.5));
        assert!(!rep.count("streams", 100_000, 1..=64) && rep.count("streams", 4, 1..=64));
        let text = rep.to_string();
        assert!(text.contains("NaN: it must be a finite number of copies"), "{text}");
        assert!(text.contains("-3.00 copies is out of range"), "{text}");
        assert!(text.contains("100000 streams is out of range: this exercise takes 1 to 64"), "{text}");
    }

    #[test]
    fn tolerance_works_near_zero_and_numbers_print_short() {
        assert!(close(0.0, 0.0, 0.15, 0.5) && close(0.3, 0.0, 0.15, 0.5) && !close(2.0, 0.0, 0.15, 0.5));
        assert!(close(11.0, 12.1, 0.15, 0.5) && !close(14.5, 12.1, 0.15, 0.5) && !close(f64::NAN, 1.0, 0.15, 0.5));
        assert_eq!(short(-4.926198123), "-4.93");
        assert_eq!(short(1234.5678), "1235");
        assert_eq!(short(0.012345), "0.0123");
        assert_eq!(short(3e-7), "3.00e-7");
        assert_eq!(pct(f64::INFINITY), "n/a");
        assert_eq!(pct(0.9721), "97.2%");
    }

    #[test]
    fn unit_slips_are_named() {
        assert!(unit_slip(1000.0, 1.0).unwrap().contains("factor 1000 too large"));
        assert!(unit_slip(1e-3, 1.0).unwrap().contains("factor 1000 too small"));
        assert!(unit_slip(1e-9, 1.0).unwrap().contains("a billion too small"));
        assert!(unit_slip(1e6, 1.0).unwrap().contains("a million"));
        assert!(unit_slip(55.4 * 1.073741824, 55.4).unwrap().contains("GiB against GB"));
        assert!(unit_slip(55.4 / 1.073741824, 55.4).unwrap().contains("GiB against GB"));
        assert!(unit_slip(8.0, 1.0).unwrap().contains("bits"));
        assert_eq!(unit_slip(1.3, 1.0), None);
        assert_eq!(unit_slip(-1000.0, 1.0), None);
    }
}

/// Hint `k` (from 1) of an exercise's `hints`, saying how many there are:
/// a learner asks for the next only when stuck, so each hint gives a little
/// more than the one before, and the last falls short of the solution.
pub fn hint(hints: &[&str], k: usize) -> String {
    match hints.get(k.wrapping_sub(1)) {
        Some(h) if k < hints.len() => format!("Hint {k} of {}: {h}\n(hint({}) gives the next.)", hints.len(), k + 1),
        Some(h) => format!("Hint {k} of {}: {h}\n(That is the last hint; the solution is kept back below the exercise.)", hints.len()),
        None => format!("There are hints 1 to {} for this exercise.", hints.len()),
    }
}

#[cfg(test)]
mod hint_tests {
    use super::hint;

    #[test]
    fn hints_come_one_at_a_time_and_say_how_many_there_are() {
        let h = ["first", "second"];
        assert!(hint(&h, 1).starts_with("Hint 1 of 2: first") && hint(&h, 1).contains("hint(2)"));
        assert!(hint(&h, 2).contains("second") && hint(&h, 2).contains("last hint"));
        for k in [0, 3, usize::MAX] {
            assert_eq!(hint(&h, k), "There are hints 1 to 2 for this exercise.");
        }
    }
}
