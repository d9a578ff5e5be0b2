//! A learner's progress through the exercises. Each exercise's cell ends
//! with `report.save_progress()`, which keeps the verdict in
//! `notebooks/progress.json` (or the file `$OVERLAP_LAB_PROGRESS` names:
//! the headless notebook runs of the tests save there, so they never
//! write a learner's verdicts); `overlap-lab progress` and notebook 00 read
//! it back together with the notebooks themselves and print one line per
//! exercise of the lab table: passed, not yet (with the first problem), or
//! not started (the cell still holds the code it was given). An exercise
//! whose answer is a file (lab 7's kernel) is checked again from the file,
//! as far as it can be without a GPU.
//!
//! The answers live in the notebooks (the exercise's cell, or the file it
//! names) and the verdicts beside them, so the notebook and the command
//! read the same place. Each exercise's cell carries, in its metadata
//! (`overlap_lab`), its id and the code it was given, which is how the
//! command tells an answer from the starter.
//!
//! May use: `error`, `lab_kit::check`, `measure::record` (reading JSON).

use crate::error::{LabError, Result};
use crate::lab_kit::check::CheckReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// One exercise of a lab, as its lab's table entry lists it.
#[derive(Debug)]
pub struct Exercise {
    /// Its notebook's name ("02-overlap"), then `/` and which where a
    /// notebook has several ("01-bandwidth/model"). The cell's metadata
    /// and the saved verdict carry it.
    pub id: &'static str,
    /// What it asks, in a few words.
    pub asks: &'static str,
    /// Where the answer is a file the learner edits (lab 7's kernel).
    pub file: Option<FileAnswer>,
    /// Its hints, in the order its notebook offers them one at a time.
    pub hints: &'static [&'static str],
    /// A right answer and the usual wrong one, as its checker judges them
    /// with no GPU: what the tests answer every exercise of the course
    /// with, and what the wrong one's verdict must name.
    pub examples: Examples,
}

impl Exercise {
    /// An exercise answered in its notebook's cell (no file to edit):
    /// `verdict` judges the right answer and the usual wrong one on a
    /// recording, and `mistake` is what the wrong one's verdict names.
    pub const fn in_cell(
        id: &'static str,
        asks: &'static str,
        hints: &'static [&'static str],
        verdict: fn(&Path, bool) -> Result<Option<CheckReport>>,
        mistake: &'static str,
    ) -> Exercise {
        Exercise { id, asks, file: None, hints, examples: Examples::Cell { verdict, mistake } }
    }
}

/// A right answer to an exercise and a usual wrong one.
#[derive(Debug)]
pub enum Examples {
    /// An answer written in the exercise's cell, judged by its checker on
    /// the lab's recording in a GPU folder of the data (`data/<gpu>/`).
    Cell {
        /// The verdict on the right answer (`true`) or the wrong one;
        /// `Ok(None)` where that folder holds no recording the check can use.
        verdict: fn(&Path, bool) -> Result<Option<CheckReport>>,
        /// Words the wrong answer's verdict names ("wrong data").
        mistake: &'static str,
    },
    /// An answer that is a file ([`FileAnswer`]): the right text (the
    /// lab's solution), and a wrong one made from the file as given (edited,
    /// still wrong); what can be seen wrong in the wrong text with no GPU
    /// names `mistake`.
    File { right: fn() -> String, wrong: fn(&str) -> String, mistake: &'static str },
}

impl Examples {
    /// What the wrong answer's verdict names.
    pub fn mistake(&self) -> &'static str {
        match self {
            Examples::Cell { mistake, .. } | Examples::File { mistake, .. } => mistake,
        }
    }
}

/// An answer that is a file, which the command checks again itself.
#[derive(Debug)]
pub struct FileAnswer {
    /// Its path, relative to the notebooks.
    pub path: &'static str,
    /// The problems found in its text with no GPU (none: nothing wrong
    /// that can be seen here).
    pub problems: fn(&str) -> Vec<String>,
}

impl Exercise {
    /// Its notebook's file name in the notebooks folder: `<id before any '/'>.ipynb`.
    pub fn notebook(&self) -> String {
        format!("{}.ipynb", self.id.split('/').next().unwrap_or(self.id))
    }
}

