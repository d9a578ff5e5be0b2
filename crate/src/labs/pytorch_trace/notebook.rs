//! Lab 10 in its notebook: the course's programs ([`TraceRun`]: traced
//! live where a GPU and PyTorch are here, else the newest recording,
//! labelled) and a learner's own trace ([`YourTrace`]), each diagnosed,
//! priced and drawn the way the lab's table entry does it.
//!
//! May use: what the lab may (see its module).

use super::prices::Prices;
use super::recording::{FixChecks, Recording};
use super::run::trace_programs;
use super::{best_fix, charts, exercise, fixes_table, program_chart, programs_table, scratch_folder, TraceSettings, LAB};
use crate::diagnose::{Diagnosis, Trace};
use crate::error::{LabError, Result};
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::Source;
use crate::measure::record::{default_data_dir, display_path};
use crate::present::gantt::Gantt;
use std::path::{Path, PathBuf};

/// The course's programs in a notebook: traced live when a GPU and PyTorch
/// are here (into a folder of the system's temporary files: a notebook
/// never writes the recordings), else the newest recording, labelled.
pub struct TraceRun {
    pub recording: Recording,
    pub source: Source,
}

impl TraceRun {
    /// Live with `s` where notebooks run live here and PyTorch runs, else recorded.
    pub fn live_or_recorded(s: TraceSettings) -> Result<TraceRun> {
        let why_not = match crate::lab_kit::live_here() {
            Ok(()) => {
                let ran = trace_programs(&s, s.device, &scratch_folder("notebook"), &default_data_dir(), &format!("notebook {LAB}"), false);
                match ran.and_then(|rec| TraceRun::new(rec, Source::Live)) {
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

    /// The run of `recording`, its fixes set beside their programs (an
    /// error here is the notebook's to show, before any cell needs them).
    fn new(recording: Recording, source: Source) -> Result<TraceRun> {
        recording.fix_checks()?;
        Ok(TraceRun { recording, source })
    }

    fn checks(&self) -> &FixChecks {
        self.recording.fix_checks().expect("made when the run was")
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
        fixes_table(self.checks())
    }

    /// The fixes predicted from `program`'s trace, each beside the program that applies it.
    pub fn fixes_of(&self, program: &str) -> String {
        let all = self.checks();
        let of = FixChecks { checks: all.checks.iter().filter(|c| c.before == program).cloned().collect(), ..FixChecks::default() };
        fixes_table(&of)
    }

    /// The trace file of `program`: what `overlap-lab diagnose` reads, and
    /// what Perfetto (ui.perfetto.dev) and chrome://tracing open.
    pub fn trace_path(&self, program: &str) -> Result<PathBuf> {
        self.recording.trace_path(program)
    }

    /// The diagnosis of `program`'s trace, with its what-if.
    pub fn diagnosis(&self, program: &str) -> Result<Diagnosis> {
        self.recording.diagnosis(program)
    }

    /// `program`'s trace, the fix that gains most on the model, and the
    /// traced program that applies it.
    pub fn timeline_chart(&self, program: &str) -> Result<Gantt> {
        let mut g = program_chart(&self.recording, program, self.checks())?;
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
        exercise::check_on_recording(&self.recording, exercise::PROGRAM, self.is_live(), fix, ms)
    }

    /// "Your training loop"'s check: on the trace of
    /// [`exercise::TRAINING_PROGRAM`], `fix` is the fix that gains most and
    /// `ms` the time the loop takes with it.
    pub fn check_training_fix(&self, fix: &str, ms: f64) -> CheckReport {
        exercise::check_on_recording(&self.recording, exercise::TRAINING_PROGRAM, self.is_live(), fix, ms)
    }
}

/// A learner's own trace, diagnosed and priced by this machine's recordings.
pub struct YourTrace {
    pub trace: Trace,
    pub diagnosis: Diagnosis,
}

impl YourTrace {
    /// Reads `path` (a `.json` or `.json.gz` Chrome trace from
    /// `torch.profiler`'s `export_chrome_trace`); a one-line error naming
    /// the file and what is wrong with it.
    pub fn open(path: impl AsRef<Path>) -> Result<YourTrace> {
        let path = path.as_ref();
        let trace = crate::diagnose::read_trace(path, &mut |_, _| {})?;
        let diagnosis = Prices::read(&default_data_dir()).diagnose(&trace, &display_path(path), None);
        Ok(YourTrace { trace, diagnosis })
    }

    /// The trace above the fix that gains most on the model (the trace
    /// alone, its title saying why, where no fix is predicted).
    pub fn timeline_chart(&self) -> Result<Gantt> {
        match best_fix(&self.diagnosis) {
            Ok(best) => charts::fix_chart(charts::FixChart {
                stem: format!("{LAB}-yours"),
                title: format!("Your trace, and with {} (the fix that gains most)", best.fix),
                origin: self.diagnosis.file.clone(),
                before: (&self.trace, "your program", None),
                diagnosis: &self.diagnosis,
                fix: &best,
                after: None,
            }),
            Err(_) => Ok(Gantt::new(
                &format!("{LAB}-yours"),
                &format!("Your trace: no fix predicted ({})", self.diagnosis.what_if_error.as_deref().unwrap_or("the findings suggest none")),
                &self.diagnosis.file,
                vec![{
                    let mut t = charts::traced_timeline(&self.trace, "your program, traced (each idle stretch coloured by its cause)", None);
                    t.spans.extend(charts::idle_spans(&self.trace, &self.diagnosis));
                    t
                }],
            )
            .with_classes(charts::idle_palette())),
        }
    }
}
