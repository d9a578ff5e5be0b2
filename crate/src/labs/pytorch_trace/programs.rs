//! What a lab 10 recording's `programs.json` says (what
//! `crate/reference/lab10_trace.py` wrote: each program's untraced runs,
//! its trace file, which program it fixes and by what fix, the GPU's
//! calibration, the host's state around each run where it was probed),
//! read with a one-line error naming the file. Below both
//! the recording and the prices, which each read it.
//!
//! May use: `error`, `measure::record` (how outputs name a file),
//! `measure::stats` (a median).

use super::PROGRAMS;
use crate::diagnose::replay::GraphPrice;
use crate::error::{LabError, Result};
use crate::measure::record::display_path;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

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

impl Calibration {
    /// What a CUDA graph's kernels take, as this calibration measured
    /// them (its file named `from`); none where it measured no gap.
    pub fn graph_price(&self, from: String) -> Option<GraphPrice> {
        let mut branch_spacing_us: Vec<(usize, f64)> = self
            .graph_branch_spacing_us
            .iter()
            .flatten()
            .filter_map(|(branches, &us)| Some((branches.parse::<usize>().ok().filter(|&b| b > 0)?, us)))
            .collect();
        branch_spacing_us.sort_by_key(|&(branches, _)| branches);
        Some(GraphPrice { gap_us: self.graph_gap_us?, least_kernel_us: self.graph_gap_kernel_us, branch_spacing_us, from })
    }
}

/// What the script measured of the GPU before the programs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Calibration {
    /// The GPU's gap between two kernels of one CUDA graph, µs.
    #[serde(default)]
    pub graph_gap_us: Option<f64>,
    /// The median time of that graph's small kernels, µs: the least a
    /// kernel of a graph takes (one that runs shorter launched eagerly
    /// still takes this long in a graph).
    #[serde(default)]
    pub graph_gap_kernel_us: Option<f64>,
    /// How far apart one branch of a CUDA graph starts its small kernels
    /// with so many branches side by side ("1", "2", "4", "8"), µs, timed
    /// by CUDA events before the profiler ran in the process.
    #[serde(default)]
    pub graph_branch_spacing_us: Option<BTreeMap<String, f64>>,
    /// A DataLoader's time per batch with `handover_workers` workers and
    /// pin_memory over samples that cost nothing to build, µs.
    #[serde(default)]
    pub handover_us: Option<f64>,
    /// The same with one worker, µs.
    #[serde(default)]
    pub handover_one_worker_us: Option<f64>,
    #[serde(default)]
    pub handover_workers: Option<usize>,
    /// The wait for the first batch with `handover_workers` workers, from
    /// asking for the loader's iterator (its workers told to start), µs.
    #[serde(default)]
    pub handover_first_batch_us: Option<f64>,
    /// What the loop loses a batch while busy with its own work between
    /// batches (asking for it, the interpreter the pinning thread holds,
    /// and, where the recording also has `handover_taken_over_ready_us`,
    /// the host its workers share as they build the loader programs'
    /// batches; older recordings timed it over ready samples): its time a
    /// batch then less that work's alone, µs.
    #[serde(default)]
    pub handover_taken_over_us: Option<f64>,
    /// That loop's own work between batches alone, µs (what it lost
    /// `handover_taken_over_us` over).
    #[serde(default)]
    pub handover_loop_work_us: Option<f64>,
    /// The loop's time a batch beside `handover_workers` workers building
    /// the loader programs' batches, against its own work between batches
    /// (none, then a few lengths up to `handover_loop_work_us`): from its
    /// first batch on, over the batches after it. Older recordings have
    /// none.
    #[serde(default)]
    pub handover_by_loop_work: Option<Vec<LoopWorkPoint>>,
}

/// One point of [`Calibration::handover_by_loop_work`].
#[derive(Clone, Debug, Deserialize)]
pub struct LoopWorkPoint {
    /// The loop's own work between two batches, timed alone, µs.
    pub loop_work_us: f64,
    /// The loop's time a batch with that work beside the loader, µs.
    pub per_batch_us: f64,
}