/// The notebooks' folder: `$OVERLAP_LAB_NOTEBOOKS`, else the repository's
/// `notebooks/`, else `notebooks` here.
pub fn default_notebooks_dir() -> PathBuf {
    crate::measure::record::repo_folder("OVERLAP_LAB_NOTEBOOKS", "notebooks")
}

/// The file of saved verdicts in a notebooks folder.
pub const PROGRESS_FILE: &str = "progress.json";

/// The variable that puts the saved verdicts elsewhere than beside the
/// notebooks: the test command's headless notebook runs point it at a
/// scratch file, so a test run leaves a learner's verdicts as they were.
pub const PROGRESS_ENV: &str = "OVERLAP_LAB_PROGRESS";

/// The verdicts file of the notebooks folder `dir`: `dir/progress.json`.
pub fn verdicts_in(dir: &Path) -> PathBuf {
    dir.join(PROGRESS_FILE)
}

/// The verdicts file the exercises' cells save to and notebook 00 and
/// `overlap-lab progress` read: `$OVERLAP_LAB_PROGRESS` where set, else
/// `progress.json` in the notebooks' folder.
pub fn default_verdicts() -> PathBuf {
    verdicts_file(std::env::var_os(PROGRESS_ENV), &default_notebooks_dir())
}

/// [`default_verdicts`], given the variable's value.
fn verdicts_file(env: Option<std::ffi::OsString>, notebooks: &Path) -> PathBuf {
    env.filter(|v| !v.is_empty()).map_or_else(|| verdicts_in(notebooks), PathBuf::from)
}

/// An exercise's latest verdict, as its cell saved it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub passed: bool,
    /// The check's title (what it judged, and where: queue model or live).
    pub check: String,
    /// Its problems and notes, in order.
    pub findings: Vec<String>,
    /// The problems alone (the findings that failed it).
    #[serde(default)]
    pub problems: Vec<String>,
    pub saved: chrono::DateTime<chrono::Utc>,
}

/// Every saved verdict, by exercise id.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    pub verdicts: BTreeMap<String, Verdict>,
}

impl Saved {
    /// The verdicts saved in the file `path` (none yet is no error).
    pub fn load(path: &Path) -> Result<Saved> {
        if !path.is_file() {
            return Ok(Saved::default());
        }
        let text = std::fs::read_to_string(path).map_err(|e| LabError::io(format!("reading the saved verdicts {}", path.display()), e))?;
        serde_json::from_str(&text)
            .map_err(|e| LabError::io(format!("the saved verdicts {} are not the verdicts the exercises save", path.display()), std::io::Error::from(e)))
    }

    /// Writes them to the file `path`, whole, through a temporary file (a
    /// reader never sees half of it).
    pub fn store(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| LabError::config(format!("progress does not serialize: {e}")))?;
        crate::measure::record::write_atomic(path, &(text + "\n"))
    }
}

/// Saves `rep` as the verdict of its exercise in the verdicts file
/// `verdicts` (of a notebooks folder: [`verdicts_in`]).
pub fn save(rep: &CheckReport, verdicts: &Path) -> Result<PathBuf> {
    let id = rep.exercise_id.ok_or_else(|| LabError::config(format!("'{}' answers no exercise of the course: nothing to save", rep.exercise)))?;
    let mut saved = Saved::load(verdicts)?;
    saved.verdicts.insert(
        id.to_string(),
        Verdict {
            passed: rep.passed,
            check: rep.exercise.clone(),
            findings: rep.findings.clone(),
            problems: rep.problems().map(String::from).collect(),
            saved: chrono::Utc::now(),
        },
    );
    saved.store(verdicts)?;
    Ok(verdicts.to_path_buf())
}

/// Where an exercise stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Standing {
    Passed {
        check: String,
    },
    /// Not yet, and the first problem.
    NotYet {
        problem: String,
    },
    /// The cell (or file) still holds what it was given.
    NotStarted,
    /// Changed from what was given, with no verdict saved (for a file
    /// answer: none saved since the file last changed).
    NotChecked,
}

