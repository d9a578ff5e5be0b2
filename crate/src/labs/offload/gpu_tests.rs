//! Lab 9's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};

/// Lab 9 on a small model: every variant's passes verified against the
/// CPU (the ring's time beside copy-then-compute's printed), and the live
/// checker timing the ring and naming one slot doing all the work.
#[test]
fn offload_passes_are_verified_and_the_live_checker_judges_a_schedule() {
    use crate::labs::offload::forward::{copy_then_compute, ring, Weights};
    use crate::labs::offload::{exercise, measure as offload, OffloadConfig, Variant};
    let Some(gpu) = gpu_or_skip("offload_passes_are_verified_and_the_live_checker_judges_a_schedule") else {
        return;
    };
    let cfg = OffloadConfig {
        layers: 16,
        d_model: 1024,
        gpu_budget: 256,
        batches: vec![512, 4096],
        warmup: 1,
        repeats: 3,
        python: String::new(),
        sweep_batches: vec![512],
        sweep_budgets: vec![256],
        ..OffloadConfig::default()
    };
    let r = offload::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    println!("{}", r.summary());
    assert!(r.verified_passes >= 2 * 6 * 4 && r.max_error < offload::TOLERANCE, "{} passes, {:.1e}", r.verified_passes, r.max_error);
    // FP8 where the GPU has it: every pass within the tolerance the lab states, nothing clipped.
    let fp8 = gpu.compute_capability().unwrap() >= (8, 9);
    match &r.fp8 {
        Some(a) => assert!(a.verified_passes > 0 && a.max_error <= a.tolerance && a.range_used <= 1.0, "{a:?}"),
        None => assert!(!fp8, "no FP8 accuracy on a GPU with FP8: {:?}", r.fp8_missing),
    }
    // 4 bits likewise: held to the CPU's pass over the 4-bit values within
    // FP8's tolerance, and further off the FP16 reference than FP8 is not
    // asked (a figure), but off it by less than an unrelated row.
    match &r.int4 {
        Some(a) => assert!(a.verified_passes > 0 && a.max_error <= a.tolerance && a.range_used <= 1.0 && a.off_fp16 < 1.0, "{a:?}"),
        None => assert!(!fp8, "no 4-bit accuracy on a GPU with FP8: {:?}", r.int4_missing),
    }
    // The placement sweep: a grid at 256 MiB beside the planner's choice, each placement verified.
    let grid = r.sweeps.iter().find(|s| s.is_grid()).expect("a grid at 256 MiB");
    assert!(grid.measured.len() >= 3 && grid.planned().is_some(), "{grid:?}");
    for p in &r.points {
        // Without FP8, neither the FP8 nor the 4-bit variant.
        let expected = if fp8 { Variant::ALL.len() } else { Variant::ALL.len() - 2 };
        assert_eq!(p.variants.len(), expected);
        let planned = p.variant(Variant::Resident).unwrap().plan.as_ref().unwrap();
        assert!(planned.gpu_bytes <= cfg.gpu_budget << 20, "{planned:?}");
        let ring = p.variant(Variant::RingK).unwrap();
        let serial = p.variant(Variant::Pinned).unwrap();
        println!("{} tokens: the ring {:.3} ms, copy then compute {:.3} ms", p.batch, ring.ms.median, serial.ms.median);
    }
    assert!(!r.timeline.spans.is_empty());
    let rep = exercise::check_on_gpu(&gpu, &r, std::sync::Arc::new(ring)).unwrap();
    judged_only_on_time(&rep, "measured (fastest pass)", &["no overlap", "efficiency"]);
    let rep = exercise::check_on_gpu(
        &gpu,
        &r,
        std::sync::Arc::new(|f: &mut dyn crate::labs::offload::forward::Forward, t: &_| copy_then_compute(f, t, Weights::Pinned)),
    )
    .unwrap();
    assert!(!rep.passed && rep.to_string().contains("one slot of the 3 does all the work"), "{rep}");
}

