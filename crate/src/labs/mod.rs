//! The labs: one folder per lab, each listed once in [`ALL`] through its
//! table entry (`lab_kit::Entry`). A lab keeps what is its own: its plans
//! and runs (`measure`), its closed forms (`model`), its exercise and
//! checker (`exercise`), its charts, its settings, its record type and its
//! table entry. What every lab is made of is in `lab_kit`.
//!
//! May use: the safe types of `gpu` (never `gpu::driver`), `pipeline`,
//! `measure`, `present`, `units` and `lab_kit`; lab 10 (`pytorch_trace`)
//! also `diagnose`, the trace reader it teaches with, and lab 1's recorded
//! link rates (`bandwidth::recorded_link_rates`), which price its fixes.

pub mod bandwidth;
pub mod callback;
pub mod double_buffer;
pub mod kernel_pipeline;
pub mod memory;
pub mod multi_gpu;
pub mod offload;
pub mod overlap;
pub mod pytorch_trace;
pub mod streams;

use crate::lab_kit::Lab;

/// Every lab, in course order.
pub static ALL: [&dyn Lab; 10] = [
    &bandwidth::ENTRY,
    &overlap::ENTRY,
    &double_buffer::ENTRY,
    &callback::ENTRY,
    &streams::ENTRY,
    &memory::ENTRY,
    &kernel_pipeline::ENTRY,
    &multi_gpu::ENTRY,
    &offload::ENTRY,
    &pytorch_trace::ENTRY,
];

/// Every kernel of `kernels/`: the pipelines' compute kernel and each
/// lab's own, in course order.
pub fn kernels() -> Vec<&'static crate::gpu::kernels::KernelSource> {
    std::iter::once(&crate::gpu::kernels::COMPUTE).chain(ALL.iter().flat_map(|l| l.kernels().iter().copied())).collect()
}

/// The lab called `name`.
pub fn find(name: &str) -> Option<&'static dyn Lab> {
    ALL.iter().copied().find(|l| l.name() == name)
}

#[cfg(test)]
mod tests {
    /// Each `.cu` file of kernels/ is the compute kernel or a lab's, once:
    /// a kernel no lab lists is never compiled by the tests.
    #[test]
    fn every_kernel_file_is_the_compute_kernel_or_a_labs_own() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|f| f.ends_with(".cu")).collect();
        files.sort();
        let mut listed: Vec<String> = super::kernels().iter().map(|k| k.file.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed, "kernels/ and the labs' kernels (labs::kernels) disagree");
    }
}