/// One exercise's line.
#[derive(Clone, Debug)]
pub struct Line {
    pub lab: u8,
    pub exercise: &'static Exercise,
    pub standing: Standing,
}

/// The progress of every exercise of the course.
#[derive(Debug)]
pub struct Progress {
    pub lines: Vec<Line>,
    /// The notebooks it was read from.
    pub dir: PathBuf,
}

impl Progress {
    pub fn passed(&self) -> usize {
        self.lines.iter().filter(|l| matches!(l.standing, Standing::Passed { .. })).count()
    }
}

impl fmt::Display for Progress {
    /// One line per exercise, in columns as wide as their widest entry
    /// (lab 10's number, `09-offload/placement`, the longest question), so
    /// every verdict starts at the same column:
    ///
    /// ```text
    /// lab  2  02-overlap        make the chunks overlap ..........: not started
    /// lab 10  10-pytorch-trace  the fix that gains most on a trace ..: passed (...)
    /// ```
    ///
    /// (aligned in the real output). The question is followed by dots up
    /// to the verdict's column and ": ", so each line still reads "what:
    /// verdict".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lab_width = self.lines.iter().map(|l| l.lab.to_string().len()).max().unwrap_or(0);
        let id_width = self.lines.iter().map(|l| l.exercise.id.chars().count()).max().unwrap_or(0);
        let asks_width = self.lines.iter().map(|l| l.exercise.asks.chars().count()).max().unwrap_or(0);
        for l in &self.lines {
            let standing = match &l.standing {
                Standing::Passed { check } => format!("passed ({check})"),
                // One line each: a compiler's log folds into it.
                Standing::NotYet { problem } => format!("not yet: {}", problem.split_whitespace().collect::<Vec<_>>().join(" ")),
                Standing::NotStarted => "not started".into(),
                Standing::NotChecked => "answered, not checked yet: run the exercise's cell".into(),
            };
            let asks = l.exercise.asks;
            // Two dots at least, so the longest question has its leader too.
            let dots = ".".repeat(asks_width - asks.chars().count() + 2);
            writeln!(f, "lab {:>lab_width$}  {:<id_width$}  {asks} {dots}: {standing}", l.lab, l.exercise.id)?;
        }
        write!(f, "{} of {} exercises passed (answers in {})", self.passed(), self.lines.len(), crate::measure::record::display_path(&self.dir))
    }
}

/// The text of an exercise's answer and what it was given, read from its
/// notebook in `dir` (and its file, for a file answer).
struct Answer {
    now: String,
    given: String,
    /// When the file holding it was last written.
    written: Option<std::time::SystemTime>,
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Whitespace aside, the same text: a re-indented starter is still the starter.
fn same_code(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// A notebook as read once for all its exercises: its JSON, where it is
/// and when it was last written.
struct Notebook {
    json: serde_json::Value,
    path: std::path::PathBuf,
    written: Option<std::time::SystemTime>,
}

impl Notebook {
    /// The notebook `name` of the folder `dir`: a missing one and one that
    /// is no notebook (not JSON) are each named in one line.
    fn read(dir: &Path, name: &str) -> Result<Notebook> {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| LabError::io(format!("{} holds no notebook {name} (expected the course's notebooks in it, named NN-name.ipynb)", dir.display()), e))?;
        let json = serde_json::from_str(&text)
            .map_err(|e| LabError::io(format!("{} is not a Jupyter notebook (a notebook is JSON)", path.display()), std::io::Error::from(e)))?;
        Ok(Notebook { json, written: modified(&path), path })
    }
}

/// The cell of `ex` in its notebook `nb`: its source and the code it was
/// given (its metadata's `overlap_lab.given`).
fn exercise_cell(nb: &Notebook, ex: &Exercise) -> Result<Answer> {
    let path = &nb.path;
    let cells = nb.json.get("cells").and_then(|c| c.as_array()).map(Vec::as_slice).unwrap_or_default();
    let mine: Vec<&serde_json::Value> = cells.iter().filter(|c| c["metadata"]["overlap_lab"]["exercise"].as_str() == Some(ex.id)).collect();
    if mine.len() > 1 {
        // A copied cell keeps its metadata: which one is the answer is unclear.
        return Err(LabError::config(format!(
            "{}: {} cells carry exercise {} in their metadata (a copied cell?): one is its answer",
            path.display(),
            mine.len(),
            ex.id
        )));
    }
    if let Some(c) = mine.into_iter().next() {
        let meta = &c["metadata"]["overlap_lab"];
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::Array(lines) => lines.iter().filter_map(|l| l.as_str()).collect::<String>(),
            v => v.as_str().unwrap_or("").to_string(),
        };
        let given =
            meta["given"].as_str().ok_or_else(|| LabError::config(format!("{}: the cell of {} does not say what it was given", path.display(), ex.id)))?;
        return Ok(Answer { now: text(&c["source"]), given: given.to_string(), written: nb.written });
    }
    Err(LabError::config(format!("{} has no cell of exercise {} (its metadata names it: overlap_lab.exercise)", path.display(), ex.id)))
}

