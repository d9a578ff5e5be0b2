//! The labs: one folder per lab, each listed once in the lab table
//! ([`ALL`], one line each in `lab_table!`) through its entry
//! (`lab_kit::Entry`). A lab keeps what is its own: its plans and runs
//! (`measure`), its closed forms (`model`), its exercise, checker and
//! examples (`exercise`), its charts, its settings, its record type, its
//! fixture (`fixture`: results made up for tests) and its table entry,
//! which names its glossary words. What every lab is made of is in
//! `lab_kit`.
//!
//! May use: the safe types of `gpu` (never `gpu::driver`), `pipeline`,
//! `measure`, `present`, `units`, `lab_kit` and `testing` (fixtures);
//! lab 10 (`pytorch_trace`) also `diagnose`, the trace reader it teaches
//! with, and lab 1's results, whose recorded link rates price its fixes
//! (`pytorch_trace::prices`); lab 8 (`multi_gpu`) also `diagnose::ranks`,
//! whose `CollectiveRates` its recorded all-reduces are handed over as.

/// The lab table: each lab once, in course order, by its module's name.
/// A line here declares the lab's module and puts its entry (`<lab>::ENTRY`)
/// in [`ALL`], from which everything the tools know of a lab is derived.
macro_rules! lab_table {
    ($($lab:ident),* $(,)?) => {
        $(pub mod $lab;)*
        /// Every lab, in course order.
        pub static ALL: &[&dyn Lab] = &[$(&$lab::ENTRY),*];
    };
}

lab_table! {
    bandwidth,
    overlap,
    double_buffer,
    callback,
    streams,
    memory,
    kernel_pipeline,
    multi_gpu,
    offload,
    pytorch_trace,
}

use crate::lab_kit::Lab;

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