/// Lab 9's dequantization kernel against its CPU twin, bit for bit: one
/// layer's two matrices (d = 512: 512 x 2048 and 2048 x 512) quantized on
/// the CPU, their packed bytes and scales uploaded, dequantized into E4M3
/// in a buffer poisoned first; every byte must be the CPU's
/// (`Int4Matrix::e4m3_bits`), and the words past the matrix untouched.
#[test]
fn the_dequantization_kernel_gives_the_cpus_e4m3_bytes_for_every_value() {
    use crate::gpu::host::{HostBuffer, PageableBuffer};
    use crate::labs::offload::{cpu::words_of_halves, int4, kernel::Dequant, network::Shape};
    let test = "the_dequantization_kernel_gives_the_cpus_e4m3_bytes_for_every_value";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if gpu.compute_capability().unwrap() < (8, 9) {
        crate::testing::skip_unless_required(test, "this GPU has no E4M3 conversion (compute capability 8.9 and up)");
        return;
    }
    let shape = Shape { layers: 1, d: 512 };
    let (mut w1, mut w2) = int4::quantize_layer(&int4::test_weights(shape), shape, 0);
    // Groups' scales spread down 13 binades below the largest, so that the
    // E4M3 bytes reach its subnormals and zero, not only its top binades.
    for m in [&mut w1, &mut w2] {
        for (i, s) in m.scales.iter_mut().enumerate() {
            *s = half::f16::from_f32(half::f16::from_bits(*s).to_f32() * 2f32.powi(-((i % 14) as i32))).to_bits();
        }
    }
    let dequant = Dequant::load(&gpu).unwrap();
    let stream = gpu.stream().unwrap();
    const POISON: u32 = 0xDEAD_BEEF;
    let words_of_bytes = |b: &[u8]| -> Vec<u64> { b.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect() };
    for (name, m) in [("W1", &w1), ("W2", &w2)] {
        let packed = PageableBuffer::from_words(words_of_bytes(&m.packed)).unwrap();
        let scales = PageableBuffer::from_words(words_of_halves(&m.scales)).unwrap();
        let (on_gpu_packed, on_gpu_scales) = (gpu.alloc(packed.bytes()).unwrap(), gpu.alloc(scales.bytes()).unwrap());
        stream.upload(&on_gpu_packed, &packed, packed.bytes()).unwrap();
        stream.upload(&on_gpu_scales, &scales, scales.bytes()).unwrap();
        let (bytes, scale) = m.e4m3();
        let subnormal_or_zero = bytes.iter().filter(|&&b| b & 0x78 == 0).count();
        assert!(subnormal_or_zero > bytes.len() / 20, "{name}: only {subnormal_or_zero} subnormal or zero bytes");
        let expected = words_of_bytes(&bytes);
        let tail = 8;
        let out = gpu.alloc(8 * (expected.len() + tail)).unwrap();
        stream.fill_u32(&out, POISON).unwrap();
        // SAFETY: every buffer lives until the download below has waited for the kernel.
        unsafe { dequant.enqueue(&stream, on_gpu_packed.span(), on_gpu_scales.span(), out.span(), m.rows, m.cols, scale) }.unwrap();
        let mut host = PageableBuffer::new(out.bytes()).unwrap();
        stream.download(&mut host, &out, out.bytes()).unwrap();
        let got = host.words();
        let wrong: Vec<usize> = (0..expected.len()).filter(|&i| got[i] != expected[i]).collect();
        assert!(wrong.is_empty(), "{name}: {} of {} words differ from the CPU's, the first at word {}: {:#018x} against {:#018x}", wrong.len(), expected.len(), wrong[0], got[wrong[0]], expected[wrong[0]]);
        let poison = (POISON as u64) << 32 | POISON as u64;
        assert!(got[expected.len()..].iter().all(|&w| w == poison), "{name}: the kernel wrote past the matrix");
        println!("{name}: {} x {}, all {} E4M3 bytes the CPU's (scale {scale:e})", m.rows, m.cols, m.rows * m.cols);
    }
    // A shape or scale the kernel cannot take is refused, not launched.
    let small = gpu.alloc(1 << 16).unwrap();
    for (rows, scale) in [(100, 1.0), (128, 0.0), (128, f32::NAN)] {
        // SAFETY: refused before any launch.
        let refused = unsafe { dequant.enqueue(&stream, small.span(), small.span(), small.span(), rows, 64, scale) };
        assert!(refused.is_err(), "{rows} rows, scale {scale}");
    }
}

/// What the dequantization of one layer of the lab's default network
/// (d = 2048: W1 and W2, 16 Mi values each) takes on this GPU, by CUDA
/// events (a warm-up, then the median of 20), printed beside the bytes it
/// reads and writes (`cargo test --release -p overlap-lab --lib
/// dequantization_cost -- --ignored --nocapture`, on a GPU).
#[test]
#[ignore]
fn dequantization_cost() {
    use crate::labs::offload::{int4, kernel::Dequant, network::Shape};
    let Some(gpu) = gpu_or_skip("dequantization_cost") else {
        return;
    };
    if gpu.compute_capability().unwrap() < (8, 9) {
        crate::testing::skip_unless_required("dequantization_cost", "this GPU has no E4M3 conversion (compute capability 8.9 and up)");
        return;
    }
    let shape = Shape { layers: 1, d: 2048 };
    let (w1, w2) = int4::quantize_layer(&int4::test_weights(shape), shape, 0);
    let dequant = Dequant::load(&gpu).unwrap();
    let stream = gpu.stream().unwrap();
    let bufs: Vec<_> = [&w1, &w2].iter().map(|m| (gpu.alloc(m.packed.len()).unwrap(), gpu.alloc(2 * m.scales.len()).unwrap(), gpu.alloc(m.rows * m.cols).unwrap())).collect();
    let scales = [w1.e4m3_scale(), w2.e4m3_scale()];
    let events: Vec<_> = (0..3).map(|_| gpu.timing_event().unwrap()).collect();
    let mut ms = Vec::new();
    for run in 0..21 {
        // Both matrices' kernels queued behind the first event, so that
        // the events time the GPU, not the host's launching.
        events[0].record(&stream).unwrap();
        for (i, (m, (p, s, o))) in [&w1, &w2].iter().zip(&bufs).enumerate() {
            // SAFETY: the buffers live until the stream is waited for below.
            unsafe { dequant.enqueue(&stream, p.span(), s.span(), o.span(), m.rows, m.cols, scales[i]) }.unwrap();
            events[i + 1].record(&stream).unwrap();
        }
        events[2].synchronize().unwrap();
        if run > 0 {
            ms.push(events[0].elapsed_ms(&events[2]).unwrap());
            println!("W1 {:.4} ms, W2 {:.4} ms", events[0].elapsed_ms(&events[1]).unwrap(), events[1].elapsed_ms(&events[2]).unwrap());
        }
    }
    ms.sort_by(f64::total_cmp);
    let (read, written) = (w1.bytes() + w2.bytes(), w1.rows * w1.cols + w2.rows * w2.cols);
    let median = ms[ms.len() / 2];
    println!(
        "one layer (d = 2048) dequantized: median {median:.4} ms ({:.4}..{:.4}), {:.1} MiB read, {:.1} MiB written, {:.0} GB/s",
        ms[0],
        ms[ms.len() - 1],
        read as f64 / (1 << 20) as f64,
        written as f64 / (1 << 20) as f64,
        (read + written) as f64 / median / 1e6
    );
}
