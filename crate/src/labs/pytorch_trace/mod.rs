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
//! `overlap-lab pytorch-trace` runs (carried inside the binary); the
//! recording is a folder of their traces ([`recording`]). Each fix
//! predicted from a "before" program's trace is set beside the untraced
//! runs of the program that applies it. [`charts`] draws a trace beside
//! its predicted fix and the fixed program's trace; [`exercise`] asks
//! which fix gains most. In a notebook, [`TraceRun`] is the course's
//! programs (traced live where a GPU and PyTorch are here, else
//! recorded) and [`YourTrace`] a learner's own trace.
//!
//! This lab runs Python, not the lab's runner: what it measures is PyTorch
//! on the GPU, and what it teaches is reading that. It implements the lab
//! table's [`Lab`] itself, since its recording is a folder of traces.
//!
//! May use: what every lab may (see `labs`), `diagnose`, and
//! `labs::bandwidth`'s recorded link rates.

pub mod charts;
pub mod exercise;
pub mod recording;

use crate::diagnose::replay::Pricing;
use crate::diagnose::{Diagnosis, Trace};
use crate::error::{LabError, Result};
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::headline::HeadlineFigure;
use crate::lab_kit::table::{command_line_error, Visited};
use crate::lab_kit::{Lab, Preset, RunContext, Source};
use crate::measure::record::{default_data_dir, display_path};
use crate::measure::stats::Summary;
use crate::present::gantt::Gantt;
use crate::present::progress::ProgressMode;
pub use recording::{FixCheck, FixChecks, Recording};
use std::path::{Path, PathBuf};

pub const LAB: &str = "pytorch-trace";

/// The course's programs, in course order (`crate/reference/lab10_programs.py`'s `PROGRAMS`).
pub const PROGRAMS: [&str; 7] =
    ["pageable_then_compute", "pinned_one_stream", "pinned_double_buffered", "sync_read_in_loop", "sync_read_deferred", "tiny_ops", "tiny_ops_graph"];

/// The scripts the lab runs, carried inside the binary (the second is the
/// first's import).
const SCRIPTS: [(&str, &str); 2] =
    [("lab10_trace.py", include_str!("../../../reference/lab10_trace.py")), ("lab10_programs.py", include_str!("../../../reference/lab10_programs.py"))];

/// The lab's settings (`overlap-lab pytorch-trace --help`).
#[derive(Clone, Debug, clap::Args)]
pub struct TraceSettings {
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
}

impl TraceSettings {
    fn preset(p: Preset) -> TraceSettings {
        let all = TraceSettings { repeats: 15, programs: Vec::new(), python: "python3".into() };
        match p {
            Preset::Full | Preset::Headline => all,
            // Every program, fewer runs each: the notebook's live run.
            Preset::Quick => TraceSettings { repeats: 5, ..all },
            // The exercise's trace and the programs that apply its fixes.
            Preset::Small => TraceSettings {
                repeats: 2,
                programs: ["pageable_then_compute", "pinned_one_stream", "pinned_double_buffered"].map(String::from).to_vec(),
                ..all
            },
        }
    }

    /// The notebook's live run: every program, 5 untraced runs each.
    pub fn quick() -> TraceSettings {
        Self::preset(Preset::Quick)
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

/// Runs the course's programs on GPU `device` (PyTorch's view of it is
/// that GPU alone) with `s`, their traces and `programs.json` written to
/// `out` (emptied first); the script's progress passed on unless `quiet`.
pub fn trace_programs(s: &TraceSettings, device: usize, out: &Path, command: &str, quiet: bool) -> Result<Recording> {
    s.validate()?;
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| LabError::io(format!("emptying {}", display_path(out)), e))?;
    }
    let mut args = vec!["--out".to_string(), out.display().to_string(), "--repeats".into(), s.repeats.to_string(), "--command".into(), command.into()];
    if !s.programs.is_empty() {
        args.extend(["--programs".to_string(), s.programs.join(",")]);
    }
    let env = [("CUDA_VISIBLE_DEVICES", device.to_string())];
    crate::lab_kit::reference::run_files(&s.python, &SCRIPTS, &args, &env, !quiet).map_err(LabError::Script)?;
    Recording::load(out)
}

