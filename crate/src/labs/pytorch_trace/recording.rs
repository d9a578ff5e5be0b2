//! Lab 10's recording: a folder per GPU, `data/<gpu>/pytorch-trace/`,
//! holding `programs.json` (what `crate/reference/lab10_trace.py` wrote:
//! each program's untraced runs, its trace file, which program it fixes and
//! by what fix, the GPU's calibration) and the traces themselves
//! (`<program>.json.gz`). A recording is a folder, not a lab's one JSON
//! file, because its traces are the torch.profiler files a learner's own
//! would be, read by the same reader; it is kept through the lab table's
//! `Recorded`, as a lab's one JSON record is.
//!
//! A recording carries the prices of its what-if ([`Prices`]: lab 1's link
//! rates, the graph gaps, read once from the data folder it is priced by;
//! for a GPU lab 1 has not recorded, such as a learner's live run, the
//! pinned rate its own pinned program's copies ran at, which the what-if
//! then names as its price: not an independent figure for that program's
//! own fix), reads each trace once, and diagnoses each program once: the
//! fixes each "before" trace predicts, set beside the fixed program's
//! untraced runs ([`Recording::fix_checks`]), are made once and read by the
//! tables, the headline, the charts and the exercise.

use super::prices::{diagnosis_priced, Prices, RecordedPrices};
pub use super::programs::{read_programs, Calibration, FixOf, Program, Programs, Runs, Sizes, Untraced, PROGRAMS_FILE};
use super::{LAB, PROGRAMS};
use crate::diagnose::replay::{GraphPrice, Pricing};
use crate::diagnose::whatif::Prediction;
use crate::diagnose::{Diagnosis, LinkRates, Trace};
use crate::error::{LabError, Result};
use crate::lab_kit::{Kept, Recorded};
use crate::measure::fingerprint::Fingerprint;
use crate::measure::record::display_path;
use crate::measure::stats::Summary;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// One GPU's recording: its folder and what `programs.json` says, with
/// what it is priced by and what has been read and diagnosed of it.
#[derive(Clone, Debug)]
pub struct Recording {
    pub dir: PathBuf,
    pub programs: Programs,
    prices: Arc<Prices>,
    /// What this recording measured itself, read once when opened.
    recorded: RecordedPrices,
    made: Made,
    /// Each trace file, read once (by its path).
    traces: Arc<Mutex<BTreeMap<String, Arc<Trace>>>>,
    /// The fixes set beside their programs, made once.
    fix_checks: Arc<OnceLock<FixChecks>>,
}

/// Where a recording's folder comes from, which says whether it may be
/// kept in the data folder.
#[derive(Clone, Debug)]
enum Made {
    /// Read from a data folder: a recording already.
    Read,
    /// A run of the programs into a folder of the system's temporary
    /// files (removed with the last copy of the recording); `partial`
    /// where it ran some of them only.
    Ran { _folder: Arc<TemporaryFolder>, partial: bool },
    /// A recording shown in place of a run that could not be made here, and why.
    Shown { why: String },
}

/// A folder removed when dropped.
#[derive(Debug)]
pub(super) struct TemporaryFolder(pub(super) PathBuf);

impl Drop for TemporaryFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The most a fix's prediction may be off the fixed program's run, where
/// a third of the fix's measured gain is more.
pub const FIX_TOLERANCE: f64 = 0.10;

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
    /// The same fix predicted from the "before" program's run traced with
    /// the profiler's CUDA sync events, where the recording has one.
    pub with_sync_events: Option<Prediction>,
    /// Whether the "before" program waits for events: its sync-events
    /// trace then names each wait's streams, which its plain trace leaves
    /// to inference, and is the one judged ([`FixCheck::judged_us`]).
    pub waits_for_events: bool,
    /// The fixed program's untraced runs, ms.
    pub measured: Summary,
    /// The "before" program's untraced runs, ms.
    pub before_measured: Summary,
    /// The host's state around the traces and the runs compared, where
    /// the recording probed it.
    pub host: Option<super::programs::HostAround>,
}

