//! Any CUDA program, traced by `overlap-lab trace`: the recording of its
//! reference programs, `data/<gpu>/trace-programs/` (what
//! `crate/reference/trace/record.py` wrote: `programs.json` and each
//! program's trace). The same copy/compute patterns written in CUDA C++
//! (`patterns.cu`), in Rust on cudarc (`cudarc_patterns.rs`) and in CuPy
//! (`cupy_patterns.py`), each timed untraced and traced; each fix a
//! program's diagnosis offers set beside the untraced runs of the program
//! that applies it, as lab 10's own programs are ([`FixCheck`], the same
//! rule); and the tracer's cost beside torch.profiler's on two PyTorch
//! loops, with both tracers' op times compared.
//!
//! May use: what lab 10's other rooms may (`diagnose`, lab 10's
//! `recording` for its fix rule, `prices` for the machine's rates), and
//! `crate::trace` (the tracer, which traces `patterns.cu` live).

use super::prices::{diagnosis_priced, Prices};
use super::recording::{FixCheck, FixChecks, TemporaryFolder};
use crate::diagnose::Trace;
use crate::error::{LabError, Result};
use crate::measure::record::display_path;
use crate::measure::stats::Summary;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folder of a GPU's recording, under its data folder.
pub const FOLDER: &str = "trace-programs";

/// What `record.py` wrote into `programs.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct RecordedPrograms {
    /// The command that recorded it.
    pub command: String,
    /// The GPU's name ("NVIDIA H200").
    pub gpu: String,
    /// The NVIDIA driver's version.
    pub driver: String,
    /// When it was recorded, UTC.
    pub date: String,
    /// Rounds over the programs (each untraced, then traced).
    pub repeats: usize,
    pub programs: BTreeMap<String, TracedProgram>,
    /// The tracer's cost beside torch.profiler's, by PyTorch loop.
    pub torch_cost: BTreeMap<String, TorchCost>,
    /// The two tracers' op times compared, by PyTorch loop.
    pub torch_traces_compared: BTreeMap<String, TracesCompared>,
    /// Programs recorded again later (`record.py --only`), each run's
    /// entries replacing the first run's; none in a recording made whole.
    #[serde(default)]
    pub rerecorded: Vec<Rerecorded>,
}

/// A later run of `record.py --only` or `--torch-only`: which programs (or
/// PyTorch loops) it recorded again, on the recording's GPU.
#[derive(Clone, Debug, Deserialize)]
pub struct Rerecorded {
    pub date: String,
    pub command: String,
    pub driver: String,
    pub programs: Vec<String>,
    /// Rounds over its programs (each untraced, then traced).
    pub repeats: usize,
}

/// One reference program.
#[derive(Clone, Debug, Deserialize)]
pub struct TracedProgram {
    /// Its command line (the program's file name and arguments).
    pub command: Vec<String>,
    /// Its loop's time by its own clock, untraced and traced, ms.
    pub untraced: Runs,
    pub traced: Runs,
    /// Its trace (from the first traced run), in the recording's folder.
    pub trace: String,
    /// Each fix its diagnosis offers that a program here applies: fix → that program.
    pub fixes: BTreeMap<String, String>,
}

/// Runs of one program one way, ms.
#[derive(Clone, Debug, Deserialize)]
pub struct Runs {
    pub runs_ms: Vec<f64>,
    /// Each run's fastest step, where the loop prints one (in recordings
    /// made since it does), ms.
    #[serde(default)]
    pub fastest_steps_ms: Vec<f64>,
}

impl Runs {
    pub fn summary(&self) -> Result<Summary> {
        Summary::of(&self.runs_ms)
    }
}

/// A PyTorch loop's wall time untraced, under `overlap-lab trace` and
/// under torch.profiler (CUDA activities only), ms.
#[derive(Clone, Debug, Deserialize)]
pub struct TorchCost {
    pub command: Vec<String>,
    pub untraced: Runs,
    #[serde(rename = "overlap-lab trace")]
    pub ours: Runs,
    #[serde(rename = "torch.profiler")]
    pub profiler: Runs,
    /// The CPUs every run was held to (`record.py --cpus`), if any.
    #[serde(default)]
    pub cpus: Option<String>,
}