/// Why `python` cannot run the programs (no such Python, no PyTorch in
/// it), or `None` when it can.
pub fn no_pytorch(python: &str) -> Option<String> {
    match std::process::Command::new(python).args(["-c", "import torch"]).output() {
        Err(e) => Some(format!("`{python}` could not be started: {e}")),
        Ok(out) if !out.status.success() => Some(format!("`{python}` has no PyTorch (`import torch` failed)")),
        Ok(_) => None,
    }
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

/// The fixes' table: each prediction beside the fixed program's runs,
/// then each fix that is not, and why.
pub fn fixes_table(f: &FixChecks) -> String {
    let mut s = format!("{:<24} {:<22} {:>12}   {:<24} {:>10} {:>7}\n", "traced program", "fix", "predicted", "program with the fix", "ran", "off");
    for c in &f.checks {
        s += &format!(
            "{:<24} {:<22} {:>9.2} ms   {:<24} {:>7.2} ms {:>+6.1}%\n",
            c.before,
            c.fix,
            c.predicted_ms(),
            c.after,
            c.measured.median,
            100.0 * c.off()
        );
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
        if let Ok(predicted) = Summary::of(&[c.predicted_ms()]) {
            v.push(HeadlineFigure::new(format!("{} + {}: predicted", c.before, c.fix), "ms", predicted));
        }
        if !v.iter().any(|f| f.what == format!("{}: untraced", c.after)) {
            v.push(HeadlineFigure::new(format!("{}: untraced", c.after), "ms", c.measured));
        }
    }
    v
}

/// The chart of each traced program with a fix (`checks`, the
/// recording's): it, its fastest predicted fix, and the traced program
/// that applies that fix where there is one.
pub fn fix_charts(r: &Recording, data: &Path, checks: &FixChecks) -> Result<Vec<Gantt>> {
    let (_, pricing) = r.pricing(data);
    r.names().into_iter().filter(|n| checks.diagnoses.contains_key(*n)).map(|before| program_chart(r, before, data, &pricing, checks)).collect()
}

/// `before`'s chart ([`fix_charts`]), from its diagnosis in `checks`
/// (made here for a program no fix starts from).
fn program_chart(r: &Recording, before: &str, data: &Path, pricing: &Pricing, checks: &FixChecks) -> Result<Gantt> {
    let best = match checks.diagnoses.get(before) {
        Some(d) => best_fix(d)?,
        None => best_fix(&r.diagnosis(before, data)?)?,
    };
    let trace = r.trace(before)?;
    let after_name = checks.checks.iter().find(|c| c.before == before && c.fix == best.fix).map(|c| c.after.clone());
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
        fix: (&best.fix, &best.changes),
        pricing,
        after: after.as_ref().zip(after_name.as_deref()).map(|((t, u), a)| (t, a, u)),
    })
}

/// The fix of `d`'s what-if that gains most.
fn best_fix(d: &Diagnosis) -> Result<crate::diagnose::whatif::Prediction> {
    d.what_if
        .as_ref()
        .and_then(|w| w.predictions.first().cloned())
        .ok_or_else(|| LabError::NothingToDraw(format!("{}: no fix predicted ({})", d.file, d.what_if_error.as_deref().unwrap_or("the findings suggest none"))))
}

/// The lab's table entry.
pub struct PytorchTrace;

pub static ENTRY: PytorchTrace = PytorchTrace;

