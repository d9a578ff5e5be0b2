//! Lab 10's recording: a folder per GPU, `data/<gpu>/pytorch-trace/`,
//! holding `programs.json` (what `crate/reference/lab10_trace.py` wrote:
//! each program's untraced runs, its trace file, which program it fixes and
//! by what fix, the GPU's calibration) and the traces themselves
//! (`<program>.json.gz`). A recording is a folder, not a lab's one JSON
//! file, because its traces are the torch.profiler files a learner's own
//! would be, read by the same reader.
//!
//! Here too: what the diagnosis of any trace is priced by on this machine
//! ([`pricing`]: lab 1's link rates, the graph gap of this folder; for a
//! recording of a GPU lab 1 has not recorded, such as a learner's live
//! run, the pinned rate its own pinned program's copies ran at, which the
//! what-if then names as its price: not an independent figure for that
//! program's own fix), and the
//! fixes each recording's programs make, predicted from the "before" trace
//! and set beside the fixed program's untraced runs ([`Recording::fix_checks`]).

use super::{LAB, PROGRAMS};
use crate::diagnose::replay::Pricing;
use crate::diagnose::whatif::Prediction;
use crate::diagnose::{Diagnosis, LinkRates, Trace};
use crate::error::{LabError, Result};
use crate::measure::record::display_path;
use crate::measure::stats::Summary;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file of a recording's folder that says what is in it.
pub const PROGRAMS_FILE: &str = "programs.json";

/// `programs.json`, as far as the lab reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct Programs {
    /// The command that made it.
    pub command: String,
    /// "2026-11-27 05:46 UTC".
    pub date: String,
    pub torch: String,
    /// The GPU's name as CUDA gives it (none in a CPU smoke run).
    pub gpu: Option<String>,
    #[serde(default)]
    pub driver: Option<String>,
    /// None in a CPU smoke run.
    #[serde(default)]
    pub calibration: Option<Calibration>,
    pub programs: BTreeMap<String, Program>,
    #[serde(default)]
    pub problems: Vec<String>,
}

/// What the script measured of the GPU before the programs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Calibration {
    /// The GPU's gap between two kernels of one CUDA graph, µs.
    #[serde(default)]
    pub graph_gap_us: Option<f64>,
}

