//! Lab 10: your own program. A PyTorch program traced by `torch.profiler`,
//! read by the trace diagnosis (`crate::diagnose`): where its copies fail
//! to hide, which call drains its pipeline, where the GPU waits for the
//! CPU's launches, and what each fix the findings suggest would make of
//! it, predicted by the queue model.
//!
//! The course's own real programs (`crate/reference/lab10_programs.py`:
//! pageable `.to()` then compute, pinned on one stream, pinned and
//! double-buffered on a copy stream, a sync read in the loop and without
//! it, thousands of tiny ops and their CUDA graph) are run, timed untraced
//! and traced on the GPU by `crate/reference/lab10_trace.py`, which
//! `overlap-lab pytorch-trace` runs (carried inside the binary: [`run`]);
//! the recording is a folder of their traces ([`recording`]), priced by
//! this machine's recordings ([`prices`]). Each fix predicted from a
//! "before" program's trace is set beside the untraced runs of the program
//! that applies it. [`charts`] draws a trace beside its predicted fix and
//! the fixed program's trace; [`exercise`] asks which fix gains most. In a
//! notebook, [`TraceRun`] is the course's programs (traced live where a GPU
//! and PyTorch are here, else recorded) and [`YourTrace`] a learner's own
//! trace ([`notebook`]). [`any_program`] is the same diagnosis of programs
//! in any language, traced by `overlap-lab trace`: the recording of its
//! reference programs in CUDA C++, Rust on cudarc and CuPy.
//!
//! This lab runs Python, not the lab's runner: what it measures is PyTorch
//! on the GPU, and what it teaches is reading that. Its table entry is an
//! ordinary one whose recording is a folder (`Recorded` for [`Recording`]).
//!
//! May use: what every lab may (see `labs`), `diagnose`,
//! `labs::bandwidth`'s results (lab 1's recorded link rates price the fixes:
//! [`prices`] alone reads them), and `trace` ([`any_program`] traces a
//! program live).

pub mod any_program;
pub mod charts;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
pub mod notebook;
pub mod prices;
pub mod programs;
pub mod recording;
pub mod run;

use crate::diagnose::Diagnosis;
use crate::error::{LabError, Result};
use crate::lab_kit::headline::HeadlineFigure;
use crate::lab_kit::Word;
use crate::measure::stats::Summary;
use crate::present::gantt::Gantt;
pub use notebook::{TraceRun, YourTrace};
pub use recording::{FixCheck, FixChecks, Recording};
use std::path::{Path, PathBuf};

pub const LAB: &str = "pytorch-trace";

/// The course's programs, in course order (`crate/reference/lab10_programs.py`'s `PROGRAMS`).
pub const PROGRAMS: [&str; 15] = [
    "pageable_then_compute",
    "pinned_one_stream",
    "pinned_double_buffered",
    "sync_read_in_loop",
    "sync_read_deferred",
    "tiny_ops",
    "tiny_ops_graph",
    "tiny_ops_streams",
    "tiny_ops_streams_graph",
    "cpu_prepared_batches",
    "dataloader_workers_pinned",
    "training_loop",
    "training_loop_workers_pinned",
    "results_cpu_each_step",
    "results_pinned_read_late",
];

/// The programs of the headline run, whose fixes are the lab's headline
/// figures: the course's first seven (each flaw of labs 1, 3 and 5 and its
/// fix). The others (several streams, the host's own work, a training
/// loop, downloads) are recorded and checked by the full run.
pub const HEADLINE_PROGRAMS: &[&str] = PROGRAMS.split_at(7).0;