impl Calibration {
    /// What a DataLoader costs per batch it hands over, split between a
    /// worker and the loop's process: with `t1` the time per batch with one
    /// worker and `tk` with `k`, a pipeline of a worker stage (`w` a batch,
    /// `k` side by side) and the loop's process's (`m`) takes `t1 = max(w,
    /// m)` and `tk = max(w / k, m)`. Where more workers went faster, `w =
    /// t1`, and `m = tk` unless the workers alone explain `tk` (then `m` is
    /// hidden under them: 0, a lower bound); where they did not, `m = tk`
    /// and `w` is hidden (0). None where the recording has no such
    /// calibration.
    pub fn handover(&self) -> Option<(f64, f64)> {
        let (tk, t1, k) = (self.handover_us?, self.handover_one_worker_us?, self.handover_workers? as f64);
        Some(if tk < 0.9 * t1 { (t1, if tk > 1.1 * t1 / k { tk } else { 0.0 }) } else { (0.0, tk) })
    }
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
    /// Its trace, beside `programs.json`; none where it was timed untraced
    /// only (`--untraced-fixes`: a program that only applies a fix, whose
    /// trace no prediction reads).
    #[serde(default)]
    pub trace: Option<String>,
    /// The programs it fixes, and by what fix (as the what-if names it).
    #[serde(default)]
    pub fix_of: Vec<FixOf>,
    /// The traced run's time by the host's clock, ms.
    #[serde(default)]
    pub traced_host_ms: Option<f64>,
    /// What its trace holds, as far as the lab reads it.
    #[serde(default)]
    pub trace_facts: Option<TraceFacts>,
    /// A second traced run, recorded with the profiler's CUDA sync events
    /// (none in a CPU smoke run, or a recording made before they were).
    #[serde(default)]
    pub sync_events: Option<SyncEventsTrace>,
    /// The host's state before and after its (plain) traced run, where the
    /// recording probed it (the loader and training programs, from
    /// 2026-12-01).
    #[serde(default)]
    pub traced_host_probe: Option<Vec<HostProbe>>,
}

/// A program's run traced with the profiler's CUDA sync events
/// (`_ExperimentalConfig(enable_cuda_sync_events=True)`): which stream and
/// which event record each `cudaStreamWaitEvent` waited for.
#[derive(Clone, Debug, Deserialize)]
pub struct SyncEventsTrace {
    /// Its trace, beside `programs.json`.
    pub trace: String,
    /// The traced run's time by the host's clock, ms.
    #[serde(default)]
    pub traced_host_ms: Option<f64>,
    /// The host's state before and after it, where the recording probed it.
    #[serde(default)]
    pub host_probe: Option<Vec<HostProbe>>,
}

/// How fast the host ran at one moment, as `host_probe`
/// (`crate/reference/lab10_programs.py`) found it on the loop's core.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct HostProbe {
    /// One batch of the loader programs built on the CPU, ms (the state
    /// is judged by it; the probe's launch time is recorded beside it).
    pub batch_ms: f64,
}

/// An untraced run of a program timed in the host's fast state, with
/// the host's state around it.
#[derive(Clone, Debug, Deserialize)]
pub struct HostRun {
    /// The probes before and after it.
    pub host_probe: Vec<HostProbe>,
    /// Whether both found the host in its fast state.
    pub fast: bool,
    /// Whether it is among the runs the program's times are over.
    pub counted: bool,
}

/// The host's state around one comparison of a fix with the program that
/// applies it ([`Programs::host_around`]), where the recording probed it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostAround {
    /// The batch the probes built before and after each traced run of the
    /// program the fix starts from (its plain trace, then its sync-events
    /// trace), ms.
    pub traces_batch_ms: Vec<(f64, f64)>,
    /// The fixed program's untraced runs: those its times are over, all of
    /// them, and those the probes found in the fast state.
    pub runs_counted: usize,
    pub runs: usize,
    pub runs_fast: usize,
    /// The median batch the probes built around the runs counted, ms.
    pub runs_batch_ms: f64,
}

impl std::fmt::Display for HostAround {
    /// "traced at 4.26 -> 4.74 and 4.61 -> 4.27 ms a batch; the fix timed
    /// over 15 of 21 runs (15 in the fast state) at 4.60 ms a batch".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let traces: Vec<String> = self.traces_batch_ms.iter().map(|(a, b)| format!("{a:.2} -> {b:.2}")).collect();
        write!(
            f,
            "traced at {} ms a batch; the fix timed over {} of {} runs ({} in the fast state) at {:.2} ms a batch",
            traces.join(" and "),
            self.runs_counted,
            self.runs,
            self.runs_fast,
            self.runs_batch_ms
        )
    }
}

/// What a program's trace holds.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TraceFacts {
    /// Its events, counted by category (`cpu_op`, `kernel`, ...).
    #[serde(default)]
    pub events: BTreeMap<String, u64>,
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
    /// By the host's clock.
    #[serde(default)]
    pub host_ms: Option<Runs>,
    /// Each run with the host's state around it, where the program was
    /// timed in the host's fast state (empty before 2026-12-01).
    #[serde(default)]
    pub host_runs: Vec<HostRun>,
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

