//! Lab 10's exercises: on a given trace, which fix gains most, and what
//! time does the program take with it? Asked twice: of the pageable loop
//! ([`PROGRAM`]) and of the training loop ([`TRAINING_PROGRAM`], "your
//! training loop"). The learner reads the diagnosis and its what-if and
//! answers with a fix (as the what-if names it) and a time in ms. The
//! checker judges the fix against the queue model's fastest, and the time
//! against the model's prediction for it or the measured run of the
//! program that applies it (this GPU's, when the traces were recorded
//! live).

use super::recording::{FixCheck, Recording};
use crate::diagnose::replay::Change;
use crate::diagnose::whatif::{fix_label, WhatIf};
use crate::error::Result;
use crate::lab_kit::check::{short, unit_slip, CheckReport};
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;

/// The exercises, as the course lists them (`overlap-lab progress`): one
/// a program whose trace it gives ([`QUESTIONS`]).
pub const EXERCISES: &[Exercise] = &[
    Exercise::in_cell("10-pytorch-trace", "the fix that gains most on a trace, and its time", HINTS, example_pageable, "another fix the diagnosis suggests gains more"),
    Exercise::in_cell(
        "10-pytorch-trace/training-loop",
        "the fix that gains most on a training loop's trace, and its time",
        HINTS,
        example_training,
        "another fix the diagnosis suggests gains more",
    ),
];

/// Each exercise's program, in [`EXERCISES`]' order.
pub const QUESTIONS: [&str; 2] = [PROGRAM, TRAINING_PROGRAM];

/// The program whose trace the first exercise gives.
pub const PROGRAM: &str = "pageable_then_compute";
/// The program whose trace "your training loop" gives.
pub const TRAINING_PROGRAM: &str = "training_loop";

fn example_pageable(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    example(dev, PROGRAM, right)
}

fn example_training(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    example(dev, TRAINING_PROGRAM, right)
}

/// The exercise on `program` answered on the recording in `dev`: the fix
/// the what-if puts first and its predicted time, or "pinned" (the
/// finding a learner sees first, answered alone) with its own predicted time.
fn example(dev: &std::path::Path, program: &str, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Recording as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    if rec.program(program).is_err() {
        return Ok(None);
    }
    let Some(w) = rec.diagnosis(program)?.what_if else { return Ok(None) };
    let answer = if right { w.predictions.first() } else { w.predictions.iter().find(|p| p.fix == "pinned") };
    let Some(answer) = answer else { return Ok(None) };
    Ok(Some(check_on_recording(&rec, program, false, &answer.fix, answer.predicted_us / 1e3)))
}

/// The exercise's check on `rec` (a run of this GPU's, `live`, or a
/// recording): on the trace of `program` (one of [`QUESTIONS`]), `fix` is
/// the fix that gains most and `ms` the time the program takes with it.
pub fn check_on_recording(rec: &Recording, program: &str, live: bool, fix: &str, ms: f64) -> CheckReport {
    let checks = match rec.fix_checks() {
        Ok(f) => f.checks.as_slice(),
        Err(_) => &[],
    };
    let id: &'static str = QUESTIONS.iter().position(|q| *q == program).map_or(EXERCISES[0].id, |i| EXERCISES[i].id);
    let report = || CheckReport::new(&format!("the fix that gains most on {program}'s trace")).answering(id);
    match rec.diagnosis(program) {
        Ok(crate::diagnose::Diagnosis { what_if: Some(w), .. }) => check_best_fix(&w, checks, program, id, live, fix, ms),
        Ok(d) => {
            let mut rep = report();
            rep.problem(format!("the trace could not be replayed, so there is nothing to judge: {}", d.what_if_error.as_deref().unwrap_or("no what-if")));
            rep
        }
        Err(e) => {
            let mut rep = report();
            rep.problem(format!("the trace could not be read, so there is nothing to judge: {e}"));
            rep
        }
    }
}

/// A time passes within this fraction of the model's prediction (or of
/// the fixed program's measured median): the model's own error on the
/// course's programs stays inside it.
pub const TOLERANCE: f64 = 0.10;

const HINTS: &[&str] = &[
    "The diagnosis ends with the what-if table: every fix its findings suggest, each with the time the queue model predicts for the traced window and the gain over the trace replayed as traced.",
    "A fix can combine changes (joined by +). Compare the predicted times of all the rows, not only the one that answers the largest finding.",
    "Answer the predicted time of the window in ms (the table prints it), not the gain, and not the traced window's own time.",
];