impl Lab for PytorchTrace {
    fn number(&self) -> u8 {
        10
    }
    fn name(&self) -> &'static str {
        LAB
    }
    fn teaches(&self) -> &'static str {
        "Your own program: a PyTorch profiler trace read for where its overlap is lost, and each fix's time predicted by the queue model"
    }
    fn builds_on(&self) -> &'static [(u8, &'static str)] {
        &[(1, "pinned and pageable copies"), (3, "double buffering"), (5, "sync points and CUDA graphs")]
    }
    fn module(&self) -> &'static str {
        module_path!()
    }
    fn kernels(&self) -> &'static [&'static crate::gpu::kernels::KernelSource] {
        &[]
    }
    fn exercises(&self) -> &'static [crate::lab_kit::progress::Exercise] {
        exercise::EXERCISES
    }
    fn command(&self) -> clap::Command {
        use clap::Args;
        TraceSettings::augment_args(clap::Command::new(LAB)).about(
            "Lab 10: trace the course's PyTorch programs (PyTorch needed), diagnose each trace, and set each fix predicted from a trace beside the program that applies it",
        )
    }
    fn run(&self, matches: Option<&clap::ArgMatches>, preset: Preset, cx: &RunContext) -> Result<Vec<HeadlineFigure>> {
        use clap::FromArgMatches;
        let s = match matches {
            Some(m) => TraceSettings::from_arg_matches(m).map_err(|e| LabError::config(command_line_error(&e)))?,
            None => TraceSettings::preset(preset),
        };
        s.validate()?;
        // Within `overlap-lab all`, a machine without PyTorch skips this lab
        // with a line, as the other labs skip their PyTorch references.
        if matches.is_none() {
            if let Some(why) = no_pytorch(&s.python) {
                println!("{LAB}: skipped: {why}");
                return Ok(Vec::new());
            }
        }
        let gpu = crate::gpu::Gpu::open(cx.device)?;
        let fp = gpu.fingerprint()?;
        drop(gpu);
        eprintln!("{}", fp.describe());
        let mut command = vec!["overlap-lab".to_string(), LAB.into(), "--repeats".into(), s.repeats.to_string()];
        if !s.programs.is_empty() {
            command.extend(["--programs".to_string(), s.programs.join(",")]);
        }
        // Into a folder of its own first: a run that fails leaves the
        // recording as it was. A run of some programs only is not recorded:
        // it would replace the whole set's traces with a few.
        let scratch = std::env::temp_dir().join(format!("overlap-lab-{LAB}-{}", std::process::id()));
        let record_to = cx.record_to.filter(|_| s.programs.is_empty());
        if cx.record_to.is_some() && record_to.is_none() {
            println!("not recorded: --programs runs part of the set, and the recording holds the whole of it");
        }
        let ran = (|| {
            let r = trace_programs(&s, cx.device, &scratch, &command.join(" "), cx.progress == ProgressMode::Quiet)?;
            let rec = match record_to {
                Some(data) => {
                    let dir = data.join(fp.slug()).join(LAB);
                    replace_folder(&r.dir, &dir)?;
                    println!("recorded: {}", display_path(&dir));
                    Recording::load(&dir)?
                }
                None => r,
            };
            println!("{}", programs_table(&rec));
            let checks = rec.fix_checks(cx.data)?;
            println!("{}", fixes_table(&checks));
            Ok(headline_figures(&checks.checks))
        })();
        let _ = std::fs::remove_dir_all(&scratch);
        ran
    }
    fn check_presets(&self) -> Result<()> {
        for p in [Preset::Headline, Preset::Full, Preset::Quick, Preset::Small] {
            TraceSettings::preset(p).validate().map_err(|e| LabError::config(format!("{LAB} --preset {p:?}: {e}")))?;
        }
        Ok(())
    }
    fn visit(&self, dev: &Path, out: Option<&Path>) -> Result<Option<Visited>> {
        let dir = dev.join(LAB);
        if !dir.join(recording::PROGRAMS_FILE).is_file() {
            return Ok(None);
        }
        let rec = Recording::load(&dir)?;
        let data = dev.parent().unwrap_or(dev);
        let all = rec.fix_checks(data)?;
        let mut headline: Vec<(String, String)> = all
            .checks
            .iter()
            .map(|c| {
                (
                    format!("{} + {}", c.before, c.fix),
                    format!("predicted {:.2} ms; {} ran {:.2} ms ({:+.1}%)", c.predicted_ms(), c.after, c.measured.median, 100.0 * c.off()),
                )
            })
            .collect();
        if let Some(gap) = rec.graph_gap_us() {
            headline.push(("gap between a CUDA graph's kernels".into(), format!("{gap:.3} µs")));
        }
        let mut files = Vec::new();
        if let Some(out) = out {
            let folder = out.join(crate::units::slug(rec.gpu()));
            for chart in fix_charts(&rec, data, &all)? {
                files.extend(crate::present::chart::save_chart(&chart, &folder)?);
            }
        }
        Ok(Some(Visited { gpu: rec.gpu().to_string(), origin: rec.origin(), lab: LAB, headline, figures: headline_figures(&all.checks), files }))
    }
    fn timeline_charts(&self, dev: &Path) -> Result<Vec<Gantt>> {
        let dir = dev.join(LAB);
        if !dir.join(recording::PROGRAMS_FILE).is_file() {
            return Ok(Vec::new());
        }
        let (rec, data) = (Recording::load(&dir)?, dev.parent().unwrap_or(dev));
        fix_charts(&rec, data, &rec.fix_checks(data)?)
    }
}