impl FixCheck {
    pub fn predicted_ms(&self) -> f64 {
        self.prediction.predicted_us / 1e3
    }
    /// The prediction's error against the fixed program's median: -0.05 is 5% low.
    pub fn off(&self) -> f64 {
        self.predicted_ms() / self.measured.median - 1.0
    }
    /// The same for the judged prediction ([`FixCheck::judged_us`]).
    pub fn off_judged(&self) -> f64 {
        self.judged_us() / 1e3 / self.measured.median - 1.0
    }
    /// The measured gain of the fix: the "before" program's median over the
    /// fixed one's, less one (0.08: 8% faster).
    pub fn measured_gain(&self) -> f64 {
        self.before_measured.median / self.measured.median - 1.0
    }
    /// How far a prediction may be off and still agree: the smaller of
    /// [`FIX_TOLERANCE`] and a third of the measured gain (a fix that
    /// gains 8% must be predicted within 2.7%: predicting no change never
    /// agrees).
    pub fn tolerance(&self) -> f64 {
        FIX_TOLERANCE.min(self.measured_gain().max(0.0) / 3.0)
    }
    /// Whether the judged prediction agrees with the fixed program's run.
    pub fn agrees(&self) -> bool {
        self.off_judged().abs() < self.tolerance()
    }
    /// The prediction set beside the fixed program's run, µs: from the
    /// sync-events trace where the program waits for events (it reads
    /// which streams each wait joins); else the mean of the predictions
    /// from the program's two traced runs, where the recording has both
    /// (the host's own work moves from one run to the next: one trace is
    /// one sample of it); else the plain trace's.
    pub fn judged_us(&self) -> f64 {
        self.judged().0
    }
    /// Which traces [`FixCheck::judged_us`] comes from, in words.
    pub fn judged_from(&self) -> &'static str {
        self.judged().1
    }
    /// The judged prediction, µs, and which traces it comes from.
    fn judged(&self) -> (f64, &'static str) {
        let plain = self.prediction.predicted_us;
        match (&self.with_sync_events, self.waits_for_events) {
            (Some(synced), true) => (synced.predicted_us, "traced with CUDA sync events"),
            (Some(synced), false) => ((plain + synced.predicted_us) / 2.0, "the mean of its two traced runs"),
            (None, _) => (plain, "traced once"),
        }
    }
}

impl Recording {
    /// The recording in the folder `dir`, priced by `prices`.
    fn open(dir: &Path, prices: Arc<Prices>, made: Made) -> Result<Recording> {
        let programs = read_programs(dir)?;
        // Read with its data folder's prices where they hold it; a live run's, here.
        let recorded = prices.recorded_in(dir).cloned().unwrap_or_else(|| RecordedPrices::of(&programs, dir));
        Ok(Recording { dir: dir.to_path_buf(), programs, prices, recorded, made, traces: Arc::default(), fix_checks: Arc::default() })
    }

    /// The recording in `dir` (a folder holding `programs.json`), priced
    /// by the data folder it lies in (`<data>/<gpu>/pytorch-trace/`); a
    /// one-line error naming the file when it cannot be read.
    pub fn load(dir: &Path) -> Result<Recording> {
        let data = dir.parent().and_then(Path::parent).unwrap_or(dir);
        Self::open(dir, Arc::new(Prices::read(data)), Made::Read)
    }

    /// The recording in the folder `dir` that is not a data folder's (a
    /// made-up one, say), priced by `prices`.
    pub fn priced(dir: &Path, prices: Prices) -> Result<Recording> {
        Self::open(dir, Arc::new(prices), Made::Read)
    }

    /// A run of the programs into the temporary folder `dir` (removed with
    /// the recording), priced by the data folder `data`; `partial` where
    /// it ran some programs only.
    pub(super) fn ran(dir: &Path, data: &Path, partial: bool) -> Result<Recording> {
        let folder = Arc::new(TemporaryFolder(dir.to_path_buf()));
        Self::open(dir, Arc::new(Prices::read(data)), Made::Ran { _folder: folder, partial })
    }

    /// This recording shown in place of a run that could not be made, and why.
    pub(super) fn shown_instead(mut self, why: String) -> Recording {
        self.made = Made::Shown { why };
        self
    }