impl Programs {
    /// The host's state around the comparison of the fix that starts from
    /// `before` with `after`, the program that applies it: the probes
    /// around each traced run of `before`, and around `after`'s untraced
    /// runs. None where the recording did not probe both (one made before
    /// 2026-12-01, or a program timed whatever the host's state).
    pub fn host_around(&self, before: &str, after: &str) -> Option<HostAround> {
        let (b, a) = (self.programs.get(before)?, self.programs.get(after)?);
        let ends = |probes: Option<&Vec<HostProbe>>| Some((probes?.first()?.batch_ms, probes?.last()?.batch_ms));
        let traces_batch_ms: Vec<(f64, f64)> =
            [ends(b.traced_host_probe.as_ref()), ends(b.sync_events.as_ref().and_then(|s| s.host_probe.as_ref()))].into_iter().flatten().collect();
        let runs = &a.untraced.host_runs;
        let counted: Vec<&HostRun> = runs.iter().filter(|r| r.counted).collect();
        let around: Vec<f64> = counted.iter().flat_map(|r| r.host_probe.iter().map(|p| p.batch_ms)).collect();
        if traces_batch_ms.is_empty() {
            return None;
        }
        let runs_batch_ms = crate::measure::stats::Summary::of(&around).ok()?.median;
        Some(HostAround { traces_batch_ms, runs_counted: counted.len(), runs: runs.len(), runs_fast: runs.iter().filter(|r| r.fast).count(), runs_batch_ms })
    }
}

/// `programs.json` of the folder `dir`; a one-line error naming the
/// file when it cannot be read.
pub fn read_programs(dir: &Path) -> Result<Programs> {
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
    Ok(programs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording's two programs of one fix, probed as `lab10_trace.py` probes the loader programs.
    fn probed(before_probes: &str, runs: &str) -> Programs {
        let text = format!(
            r#"{{"command": "x", "date": "2026-12-01 06:00 UTC", "torch": "2.11", "gpu": "NVIDIA H200", "programs": {{
            "cpu_prepared_batches": {{"what": "a", "iterations": 40, "untraced": {{"device_ms": {{"samples": [220.0]}}}}, {before_probes}}},
            "dataloader_workers_pinned": {{"what": "b", "iterations": 40, "untraced": {{"device_ms": {{"samples": [110.0, 112.0]}}, "host_runs": {runs}}}}}}}}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    const P: fn(f64) -> String = |ms| format!(r#"{{"batch_ms": {ms}, "launch_us": 7.0}}"#);

    #[test]
    fn the_host_around_a_fixs_comparison_is_read_from_the_probes_of_both_programs() {
        let before = format!(r#""traced_host_probe": [{}, {}], "sync_events": {{"trace": "s", "host_probe": [{}, {}]}}"#, P(4.2), P(4.8), P(4.6), P(4.4));
        let runs = format!(
            r#"[{{"host_probe": [{}, {}], "fast": true, "counted": true}}, {{"host_probe": [{}, {}], "fast": false, "counted": false}},
               {{"host_probe": [{}, {}], "fast": true, "counted": true}}]"#,
            P(4.0),
            P(4.4),
            P(7.5),
            P(7.9),
            P(4.5),
            P(5.0)
        );
        let h = probed(&before, &runs).host_around("cpu_prepared_batches", "dataloader_workers_pinned").unwrap();
        // The counted runs' probes only: 4.0, 4.4, 4.5, 5.0.
        assert_eq!(h, HostAround { traces_batch_ms: vec![(4.2, 4.8), (4.6, 4.4)], runs_counted: 2, runs: 3, runs_fast: 2, runs_batch_ms: 4.45 });
        assert_eq!(h.to_string(), "traced at 4.20 -> 4.80 and 4.60 -> 4.40 ms a batch; the fix timed over 2 of 3 runs (2 in the fast state) at 4.45 ms a batch");
        // A recording that did not probe one side has nothing to say.
        assert_eq!(probed(r#""trace": "t""#, &runs).host_around("cpu_prepared_batches", "dataloader_workers_pinned"), None);
        assert_eq!(probed(&before, "[]").host_around("cpu_prepared_batches", "dataloader_workers_pinned"), None);
        assert_eq!(probed(&before, &runs).host_around("cpu_prepared_batches", "training_loop"), None);
    }
}
