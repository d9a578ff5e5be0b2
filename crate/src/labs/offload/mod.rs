//! Lab 9, the capstone: run a neural network whose weights do not fit the
//! GPU memory the lab lets itself use, at the speed of the host link.
//!
//! The network is a stack of layers, each two FP16 GEMMs (d x 4d, then 4d
//! x d, by cuBLAS) with a ReLU between ([`rig`], [`kernel`]). Its weights
//! live in host memory; the GPU holds a ring of a few layer buffers and the
//! activations, under `--gpu-budget`. A forward pass ([`forward`]) uploads
//! each layer's weights into a slot of the ring and runs the layer from
//! it. Per layer the bound is the slower of the two, the upload at the
//! link's rate and the GEMMs alone, each at its best (its fastest quarter;
//! the upload the run's one, since it moves the same weights at every
//! batch): over a sweep of batch sizes it moves from the link to the GPU's
//! arithmetic, and the crossover batch is where compute hides the stream.
//!
//! Ten variants, each a pass on the one runner ([`Variant`]): pageable
//! weights copied then computed, pinned copied then computed, a ring of 2
//! on a copy stream ordered by events, a ring of K with the copy stream at
//! high priority, that pass captured as a CUDA graph, and that pass with
//! its hidden activations from the stream-ordered pool; then past the
//! streaming bound, by changing the problem: the ReLU fused into the
//! first GEMM's epilogue, the budget spent on resident layers as the
//! planner places them ([`placement`]), FP8 weights (half the bytes
//! over the link, each GEMM quantizing its output in its epilogue) where
//! the GPU has FP8, and 4-bit weights (a quarter of the bytes and 3%:
//! [`int4`]), each layer dequantized into E4M3 on the GPU ([`kernel`])
//! before FP8's GEMMs. A sweep over the budget shows tokens/s against GPU
//! memory, and the planner's choice beside the best of a measured grid of
//! placements. Each is predicted
//! by the queue model from the costs measured alone (the pass recorded on
//! the dry run, no GPU), verified against the CPU on sampled rows
//! ([`cpu`]), and set beside PyTorch in the same run ([`mod@reference`]).
//! The exercise ([`exercise`]) has the learner write the ring's prefetch
//! schedule, and then place the layers under a budget
//! ([`exercise_placement`]). [`measure::run`] runs it all; [`results`]
//! holds what it found, [`tables`] and [`charts`] show it.
//!
//! The files stand in floors, each using only those below it. With no
//! GPU: [`network`] (the shape, the kinds of layer, a placement), then
//! [`forward`] (the vocabulary, the passes, the queue model's time of a
//! pass), [`config`], [`variant`], [`placement`] (the planner),
//! [`mod@reference`] (PyTorch's script and its times), [`results`],
//! [`tables`], [`charts`], [`exercise_placement`]. Then the kernels
//! ([`kernel`], with the ReLU's rule on one value for the CPU), the CPU's
//! reference ([`cpu`]), the 4-bit weights on the CPU ([`int4`]), and the
//! GPU side: the weights' host copies ([`host_copies`]), [`rig`], the
//! accuracy a pass is held to ([`accuracy`]), [`live`] (a pass on the runner), [`measure`], and
//! the prefetch checker ([`exercise`]). This
//! file hands their names on, and holds the lab's entry.
//!
//! May use: what every lab may (see `labs`).

pub mod accuracy;
pub mod charts;
pub mod config;
pub mod cpu;
pub mod exercise;
pub mod exercise_placement;
#[doc(hidden)]
pub mod fixture;
pub mod forward;
pub mod host_copies;
pub mod int4;
#[cfg(test)]
mod gpu_tests;
pub mod kernel;
pub mod live;
pub mod measure;
pub mod network;
pub mod placement;
#[cfg(test)]
mod recorded_tests;
pub mod reference;
pub mod results;
pub mod rig;
pub mod tables;
pub mod variant;

pub use config::OffloadConfig;
pub use network::Shape;
pub use results::{placement_bound_ms, BatchPoint, Fp8Accuracy, OffloadRecord, OffloadResults, PlacementPoint, PlacementSweep, VariantPoint, VariantTimeline};
pub use variant::Variant;

use crate::error::Result;
use network::Placement;
use std::path::{Path, PathBuf};

pub const LAB: &str = "offload";

/// Lab 9 in the report: the tokens/s chart, the timelines (+ Chrome trace), the budget and precision charts, the summary.
pub fn report(rec: &OffloadRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    use crate::present::chart::Chart;
    let mut files = rec.results.throughput_chart(origin).save(dir)?;
    files.extend(charts::timeline_chart(&rec.results, origin).save(dir)?);
    if let Some(g) = charts::beyond_chart(&rec.results, origin) {
        files.extend(g.save(dir)?);
    }
    if let Some(f) = charts::budget_chart(&rec.results, origin) {
        files.extend(f.save(dir)?);
    }
    if let Some(f) = charts::precision_chart(&rec.results, origin) {
        files.extend(f.save(dir)?);
    }
    let trace = dir.join(format!("{LAB}-timeline.trace.json"));
    rec.results.timeline.save_chrome_trace(&trace)?;
    files.push(trace);
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}\n{}", rec.results.summary(), rec.results.precision_table()))?);
    Ok(files)
}