    /// Every GPU's recording under `data` (`<gpu>/pytorch-trace/`), newest
    /// first, priced by `data`'s recordings (read once for all).
    pub fn find(data: &Path) -> Result<Vec<Recording>> {
        let folders = std::fs::read_dir(data).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(data) },
            _ => LabError::io(format!("listing {}", display_path(data)), e),
        })?;
        let prices = Arc::new(Prices::read(data));
        let mut found = Vec::new();
        for dir in folders.flatten().map(|e| e.path().join(LAB)) {
            if dir.join(PROGRAMS_FILE).is_file() {
                found.push(Self::open(&dir, prices.clone(), Made::Read)?);
            }
        }
        found.sort_by(|a, b| b.programs.date.cmp(&a.programs.date).then_with(|| a.dir.cmp(&b.dir)));
        Ok(found)
    }

    /// What a CUDA graph's kernels take on this GPU, as this run measured it.
    pub fn graph_price(&self) -> Option<GraphPrice> {
        self.programs.calibration.as_ref()?.graph_price(display_path(&self.dir.join(PROGRAMS_FILE)))
    }

    /// The GPU's gap between a graph's kernels, µs, as this run measured it.
    pub fn graph_gap_us(&self) -> Option<f64> {
        self.graph_price().map(|g| g.gap_us)
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

    /// The trace file of `name`; an error naming `programs.json` where the
    /// program was timed untraced only.
    pub fn trace_path(&self, name: &str) -> Result<PathBuf> {
        match &self.program(name)?.trace {
            Some(file) => Ok(self.dir.join(file)),
            None => Err(LabError::BadData {
                path: display_path(&self.dir.join(PROGRAMS_FILE)),
                reason: format!("{name} was timed untraced only (--untraced-fixes): it has no trace"),
            }),
        }
    }

    /// Whether the recording has a trace of `name`.
    pub fn has_trace(&self, name: &str) -> bool {
        self.programs.programs.get(name).is_some_and(|p| p.trace.is_some())
    }

    /// The trace of `name`'s run traced with CUDA sync events, where the recording has one.
    pub fn sync_events_trace_path(&self, name: &str) -> Result<Option<PathBuf>> {
        Ok(self.program(name)?.sync_events.as_ref().map(|s| self.dir.join(&s.trace)))
    }

    /// The trace of `name`, read once.
    pub fn trace(&self, name: &str) -> Result<Arc<Trace>> {
        self.read_once(&self.trace_path(name)?)
    }

    /// The trace of `name`'s run with CUDA sync events, read once; none where the recording has none.
    pub fn sync_events_trace(&self, name: &str) -> Result<Option<Arc<Trace>>> {
        self.sync_events_trace_path(name)?.map(|p| self.read_once(&p)).transpose()
    }

    /// The trace file `path` of this recording, read once.
    fn read_once(&self, path: &Path) -> Result<Arc<Trace>> {
        let key = path.display().to_string();
        if let Some(t) = self.traces.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(crate::diagnose::read_trace(path, &mut |_, _| {})?);
        self.traces.lock().unwrap_or_else(|e| e.into_inner()).insert(key, t.clone());
        Ok(t)
    }

    /// Every lab 1 recording's link rates, which its copies are set beside.
    pub fn links(&self) -> &[LinkRates] {
        &self.prices.links
    }

    /// The what-if's prices for this recording's traces: its GPU's link
    /// rates, and what it measured itself (a live run's, not the committed
    /// one's): the graph gap, a DataLoader's cost per batch, the
    /// profiler's per recorded CPU op and the GPU's busy clock (read once,
    /// when the recording was opened).
    pub fn pricing(&self) -> Pricing {
        let mut pricing = self.prices.for_gpu(self.programs.gpu.as_deref());
        // A GPU with no lab 1 recording here (a learner's, live): the pinned
        // rate its own pinned program's copies ran at.
        if pricing.rates.is_none() {
            pricing.rates = self.traced_pinned_rates();
        }
        self.recorded.over(pricing)
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

    /// The diagnosis of `name`'s trace with its what-if
    /// ([`Recording::pricing`]): the one [`Recording::fix_checks`] made
    /// where it made one.
    pub fn diagnosis(&self, name: &str) -> Result<Diagnosis> {
        if let Some(d) = self.fix_checks.get().and_then(|f| f.diagnoses.get(name)) {
            return Ok(d.clone());
        }
        self.diagnosis_priced(name, &self.pricing())
    }

    /// The diagnosis of `name`'s trace, priced by `pricing`.
    fn diagnosis_priced(&self, name: &str, pricing: &Pricing) -> Result<Diagnosis> {
        let trace = self.trace(name)?;
        Ok(diagnosis_priced(&trace, &display_path(&self.trace_path(name)?), self.links(), pricing))
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
    /// Made once: later calls return the same.
    pub fn fix_checks(&self) -> Result<&FixChecks> {
        if let Some(f) = self.fix_checks.get() {
            return Ok(f);
        }
        let made = self.make_fix_checks()?;
        Ok(self.fix_checks.get_or_init(|| made))
    }

    fn make_fix_checks(&self) -> Result<FixChecks> {
        let mut out = FixChecks::default();
        let pricing = self.pricing();
        // Each "before" program's sync-events trace diagnosed once, however many fixes it has.
        let mut synced: std::collections::HashMap<String, Option<crate::diagnose::Diagnosis>> = std::collections::HashMap::new();
        for after in self.names() {
            for f in &self.program(after)?.fix_of {
                let (Ok(measured), Ok(before_measured)) = (self.untraced(after), self.untraced(&f.program)) else {
                    out.not_compared.push(format!("{} + {}: {after} or {} has no untraced runs in this recording", f.program, f.fix, f.program));
                    continue;
                };
                if !out.diagnoses.contains_key(&f.program) {
                    out.diagnoses.insert(f.program.clone(), self.diagnosis_priced(&f.program, &pricing)?);
                }
                let d = &out.diagnoses[&f.program];
                let bad = |reason: String| LabError::BadData { path: display_path(&self.trace_path(&f.program).unwrap_or_default()), reason };
                let w = d.what_if.as_ref().ok_or_else(|| bad(format!("no what-if: {}", d.what_if_error.as_deref().unwrap_or("?"))))?;
                match w.predictions.iter().find(|p| p.fix == f.fix) {
                    Some(p) => {
                        let waits_for_events = crate::diagnose::event_joins::JoinsKnown::of(&*self.trace(&f.program)?).is_some();
                        if !synced.contains_key(&f.program) {
                            let d = match self.sync_events_trace(&f.program)? {
                                Some(t) => {
                                    let shown = display_path(&self.sync_events_trace_path(&f.program)?.unwrap_or_default());
                                    Some(diagnosis_priced(&t, &shown, self.links(), &pricing))
                                }
                                None => None,
                            };
                            synced.insert(f.program.clone(), d);
                        }
                        let with_sync_events = synced[&f.program]
                            .as_ref()
                            .and_then(|d| d.what_if.as_ref())
                            .and_then(|w| w.predictions.iter().find(|q| q.fix == f.fix).cloned());
                        out.checks.push(FixCheck {
                            before: f.program.clone(),
                            fix: f.fix.clone(),
                            after: after.to_string(),
                            prediction: p.clone(),
                            with_sync_events,
                            waits_for_events,
                            measured,
                            before_measured,
                            host: self.programs.host_around(&f.program, after),
                        })
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

impl Recorded for Recording {
    type Results = Recording;
    /// The run's folder already says what GPU it ran on (`programs.json`).
    fn new(_lab: &str, _fingerprint: Fingerprint, results: Recording) -> Recording {
        results
    }
    fn load(dev: &Path, lab: &str) -> Result<Option<Recording>> {
        let dir = dev.join(lab);
        if !dir.join(PROGRAMS_FILE).is_file() {
            return Ok(None);
        }
        Recording::load(&dir).map(Some)
    }
    /// A copy of the run's folder as `<data>/<gpu>/pytorch-trace/` (what
    /// was there goes); a run of some programs only, or a recording shown
    /// instead of a run, is not kept.
    fn save(&self, data: &Path) -> Result<Kept> {
        match &self.made {
            Made::Read => Ok(Kept::Not("it was read from the data folder, not run".into())),
            Made::Shown { why } => Ok(Kept::Not(format!("the recorded traces were shown, not run ({why})"))),
            Made::Ran { partial: true, .. } => Ok(Kept::Not("--programs runs part of the set, and the recording holds the whole of it".into())),
            Made::Ran { partial: false, .. } => {
                let to = data.join(crate::units::slug(self.gpu())).join(LAB);
                replace_folder(&self.dir, &to)?;
                Ok(Kept::At(to))
            }
        }
    }
    fn results(&self) -> &Recording {
        self
    }
    fn gpu(&self) -> String {
        Recording::gpu(self).to_string()
    }
    fn origin(&self) -> String {
        Recording::origin(self)
    }
    fn measured_here(&self) -> bool {
        matches!(self.made, Made::Ran { .. })
    }
}

/// `to` made a copy of the folder `from` (what was in `to` goes): copied
/// beside it first and swapped in whole, so a copy that fails leaves the
/// recording as it was.
fn replace_folder(from: &Path, to: &Path) -> Result<()> {
    let io = |what: &str, p: &Path, e| LabError::io(format!("{what} {}", display_path(p)), e);
    let fresh = to.with_extension("new");
    if fresh.exists() {
        std::fs::remove_dir_all(&fresh).map_err(|e| io("emptying", &fresh, e))?;
    }
    std::fs::create_dir_all(&fresh).map_err(|e| io("making", &fresh, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io("listing", from, e))?.flatten() {
        std::fs::copy(entry.path(), fresh.join(entry.file_name())).map_err(|e| io("copying into", &fresh, e))?;
    }
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| io("emptying", to, e))?;
    }
    std::fs::rename(&fresh, to).map_err(|e| io("moving into place", to, e))
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
        let dir = Recording::find(&data).unwrap().into_iter().find(|r| r.dir.to_string_lossy().contains("h100")).unwrap().dir;
        let rec = Recording::priced(&dir, Prices::default()).unwrap();
        let rates = rec.traced_pinned_rates().expect("pinned copies in pinned_one_stream");
        assert!(rates.points.iter().all(|p| p.gbps > 10.0 && p.gbps < 100.0), "{rates:?}");
        let f = rec.fix_checks().unwrap();
        assert!(f.not_compared.is_empty(), "{:?}", f.not_compared);
        for c in f.checks.iter().filter(|c| c.fix.contains("pinned")) {
            println!("{} + {}: predicted {:.2} ms, {} ran {:.2} ms ({:+.1}%)", c.before, c.fix, c.predicted_ms(), c.after, c.measured.median, 100.0 * c.off());
            assert!(c.off().abs() < 0.10, "{} + {}: {:+.1}%", c.before, c.fix, 100.0 * c.off());
            assert!(c.prediction.priced_by.as_deref().unwrap_or("").contains("traced pinned copies"), "{:?}", c.prediction.priced_by);
        }
    }

    /// A recording kept twice replaces the first whole; each run's
    /// temporary folder is its own and goes with its last copy.
    #[test]
    fn a_recording_is_priced_by_what_it_measured_itself_not_only_by_the_data_folder() {
        // Priced with no data folder's figures at all (as a live run is
        // before it is kept), the committed H200 recording still prices a
        // batch's handing over and the profiler's cost by its own calibration.
        let data = crate::measure::record::repo_root().join("data");
        let dir = Recording::find(&data).unwrap().into_iter().find(|r| r.dir.to_string_lossy().contains("h200")).unwrap().dir;
        let r = Recording::priced(&dir, super::super::prices::Prices::default()).unwrap();
        let pricing = r.pricing();
        let calibration = r.programs.calibration.as_ref().unwrap();
        let handover = pricing.batch_handover.expect("its own DataLoader calibration");
        assert_eq!(Some(handover.taken_over_us), calibration.handover_taken_over_us);
        assert_eq!(Some(handover.busy_loop_us), calibration.handover_loop_work_us);
        assert!(handover.from.ends_with("programs.json"), "{}", handover.from);
        let (cost, from) = pricing.profiler_us_per_cpu_op.expect("its own profiler cost");
        assert_eq!(Some(cost), super::super::prices::profiler_cost_us(&r.programs));
        assert!(from.ends_with("programs.json"), "{from}");
    }

    #[test]
    fn a_kept_run_replaces_the_folder_whole_and_each_run_folder_is_its_own() {
        let (from, data) = (crate::testing::temp_dir("pytorch-trace-from"), crate::testing::temp_dir("pytorch-trace-data"));
        let to = data.join("gpu").join(LAB);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(to.join("old.json.gz"), "old").unwrap();
        std::fs::write(from.join("new.json.gz"), "new").unwrap();
        replace_folder(&from, &to).unwrap();
        let names: Vec<String> = std::fs::read_dir(&to).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["new.json.gz"]);
        assert!(!to.with_extension("new").exists());
        let (a, b) = (super::super::scratch_folder("test"), super::super::scratch_folder("test"));
        assert_ne!(a, b, "two runs of one process share no folder");
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
        let r = Recording::priced(&dir, Prices::default()).unwrap();
        assert_eq!((r.gpu(), r.graph_gap_us()), ("no GPU", None));
        let f = r.fix_checks().unwrap();
        assert!(f.checks.is_empty() && f.not_compared.len() == 1, "{f:?}");
        assert!(r.untraced("pinned_one_stream").unwrap_err().to_string().contains("a CPU smoke run"));
        std::fs::write(dir.join(PROGRAMS_FILE), "{\"traceEvents\": []}").unwrap();
        let e = Recording::priced(&dir, Prices::default()).unwrap_err().to_string();
        assert!(e.contains(PROGRAMS_FILE) && e.contains("not lab 10's programs.json") && !e.contains('\n'), "{e}");
    }
}