/// The lab's settings (`overlap-lab pytorch-trace --help`).
#[derive(Clone, Debug, clap::Args)]
pub struct TraceSettings {
    /// GPU ordinal (the command line's `--device`; PyTorch sees that GPU alone).
    #[arg(skip)]
    pub device: usize,
    /// Untraced timed runs per program.
    #[arg(long, default_value_t = 15)]
    pub repeats: usize,
    /// The programs to run, comma-separated (default: all; a program's
    /// partner in a fix runs too, untimed, to check their outputs agree).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub programs: Vec<String>,
    /// The Python that has PyTorch.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Time the programs that only apply a fix untraced, with no traces:
    /// no prediction starts from their traces, and each trace costs its
    /// process the profiler's start (quicker: `overlap-lab all` at its
    /// headline preset).
    #[arg(long)]
    pub untraced_fixes: bool,
}

impl Default for TraceSettings {
    /// Every program, 15 untraced runs each: the recording's run.
    fn default() -> Self {
        TraceSettings { device: 0, repeats: 15, programs: Vec::new(), python: "python3".into(), untraced_fixes: false }
    }
}

impl TraceSettings {
    /// The headline run (within `overlap-lab all`'s five minutes): the
    /// first seven programs ([`HEADLINE_PROGRAMS`]), whose fixes are the
    /// lab's headline figures, those that only apply a fix timed untraced
    /// (their runs are the figures); the recording's run has all fifteen,
    /// every one traced.
    pub fn headline() -> TraceSettings {
        TraceSettings { programs: HEADLINE_PROGRAMS.iter().map(|p| p.to_string()).collect(), untraced_fixes: true, ..Self::default() }
    }

    /// The notebook's live run: every program, 5 untraced runs each.
    pub fn quick() -> TraceSettings {
        TraceSettings { repeats: 5, ..Self::default() }
    }

    /// The exercise's trace and the programs that apply its fixes, 2 runs each.
    pub fn small() -> TraceSettings {
        TraceSettings {
            repeats: 2,
            programs: ["pageable_then_compute", "pinned_one_stream", "pinned_double_buffered"].map(String::from).to_vec(),
            ..Self::default()
        }
    }

    /// A one-line error naming the setting that is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.repeats == 0 {
            return Err(LabError::config("--repeats: at least 1"));
        }
        if let Some(p) = self.programs.iter().find(|p| !PROGRAMS.contains(&p.as_str())) {
            return Err(LabError::config(format!("--programs: no program '{p}'; the course's are {}", PROGRAMS.join(", "))));
        }
        if self.python.trim().is_empty() {
            return Err(LabError::config("--python: empty"));
        }
        Ok(())
    }
}

crate::lab_config!(TraceSettings);