impl TorchCost {
    /// Our traced run over torch.profiler's run of the same round (the
    /// runs are made in rounds, one each way, so the two of a round saw
    /// the same host), as a summary over the rounds.
    pub fn ours_over_profiler(&self) -> Result<Summary> {
        let ratios: Vec<f64> = self.ours.runs_ms.iter().zip(&self.profiler.runs_ms).map(|(o, p)| o / p).collect();
        Summary::of(&ratios)
    }
}

/// Each op name's total GPU time in our traces and torch.profiler's of the
/// same loop (separate runs: one CUPTI subscriber per process).
#[derive(Clone, Debug, Deserialize)]
pub struct TracesCompared {
    /// Runs each way.
    pub runs: usize,
    pub rows: Vec<OpTotals>,
    /// The largest relative difference of the medians among the names
    /// holding at least 1% of the GPU time; none where such a name is in
    /// our traces only.
    pub worst: Option<f64>,
    /// The same among every name both traces hold (recordings before
    /// 2026-11-30 lack it).
    #[serde(default)]
    pub worst_every_op: Option<f64>,
    /// As `worst`, but each pageable copy judged by `off_by_events` where
    /// its runs timed it by CUDA events (recordings before 2026-11-30 12:00
    /// lack it).
    #[serde(default)]
    pub worst_judged: Option<f64>,
    /// Whether the copies' names (direction and memory kinds) and counts agree.
    pub copies_agree: bool,
}

/// One op name's total time over a traced run: medians over the runs, µs.
#[derive(Clone, Debug, Deserialize)]
pub struct OpTotals {
    /// "kernel", "copy" or "memset".
    pub kind: String,
    pub name: String,
    pub count_ours: u64,
    pub count_theirs: u64,
    pub us_ours: f64,
    pub us_theirs: f64,
    pub ours_range: [f64; 2],
    pub theirs_range: [f64; 2],
    /// Whether the name holds at least 1% of the GPU time.
    pub counted: bool,
    pub ranges_overlap: bool,
    /// For a pageable copy the program timed by CUDA events around each
    /// one: each run's trace total over those events' total, ours and
    /// torch.profiler's (a pageable copy's time is the host's staging of
    /// it, which moves from one process to the next; set over its own
    /// run's events, each tracer's record of it can be compared).
    #[serde(default)]
    pub events_ratio_ours: Vec<f64>,
    #[serde(default)]
    pub events_ratio_theirs: Vec<f64>,
    /// The median of `events_ratio_ours` over that of
    /// `events_ratio_theirs`, less one.
    #[serde(default)]
    pub off_by_events: Option<f64>,
}

/// A GPU's recording of the reference programs: its folder and what
/// `programs.json` says, priced by the data folder it lies in.
#[derive(Clone, Debug)]
pub struct ReferenceRecording {
    pub dir: PathBuf,
    pub recorded: RecordedPrograms,
    prices: Prices,
}