/// One program of `crate/reference/lab10_programs.py`, as it ran.
#[derive(Clone, Debug, Deserialize)]
pub struct Program {
    /// What it does, in a line.
    pub what: String,
    pub iterations: u32,
    /// Its sizes, as far as the lab reads them.
    #[serde(default)]
    pub sizes: Sizes,
    pub untraced: Untraced,
    /// Its trace, beside `programs.json`.
    pub trace: String,
    /// The programs it fixes, and by what fix (as the what-if names it).
    #[serde(default)]
    pub fix_of: Vec<FixOf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sizes {
    /// Bytes of one batch a copy program moves to the GPU (none for the tiny-op ones).
    #[serde(default)]
    pub batch_bytes: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Untraced {
    /// By CUDA events (absent in a CPU smoke run).
    pub device_ms: Option<Runs>,
}

/// The untraced runs, ms.
#[derive(Clone, Debug, Deserialize)]
pub struct Runs {
    pub samples: Vec<f64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct FixOf {
    /// The program it fixes.
    pub program: String,
    /// The fix, as the what-if names it ("pinned + copy stream").
    pub fix: String,
}

/// One GPU's recording: its folder and what `programs.json` says.
#[derive(Clone, Debug)]
pub struct Recording {
    pub dir: PathBuf,
    pub programs: Programs,
}

/// One fix of the recorded programs: predicted from the "before" trace,
/// set beside the untraced runs of the program that applies it.
#[derive(Clone, Debug)]
pub struct FixCheck {
    pub before: String,
    /// "pinned + copy stream".
    pub fix: String,
    /// The program that applies it.
    pub after: String,
    pub prediction: Prediction,
    /// The fixed program's untraced runs, ms.
    pub measured: Summary,
}

impl FixCheck {
    pub fn predicted_ms(&self) -> f64 {
        self.prediction.predicted_us / 1e3
    }
    /// The prediction's error against the fixed program's median: -0.05 is 5% low.
    pub fn off(&self) -> f64 {
        self.predicted_ms() / self.measured.median - 1.0
    }
}

impl Recording {
    /// The recording in `dir` (a folder holding `programs.json`); a
    /// one-line error naming the file when it cannot be read.
    pub fn load(dir: &Path) -> Result<Recording> {
        let path = dir.join(PROGRAMS_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(&path) },
            _ => LabError::io(format!("reading {}", display_path(&path)), e),
        })?;
        let programs: Programs =
            serde_json::from_str(&text).map_err(|e| LabError::BadData { path: display_path(&path), reason: format!("not lab 10's programs.json: {e}") })?;
        if let Some(name) = programs.programs.keys().find(|n| !PROGRAMS.contains(&n.as_str())) {
            return Err(LabError::BadData { path: display_path(&path), reason: format!("a program this lab does not know: {name}") });
        }
        Ok(Recording { dir: dir.to_path_buf(), programs })
    }

    /// Every GPU's recording under `data` (`<gpu>/pytorch-trace/`), newest first.
    pub fn find(data: &Path) -> Result<Vec<Recording>> {
        let folders = std::fs::read_dir(data).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(data) },
            _ => LabError::io(format!("listing {}", display_path(data)), e),
        })?;
        let mut found = Vec::new();
        for dir in folders.flatten().map(|e| e.path().join(LAB)) {
            if dir.join(PROGRAMS_FILE).is_file() {
                found.push(Recording::load(&dir)?);
            }
        }
        found.sort_by(|a, b| b.programs.date.cmp(&a.programs.date).then_with(|| a.dir.cmp(&b.dir)));
        Ok(found)
    }

    /// The GPU's gap between a graph's kernels, µs, as this run measured it.
    pub fn graph_gap_us(&self) -> Option<f64> {
        self.programs.calibration.as_ref().and_then(|c| c.graph_gap_us)
    }

    /// "NVIDIA H100 80GB HBM3" (or "no GPU" for a smoke run).
    pub fn gpu(&self) -> &str {
        self.programs.gpu.as_deref().unwrap_or("no GPU")
    }

    /// Where its numbers come from: the GPU, the date, the command.
    pub fn origin(&self) -> String {
        format!("recorded on {} {} by `{}`", self.gpu(), self.programs.date, self.programs.command)
    }

    /// Its programs in course order.
    pub fn names(&self) -> Vec<&'static str> {
        PROGRAMS.iter().copied().filter(|n| self.programs.programs.contains_key(*n)).collect()
    }

    /// The program called `name`; an error naming the known ones.
    pub fn program(&self, name: &str) -> Result<&Program> {
        self.programs
            .programs
            .get(name)
            .ok_or_else(|| LabError::config(format!("no program '{name}' in {}; it has {}", display_path(&self.dir), self.names().join(", "))))
    }

    /// The untraced runs of `name`, ms.
    pub fn untraced(&self, name: &str) -> Result<Summary> {
        let runs = self.program(name)?.untraced.device_ms.as_ref().ok_or_else(|| LabError::BadData {
            path: display_path(&self.dir.join(PROGRAMS_FILE)),
            reason: format!("{name} has no CUDA-event times (a CPU smoke run)"),
        })?;
        Summary::of(&runs.samples)
    }

    /// The trace file of `name`.
    pub fn trace_path(&self, name: &str) -> Result<PathBuf> {
        Ok(self.dir.join(&self.program(name)?.trace))
    }

    /// The trace of `name`, read.
    pub fn trace(&self, name: &str) -> Result<Trace> {
        crate::diagnose::read_trace(&self.trace_path(name)?, &mut |_, _| {})
    }

    /// The what-if's prices for this recording's traces: `data`'s link
    /// rates for its GPU, and the graph gap it measured itself (a live
    /// run's, not the committed one's).
    pub fn pricing(&self, data: &Path) -> (Vec<LinkRates>, Pricing) {
        let (links, mut pricing) = pricing(data, self.programs.gpu.as_deref());
        // A GPU with no lab 1 recording here (a learner's, live): the pinned
        // rate its own pinned program's copies ran at.
        if pricing.rates.is_none() {
            pricing.rates = self.traced_pinned_rates();
        }
        if let Some(gap) = self.graph_gap_us() {
            pricing.graph_gap_us = Some((gap, display_path(&self.dir.join(PROGRAMS_FILE))));
        }
        (links, pricing)
    }

    /// The host link's pinned rate each way as this recording's pinned
    /// program on one stream (`pinned_one_stream`) ran its copies: the
    /// median rate of its largest copies (the batches), bytes over the
    /// traced time. None where that trace is missing or has no such copies.
    pub fn traced_pinned_rates(&self) -> Option<LinkRates> {
        use crate::diagnose::events::{Direction, GpuOpKind, HostMemory};
        const PROGRAM: &str = "pinned_one_stream";
        let trace = self.trace(PROGRAM).ok()?;
        let mut points = Vec::new();
        for direction in [Direction::H2d, Direction::D2h] {
            let copies: Vec<(u64, f64)> = trace
                .gpu_ops
                .iter()
                .filter(|o| o.kind == GpuOpKind::Copy { direction, host: Some(HostMemory::Pinned) } && o.duration_us() > 0.0)
                .filter_map(|o| Some((o.bytes?, o.duration_us())))
                .collect();
            let Some(largest) = copies.iter().map(|c| c.0).max() else { continue };
            let rates: Vec<f64> = copies.iter().filter(|c| c.0 == largest).map(|&(b, us)| b as f64 / (us * 1e3)).collect();
            if let Ok(gbps) = Summary::of(&rates) {
                points.push(crate::diagnose::LinkPoint { host: HostMemory::Pinned, direction, bytes: largest, gbps: gbps.median });
            }
        }
        let source = format!("{}'s traced pinned copies", display_path(&self.trace_path(PROGRAM).ok()?));
        (!points.is_empty()).then(|| LinkRates { gpu_name: self.gpu().to_string(), source, points })
    }

    /// The diagnosis of `name`'s trace with its what-if ([`Recording::pricing`]).
    pub fn diagnosis(&self, name: &str, data: &Path) -> Result<Diagnosis> {
        let (links, pricing) = self.pricing(data);
        self.diagnosis_priced(name, &links, &pricing)
    }

    /// The diagnosis of `name`'s trace beside `links`, priced by `pricing`
    /// (read once for several traces: [`Recording::pricing`] reads files).
    fn diagnosis_priced(&self, name: &str, links: &[LinkRates], pricing: &Pricing) -> Result<Diagnosis> {
        let trace = self.trace(name)?;
        Ok(diagnosis_priced(&trace, &display_path(&self.trace_path(name)?), links, pricing))
    }

    /// Each fix the programs make, in course order of the fixed program:
    /// its prediction from the "before" program's trace (diagnosed once
    /// each, priced by [`Recording::pricing`]) beside its own untraced
    /// runs; and, a line each, the fixes that could not be set beside
    /// their program: one whose programs this run did not time (a partial
    /// or CPU smoke run), or one the what-if could not price (no pinned
    /// rate for this GPU: no lab 1 recording of it). A fix the "before"
    /// trace's diagnosis does not suggest at all is an error: the finding
    /// that should have suggested it is missing.
    pub fn fix_checks(&self, data: &Path) -> Result<FixChecks> {
        let mut out = FixChecks::default();
        let (links, pricing) = self.pricing(data);
        for after in self.names() {
            for f in &self.program(after)?.fix_of {
                let (Ok(measured), Ok(_)) = (self.untraced(after), self.program(&f.program)) else {
                    out.not_compared.push(format!("{} + {}: {after} or {} has no untraced runs in this recording", f.program, f.fix, f.program));
                    continue;
                };
                if !out.diagnoses.contains_key(&f.program) {
                    out.diagnoses.insert(f.program.clone(), self.diagnosis_priced(&f.program, &links, &pricing)?);
                }
                let d = &out.diagnoses[&f.program];
                let bad = |reason: String| LabError::BadData { path: display_path(&self.dir.join(&self.programs.programs[&f.program].trace)), reason };
                let w = d.what_if.as_ref().ok_or_else(|| bad(format!("no what-if: {}", d.what_if_error.as_deref().unwrap_or("?"))))?;
                match w.predictions.iter().find(|p| p.fix == f.fix) {
                    Some(p) => {
                        out.checks.push(FixCheck { before: f.program.clone(), fix: f.fix.clone(), after: after.to_string(), prediction: p.clone(), measured })
                    }
                    None => match w.not_priced.iter().find(|n| n.starts_with(&format!("{}:", f.fix))) {
                        Some(why) => out.not_compared.push(format!("{} + {why}", f.program)),
                        None => return Err(bad(format!("its diagnosis does not suggest '{}', the fix {after} applies", f.fix))),
                    },
                }
            }
        }
        Ok(out)
    }
}