/// The lab's table entry.
pub static ENTRY: crate::lab_kit::Entry<TraceSettings, Recording, Recording> = crate::lab_kit::Entry {
    number: 10,
    name: LAB,
    module: module_path!(),
    teaches: "Your own program: a PyTorch profiler trace read for where its overlap is lost, and each fix's time predicted by the queue model",
    builds_on: &[(1, "pinned and pageable copies"), (3, "double buffering"), (5, "sync points and CUDA graphs")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[
        Word::new("trace, CUPTI", "torch.profiler's record of a run (a Chrome trace file) / the CUDA library that times its GPU ops"),
        Word::new("finding", "where a traced program loses time, with the call behind it and what it costs"),
        Word::new("what-if, fix", "the trace replayed on the queue model with a change (pinned, copy stream, sync removed, CUDA graph) / such a change"),
        Word::new("issue-bound", "the GPU idle between ops while the CPU launches the next: the launches, not the work, set the pace"),
        Word::new("graph gap", "the GPU's time between two kernels of one CUDA graph, measured; a graph's price in the what-if"),
    ],
    about: "Lab 10: trace the course's PyTorch programs (PyTorch needed), diagnose each trace, and set each fix predicted from a trace beside the program that applies it",
    measure: run::measure,
    tables,
    figures: |rec, out, _| {
        let mut files = Vec::new();
        for chart in fix_charts(rec)? {
            files.extend(crate::present::chart::save_chart(&chart, out)?);
        }
        Ok(files)
    },
    headline,
    headline_figures: |rec| {
        rec.fix_checks()
            .map(|f| {
                let headline: Vec<FixCheck> =
                    f.checks.iter().filter(|c| HEADLINE_PROGRAMS.contains(&c.before.as_str()) && HEADLINE_PROGRAMS.contains(&c.after.as_str())).cloned().collect();
                headline_figures(&headline)
            })
            .unwrap_or_default()
    },
    // A chart that cannot be drawn is the report's error to name, not this list's.
    timelines: |rec, _| fix_charts(rec).unwrap_or_default(),
    fixture: fixture::results,
};

/// What the command line prints after a run: the programs, then the fixes.
fn tables(rec: &Recording) -> String {
    match rec.fix_checks() {
        Ok(checks) => format!("{}\n{}", programs_table(rec), fixes_table(checks)),
        Err(e) => format!("{}\nthe fixes could not be set beside their programs: {e}", programs_table(rec)),
    }
}

/// The headline rows: each fix predicted beside its program's run, and the graph gap.
fn headline(rec: &Recording) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = match rec.fix_checks() {
        Ok(all) => all
            .checks
            .iter()
            .map(|c| {
                let best = c.judged_us() / 1e3;
                let from = if c.with_sync_events.is_some() { format!(" ({})", c.judged_from()) } else { String::new() };
                (
                    format!("{} + {}", c.before, c.fix),
                    format!("predicted {best:.2} ms{from}; {} ran {:.2} ms ({:+.1}%)", c.after, c.measured.median, 100.0 * c.off_judged()),
                )
            })
            .collect(),
        Err(e) => vec![("fixes".into(), format!("not set beside their programs: {e}"))],
    };
    if let Some(graph) = rec.graph_price() {
        rows.push(("gap between a CUDA graph's kernels".into(), format!("{:.3} µs", graph.gap_us)));
        if let Some(least) = graph.least_kernel_us {
            rows.push(("least time of a CUDA graph's kernel".into(), format!("{least:.3} µs")));
        }
    }
    rows
}

/// The programs' table: each one's untraced median and middle half.
pub fn programs_table(r: &Recording) -> String {
    let mut s = format!("{:<24} {:>11} {:>21}  what\n", "program", "median", "middle half");
    for name in r.names() {
        let p = &r.programs.programs[name];
        match r.untraced(name) {
            Ok(u) => {
                let (lo, hi) = u.middle_range();
                s += &format!("{name:<24} {:>8.2} ms {:>9.2}-{:<8.2} ms  {}\n", u.median, lo, hi, p.what);
            }
            Err(_) => s += &format!("{name:<24} {:>11} {:>21}  {}\n", "-", "-", p.what),
        }
    }
    s
}

/// The fixes' table: each prediction (from the plain trace, and from the
/// run traced with CUDA sync events where there is one) beside the fixed
/// program's runs, how far the judged one ([`FixCheck::judged_us`]) is off, and whether that
/// is within the fix's tolerance; then each fix that is not, and why.
pub fn fixes_table(f: &FixChecks) -> String {
    let width = f.checks.iter().map(|c| c.fix.chars().count()).fold(22, usize::max);
    let mut s = format!(
        "{:<24} {:<width$} {:>12} {:>12}   {:<28} {:>10} {:>7} {:>7}\n",
        "traced program", "fix", "predicted", "sync events", "program with the fix", "ran", "off", "within"
    );
    for c in &f.checks {
        let sync = c.with_sync_events.as_ref().map_or("-".to_string(), |p| format!("{:.2} ms", p.predicted_us / 1e3));
        let off = c.off_judged();
        s += &format!(
            "{:<24} {:<width$} {:>9.2} ms {:>12}   {:<28} {:>7.2} ms {:>+6.1}% {:>6.1}% {}\n",
            c.before,
            c.fix,
            c.predicted_ms(),
            sync,
            c.after,
            c.measured.median,
            100.0 * off,
            100.0 * c.tolerance(),
            if c.agrees() { "agrees" } else { "OFF" }
        );
    }
    s += "(off: the judged prediction: the sync-events trace's where the program waits for events (it names each wait's streams), else the mean of the two traced runs' (a run's host work moves from one run to the next); within: the smaller of 10% and a third of the fix's measured gain)\n";
    let probed: Vec<(&FixCheck, &programs::HostAround)> = f.checks.iter().filter_map(|c| Some((c, c.host.as_ref()?))).collect();
    if !probed.is_empty() {
        s += "host, as `host_probe` found it on the loop's core (the time it took to build one batch) around each run compared: a host-bound fix compares like with like only where both sides ran in the host's fast state\n";
    }
    for (c, h) in probed {
        s += &format!("  {} + {}: {h}\n", c.before, c.fix);
    }
    for n in &f.not_compared {
        s += &format!("not compared: {n}\n");
    }
    s
}