/// Where `ex` stands, from the notebooks in `dir` and the verdicts saved
/// there; a file answer is checked again as far as it can be here.
fn standing(dir: &Path, nb: &Notebook, ex: &Exercise, saved: &Saved) -> Result<Standing> {
    let mut verdict = saved.verdicts.get(ex.id);
    let cell = exercise_cell(nb, ex)?;
    let (answer, given, written) = match &ex.file {
        Some(file) => {
            let path = dir.join(file.path);
            let now = std::fs::read_to_string(&path).map_err(|e| LabError::io(format!("reading {}", path.display()), e))?;
            (now, cell.given, modified(&path))
        }
        None => (cell.now, cell.given, cell.written),
    };
    let saved_after = |v: &Verdict| written.is_some_and(|w| chrono::DateTime::<chrono::Utc>::from(w) < v.saved);
    // A cell's verdict saved after its notebook was: the cell was checked
    // as edited, before the edit reached the disk (Jupyter saves every few
    // minutes), so the starter on disk is not the answer. (A file answer
    // is checked as it is on disk.)
    let checked_unsaved = ex.file.is_none() && verdict.is_some_and(saved_after);
    if same_code(&answer, &given) && !checked_unsaved {
        return Ok(Standing::NotStarted);
    }
    if let Some(file) = &ex.file {
        // What can be judged here is judged now, from the file as it is.
        if let Some(first) = (file.problems)(&answer).into_iter().next() {
            return Ok(Standing::NotYet { problem: first });
        }
        // A verdict on the file before it last changed is not this file's.
        verdict = verdict.filter(|v| saved_after(v));
    }
    Ok(match verdict {
        Some(v) if v.passed => Standing::Passed { check: v.check.clone() },
        Some(v) => Standing::NotYet { problem: v.problems.first().or(v.findings.first()).cloned().unwrap_or_else(|| "no finding saved".into()) },
        None => Standing::NotChecked,
    })
}

/// The progress of the exercises of `labs` ((number, exercises) each), read
/// from the notebooks folder `dir` and the verdicts file `verdicts` (of
/// that folder: [`verdicts_in`]).
pub fn read(dir: &Path, verdicts: &Path, labs: &[(u8, &'static [Exercise])]) -> Result<Progress> {
    if let Err(e) = std::fs::read_dir(dir) {
        return Err(LabError::io(format!("reading the notebooks folder {}", dir.display()), e));
    }
    let saved = Saved::load(verdicts)?;
    let mut lines = Vec::new();
    // Each notebook read once, however many exercises it holds.
    let mut notebooks: BTreeMap<String, Notebook> = BTreeMap::new();
    for &(lab, exercises) in labs {
        for ex in exercises {
            let name = ex.notebook();
            if !notebooks.contains_key(&name) {
                notebooks.insert(name.clone(), Notebook::read(dir, &name)?);
            }
            lines.push(Line { lab, exercise: ex, standing: standing(dir, &notebooks[&name], ex, &saved)? });
        }
    }
    Ok(Progress { lines, dir: dir.to_path_buf() })
}

impl CheckReport {
    /// Saves the verdict for `overlap-lab progress` and notebook 00 (in the
    /// notebooks' `progress.json`, or `$OVERLAP_LAB_PROGRESS`: see
    /// [`default_verdicts`]); prints as the report followed by whether it
    /// was saved.
    pub fn save_progress(&self) -> SavedReport<'_> {
        SavedReport { report: self, saved: save(self, &default_verdicts()) }
    }
}

/// A report and whether it was saved, for the exercise's cell to print.
pub struct SavedReport<'a> {
    pub report: &'a CheckReport,
    pub saved: Result<PathBuf>,
}

