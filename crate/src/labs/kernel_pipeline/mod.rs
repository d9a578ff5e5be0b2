//! Lab 7: pipelining inside a kernel. Streams keep the GPU fed; inside one
//! kernel, loading tile N+1 from device memory while computing tile N keeps
//! each SM busy. The kernels of `kernels/tile_*.cu` (naive tiled,
//! asynchronous copies with 1 to 4 stages, warp-specialized, the TMA) run
//! over one workload, each against the device-memory ceiling (the fastest
//! device-to-device copy of the input's size or larger, measured in the
//! same run), beside a plain CUDA kernel of the same workload written as
//! the CUDA programming guide writes a two-stage pipeline
//! (`kernels/tile_plain.cu`): the yardstick the lab's own are held to.
//! Two timelines show it: one round of every kernel on the stream, and,
//! from traced builds of four kernels, what each warp of one block does
//! when.
//!
//! Its parts: `settings` (the options and every kernel a run times),
//! `kernel` (the tile kernels, loaded and launched), `builds` (every
//! distinct build compiled once, in parallel, and loaded once), `measure`
//! (the run on a GPU), `results` (what a run holds and its table),
//! `headline` (the run in words, the headline), `charts`, `warps` (block
//! 0's warps as a timeline), `exercise` with `checker` and `ptx_checks`
//! (the learner's double-buffered kernel). This file holds the lab's name,
//! its notebook entry points and its entry in the lab table, and names
//! the types the notebook, the tests and other modules use.
//!
//! May use what every lab may (see `labs`).

pub mod builds;
pub mod charts;
pub mod checker;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod headline;
pub mod kernel;
pub mod measure;
pub mod ptx_checks;
#[cfg(test)]
mod recorded_tests;
pub mod results;
pub mod settings;
pub mod warps;

use crate::error::{LabError, Result};
use crate::present::gantt::Gantt;
pub use results::{CopyPoint, KernelPipelineResults, VariantResult};
pub use settings::{BlocksPerSm, KernelPipelineConfig, Role, Variant};

pub const LAB: &str = "kernel-pipeline";

pub type KernelPipelineRecord = crate::measure::record::Record<KernelPipelineResults>;

/// Notebook entry points for lab 7.
impl crate::lab_kit::LabRun<KernelPipelineResults> {
    /// Every kernel: resources, time, GB/s, share of the ceiling.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// Share of the ceiling against stages in flight.
    pub fn chart(&self) -> crate::present::chart::Figure {
        self.record.results.chart(&self.origin())
    }
    /// What each warp of block 0 does when, in four kernels (from traced
    /// builds).
    pub fn warps(&self) -> Result<Gantt> {
        self.record.results.warp_chart(&self.origin()).ok_or_else(|| self.predates("the warp timeline"))
    }
    /// One round on the stream: a D2D copy of the input and every kernel.
    pub fn round(&self) -> Result<Gantt> {
        self.record.results.round_chart(&self.origin()).ok_or_else(|| self.predates("the round's timeline"))
    }
    fn predates(&self, what: &str) -> LabError {
        LabError::config(format!(
            "{}: this recording has no {what} (it was made before the lab traced it): run `overlap-lab kernel-pipeline` to record again",
            self.origin()
        ))
    }
    /// Checks the learner's double-buffered kernel in `path` (read when
    /// called, so edits to the file count): on a GPU, its outputs and its
    /// speed against the naive kernel; with none, its compile and copies.
    pub fn check_double_buffered(&self, path: &str) -> crate::lab_kit::check::CheckReport {
        let cfg = KernelPipelineConfig { repeats: 9, ..self.record.results.config.clone() };
        let source = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                let mut rep = crate::lab_kit::check::CheckReport::new(exercise::EXERCISE).answering(exercise::EXERCISES[0].id);
                rep.problem(format!("could not read {path}: {e}"));
                return rep;
            }
        };
        let file = std::path::Path::new(path).file_name().map_or(path.to_string(), |f| f.to_string_lossy().into_owned());
        self.check(
            exercise::EXERCISE,
            &exercise::EXERCISES[0],
            cfg.device,
            |gpu| exercise::check_on_gpu(gpu, &file, &source, &cfg),
            || exercise::check_offline(&file, &source, &cfg),
        )
    }
}

/// Lab 7's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<KernelPipelineConfig, KernelPipelineResults> = crate::lab_kit::Entry {
    number: 7,
    name: LAB,
    module: module_path!(),
    teaches: "Pipelining inside a kernel: async copies to shared memory, stages, warp specialization, the TMA",
    builds_on: &[(2, "overlap: work in flight while other work runs")],
    kernels: &[&kernel::TILE_NAIVE, &kernel::TILE_ASYNC, &kernel::TILE_WARP_SPECIALIZED, &kernel::TILE_TMA, &kernel::TILE_PLAIN],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("regs, smem, occ, bps, lcl", "registers per thread, shared memory per block, resident share of an SM's threads, blocks per SM launched, spilled bytes per thread"),
        crate::lab_kit::Word::new("stage, tile, TMA", "tiles in flight per block, the block's unit of work, the tensor memory accelerator's bulk copies"),
    ],
    about: "Lab 7: tile kernels (naive, async copies with 1-4 stages, warp-specialized, TMA) against the device-memory ceiling, beside a plain CUDA two-stage kernel",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: charts::report,
    headline: KernelPipelineResults::headline,
    headline_figures: KernelPipelineResults::headline_figures,
    timelines: |rec, o| [rec.results.warp_chart(o), rec.results.round_chart(o)].into_iter().flatten().collect(),
    fixture: fixture::results,
};