/// `to` made a copy of the folder `from` (what was in `to` goes).
fn replace_folder(from: &Path, to: &Path) -> Result<()> {
    let io = |what: &str, p: &Path, e| LabError::io(format!("{what} {}", display_path(p)), e);
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| io("emptying", to, e))?;
    }
    std::fs::create_dir_all(to).map_err(|e| io("making", to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io("listing", from, e))?.flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).map_err(|e| io("copying into", to, e))?;
    }
    Ok(())
}

/// The course's programs in a notebook: traced live when a GPU and PyTorch
/// are here (into a folder of the system's temporary files: a notebook
/// never writes the recordings), else the newest recording, labelled.
pub struct TraceRun {
    pub recording: Recording,
    pub source: Source,
    /// Where the what-if's prices come from (the data directory).
    data: PathBuf,
    /// The fixes set beside their programs, with the diagnoses they came
    /// from (the exercise's trace's among them).
    checks: FixChecks,
}

impl TraceRun {
    /// Live with `s` where notebooks run live here and PyTorch runs, else recorded.
    pub fn live_or_recorded(s: TraceSettings) -> Result<TraceRun> {
        let why_not = match crate::lab_kit::live_here() {
            Ok(()) => {
                let out = std::env::temp_dir().join(format!("overlap-lab-notebook-{LAB}-{}", std::process::id()));
                match trace_programs(&s, 0, &out, &format!("notebook {LAB}"), false).and_then(|rec| TraceRun::new(rec, Source::Live)) {
                    Ok(run) => return Ok(run),
                    Err(e) => format!("the live run failed: {e}"),
                }
            }
            Err(why) => why,
        };
        Self::recorded(why_not)
    }

    /// The newest recording, shown because of `why_not_live`.
    pub fn recorded(why_not_live: String) -> Result<TraceRun> {
        let data = default_data_dir();
        let rec = Recording::find(&data)?.into_iter().next().ok_or_else(|| LabError::MissingData { path: display_path(&data.join("*").join(LAB)) })?;
        let path = rec.dir.clone();
        TraceRun::new(rec, Source::Recorded { path, why_not_live })
    }

    fn new(recording: Recording, source: Source) -> Result<TraceRun> {
        let data = default_data_dir();
        let mut checks = recording.fix_checks(&data)?;
        if !checks.diagnoses.contains_key(exercise::PROGRAM) {
            checks.diagnoses.insert(exercise::PROGRAM.to_string(), recording.diagnosis(exercise::PROGRAM, &data)?);
        }
        Ok(TraceRun { recording, source, data, checks })
    }

    pub fn is_live(&self) -> bool {
        matches!(self.source, Source::Live)
    }

    /// A visible banner: live or recorded, on what, by what command.
    pub fn banner(&self) -> String {
        let bar = "=".repeat(72);
        let r = &self.recording;
        let what = format!("{} {} (PyTorch {}, driver {})", r.gpu(), r.programs.date, r.programs.torch, r.programs.driver.as_deref().unwrap_or("?"));
        match &self.source {
            Source::Live => format!("{bar}\nLIVE RUN on {what}\n{bar}"),
            Source::Recorded { path, why_not_live } => {
                format!("{bar}\nRECORDED on {what}\nNot live because {why_not_live}.\nData: {}\nCommand: {}\n{bar}", display_path(path), r.programs.command)
            }
        }
    }

    /// The programs' untraced times ([`programs_table`]).
    pub fn programs(&self) -> String {
        programs_table(&self.recording)
    }

    /// Each fix predicted from a trace beside the program that applies it ([`fixes_table`]).
    pub fn fixes(&self) -> String {
        fixes_table(&self.checks)
    }

    /// The trace file of `program`: what `overlap-lab diagnose` reads, and
    /// what Perfetto (ui.perfetto.dev) and chrome://tracing open.
    pub fn trace_path(&self, program: &str) -> Result<PathBuf> {
        self.recording.trace_path(program)
    }