impl fmt::Display for SavedReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.report)?;
        match &self.saved {
            Ok(_) => write!(f, "(saved: `overlap-lab progress` and notebook 00 list it)"),
            Err(e) => write!(f, "(not saved for `overlap-lab progress`: {e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static MODEL: Exercise =
        Exercise { id: "01-x/model", asks: "a model", file: None, hints: &[], examples: Examples::Cell { verdict: |_, _| Ok(None), mistake: "" } };
    static KERNEL: Exercise = Exercise {
        id: "02-y",
        asks: "a kernel",
        file: Some(FileAnswer { path: "exercises/k.cu", problems: compiles }),
        hints: &[],
        examples: Examples::File { right: || "ok".into(), wrong: |given| format!("oops {given}"), mistake: "does not compile" },
    };

    /// A stand-in compiler: "oops" does not compile.
    fn compiles(src: &str) -> Vec<String> {
        if src.contains("oops") {
            vec!["line 1: does not compile".to_string()]
        } else {
            vec![]
        }
    }

    fn notebook(dir: &Path, name: &str, cells: serde_json::Value) {
        std::fs::write(dir.join(name), serde_json::json!({ "cells": cells }).to_string()).unwrap();
    }

    fn cell(id: &str, given: &str, now: &str) -> serde_json::Value {
        serde_json::json!({ "cell_type": "code", "metadata": { "overlap_lab": { "exercise": id, "given": given } }, "source": now.split_inclusive('\n').collect::<Vec<_>>() })
    }

    #[test]
    fn an_exercise_is_not_started_answered_not_yet_or_passed() {
        let dir = crate::testing::temp_dir("progress-unit");
        let labs: &[(u8, &'static [Exercise])] = &[(1, std::slice::from_ref(&MODEL)), (2, std::slice::from_ref(&KERNEL))];
        notebook(&dir, "01-x.ipynb", serde_json::json!([cell("01-x/model", "let a = 1;\nlet b = 2;", "let a = 1;\n    let b = 2;\n")]));
        notebook(&dir, "02-y.ipynb", serde_json::json!([cell("02-y", "__global__ void k() {}", "check(\"exercises/k.cu\")")]));
        std::fs::create_dir_all(dir.join("exercises")).unwrap();
        std::fs::write(dir.join("exercises/k.cu"), "__global__ void k() {}\n").unwrap();
        // The starters, re-indented: not started; no progress file is no error.
        let p = read(&dir, &verdicts_in(&dir), labs).unwrap();
        assert_eq!(p.lines.iter().map(|l| l.standing.clone()).collect::<Vec<_>>(), [Standing::NotStarted, Standing::NotStarted]);
        // Answered, no verdict yet.
        notebook(&dir, "01-x.ipynb", serde_json::json!([cell("01-x/model", "let a = 1;\nlet b = 2;", "let a = 3;\nlet b = 2;\n")]));
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[0].standing, Standing::NotChecked);
        // A saved verdict: the first problem, then passed.
        let mut rep = CheckReport::new("a model (queue model)");
        rep.exercise_id = Some(MODEL.id);
        rep.note("a note first");
        rep.problem("the latency is 1000x too large");
        save(&rep, &verdicts_in(&dir)).unwrap();
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[0].standing, Standing::NotYet { problem: "the latency is 1000x too large".into() });
        let mut rep = CheckReport::new("a model (queue model)");
        rep.exercise_id = Some(MODEL.id);
        save(&rep, &verdicts_in(&dir)).unwrap();
        let p = read(&dir, &verdicts_in(&dir), labs).unwrap();
        assert_eq!(p.lines[0].standing, Standing::Passed { check: "a model (queue model)".into() });
        let text = p.to_string();
        assert!(text.contains("lab 1  01-x/model  a model ...: passed") && text.contains("1 of 2 exercises passed"), "{text}");
        // A file answer is checked again from the file: its problem wins
        // over a verdict saved before it changed.
        std::fs::write(dir.join("exercises/k.cu"), "__global__ void k() { oops }\n").unwrap();
        let mut rep = CheckReport::new("a kernel (live)");
        rep.exercise_id = Some(KERNEL.id);
        save(&rep, &verdicts_in(&dir)).unwrap();
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[1].standing, Standing::NotYet { problem: "line 1: does not compile".into() });
        // Fixed: the verdict saved before the fix is not the fixed file's;
        // checked again, it is.
        std::fs::write(dir.join("exercises/k.cu"), "__global__ void k() { fine(); }\n").unwrap();
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[1].standing, Standing::NotChecked);
        save(&rep, &verdicts_in(&dir)).unwrap();
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[1].standing, Standing::Passed { check: "a kernel (live)".into() });
        // The starter on disk but a verdict saved after the notebook was
        // written: the cell was checked before Jupyter saved it.
        notebook(&dir, "01-x.ipynb", serde_json::json!([cell("01-x/model", "let a = 1;", "let a = 1;")]));
        let mut rep = CheckReport::new("a model (queue model)");
        rep.exercise_id = Some(MODEL.id);
        save(&rep, &verdicts_in(&dir)).unwrap();
        assert_eq!(read(&dir, &verdicts_in(&dir), labs).unwrap().lines[0].standing, Standing::Passed { check: "a model (queue model)".into() });
        // Two cells naming one exercise (a copied cell): which is the answer is unclear.
        notebook(&dir, "01-x.ipynb", serde_json::json!([cell("01-x/model", "a", "b"), cell("01-x/model", "a", "c")]));
        let e = read(&dir, &verdicts_in(&dir), labs).unwrap_err().to_string();
        assert!(e.contains("2 cells carry exercise 01-x/model"), "{e}");
        // A report of no exercise is not saved; a notebook without the cell is named.
        assert!(save(&CheckReport::new("t"), &verdicts_in(&dir)).unwrap_err().to_string().contains("answers no exercise"));
        notebook(&dir, "01-x.ipynb", serde_json::json!([]));
        let e = read(&dir, &verdicts_in(&dir), labs).unwrap_err().to_string();
        assert!(e.contains("01-x.ipynb has no cell of exercise 01-x/model"), "{e}");
    }

    #[test]
    fn every_column_lines_up_whatever_the_widths() {
        const NONE: Examples = Examples::Cell { verdict: |_, _| Ok(None), mistake: "" };
        static SHORT: Exercise = Exercise { id: "02-y", asks: "a kernel", file: None, hints: &[], examples: NONE };
        static LONG: Exercise = Exercise { id: "10-pytorch-trace/fix", asks: "the fix that gains most, in µs", file: None, hints: &[], examples: NONE };
        let p = Progress {
            lines: vec![
                Line { lab: 1, exercise: &MODEL, standing: Standing::NotStarted },
                Line { lab: 2, exercise: &SHORT, standing: Standing::Passed { check: "a kernel (live)".into() } },
                Line { lab: 10, exercise: &LONG, standing: Standing::NotYet { problem: "too slow:\n  by 3 ms".into() } },
                Line { lab: 9, exercise: &KERNEL, standing: Standing::NotChecked },
            ],
            dir: PathBuf::from("/course/notebooks"),
        };
        let text = p.to_string();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("lab ")).collect();
        assert_eq!(rows.len(), 4, "{text}");
        // The column (in characters) where a row's id and its verdict start.
        let column = |row: &str, part: &str| row[..row.find(part).unwrap_or_else(|| panic!("{part:?} not in {row:?}"))].chars().count();
        let ids: Vec<usize> = rows.iter().zip(["01-x/model", "02-y", "10-pytorch-trace/fix", "02-y"]).map(|(r, id)| column(r, id)).collect();
        let verdicts: Vec<usize> =
            rows.iter().zip(["not started", "passed (", "not yet: too slow: by 3 ms", "answered, not checked"]).map(|(r, v)| column(r, v)).collect();
        assert!(ids.iter().all(|&c| c == ids[0]), "ids start at columns {ids:?}:\n{text}");
        assert!(verdicts.iter().all(|&c| c == verdicts[0]), "verdicts start at columns {verdicts:?}:\n{text}");
        assert!(rows[0].starts_with("lab  1  ") && rows[2].starts_with("lab 10  "), "{text}");
        // Each still reads "what: verdict", as the command line's tests look for.
        assert!(rows[0].ends_with(": not started") && rows[1].contains(": passed (") && rows[2].contains(": not yet: "), "{text}");
    }

    #[test]
    fn a_wrong_folder_or_file_is_named_in_one_line() {
        let labs: &[(u8, &'static [Exercise])] = &[(1, std::slice::from_ref(&MODEL))];
        let one_line = |dir: &Path| {
            let e = read(dir, &verdicts_in(dir), labs).unwrap_err().to_string();
            assert_eq!(e.lines().count(), 1, "{e}");
            assert!(!e.contains("recorded data") && !e.contains("overlap-lab all"), "a notebook is no recording: {e}");
            e
        };
        let missing = Path::new("/nonexistent/notebooks");
        let e = one_line(missing);
        assert!(e.starts_with("reading the notebooks folder /nonexistent/notebooks: "), "{e}");
        let empty = crate::testing::temp_dir("progress-empty");
        let e = one_line(&empty);
        assert!(e.contains(&format!("{} holds no notebook 01-x.ipynb", empty.display())) && e.contains("NN-name.ipynb"), "{e}");
        std::fs::write(empty.join("01-x.ipynb"), "not JSON\n").unwrap();
        let e = one_line(&empty);
        assert!(e.contains(&format!("{} is not a Jupyter notebook", empty.join("01-x.ipynb").display())), "{e}");
        notebook(&empty, "01-x.ipynb", serde_json::json!([cell("01-x/model", "a", "a")]));
        std::fs::write(verdicts_in(&empty), "{ half").unwrap();
        let e = one_line(&empty);
        assert!(e.contains("progress.json are not the verdicts the exercises save"), "{e}");
    }

    #[test]
    fn the_variable_puts_the_verdicts_elsewhere() {
        let dir = Path::new("/course/notebooks");
        assert_eq!(verdicts_file(None, dir), dir.join("progress.json"));
        assert_eq!(verdicts_file(Some("".into()), dir), dir.join("progress.json"));
        assert_eq!(verdicts_file(Some("/scratch/v.json".into()), dir), Path::new("/scratch/v.json"));
    }

    /// An exercise's cell run under `OVERLAP_LAB_PROGRESS` (as the test
    /// command's headless notebook runs are) saves its verdict there and
    /// leaves the course's `notebooks/progress.json` as it was. The cell's
    /// call runs in a child process of this test binary, which sets the
    /// variable for it alone.
    #[test]
    fn a_cell_saves_where_the_variable_points_and_nowhere_else() {
        const CHILD: &str = "OVERLAP_LAB_TEST_SAVING_CHILD";
        const ID: &str = "00-test/saved-where-told";
        if std::env::var_os(CHILD).is_some() {
            let mut rep = CheckReport::new("a check (queue model)");
            rep.exercise_id = Some(ID);
            let shown = rep.save_progress();
            assert!(shown.saved.is_ok(), "{shown}");
            return;
        }
        let scratch = crate::testing::temp_dir("progress-variable").join("verdicts.json");
        let course = verdicts_in(&default_notebooks_dir());
        let before = (std::fs::read(&course).ok(), modified(&course));
        let name = format!("{}::a_cell_saves_where_the_variable_points_and_nowhere_else", module_path!().trim_start_matches("overlap_lab::"));
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .env(PROGRESS_ENV, &scratch)
            .env_remove("OVERLAP_LAB_NOTEBOOKS")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.contains("1 passed"), "the child did not run the save: {said}");
        let saved = Saved::load(&scratch).unwrap();
        assert!(saved.verdicts.get(ID).is_some_and(|v| v.passed), "{saved:?}");
        assert_eq!((std::fs::read(&course).ok(), modified(&course)), before, "{} changed", course.display());
    }
}
