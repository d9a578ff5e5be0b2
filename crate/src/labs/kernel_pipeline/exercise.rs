//! Lab 7's exercise: the learner makes the naive kernel double-buffered in
//! `notebooks/exercises/07-double-buffered.cu`. This file is the exercise
//! as the course lists it ([`EXERCISES`]: what it asks, the file answer and
//! the problems a check with no GPU finds in it, the hints), the shape and
//! vector width the learner's kernel is built at, and the solution. The
//! checker is in `checker.rs` (compile, PTX, outputs, time; re-exported
//! here), what the source and the PTX say in `ptx_checks.rs`.
//!
//! May use: `super::checker`, `super::ptx_checks`, `super::kernel`,
//! `super::settings`, `lab_kit::check` and `lab_kit::progress`.

use super::checker::{check_offline_with, NEEDS_A_GPU};
use super::settings::KernelPipelineConfig;
use crate::lab_kit::progress::{Examples, Exercise, FileAnswer};

pub use super::checker::{check_offline, check_on_gpu, shape, Toolchain, EXERCISE, GIVEN_VECTOR_WIDTH, SOLUTION_SLACK};
pub use super::ptx_checks::{
    entry_params, launch_problem, pointer_problem, ptx_problem, signature_problem, source_problem, LAUNCH_PARAMS, SMEM_LIMIT_SM90, STATIC_SMEM_LIMIT,
};

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise {
    id: "07-kernel-pipeline",
    asks: "a double-buffered tile kernel",
    file: Some(FileAnswer { path: "exercises/07-double-buffered.cu", problems: offline_problems }),
    hints: HINTS,
    // The wrong one: the given kernel, answered only with a comment, still
    // copies through registers.
    examples: Examples::File {
        right: || solution_source().to_string(),
        wrong: |given| format!("// my answer: not yet\n{given}"),
        mistake: "no asynchronous copy",
    },
}];

/// What [`check_offline`] finds wrong in `source` at the lab's default
/// settings (the recordings' too; the notebook's check uses its recording's),
/// beyond needing a GPU for the rest (nothing, where this machine cannot
/// compile it, [`Toolchain::problem`]: the verdict saved by the notebook
/// stands then).
fn offline_problems(source: &str) -> Vec<String> {
    let toolchain = Toolchain::here();
    if toolchain.problem(source).is_some() {
        return Vec::new();
    }
    let rep = check_offline_with(&toolchain, "07-double-buffered.cu", source, &KernelPipelineConfig::default());
    rep.problems().filter(|p| *p != NEEDS_A_GPU).map(String::from).collect()
}

/// The solution: the lab's own asynchronous-copy kernel (kernels/tile_async.cu).
pub fn solution_source() -> &'static str {
    super::kernel::TILE_ASYNC.source
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "While a block computes one tile, the next tile can already be on its way into shared memory: two slots, one being filled and one being read.",
    "Asynchronous copies (`cuda::memcpy_async` through a `cuda::pipeline`) do not pass through registers; commit each tile's copies as one batch and wait only for the oldest.",
    "A slot may be refilled only after every thread has finished reading it, and the kernel's name and parameters must stay as the lab launches them.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_that_cannot_be_read_is_a_failed_check_naming_it() {
        let run = crate::lab_kit::LabRun::<super::super::KernelPipelineResults>::recorded(super::super::LAB, "test".into()).unwrap();
        let rep = run.check_double_buffered("exercises/no-such-file.cu");
        assert!(!rep.passed && rep.to_string().contains("could not read exercises/no-such-file.cu"), "{rep}");
    }

    /// The hints come one at a time, from the first.
    #[test]
    fn hints_come_one_at_a_time() {
        assert_eq!(super::HINTS.len(), 3);
        assert!(super::hint(1).contains(super::HINTS[0]), "{}", super::hint(1));
    }
}