impl ReferenceRecording {
    /// The recording in `dir` (`<data>/<gpu>/trace-programs/`); a one-line
    /// error naming the file when it cannot be read.
    pub fn load(dir: &Path) -> Result<ReferenceRecording> {
        let path = dir.join("programs.json");
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(&path) },
            _ => LabError::io(format!("reading {}", display_path(&path)), e),
        })?;
        let recorded: RecordedPrograms = serde_json::from_str(&text).map_err(|e| LabError::BadData { path: display_path(&path), reason: e.to_string() })?;
        let data = dir.parent().and_then(Path::parent).unwrap_or(dir);
        Ok(ReferenceRecording { dir: dir.to_path_buf(), recorded, prices: Prices::read(data) })
    }

    /// Every GPU's recording under `data`, in folder order.
    pub fn find(data: &Path) -> Result<Vec<ReferenceRecording>> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(data)
            .map_err(|e| LabError::io(format!("listing {}", display_path(data)), e))?
            .flatten()
            .map(|e| e.path().join(FOLDER))
            .filter(|d| d.join("programs.json").is_file())
            .collect();
        dirs.sort();
        dirs.iter().map(|d| Self::load(d)).collect()
    }

    /// The recording in this repository's data folder (the first GPU's,
    /// in folder order, where there are several).
    pub fn recorded() -> Result<ReferenceRecording> {
        let data = crate::measure::record::repo_root().join("data");
        let found = Self::find(&data)?;
        found.into_iter().next().ok_or_else(|| LabError::MissingData { path: display_path(&data.join("<gpu>").join(FOLDER).join("programs.json")) })
    }

    /// Where its numbers come from: the run, and each later run that
    /// recorded some programs again.
    pub fn origin(&self) -> String {
        let r = &self.recorded;
        let mut s = format!("recorded on {} (driver {}) {} by `{}`", r.gpu, r.driver, r.date, r.command);
        for again in &r.rerecorded {
            s += &format!("; {} recorded again {} (driver {}) by `{}`", again.programs.join(", "), again.date, again.driver, again.command);
        }
        s
    }

    /// The program called `name`; an error naming the known ones.
    pub fn program(&self, name: &str) -> Result<&TracedProgram> {
        self.recorded.programs.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.recorded.programs.keys().map(String::as_str).collect();
            LabError::config(format!("no program '{name}' in {}; it has {}", display_path(&self.dir), known.join(", ")))
        })
    }

    /// The trace of `name`.
    pub fn trace(&self, name: &str) -> Result<Trace> {
        crate::diagnose::read_trace(&self.dir.join(&self.program(name)?.trace), &mut |_, _| {})
    }

    /// Each fix a program's diagnosis offers (priced by this machine's
    /// recordings, as lab 10's are) beside the untraced runs of the program
    /// that applies it. A fix the diagnosis does not offer is an error:
    /// the finding that should have suggested it is missing.
    pub fn fix_checks(&self) -> Result<FixChecks> {
        let mut out = FixChecks::default();
        for (before, p) in &self.recorded.programs {
            if p.fixes.is_empty() {
                continue;
            }
            let file = display_path(&self.dir.join(&p.trace));
            let d = self.diagnosis(before)?;
            let bad = |reason: String| LabError::BadData { path: file.clone(), reason };
            let w = d.what_if.as_ref().ok_or_else(|| bad(format!("no what-if: {}", d.what_if_error.as_deref().unwrap_or("?"))))?;
            for (fix, after) in &p.fixes {
                let prediction = w.predictions.iter().find(|q| &q.fix == fix).ok_or_else(|| bad(format!("its diagnosis does not offer '{fix}', the fix {after} applies")))?;
                out.checks.push(FixCheck {
                    before: before.clone(),
                    fix: fix.clone(),
                    after: after.clone(),
                    prediction: prediction.clone(),
                    with_sync_events: None,
                    waits_for_events: false,
                    measured: self.program(after)?.untraced.summary()?,
                    before_measured: p.untraced.summary()?,
                    host: None,
                });
            }
            out.diagnoses.insert(before.clone(), d);
        }
        Ok(out)
    }

    /// Each program's loop untraced and traced (medians of its runs, the
    /// range beside), and what tracing cost it, twice: of the medians, and
    /// of the fastest runs (noise on the host, its other work and page
    /// faults, only ever slows a run, so where the runs spread the fastest
    /// of each way is the nearer to the tracer's own cost); then each
    /// PyTorch loop's under both tracers.
    pub fn cost_table(&self) -> Result<String> {
        let range = |s: &Summary| format!("{:.2} ms ({:.2}..{:.2})", s.median, s.min, s.max);
        let overlap = |a: &Summary, b: &Summary| if a.min.max(b.min) <= a.max.min(b.max) { "overlap" } else { "apart" };
        let cost = |traced: &Summary, untraced: &Summary| (100.0 * (traced.median / untraced.median - 1.0), 100.0 * (traced.min / untraced.min - 1.0));
        let mut s = format!("{:<20} {:>26} {:>26} {:>8} {:>8}  {}\n", "program", "untraced", "overlap-lab trace", "cost", "fastest", "ranges");
        for (name, p) in &self.recorded.programs {
            let (u, t) = (p.untraced.summary()?, p.traced.summary()?);
            let (median, fastest) = cost(&t, &u);
            s += &format!("{:<20} {:>26} {:>26} {:>+7.1}% {:>+7.1}%  {}\n", name, range(&u), range(&t), median, fastest, overlap(&u, &t));
        }
        s += &format!(
            "\n{:<20} {:>26} {:>26} {:>8} {:>8} {:>26} {:>8} {:>8} {:>22}\n",
            "PyTorch loop", "untraced", "overlap-lab trace", "cost", "fastest", "torch.profiler (CUDA)", "cost", "fastest", "ours ÷ theirs a round"
        );
        let mut held = Vec::new();
        for (name, c) in &self.recorded.torch_cost {
            let (u, o, p, head) = (c.untraced.summary()?, c.ours.summary()?, c.profiler.summary()?, c.ours_over_profiler()?);
            let ((ours, ours_fastest), (theirs, theirs_fastest)) = (cost(&o, &u), cost(&p, &u));
            s += &format!(
                "{:<20} {:>26} {:>26} {:>+7.1}% {:>+7.1}% {:>26} {:>+7.1}% {:>+7.1}% {:>22}\n",
                name,
                range(&u),
                range(&o),
                ours,
                ours_fastest,
                range(&p),
                theirs,
                theirs_fastest,
                format!("{:.3} ({:.3}..{:.3})", head.median, head.min, head.max)
            );
            if [&c.untraced, &c.ours, &c.profiler].iter().all(|r| !r.fastest_steps_ms.is_empty()) {
                let (u, o, p) = (Summary::of(&c.untraced.fastest_steps_ms)?, Summary::of(&c.ours.fastest_steps_ms)?, Summary::of(&c.profiler.fastest_steps_ms)?);
                s += &format!(
                    "{:<20} {:>26} {:>26} {:>+7.1}% {:>8} {:>26} {:>+7.1}%\n",
                    "  its fastest step",
                    range(&u),
                    range(&o),
                    cost(&o, &u).0,
                    "",
                    range(&p),
                    cost(&p, &u).0
                );
            }
            let cpus = c.cpus.as_ref().map_or(String::new(), |cpus| format!(" on CPUs {cpus} only"));
            held.push(format!("{name} {} runs each way{cpus}", c.ours.runs_ms.len()));
        }
        let held = held.join(", ");
        let again: String = self.recorded.rerecorded.iter().map(|r| format!("; {} in {} rounds of their own ({})", r.programs.join(", "), r.repeats, r.date)).collect();
        s += &format!(
            "(each a median of the runs, their range beside; cost: of the medians, fastest: of the fastest runs; ours ÷ theirs a round: our traced run over torch.profiler's of the same round, the median over the rounds and its range; its fastest step: each run's fastest step, where the loop prints one; {} rounds over the programs, each untraced then traced{again}; PyTorch loops: {held})\n",
            self.recorded.repeats
        );
        Ok(s)
    }

    /// Each PyTorch loop's ops as our traces and torch.profiler's time them
    /// (the names holding at least 1% of the GPU time).
    pub fn comparison_table(&self) -> String {
        let mut s = String::new();
        for (name, c) in &self.recorded.torch_traces_compared {
            s += &format!("{name}: {} runs each way; copies' names, memory kinds and counts {}\n", c.runs, if c.copies_agree { "agree" } else { "DIFFER" });
            s += &format!("  {:<6} {:>7} {:>14} {:>14} {:>8}  name\n", "kind", "count", "ours, µs", "theirs, µs", "off");
            for r in &c.rows {
                let off = if r.us_theirs > 0.0 { format!("{:>+7.2}%", 100.0 * (r.us_ours / r.us_theirs - 1.0)) } else { "ours only".into() };
                let apart = if r.ranges_overlap { "" } else { " (ranges apart)" };
                let small = if r.counted { "" } else { " (under 1% of the GPU time)" };
                let events = r.off_by_events.map_or(String::new(), |o| format!("; {:+.2}% each over its own run's CUDA events", 100.0 * o));
                let short: String = r.name.chars().take(70).collect();
                s += &format!("  {:<6} {:>7} {:>14.1} {:>14.1} {off:>8}{apart}{small}{events}  {short}\n", r.kind, r.count_ours, r.us_ours, r.us_theirs);
            }
            let every = c.worst_every_op.map_or(String::new(), |w| format!(" ({:.2}% among every op)", 100.0 * w));
            s += &match c.worst {
                Some(w) => format!("  largest difference of the medians among ops holding 1% of the GPU time: {:.2}%{every}\n", 100.0 * w),
                None => "  largest difference of the medians: none (an op holding 1% of the GPU time is in our traces only)\n".into(),
            };
            if let Some(j) = c.worst_judged {
                s += &format!("  the same, each pageable copy set over its own run's CUDA events: {:.2}%\n", 100.0 * j);
            }
        }
        s
    }
}