/// The changes a learner's fix names, or the part no change is called.
/// Spelling is free: case, spaces, `_`, `-`, articles, plurals and the
/// order of the parts do not matter, parts may be joined by `+`, `,`, `&`
/// or "and", and the usual other names are understood ("pin_memory",
/// "separate stream", "no sync", "graphs", "DataLoader workers", "read
/// late"); a count in brackets ("(4 workers)") is the what-if's to set.
pub fn parse_fix(answer: &str) -> Result<Vec<Change>, String> {
    let lower = answer.to_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    // "and" between words joins two parts, as `+` does.
    let joined: String = words.iter().map(|w| if *w == "and" { "+" } else { w }).collect::<Vec<_>>().join(" ");
    let named = |key: &str| -> Option<Change> {
        Some(match key {
            "pinned" | "pin" | "pinmemory" | "pinnedmemory" | "pagelocked" | "pagelockedmemory" | "pinnedhostmemory" => Change::Pinned,
            "copystream" | "separatestream" | "streamforcopies" | "streamforthecopies" | "copiesonastream" | "ownstream" | "doublebuffered"
            | "doublebuffering" => Change::CopyStream,
            "syncremoved" | "removesync" | "nosync" | "removethesync" | "syncsremoved" | "removethesyncs" => Change::SyncRemoved,
            "cudagraph" | "graph" => Change::CudaGraph,
            "downloadstream" | "streamfordownloads" | "downloadsonstream" | "downloadsonsidestream" => Change::DownloadStream,
            "readsteplate" | "readlate" | "resultsreadsteplate" | "readresultssteplate" | "readresultslate" => Change::ReadLate,
            "preparenextbatchahead" | "prepareahead" | "preparebatchesahead" | "preparenextbatchesahead" | "prefetch" | "prefetching" | "dataloader"
            | "dataloaderworkers" | "dataloaderwithworkers" | "numworkers" | "workers" => Change::PrepareAhead,
            _ => return None,
        })
    };
    let mut changes = Vec::new();
    for part in joined.split(['+', ',', '&']).map(str::trim).filter(|p| !p.is_empty()) {
        let kept: Vec<&str> = part.split_whitespace().filter(|w| !["a", "an", "the"].contains(w)).collect();
        // "(4 workers)", "num_workers=4": the count is the what-if's to set, not the fix's name.
        let key: String = kept.concat().split('(').next().unwrap_or_default().chars().filter(|c| c.is_alphabetic()).collect();
        let change = named(&key)
            .or_else(|| key.strip_suffix('s').and_then(named))
            .or_else(|| named(&key.replace("streams", "stream").replace("syncs", "sync").replace("graphs", "graph")))
            .ok_or_else(|| format!("'{part}' is none of the what-if's changes"))?;
        if !changes.contains(&change) {
            changes.push(change);
        }
    }
    if changes.is_empty() {
        return Err("no fix named".into());
    }
    Ok(changes)
}

