//! What a lab 10 recording's `programs.json` says (what
//! `crate/reference/lab10_trace.py` wrote: each program's untraced runs,
//! its trace file, which program it fixes and by what fix, the GPU's
//! calibration), read with a one-line error naming the file. Below both
//! the recording and the prices, which each read it.
//!
//! May use: `error`, `measure::record` (how outputs name a file).

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