/// The fixes of a recording set beside their programs ([`Recording::fix_checks`]).
#[derive(Clone, Debug, Default)]
pub struct FixChecks {
    pub checks: Vec<FixCheck>,
    /// Why a fix is not among them, a line each.
    pub not_compared: Vec<String>,
    /// The diagnosis of each "before" program's trace, by program: made
    /// once here, read by the charts and the exercise.
    pub diagnoses: BTreeMap<String, Diagnosis>,
}

/// The GPU's gap between a graph's kernels for the GPU named `gpu`, µs,
/// from its lab 10 recording under `data`, and that file as outputs name it.
pub fn recorded_graph_gap(data: &Path, gpu: &str) -> Option<(f64, String)> {
    // Folder by folder: one that cannot be read costs its own gap only.
    let folders = std::fs::read_dir(data).ok()?;
    folders.flatten().map(|e| e.path().join(LAB)).filter(|d| d.join(PROGRAMS_FILE).is_file()).find_map(|dir| {
        let r = Recording::load(&dir).ok()?;
        (r.programs.gpu.as_deref() == Some(gpu)).then_some(())?;
        Some((r.graph_gap_us()?, display_path(&dir.join(PROGRAMS_FILE))))
    })
}

/// The link rates of every lab 1 recording under `data`, and the what-if's
/// prices for a trace of the GPU named `gpu`: its link's rates and its
/// graph gap, where this machine's recordings have them. A recording that
/// cannot be read costs the comparison, not the diagnosis: a warning says so.
pub fn pricing(data: &Path, gpu: Option<&str>) -> (Vec<LinkRates>, Pricing) {
    let links = crate::labs::bandwidth::recorded_link_rates(data).unwrap_or_else(|e| {
        eprintln!("overlap-lab: warning: copies are not set beside lab 1's rates: {e}");
        Vec::new()
    });
    let pricing =
        Pricing { rates: gpu.and_then(|n| links.iter().find(|l| l.matches(n)).cloned()), graph_gap_us: gpu.and_then(|n| recorded_graph_gap(data, n)) };
    (links, pricing)
}