/// The C++ patterns a learner can trace here (`patterns.cu`'s modes that
/// are programs of the recording).
pub const PATTERNS: [&str; 5] = ["serial", "pageable", "sync", "copy-stream", "chunked"];

/// A reference program's diagnosis, and where its trace came from.
#[derive(Clone, Debug)]
pub struct ProgramDiagnosis {
    /// "traced here: ..." or "recorded: ... (why not here)".
    pub origin: String,
    pub diagnosis: crate::diagnose::Diagnosis,
}

impl std::fmt::Display for ProgramDiagnosis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}\n", self.origin)?;
        write!(f, "{}", self.diagnosis)
    }
}

impl ReferenceRecording {
    /// The diagnosis of `name`'s recorded trace, its fixes priced as
    /// [`ReferenceRecording::fix_checks`] prices them.
    pub fn diagnosis(&self, name: &str) -> Result<crate::diagnose::Diagnosis> {
        let p = self.program(name)?;
        let pricing = self.prices.for_gpu(Some(&self.recorded.gpu));
        Ok(diagnosis_priced(&self.trace(name)?, &display_path(&self.dir.join(&p.trace)), &self.prices.links, &pricing))
    }

    /// `patterns.cu`'s `mode` built here with nvcc, run under `overlap-lab
    /// trace`'s library (the program's output passes through) and
    /// diagnosed, priced for this GPU; where this machine cannot (no GPU,
    /// no nvcc, the library not built), the recorded trace's diagnosis,
    /// saying why.
    pub fn traced_here_or_recorded(&self, mode: &str) -> Result<ProgramDiagnosis> {
        if !PATTERNS.contains(&mode) {
            return Err(LabError::config(format!("no pattern '{mode}': patterns.cu runs {}", PATTERNS.join(", "))));
        }
        match self.traced_here(mode) {
            Ok(d) => Ok(d),
            Err(why) => Ok(ProgramDiagnosis { origin: format!("recorded, not traced here ({why}): {}", self.origin()), diagnosis: self.diagnosis(mode)? }),
        }
    }