/// The headline figures: each fixed program's untraced runs and each
/// prediction made for it.
fn headline_figures(checks: &[FixCheck]) -> Vec<HeadlineFigure> {
    let mut v = Vec::new();
    for c in checks {
        if let Ok(predicted) = Summary::of(&[c.judged_us() / 1e3]) {
            v.push(HeadlineFigure::prediction(format!("{} + {}: predicted", c.before, c.fix), "ms", predicted, exercise::TOLERANCE));
        }
        if !v.iter().any(|f| f.what == format!("{}: untraced", c.after)) {
            v.push(HeadlineFigure::new(format!("{}: untraced", c.after), "ms", c.measured));
        }
    }
    v
}

/// The chart of each traced program with a fix (the recording's
/// [`Recording::fix_checks`]): it, its fastest predicted fix, and the
/// traced program that applies that fix where there is one.
pub fn fix_charts(r: &Recording) -> Result<Vec<Gantt>> {
    let checks = r.fix_checks()?;
    r.names().into_iter().filter(|n| checks.diagnoses.contains_key(*n)).map(|before| program_chart(r, before, checks)).collect()
}

/// `before`'s chart ([`fix_charts`]), from its diagnosis in `checks`
/// (made here for a program no fix starts from).
fn program_chart(r: &Recording, before: &str, checks: &FixChecks) -> Result<Gantt> {
    let diagnosis = match checks.diagnoses.get(before) {
        Some(d) => d.clone(),
        None => r.diagnosis(before)?,
    };
    let best = best_fix(&diagnosis)?;
    let trace = r.trace(before)?;
    // The program that applies the fix, where it was traced (a run with
    // `--untraced-fixes` times it untraced only).
    let after_name = checks.checks.iter().find(|c| c.before == before && c.fix == best.fix && r.has_trace(&c.after)).map(|c| c.after.clone());
    let after = match &after_name {
        Some(a) => Some((r.trace(a)?, r.untraced(a)?)),
        None => None,
    };
    let runs = r.untraced(before).ok();
    charts::fix_chart(charts::FixChart {
        stem: format!("{LAB}-{before}"),
        title: format!("Lab 10: {before}, traced, and with {} (the fix that gains most)", best.fix),
        origin: r.origin(),
        before: (&trace, before, runs.as_ref()),
        diagnosis: &diagnosis,
        fix: &best,
        after: after.as_ref().zip(after_name.as_deref()).map(|((t, u), a)| (&**t, a, u)),
    })
}

/// The fix of `d`'s what-if that gains most.
fn best_fix(d: &Diagnosis) -> Result<crate::diagnose::whatif::Prediction> {
    d.what_if
        .as_ref()
        .and_then(|w| w.predictions.first().cloned())
        .ok_or_else(|| LabError::NothingToDraw(format!("{}: no fix predicted ({})", d.file, d.what_if_error.as_deref().unwrap_or("the findings suggest none"))))
}