/// Judges `fix` and `ms` on the what-if of the exercise's trace (`w`) and
/// the recorded fixes (`checks`: each prediction beside the fixed program's
/// untraced runs; `live` where they ran on this GPU just now).
pub fn check_best_fix(w: &WhatIf, checks: &[FixCheck], program: &str, id: &'static str, live: bool, fix: &str, ms: f64) -> CheckReport {
    let mut rep = CheckReport::new(&format!("the fix that gains most on {program}'s trace")).answering(id);
    let Some(best) = w.predictions.first() else {
        rep.problem(format!("the what-if of {program}'s trace priced no fix, so there is nothing to judge"));
        return rep;
    };
    let same = |a: &[Change], b: &[Change]| a.len() == b.len() && a.iter().all(|c| b.contains(c));
    let changes = match parse_fix(fix) {
        Ok(c) => c,
        Err(why) => {
            rep.problem(format!("your fix \"{fix}\": {why}"));
            return rep;
        }
    };
    let suggested = |c: &Change| w.predictions.iter().any(|p| p.changes.contains(c));
    match w.predictions.iter().find(|p| same(&p.changes, &changes)) {
        None if changes.iter().all(suggested) => rep.problem(format!(
            "your fix \"{}\" combines changes the what-if prices only in other combinations, so the model has no time for it",
            fix_label(&changes)
        )),
        None => rep.problem(format!("your fix \"{}\" is not one the diagnosis of this trace suggests, so the model has no time for it", fix_label(&changes))),
        Some(p) if !same(&p.changes, &best.changes) => {
            rep.problem(format!("your fix \"{}\" gains {:.2}x on the model, but another fix the diagnosis suggests gains more", p.fix, p.gain))
        }
        Some(p) => rep.note(format!("right fix: \"{}\" gains most ({:.2}x on the model)", p.fix, p.gain)),
    }
    // The time: against the model's prediction for the best fix, or the
    // measured run of the program that applies it.
    let want = best.predicted_us / 1e3;
    let measured = checks.iter().find(|c| c.before == program && same(&c.prediction.changes, &best.changes));
    if !ms.is_finite() || ms <= 0.0 {
        rep.problem(format!("your time is {}: a time must be a positive number of ms", short(ms)));
        return rep;
    }
    let near = |x: f64| (ms / x - 1.0).abs() <= TOLERANCE;
    if near(want) {
        rep.note(format!("your {} ms is within {:.0}% of the model's {want:.2} ms", short(ms), 100.0 * TOLERANCE));
    } else if let Some(c) = measured.filter(|c| near(c.measured.median)) {
        rep.note(format!("your {} ms is within {:.0}% of {}'s measured {:.2} ms", short(ms), 100.0 * TOLERANCE, c.after, c.measured.median));
    } else if near(w.traced_us / 1e3) || near(w.replayed_us / 1e3) {
        rep.problem(format!("your {} ms is the traced program's own time, before any fix", short(ms)));
    } else if w.predictions.iter().any(|p| (ms / p.gain - 1.0).abs() <= 0.02) {
        rep.problem(format!("your {} is a gain (a ratio of times), not the time in ms the program takes with the fix", short(ms)));
    } else if let Some(p) = w.predictions.iter().find(|p| near(p.predicted_us / 1e3)) {
        rep.problem(format!("your {} ms is the time of \"{}\", not of the fix that gains most", short(ms), p.fix));
    } else if let Some(slip) = unit_slip(ms, want) {
        rep.problem(format!("your time {} ms: {slip}", short(ms)));
    } else {
        rep.problem(format!("your time {} ms is {:+.0}% off the model's prediction for that fix", short(ms), 100.0 * (ms / want - 1.0)));
    }
    if let Some(c) = measured {
        rep.note(format!(
            "{}{} ran {:.2} ms untraced; the model predicted {:.2} ms from {program}'s trace ({:+.1}%)",
            c.after,
            if live { " (live, on this GPU)" } else { "" },
            c.measured.median,
            c.predicted_ms(),
            100.0 * c.off()
        ));
    }
    rep
}

/// Hint `k` (from 1) of the exercise.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labs::pytorch_trace::Recording;

    /// Each learner's answer on the committed H100 trace: the right ones
    /// pass however they are spelt, each wrong one fails naming its mistake.
    #[test]
    fn every_wrong_answer_is_named_and_every_right_one_passes() {
        let data = crate::measure::record::repo_root().join("data");
        let rec = Recording::find(&data).unwrap().into_iter().find(|r| r.dir.to_string_lossy().contains("h100")).expect("an H100 recording");
        let w = rec.diagnosis(PROGRAM).unwrap().what_if.unwrap();
        let checks = rec.fix_checks().unwrap().checks.clone();
        let best = &w.predictions[0];
        let best_ms = best.predicted_us / 1e3;
        let pinned = w.predictions.iter().find(|p| p.fix == "pinned").unwrap();
        let after = checks.iter().find(|c| c.before == PROGRAM && c.fix == best.fix).unwrap().measured.median;
        let started = std::time::Instant::now();
        let judge = |fix: &str, ms: f64| check_best_fix(&w, &checks, PROGRAM, EXERCISES[0].id, false, fix, ms);
        for (fix, ms) in [
            (best.fix.as_str(), best_ms),
            ("Copy_Stream + PINNED", best_ms * 1.05),
            ("pin memory, separate stream", after),
            ("pinned and copy stream", best_ms),
            ("pinned memory and a copy stream", best_ms),
            ("pinned, and copy stream", best_ms),
            ("pinned + copy streams", best_ms),
        ] {
            let r = judge(fix, ms);
            assert!(r.passed, "{fix} {ms}: {r}");
        }
        let wrong: [(&str, f64, &str); 10] = [
            ("pinned", pinned.predicted_us / 1e3, "another fix the diagnosis suggests gains more"),
            ("pinned + copy stream + sync removed", best_ms, "only in other combinations"),
            ("bigger batches", best_ms, "none of the what-if's changes"),
            ("prefetch", best_ms, "not one the diagnosis of this trace suggests"),
            ("CUDA graph", best_ms, "not one the diagnosis of this trace suggests"),
            (&best.fix, w.traced_us / 1e3, "the traced program's own time"),
            (&best.fix, best.gain, "is a gain"),
            (&best.fix, best_ms * 1e3, "unit slip"),
            (&best.fix, pinned.predicted_us / 1e3, "the time of \"pinned\""),
            (&best.fix, f64::NAN, "a positive number of ms"),
        ];
        for (fix, ms, why) in wrong {
            let r = judge(fix, ms);
            assert!(!r.passed && r.problems().any(|p| p.contains(why)), "{fix} {ms}: should say {why:?}: {r}");
        }
        assert!(started.elapsed().as_secs_f64() < 1.0, "the checks took {:?}", started.elapsed());
    }
}