/// Notebook entry points for lab 9.
impl crate::lab_kit::LabRun<OffloadResults> {
    pub fn summary(&self) -> String {
        self.record.results.summary()
    }
    pub fn throughput_chart(&self) -> crate::present::chart::Figure {
        self.record.results.throughput_chart(&self.origin())
    }
    pub fn timeline_chart(&self) -> crate::present::gantt::Gantt {
        charts::timeline_chart(&self.record.results, &self.origin())
    }
    /// The passes past the streaming bound, traced (None in a recording made before them).
    pub fn beyond_chart(&self) -> Option<crate::present::gantt::Gantt> {
        charts::beyond_chart(&self.record.results, &self.origin())
    }
    /// Tokens/s against the GPU memory a placement holds (None without a sweep).
    pub fn budget_chart(&self) -> Option<crate::present::chart::Figure> {
        charts::budget_chart(&self.record.results, &self.origin())
    }
    /// Time a pass against the bytes of a layer, FP16, FP8 and 4 bits (None
    /// in a run without a 4-bit pass).
    pub fn precision_chart(&self) -> Option<crate::present::chart::Figure> {
        charts::precision_chart(&self.record.results, &self.origin())
    }
    /// The figures the precision chart draws, every batch.
    pub fn precision_table(&self) -> String {
        self.record.results.precision_table()
    }
    /// Checks a learner's prefetch schedule: live on a GPU, else on the
    /// dry run and the queue model with this recording's costs.
    pub fn check_prefetch(
        &self,
        schedule: impl Fn(&mut dyn forward::Forward, &forward::Task) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        let schedule: forward::PassFn = std::sync::Arc::new(schedule);
        self.check(
            "prefetch schedule",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, r, schedule.clone()),
            || exercise::check_on_model(r, &*schedule),
        )
    }
}

impl crate::lab_kit::LabRun<OffloadResults> {
    /// Checks two placements under `budget_mib` MiB at `batch` tokens, each
    /// (R resident layers, a ring of K): the FP16 layers' and the 4-bit
    /// layers' ([`exercise::check_fp16_and_4_bit`], on the queue model
    /// with this run's costs, live or recorded).
    pub fn check_placement(&self, budget_mib: usize, batch: usize, fp16: (usize, usize), four_bit: (usize, usize)) -> crate::lab_kit::check::CheckReport {
        let placed = |(resident, ring)| Placement { resident, ring };
        exercise::check_fp16_and_4_bit(&self.record.results, budget_mib, batch, placed(fp16), placed(four_bit)).answering(exercise::EXERCISES[1].id)
    }
}

/// Lab 9's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<OffloadConfig, OffloadResults> = crate::lab_kit::Entry {
    number: 9,
    name: LAB,
    module: module_path!(),
    teaches: "The capstone: a network bigger than the GPU's budget, its weights streamed over the link under cuBLAS GEMMs, then past that bound: resident layers, FP8 and 4-bit weights, fused epilogues",
    builds_on: &[(1, "pinned vs pageable"), (3, "double buffering with events"), (5, "stream priorities and graphs"), (6, "the stream-ordered pool")],
    kernels: &[&kernel::RELU_F16, &kernel::DEQUANT_INT4],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("layer, d, GEMM", "two FP16 matrix multiplications by cuBLAS (d x 4d, then 4d x d) with a ReLU between; d is the model's width"),
        crate::lab_kit::Word::new("GPU budget", "the GPU memory the lab lets itself use (--gpu-budget): the model's weights do not fit in it"),
        crate::lab_kit::Word::new("ring, slot, prefetch", "K layer buffers on the GPU reused in turn / one of them / a layer's upload issued while earlier layers compute"),
        crate::lab_kit::Word::new("tokens/s", "tokens (rows of a batch) through every layer per second"),
        crate::lab_kit::Word::new("link- / compute-bound, crossover", "uploads slower than the GEMMs / the other way round; the batch size where the two take as long"),
        crate::lab_kit::Word::new("epilogue, fused", "what a GEMM does as it writes its output (here the ReLU, or FP8's scaling) / done there, not by a kernel of its own"),
        crate::lab_kit::Word::new("resident, R / K", "a layer kept on the GPU for good / how many are, and the ring's slots for the rest; the planner picks both"),
        crate::lab_kit::Word::new("FP8, E4M3, scale, amax", "8-bit floats (4 exponent bits, 3 of mantissa) / a tensor's FP32 multiplier / its largest magnitude"),
        crate::lab_kit::Word::new("4-bit, group, dequantize", "weights as integers from -7 to 7, two a byte / the 128 inputs that share one FP16 scale / turn them back into FP8 on the GPU before the GEMMs"),
    ],
    about: "Lab 9: stream a network's weights over the link through a ring of GPU buffers, then past that bound (resident layers, FP8 and 4-bit weights, fused epilogues), against PyTorch",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.summary(),
    figures: report,
    headline: OffloadResults::headline,
    headline_figures: OffloadResults::headline_figures,
    timelines: |rec, o| std::iter::once(charts::timeline_chart(&rec.results, o)).chain(charts::beyond_chart(&rec.results, o)).collect(),
    fixture: fixture::results,
};

crate::lab_config!(OffloadConfig);
