//! Notebook glue shared by every lab: run live when a GPU is here, else load
//! the newest recording and say so loudly.

use crate::error::Result;
use crate::gpu::{Availability, Gpu};
use crate::lab_kit::check::CheckReport;
use crate::measure::record::{default_data_dir, find_recordings, Record};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub enum Source {
    Live,
    Recorded { path: PathBuf, why_not_live: String },
}

/// A lab's results and where they came from.
#[derive(Clone, Debug)]
pub struct LabRun<T> {
    pub record: Record<T>,
    pub source: Source,
}

/// Set to force recorded data even on a GPU machine (e.g. to reproduce the
/// committed notebook outputs).
pub const FORCE_RECORDED_ENV: &str = "OVERLAP_LAB_RECORDED";

/// Whether notebooks run live here: Ok when a GPU is usable and recorded
/// data is not forced, else why not.
pub fn live_here() -> std::result::Result<(), String> {
    if std::env::var_os(FORCE_RECORDED_ENV).is_some() {
        return Err(format!("{FORCE_RECORDED_ENV} is set"));
    }
    let avail = Availability::probe();
    if avail.is_ready() {
        Ok(())
    } else {
        Err(avail.reason())
    }
}

impl<T: Serialize + DeserializeOwned> LabRun<T> {
    /// Runs `live` on device `ordinal` if a GPU is usable, else loads the
    /// newest recording of `lab` from the data directory. Labs call it
    /// through their table entry (`ENTRY.live_or_recorded(cfg)`).
    pub fn live_or_recorded(lab: &str, ordinal: usize, live: impl FnOnce(&Gpu) -> Result<T>) -> Result<LabRun<T>> {
        if let Err(why_not) = live_here() {
            return Self::recorded(lab, why_not);
        }
        let gpu = Gpu::open(ordinal)?;
        let fp = gpu.fingerprint()?;
        let results = live(&gpu)?;
        let mut record = Record::new(lab, fp, results);
        record.command = vec!["notebook".into(), lab.into()];
        Ok(LabRun { record, source: Source::Live })
    }

    /// An exercise check: live on the recording's GPU when notebooks run
    /// live here, else `model` (no GPU). A live run that fails is a failed
    /// check titled `what`, never an error out of the cell.
    pub fn check(
        &self,
        what: &str,
        exercise: &crate::lab_kit::progress::Exercise,
        device: usize,
        live: impl FnOnce(&Gpu) -> Result<CheckReport>,
        model: impl FnOnce() -> CheckReport,
    ) -> CheckReport {
        let rep = if live_here().is_err() {
            model()
        } else {
            Gpu::open(device).and_then(|gpu| live(&gpu)).unwrap_or_else(|e| {
                let mut rep = CheckReport::new(&format!("{what} (live)"));
                rep.problem(format!("the run failed: {e}"));
                rep
            })
        };
        rep.answering(exercise.id)
    }

    /// The newest recording of `lab`.
    pub fn recorded(lab: &str, why_not_live: String) -> Result<LabRun<T>> {
        let mut found = find_recordings::<T>(&default_data_dir(), lab)?;
        let (path, record) = found.remove(0);
        Ok(LabRun { record, source: Source::Recorded { path, why_not_live } })
    }

    /// The newest recording of `lab` whose results `keep` accepts (a lab
    /// that needs a kind of machine this one is not shows one made on it),
    /// or none; `why` says in the banner why it is shown.
    pub fn recorded_where(lab: &str, why: &str, keep: impl Fn(&T) -> bool) -> Result<Option<LabRun<T>>> {
        let found = find_recordings::<T>(&default_data_dir(), lab)?;
        Ok(found
            .into_iter()
            .find(|(_, r)| keep(&r.results))
            .map(|(path, record)| LabRun { record, source: Source::Recorded { path, why_not_live: why.to_string() } }))
    }

    pub fn is_live(&self) -> bool {
        matches!(self.source, Source::Live)
    }

    /// One line for chart subtitles.
    pub fn origin(&self) -> String {
        match &self.source {
            Source::Live => format!("live on {}", self.record.provenance()),
            Source::Recorded { .. } => format!("RECORDED on {}", self.record.provenance()),
        }
    }

    /// A visible banner for the top of a notebook's results.
    pub fn banner(&self) -> String {
        let fp = &self.record.fingerprint;
        let bar = "=".repeat(72);
        let (head, detail) = match &self.source {
            Source::Live => (format!("LIVE RUN on {}", self.record.provenance()), String::new()),
            Source::Recorded { path, why_not_live } => (
                format!("RECORDED on {}", self.record.provenance()),
                format!("\nNot live because {why_not_live}.\nData: {}\nCommand: {}", crate::measure::record::display_path(path), self.record.command_line()),
            ),
        };
        format!("{bar}\n{head}{detail}\n{}\n{bar}", fp.describe())
    }
}