#[cfg(test)]
mod training_loop_tests {
    use super::*;
    use crate::labs::pytorch_trace::Recording;

    /// "Your training loop" on the committed H200 recording: the fix the
    /// what-if puts first (a DataLoader with workers and pin_memory) passes
    /// however it is spelt, with the model's time or the fixed program's
    /// measured one; pinning alone, or the first exercise's fix, fails.
    #[test]
    fn the_training_loops_fix_is_judged_as_the_first_exercises() {
        let data = crate::measure::record::repo_root().join("data");
        let rec = Recording::find(&data).unwrap().into_iter().find(|r| r.gpu() == "NVIDIA H200").expect("an H200 recording");
        let w = rec.diagnosis(TRAINING_PROGRAM).unwrap().what_if.unwrap();
        let checks = rec.fix_checks().unwrap().checks.clone();
        let best = &w.predictions[0];
        assert_eq!(best.changes, [Change::Pinned, Change::PrepareAhead], "{w}");
        let best_ms = best.predicted_us / 1e3;
        let judge = |fix: &str, ms: f64| check_best_fix(&w, &checks, TRAINING_PROGRAM, EXERCISES[1].id, false, fix, ms);
        let after = checks.iter().find(|c| c.before == TRAINING_PROGRAM).unwrap().measured.median;
        for fix in [best.fix.as_str(), "pinned + prepare the next batch ahead", "DataLoader workers and pin_memory", "pin memory, num_workers=4"] {
            let r = judge(fix, best_ms);
            assert!(r.passed, "{fix}: {r}");
        }
        assert!(judge(&best.fix, after).passed || (after / best_ms - 1.0).abs() > TOLERANCE, "the measured time, where it is near the model's");
        let pinned = w.predictions.iter().find(|p| p.fix == "pinned").unwrap();
        for (fix, ms, why) in [
            ("pinned", pinned.predicted_us / 1e3, "another fix the diagnosis suggests gains more"),
            ("pinned + copy stream", best_ms, "gains more"),
            ("CUDA graph", best_ms, "not one the diagnosis of this trace suggests"),
            (&best.fix, best.gain, "is a gain"),
        ] {
            let r = judge(fix, ms);
            assert!(!r.passed && r.problems().any(|p| p.contains(why)), "{fix} {ms}: should say {why:?}: {r}");
        }
    }

    #[test]
    fn the_new_fixes_are_read_from_a_learners_words() {
        assert_eq!(parse_fix("pinned + prepare the next batch ahead (4 workers)").unwrap(), [Change::Pinned, Change::PrepareAhead]);
        assert_eq!(parse_fix("num_workers=4, pin_memory").unwrap(), [Change::PrepareAhead, Change::Pinned]);
        assert_eq!(parse_fix("pinned and download stream and read a step late").unwrap(), [Change::Pinned, Change::DownloadStream, Change::ReadLate]);
        assert_eq!(parse_fix("read late").unwrap(), [Change::ReadLate]);
        assert!(parse_fix("bigger batches").is_err());
    }
}