/// Where a run's traces of the programs go: a folder of the system's
/// temporary files of its own (a notebook never writes the recordings),
/// one per run, so a second run in one process never touches a first
/// one's that is still in use.
fn scratch_folder(what: &str) -> PathBuf {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("overlap-lab-{what}-{LAB}-{}-{n}", std::process::id()))
}

/// Lab 10's recording in the data folder `data` for `gpu` (its own GPU's
/// where there is one, else the newest of any); `MissingData` where the
/// folder holds none.
fn recorded_for(data: &Path, gpu: &str) -> Result<Recording> {
    let mut found = Recording::find(data)?;
    let at = found.iter().position(|r| r.gpu() == gpu).unwrap_or(0);
    if found.is_empty() {
        return Err(LabError::MissingData { path: crate::measure::record::display_path(&data.join("*").join(LAB)) });
    }
    Ok(found.swap_remove(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab_kit::Lab;

    #[test]
    fn settings_name_what_is_wrong_and_presets_hold() {
        assert!(ENTRY.check_presets().is_ok());
        let mut s = TraceSettings::quick();
        s.programs.push("no_such".into());
        assert!(s.validate().unwrap_err().to_string().contains("--programs: no program 'no_such'"));
        let s = TraceSettings { python: " ".into(), ..TraceSettings::quick() };
        assert!(s.validate().unwrap_err().to_string().contains("--python"));
    }

    /// A program timed untraced only (the headline run's `--untraced-fixes`,
    /// as the fixture records `sync_read_deferred`) has no trace and says
    /// so in a line naming programs.json, while its fix is still predicted
    /// from the traced program it fixes and set beside its untraced runs,
    /// and that program's chart is drawn without it.
    #[test]
    fn a_fix_timed_untraced_only_is_judged_without_a_trace_of_its_own() {
        let r = fixture::results();
        assert!(!r.has_trace("sync_read_deferred") && r.has_trace("sync_read_in_loop"));
        let e = r.trace_path("sync_read_deferred").unwrap_err().to_string();
        assert!(e.contains("programs.json") && e.contains("untraced only") && !e.contains('\n'), "{e}");
        let checks = r.fix_checks().unwrap();
        let fix = checks.checks.iter().find(|c| c.after == "sync_read_deferred").expect("the sync-removed fix is judged");
        assert_eq!((fix.before.as_str(), fix.measured.median), ("sync_read_in_loop", r.untraced("sync_read_deferred").unwrap().median));
        let charts = fix_charts(&r).unwrap();
        let chart = charts.iter().find(|g| g.stem.ends_with("sync_read_in_loop")).expect("the traced program's chart");
        assert_eq!(chart.timelines.len(), 2, "traced and predicted only: {:?}", chart.timelines.iter().map(|t| &t.title).collect::<Vec<_>>());
        assert!(TraceSettings::headline().untraced_fixes && !TraceSettings::default().untraced_fixes);
    }

    /// Under a sanitizer the lab shows this GPU's own recording where there
    /// is one, else the newest of any.
    #[test]
    fn the_recording_shown_instead_of_a_run_is_this_gpus() {
        let data = crate::measure::record::repo_root().join("data");
        let all = Recording::find(&data).unwrap();
        for r in &all {
            assert_eq!(recorded_for(&data, r.gpu()).unwrap().gpu(), r.gpu());
        }
        assert_eq!(recorded_for(&data, "a GPU with no recording").unwrap().gpu(), all[0].gpu());
        let empty = crate::testing::temp_dir("pytorch-trace-none");
        assert!(matches!(recorded_for(&empty, "NVIDIA H200"), Err(LabError::MissingData { .. })));
    }

    /// The Rust list of programs is the script's, in its order.
    #[test]
    fn the_programs_are_the_scripts_in_its_order() {
        let script = run::SCRIPTS[1].1;
        let at: Vec<usize> = PROGRAMS.iter().map(|p| script.find(&format!("def {p}(")).unwrap_or_else(|| panic!("{p} not in lab10_programs.py"))).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "order: {at:?}");
    }
}
