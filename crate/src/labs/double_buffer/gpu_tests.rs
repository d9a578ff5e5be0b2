//! Lab 3's test on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::double_buffer::{exercise, measure, pipelined, DoubleBufferConfig};
use crate::present::progress::ProgressMode;
use crate::testing::gpu_or_skip;

#[test]
fn small_double_buffer_run_verifies_and_the_checker_judges_it() {
    let Some(gpu) = gpu_or_skip("small_double_buffer_run_verifies_and_the_checker_judges_it") else {
        return;
    };
    let cfg = DoubleBufferConfig { batches: 8, batch_elements: 1 << 20, repeats: 2, warmup: 1, ..DoubleBufferConfig::default() };
    let r = measure::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    println!("{} (speed-up {:.2})", r.summary(), r.speedup());
    assert_eq!(r.pipelined_timeline.spans.iter().filter(|s| s.label.starts_with("H2D")).count(), 8);
    let good = exercise::check_on_gpu(&gpu, &r, std::sync::Arc::new(pipelined)).unwrap();
    println!("{good}");
    assert!(!good.to_string().contains("race") && !good.to_string().contains("wrong data"), "{good}");
    // The deliberately wrong schedule: host buffer refilled too early.
    let early = exercise::check_on_gpu(&gpu, &r, std::sync::Arc::new(exercise::refills_host_buffer_too_early)).unwrap();
    println!("{early}");
    assert!(!early.passed && early.to_string().contains("race"), "{early}");
}