    fn traced_here(&self, mode: &str) -> std::result::Result<ProgramDiagnosis, String> {
        let gpu = crate::gpu::Availability::probe();
        if !gpu.is_ready() {
            return Err(gpu.reason());
        }
        let nvcc = ["nvcc", "/usr/local/cuda/bin/nvcc"]
            .into_iter()
            .find(|n| std::process::Command::new(n).arg("--version").output().is_ok_and(|o| o.status.success()))
            .ok_or("no nvcc to build patterns.cu")?;
        crate::trace::find_library(None).map_err(|e| e.to_string())?;
        let scratch = TemporaryFolder(std::env::temp_dir().join(format!("overlap-lab-patterns-{}", std::process::id())));
        let dir = &scratch.0;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let exe = dir.join("patterns");
        let source = crate::measure::record::repo_root().join("crate/reference/trace/patterns.cu");
        let built = std::process::Command::new(nvcc).args(["-O2", "-o"]).arg(&exe).arg(&source).output().map_err(|e| format!("nvcc: {e}"))?;
        if !built.status.success() {
            return Err(format!("nvcc failed: {}", String::from_utf8_lossy(&built.stderr).lines().next().unwrap_or("")));
        }
        let output = dir.join(format!("{mode}.json.gz"));
        // With sync events, as record.py traces the recorded ones: the
        // diagnosis reads each event wait's streams rather than infer them.
        let req = crate::trace::Request { command: vec![exe.into(), mode.into()], output: output.clone(), library: None, keep_raw: false, peer_copies: false, sync_events: true };
        let ran = crate::trace::run(&req).map_err(|e| e.to_string())?;
        if ran.exit_code != 0 {
            return Err(format!("patterns {mode} exited with {}", ran.exit_code));
        }
        let trace = crate::diagnose::read_trace(&output, &mut |_, _| {}).map_err(|e| e.to_string())?;
        let name = trace.gpu_names.first().map(|g| g.1.clone());
        let pricing = self.prices.for_gpu(name.as_deref());
        let diagnosis = diagnosis_priced(&trace, &format!("patterns {mode} (traced here)"), &self.prices.links, &pricing);
        Ok(ProgramDiagnosis { origin: format!("traced here: patterns {mode}, built with nvcc, in {:.2} s", ran.wall.as_secs_f64()), diagnosis })
    }
}