    /// The diagnosis of `program`'s trace, with its what-if.
    pub fn diagnosis(&self, program: &str) -> Result<Diagnosis> {
        match self.checks.diagnoses.get(program) {
            Some(d) => Ok(d.clone()),
            None => self.recording.diagnosis(program, &self.data),
        }
    }

    /// `program`'s trace, the fix that gains most on the model, and the
    /// traced program that applies it.
    pub fn timeline_chart(&self, program: &str) -> Result<Gantt> {
        let (_, pricing) = self.recording.pricing(&self.data);
        let mut g = program_chart(&self.recording, program, &self.data, &pricing, &self.checks)?;
        g.subtitle = self.origin();
        Ok(g)
    }

    /// One line for chart subtitles.
    pub fn origin(&self) -> String {
        match self.source {
            Source::Live => format!("live: {}", self.recording.origin()),
            Source::Recorded { .. } => format!("RECORDED: {}", self.recording.origin()),
        }
    }

    /// The exercise's check: on the trace of [`exercise::PROGRAM`], `fix`
    /// is the fix that gains most and `ms` the time the program takes with it.
    pub fn check_best_fix(&self, fix: &str, ms: f64) -> CheckReport {
        let d = &self.checks.diagnoses[exercise::PROGRAM];
        match &d.what_if {
            Some(w) => exercise::check_best_fix(w, &self.checks.checks, self.is_live(), fix, ms),
            None => {
                let mut rep = CheckReport::new(&format!("the fix that gains most on {}'s trace", exercise::PROGRAM)).answering(exercise::EXERCISES[0].id);
                rep.problem(format!("the trace could not be replayed, so there is nothing to judge: {}", d.what_if_error.as_deref().unwrap_or("no what-if")));
                rep
            }
        }
    }
}

/// A learner's own trace, diagnosed and priced by this machine's recordings.
pub struct YourTrace {
    pub trace: Trace,
    pub diagnosis: Diagnosis,
    data: PathBuf,
}

impl YourTrace {
    /// Reads `path` (a `.json` or `.json.gz` Chrome trace from
    /// `torch.profiler`'s `export_chrome_trace`); a one-line error naming
    /// the file and what is wrong with it.
    pub fn open(path: impl AsRef<Path>) -> Result<YourTrace> {
        let path = path.as_ref();
        let trace = crate::diagnose::read_trace(path, &mut |_, _| {})?;
        let data = default_data_dir();
        let diagnosis = recording::diagnosis(&trace, &display_path(path), &data);
        Ok(YourTrace { trace, diagnosis, data })
    }

    /// The trace above the fix that gains most on the model (the trace
    /// alone, its title saying why, where no fix is predicted).
    pub fn timeline_chart(&self) -> Result<Gantt> {
        let (_, pricing) = recording::pricing(&self.data, self.trace.first_gpu_name());
        match best_fix(&self.diagnosis) {
            Ok(best) => charts::fix_chart(charts::FixChart {
                stem: format!("{LAB}-yours"),
                title: format!("Your trace, and with {} (the fix that gains most)", best.fix),
                origin: self.diagnosis.file.clone(),
                before: (&self.trace, "your program", None),
                fix: (&best.fix, &best.changes),
                pricing: &pricing,
                after: None,
            }),
            Err(_) => Ok(Gantt::new(
                &format!("{LAB}-yours"),
                &format!("Your trace: no fix predicted ({})", self.diagnosis.what_if_error.as_deref().unwrap_or("the findings suggest none")),
                &self.diagnosis.file,
                vec![charts::traced_timeline(&self.trace, "your program, traced", None)],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_what_is_wrong_and_presets_hold() {
        assert!(ENTRY.check_presets().is_ok());
        let mut s = TraceSettings::quick();
        s.programs.push("no_such".into());
        assert!(s.validate().unwrap_err().to_string().contains("--programs: no program 'no_such'"));
        let s = TraceSettings { python: " ".into(), ..TraceSettings::quick() };
        assert!(s.validate().unwrap_err().to_string().contains("--python"));
    }

    /// The Rust list of programs is the script's, in its order.
    #[test]
    fn the_programs_are_the_scripts_in_its_order() {
        let script = SCRIPTS[1].1;
        let at: Vec<usize> = PROGRAMS.iter().map(|p| script.find(&format!("def {p}(")).unwrap_or_else(|| panic!("{p} not in lab10_programs.py"))).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "order: {at:?}");
    }
}