/// The diagnosis of `trace` (named `shown` in outputs) with its what-if,
/// priced by the recordings under `data` ([`pricing`]): what `overlap-lab
/// diagnose` prints and lab 10 draws.
pub fn diagnosis(trace: &Trace, shown: &str, data: &Path) -> Diagnosis {
    let (links, pricing) = pricing(data, trace.first_gpu_name());
    diagnosis_priced(trace, shown, &links, &pricing)
}

/// The diagnosis of `trace` beside `links`, its what-if priced by `pricing`.
pub fn diagnosis_priced(trace: &Trace, shown: &str, links: &[LinkRates], pricing: &Pricing) -> Diagnosis {
    let mut d = crate::diagnose::diagnose(trace, shown, links);
    match crate::diagnose::whatif::what_if(trace, &d, pricing) {
        Ok(w) => d.what_if = Some(w),
        Err(e) => d.what_if_error = Some(e),
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a GPU this machine has no lab 1 recording of, the recording's
    /// own pinned copies price the pinned fixes: every fix of the H100's
    /// programs is still set beside its program, within 10%.
    #[test]
    fn without_lab_1_the_recordings_own_pinned_copies_price_the_pinned_fixes() {
        let data = crate::measure::record::repo_root().join("data");
        let rec = Recording::find(&data).unwrap().into_iter().find(|r| r.dir.to_string_lossy().contains("h100")).unwrap();
        let empty = crate::testing::temp_dir("pytorch-trace-no-lab1");
        let rates = rec.traced_pinned_rates().expect("pinned copies in pinned_one_stream");
        assert!(rates.points.iter().all(|p| p.gbps > 10.0 && p.gbps < 100.0), "{rates:?}");
        let f = rec.fix_checks(&empty).unwrap();
        assert!(f.not_compared.is_empty(), "{:?}", f.not_compared);
        for c in f.checks.iter().filter(|c| c.fix.contains("pinned")) {
            println!("{} + {}: predicted {:.2} ms, {} ran {:.2} ms ({:+.1}%)", c.before, c.fix, c.predicted_ms(), c.after, c.measured.median, 100.0 * c.off());
            assert!(c.off().abs() < 0.10, "{} + {}: {:+.1}%", c.before, c.fix, 100.0 * c.off());
            assert!(c.prediction.priced_by.as_deref().unwrap_or("").contains("traced pinned copies"), "{:?}", c.prediction.priced_by);
        }
    }

    /// A CPU smoke run's programs.json (no GPU, no calibration, host times
    /// only) loads, and its fixes are listed as not compared, not an error;
    /// a file that is not lab 10's is a one-line error naming it.
    #[test]
    fn a_smoke_run_loads_and_a_foreign_file_is_named() {
        let dir = crate::testing::temp_dir("pytorch-trace-smoke");
        let smoke = r#"{"command": "python3 crate/reference/lab10_trace.py --out x --device cpu", "date": "2026-11-27 07:00 UTC",
            "torch": "2.11.0", "gpu": null, "calibration": null, "problems": [],
            "programs": {"pageable_then_compute": {"what": "w", "iterations": 3, "untraced": {"host_ms": {"samples": [1.0]}}, "trace": "p.json.gz", "fix_of": []},
                         "pinned_one_stream": {"what": "w", "iterations": 3, "untraced": {"host_ms": {"samples": [1.0]}}, "trace": "q.json.gz",
                                               "fix_of": [{"program": "pageable_then_compute", "fix": "pinned"}]}}}"#;
        std::fs::write(dir.join(PROGRAMS_FILE), smoke).unwrap();
        let r = Recording::load(&dir).unwrap();
        assert_eq!((r.gpu(), r.graph_gap_us()), ("no GPU", None));
        let f = r.fix_checks(&dir).unwrap();
        assert!(f.checks.is_empty() && f.not_compared.len() == 1, "{f:?}");
        assert!(r.untraced("pinned_one_stream").unwrap_err().to_string().contains("a CPU smoke run"));
        std::fs::write(dir.join(PROGRAMS_FILE), "{\"traceEvents\": []}").unwrap();
        let e = Recording::load(&dir).unwrap_err().to_string();
        assert!(e.contains(PROGRAMS_FILE) && e.contains("not lab 10's programs.json") && !e.contains('\n'), "{e}");
    }
}
