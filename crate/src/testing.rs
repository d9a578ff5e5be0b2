//! Fixtures for tests (unit, integration, and the GPU-skipping ones): one
//! set, shared by every test that needs a recording or a GPU.

use crate::gpu::HostMemoryKind;
use crate::gpu::MachineFacts;
use crate::lab_kit::experiment::{Experiment, ExperimentResult, VariantResult as ExperimentVariant};
use crate::lab_kit::host_memory::{AcquireCost, PinCostPoint};
use crate::labs::bandwidth::{BandwidthConfig, BandwidthResults, Direction, TransferPoint};
use crate::labs::callback::{CallbackConfig, CallbackResults, CostPoint, Variant, VariantResult};
use crate::labs::double_buffer::{DoubleBufferConfig, DoubleBufferResults};
use crate::labs::memory::{self as memory, MemoryConfig, MemoryResults};
use crate::labs::overlap::{Intensity, IntensityResults, IssueOrder, OverlapConfig, OverlapPoint, OverlapResults, Parts};
use crate::labs::streams::experiments as streams_experiments;
use crate::labs::streams::issue_cost::{self as streams_issue, IssueCost, IssuePoint};
use crate::labs::streams::{StreamsConfig, StreamsResults};
use crate::measure::fingerprint::{Fingerprint, PcieLink};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::plan::{chunk, Costs};
use crate::pipeline::timeline::Timeline;
use crate::Bytes;
use std::path::PathBuf;

pub fn fingerprint() -> Fingerprint {
    Fingerprint {
        gpu_name: "Test GPU".into(),
        gpu_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        ordinal: 0,
        compute_capability: "9.0".into(),
        sm_count: 132,
        memory_bytes: 80 << 30,
        async_engine_count: 3,
        concurrent_kernels: true,
        driver_version: Some("580.0".into()),
        driver_cuda_version: "13.0".into(),
        build_cuda_version: "13.0".into(),
        pci_bus_id: "0000:3B:00.0".into(),
        pcie: Some(PcieLink {
            max_generation: 5,
            max_width: 16,
            current_generation: Some(5),
            current_width: Some(16),
            theoretical_gbps: PcieLink::lane_gbps(5).unwrap() * 16.0,
        }),
        host_cpu: "Test CPU".into(),
        host_cpus: 16,
    }
}

/// A fresh, empty directory under the system temp dir.
/// Three chunks (H2D, kernel, D2H each) over two streams and a host op,
/// predicted at 100 µs an op on two copy engines: a timeline for tests.
pub fn sample_timeline() -> crate::pipeline::timeline::Timeline {
    use crate::pipeline::op::{Access, OpKind};
    let mut s = crate::pipeline::schedule::Schedule::new();
    for c in 0..3u64 {
        let st = c as usize % 2;
        s.gpu_op(0, st, OpKind::H2d, &format!("H2D chunk {c}"), vec![Access::write("d", c * 8, c * 8 + 8)]);
        s.gpu_op(0, st, OpKind::Kernel, &format!("compute chunk {c}"), vec![Access::read("d", c * 8, c * 8 + 8)]);
        s.gpu_op(0, st, OpKind::D2h, &format!("D2H chunk {c}"), vec![]);
    }
    s.host_op(0, "check", vec![]);
    let t = crate::pipeline::predict::predict(&s, crate::pipeline::machine::Machine::engines(2), |_| 100.0);
    crate::pipeline::timeline::Timeline::from_schedule("predicted", "GPU 0 (Test GPU)", &s, &t, &[])
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("overlap-lab-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// For tests: what names a folder of the machine that ran something,
/// which nothing committed or rendered may hold (outputs name files as the
/// repository does).
pub const MACHINE_FOLDERS: &[&str] = &["/root/", "/work/", "/home/", "/tmp/", ".gpu/", "$OUT"];

/// For tests: a copy of the course's notebooks and lab 7's exercise file
/// in a fresh folder, with no saved verdicts: where a learner's answers
/// can be made up, and the committed notebooks read as a new learner's.
pub fn notebooks_copy(tag: &str) -> PathBuf {
    let from = crate::lab_kit::progress::default_notebooks_dir();
    let to = temp_dir(tag);
    std::fs::create_dir_all(to.join("exercises")).unwrap();
    for e in std::fs::read_dir(&from).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "ipynb") {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    for e in std::fs::read_dir(from.join("exercises")).unwrap().flatten() {
        std::fs::copy(e.path(), to.join("exercises").join(e.file_name())).unwrap();
    }
    to
}

/// For tests: whether NVRTC is here to compile with; where it is not, the
/// test says it skips, or fails where CI asks for NVRTC
/// (`OVERLAP_LAB_REQUIRE_NVRTC=1`: it installs NVRTC from PyPI).
pub fn nvrtc_or_skip(test: &str) -> bool {
    if crate::gpu::kernels::nvrtc_present() {
        return true;
    }
    assert!(std::env::var_os("OVERLAP_LAB_REQUIRE_NVRTC").is_none(), "{test}: NVRTC required but not found");
    eprintln!("SKIPPED {test}: NVRTC not found");
    false
}

/// For tests: compiles `k` for compute_90 with its test settings and
/// checks its PTX holds what it is meant to, and no FMA the compiler
/// contracted on its own (fmad=false: only the explicit ones). Returns the PTX.
pub fn check_ptx(k: &crate::gpu::kernels::KernelSource) -> String {
    let ptx = crate::gpu::kernels::compile_ptx_with(k, "compute_90", k.test_defines).unwrap_or_else(|e| panic!("{e}"));
    for needle in k.expect_in_ptx {
        assert!(ptx.contains(needle), "{}: PTX lacks `{needle}`:\n{ptx}", k.file);
    }
    assert!(!ptx.contains("mad.f32"), "{}: unexpected contracted mad", k.file);
    ptx
}

/// Set to 1 on a GPU machine: a GPU test that finds no GPU fails instead of
/// skipping, so a run that should have used the GPU cannot pass by skipping.
/// Set to 2 on a machine with two GPUs: the tests of several GPUs then also
/// fail where they find only one, instead of running both sides on GPU 0.
pub const REQUIRE_GPU_ENV: &str = "OVERLAP_LAB_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU_ENV`] asks for a GPU.
pub fn gpu_required() -> bool {
    gpus_required() > 0
}

/// How many GPUs [`REQUIRE_GPU_ENV`] asks for: 0 where unset or "0", the
/// number it names, and 1 for any other non-empty value.
pub fn gpus_required() -> usize {
    match std::env::var(REQUIRE_GPU_ENV) {
        Ok(v) if v.is_empty() => 0,
        Ok(v) => v.trim().parse().unwrap_or(1),
        Err(_) => 0,
    }
}

/// For GPU tests: the opened device, or None after saying why the test
/// skips. Panics (fails the test) instead when [`REQUIRE_GPU_ENV`] is set.
pub fn gpu_or_skip(test: &str) -> Option<crate::gpu::Gpu> {
    let avail = crate::gpu::Availability::probe();
    if !avail.is_ready() {
        skip_unless_required(test, &avail.reason());
        return None;
    }
    Some(crate::gpu::Gpu::open(0).expect("GPU present but could not be opened"))
}

/// Says `SKIPPED test: why`, or fails the test when a GPU is required.
pub fn skip_unless_required(test: &str, why: &str) {
    assert!(!gpu_required(), "{test}: {REQUIRE_GPU_ENV} is set but {why}");
    eprintln!("SKIPPED {test}: {why}");
}

// ---- one fixture set: a recording of each lab, with round numbers ----------

/// A summary of one value (no spread).
pub fn flat(v: f64) -> Summary {
    Summary { median: v, min: v, max: v, n: 1, middle: Some((v, v)) }
}

/// A synthetic sweep: pinned = 5 µs + bytes/50 GB/s each way; pageable
/// = 10 µs + bytes/10 GB/s up, /15 GB/s down; pinning priced at 1 GiB.
pub fn bandwidth_results() -> BandwidthResults {
    let cfg = BandwidthConfig::default();
    let mut transfers = Vec::new();
    for bytes in cfg.sizes() {
        for (kind, lat_us, up, down) in
            [(HostMemoryKind::Pinned, 5.0, 50.0, 50.0), (HostMemoryKind::Pageable, 10.0, 10.0, 15.0), (HostMemoryKind::Registered, 5.0, 50.0, 50.0)]
        {
            for (direction, gbps) in [(Direction::H2d, up), (Direction::D2h, down)] {
                let ms = lat_us * 1e-3 + bytes.0 as f64 / (gbps * 1e9) * 1e3;
                transfers.push(TransferPoint {
                    kind,
                    direction,
                    bytes,
                    copies_per_sample: 1,
                    device_ms: flat(ms),
                    host_call_ms: flat(if kind == HostMemoryKind::Pageable { ms } else { 0.005 }),
                    gbps: flat(bytes.0 as f64 / (ms * 1e-3) / 1e9),
                    gated: kind != HostMemoryKind::Pageable,
                    verified_samples: 1,
                    plain: None,
                });
            }
        }
    }
    BandwidthResults { config: cfg, transfers, pin_cost: vec![pin_cost_point()] }
}

/// Host memory priced at 1 GiB (acquire + release, ms): pageable new
/// 100 + 10, in a loop 1 + 0.1, pinned first 300 + 30, again 280 + 30,
/// registered 50 + 10.
pub fn pin_cost_point() -> PinCostPoint {
    let cost = |acquire: f64, release: f64| AcquireCost { acquire_ms: flat(acquire), release_ms: flat(release) };
    PinCostPoint {
        bytes: Bytes(1 << 30),
        pageable_first: cost(100.0, 10.0),
        pageable_reused: cost(1.0, 0.1),
        pinned_first: cost(300.0, 30.0),
        pinned_reused: cost(280.0, 30.0),
        registered: cost(50.0, 10.0),
    }
}

pub fn overlap_results() -> OverlapResults {
    let parts = Parts { h2d_ms: flat(2.4), kernel_ms: flat(2.4), d2h_ms: flat(2.4), both_copies_ms: flat(2.7) };
    let empty = Timeline::default();
    let point = OverlapPoint { chunks: 1, streams: 1, order: IssueOrder::DepthFirst, parts: parts.clone(), total_ms: flat(7.2), verified_runs: 1 };
    OverlapResults {
        config: OverlapConfig::default(),
        copy_engines: 3,
        intensities: vec![IntensityResults {
            intensity: Intensity::Balanced,
            iterations: 1800,
            parts,
            synchronous_ms: flat(7.3),
            points: vec![point],
            serial_timeline: empty.clone(),
            best_timeline: empty.clone(),
            best_predicted: empty,
        }],
        timeline_overhead_pct: 1.0,
        timeline_overhead_pairs_pct: None,
        timeline_source: String::new(),
    }
}

pub fn double_buffer_results() -> DoubleBufferResults {
    let empty = Timeline::default();
    DoubleBufferResults {
        config: DoubleBufferConfig::default(),
        iterations: 100,
        produce_ms: flat(0.05),
        copy_ms: flat(0.15),
        kernel_ms: flat(0.15),
        no_overlap_ms: flat(20.0),
        pipelined_ms: flat(10.0),
        no_overlap_timeline: empty.clone(),
        pipelined_timeline: empty,
        verified_runs: 1,
        timeline_overhead_pct: Some(1.0),
        timeline_overhead_pairs_pct: None,
        timeline_source: "cupti".into(),
    }
}

pub fn callback_results() -> CallbackResults {
    let cfg = CallbackConfig { iterations: 128, ..CallbackConfig::default() };
    let variants = Variant::ALL.iter().map(|&variant| VariantResult { variant, total_ms: flat(40.0), cpu_ms: flat(0.27) }).collect();
    CallbackResults {
        config: cfg,
        gpu_ms: flat(0.27),
        kernel_ms: flat(0.26),
        d2h_ms: flat(0.01),
        host_fn_round_trip_ms: flat(0.07),
        points: vec![CostPoint { cpu_over_gpu: 1.0, passes: 6, cpu_alone_ms: flat(0.25), variants }],
        timelines: Vec::<Timeline>::new(),
        timeline_overhead_pct: 0.0,
        timeline_overhead_pairs_pct: None,
        timeline_overhead_cpu_over_gpu: 0.5,
        timeline_source: "cuda events".into(),
        verified_runs: 1,
    }
}

/// Lab 5's results for a small run (2^14 elements, the default chunks and
/// streams) where every op costs its share of 1 ms per chunk and each
/// variant "measured" exactly what the model predicts: the experiments'
/// own plans, so every figure and table has real timelines to draw.
pub fn streams_results() -> StreamsResults {
    let config = StreamsConfig { elements: 1 << 14, issue_chunks: vec![2, 4], ..StreamsConfig::default() };
    let exps = streams_experiments::all(&config, -5);
    let mut costs = Costs::new();
    for plan in exps.iter().flat_map(|e| e.variants.iter()) {
        for (kind, n) in plan.distinct_ops().expect("the lab's plans model") {
            costs.insert((kind, n), n as f64 * config.chunks as f64 / config.elements as f64);
        }
    }
    let machine =
        MachineFacts { copy_engines: 3, h2d_ms: 8.0, d2h_ms: 8.0, both_ms: 8.0, wake_ms: 0.05, kernel_ms: 2.0, kernels_alternating_ms: 16.0, issue_ms: 0.003 };
    let experiments = exps
        .iter()
        .map(|e| {
            let mut r = experiment_as_modelled(e, machine, machine.machine(), &costs).expect("costs for every op");
            r.costs = Vec::new();
            for v in r.variants.iter_mut().filter(|v| v.name == streams_experiments::THREE_WAY) {
                v.bound_ms = Some(v.model_ms);
            }
            r
        })
        .collect();
    let issue_cost = Some(streams_issue_cost(&config, machine));
    StreamsResults {
        config,
        machine,
        iterations: 100,
        priority_range: (0, -5),
        costs: costs.into_iter().map(|((k, n), ms)| (k, n, ms)).collect(),
        experiments,
        issue_cost,
    }
}

/// Lab 5's issue-cost sweep at `config`'s chunk counts as the model sees
/// it, each way "measured" at its prediction: ops cost as in
/// [`streams_results`], issuing an op 0.4 ms (so the graph wins at the
/// smaller chunks), a graph launch 20 µs.
fn streams_issue_cost(config: &StreamsConfig, machine: MachineFacts) -> IssueCost {
    let machine = MachineFacts { issue_ms: 0.4, ..machine };
    let n = streams_issue::elements(config);
    let mut points = Vec::new();
    let mut drawn = None;
    for &chunks in &config.issue_chunks {
        let (gated, live) = streams_issue::plans(n, chunks);
        let (gm, lm) = (gated.dry_run().expect("models"), live.dry_run().expect("models"));
        let costs: Costs =
            gated.distinct_ops().expect("models").into_iter().map(|(k, e)| ((k, e), e as f64 * config.chunks as f64 / config.elements as f64)).collect();
        let live_model = live.prediction(&lm, machine.machine(), &costs).expect("costs");
        let model_gated = gated.prediction(&gm, machine.machine(), &costs).expect("costs").total_ms;
        let model_live = live_model.total_ms;
        let model_graph = 0.02 + model_gated;
        let ops = gm.schedule.ops.len();
        points.push(IssuePoint {
            chunks,
            chunk_bytes: 4 * chunk(n, chunks, 0).1 as u64,
            ops,
            live: flat(model_live),
            graph: flat(model_graph),
            issue_us_per_op: flat(400.0),
            plain: Some(flat(model_live * 0.98)),
            plain_issue_us_per_op: Some(flat(380.0)),
            driver_us_per_op: None,
            launch_us: flat(20.0),
            capture_ms: 0.5,
            instantiate_ms: 1.5,
            nodes: ops + 2 * chunks,
            model_gated,
            model_live,
            model_graph,
        });
        let t = live_model.timeline;
        drawn = Some((chunks, Timeline { title: "measured".into(), ..t.clone() }, t));
    }
    let (timeline_chunks, timeline, predicted) = drawn.expect("at least one chunk count");
    IssueCost { elements: n, machine, points, timeline_chunks, timeline, predicted }
}

/// Asserts that a checker's report failed and says `words`.
pub fn fails_with(rep: &crate::lab_kit::check::CheckReport, words: &str) {
    assert!(!rep.passed, "should fail: {rep}");
    assert!(rep.to_string().contains(words), "should say '{words}': {rep}");
}

/// Lab 6's results for a small run (2^16 elements in the default batches)
/// with the H100's findings: cuMemFree waits for all GPU work, cuMemAlloc
/// for nothing (0.3 ms a call, 0.1 right after a release), the pool's
/// pair 20 µs; the stall experiment "measured" as the model predicts it;
/// release-threshold points shaped like the H100's (threshold 0 costs
/// more with size, threshold max stays flat); zero-copy winning at one
/// read and losing beyond, as with a kernel half as long as the upload.
pub fn memory_results() -> MemoryResults {
    use crate::gpu::PoolUsage;
    use crate::pipeline::op::{Memory, OpKind};
    use crate::pipeline::plan::{cost_keys, REUSED};
    use memory::pool::{trace_sizes, Allocator, BatchPoint, BatchTrace, PairPoint};
    use memory::probes::{Beside, BusyWith, CallProbe, PROBED_MEMORY};
    use memory::zero_copy::{ZeroCopy, ZeroCopyPoint};
    let config = MemoryConfig { elements: 1 << 16, sizes_mib: vec![1, 16, 256], trace_batches: 12, passes: vec![1, 2, 4], ..MemoryConfig::default() };
    let n = chunk(config.elements, config.batches, 0).1;
    // (idle alloc, idle free, alloc again) per call; cuMemFree beside busy
    // work waits for it; cuMemAlloc runs 3x slower beside downloads.
    let call_ms = |m: Memory| match m {
        Memory::Device => (0.3, 0.13, 0.1),
        Memory::Pool => (0.017, 0.006, 0.016),
        _ => (16.0, 5.0, 15.0),
    };
    let probes: Vec<CallProbe> = PROBED_MEMORY
        .iter()
        .map(|&memory| {
            let (a, f, again) = call_ms(memory);
            let waits = memory == Memory::Device;
            CallProbe {
                memory,
                bytes: 4 * n as u64,
                alloc_idle_ms: flat(a),
                free_idle_ms: flat(f),
                alloc_again_idle_ms: flat(again),
                beside: BusyWith::ALL
                    .iter()
                    .map(|&busy| Beside {
                        busy,
                        alloc_ms: flat(if waits && busy == BusyWith::Downloads { 3.0 * a } else { a }),
                        free_ms: flat(if waits { 4.9 } else { f }),
                        alloc_left_ms: flat(5.0),
                        free_left_ms: flat(4.8),
                    })
                    .collect(),
            }
        })
        .collect();
    let device_waits = memory::probes::device_waits(&probes);
    // Every op of an experiment's plans: memory calls as above, GPU work 1
    // ms per batch of the stall pipeline, CPU work (the producer) twice that.
    let costs_of = |e: &crate::lab_kit::experiment::Experiment| {
        let mut costs = Costs::new();
        for plan in &e.variants {
            let model = plan.dry_run().expect("the lab's plans model");
            for (o, key) in model.schedule.ops.iter().zip(cost_keys(&model.schedule)) {
                let ms = match o.kind {
                    OpKind::Alloc(m) if key & REUSED != 0 => call_ms(m).2,
                    OpKind::Alloc(m) => call_ms(m).0,
                    OpKind::Free(m) => call_ms(m).1,
                    OpKind::Host => 2.0 * key as f64 / n as f64,
                    _ => key as f64 / n as f64,
                };
                costs.insert((o.kind, key), ms);
            }
        }
        costs
    };
    let e = memory::experiments::stall(&config);
    let costs = costs_of(&e);
    let facts =
        MachineFacts { copy_engines: 3, h2d_ms: 1.0, d2h_ms: 1.0, both_ms: 1.1, wake_ms: 0.02, kernel_ms: 1.0, kernels_alternating_ms: 8.0, issue_ms: 0.003 };
    let machine = Machine { device_waits, ..facts.machine() };
    let stall = experiment_as_modelled(&e, facts, machine, &costs).expect("costs for every op");
    let mib = |m: usize| (m as u64) << 20;
    let pairs = config
        .sizes_mib
        .iter()
        .flat_map(|&m| {
            let size = m as f64;
            [(Allocator::CuMemAlloc, 0.12 + 0.0008 * size), (Allocator::PoolThresholdZero, 0.12 + 0.0035 * size), (Allocator::PoolThresholdMax, 0.004)]
                .map(|(allocator, ms)| PairPoint { allocator, bytes: mib(m), ms: flat(ms) })
        })
        .collect();
    let sizes = trace_sizes(config.trace_base_mib << 20, config.trace_batches);
    let traces = Allocator::ALL
        .iter()
        .map(|&allocator| {
            let mut most = 0u64;
            let batches = sizes
                .iter()
                .map(|&bytes| {
                    let bytes = bytes as u64;
                    most = most.max(bytes);
                    let (ms, reserved) = match allocator {
                        Allocator::CuMemAlloc => (0.28, 0),
                        Allocator::PoolThresholdZero => (0.5, 0),
                        Allocator::PoolThresholdMax => (0.056, most),
                    };
                    BatchPoint { bytes, ms, after: PoolUsage { reserved, used: 0 } }
                })
                .collect();
            BatchTrace { allocator, batches }
        })
        .collect();
    let upload = 4.9;
    let kernel = 0.5 * upload;
    let points = config
        .passes
        .iter()
        .map(|&p| {
            let k = kernel * p as f64;
            ZeroCopyPoint { passes: p, zero_copy_ms: flat(upload.max(kernel) * p as f64 * 1.02), copy_then_compute_ms: flat(upload + k), kernel_ms: flat(k) }
        })
        .collect();
    let zero_copy = ZeroCopy {
        elements: config.zero_copy_elements,
        compute_share: 0.5,
        iterations: 40,
        upload_alone_ms: flat(upload),
        upload_ms: flat(upload),
        link_in_place_ms: flat(1.17 * upload),
        points,
    };
    let pin_cost = config.sizes_mib.iter().map(|&m| PinCostPoint { bytes: Bytes(mib(m)), ..pin_cost_point() }).collect();
    // Pinned staging: producing a batch takes twice its upload; a host
    // function's round trip 0.07 ms (0.016 awake), as on the H200; the
    // CPU resumes 0.06 ms after the one it waited on.
    let staging = memory::ring::staging(&config);
    let rn = config.elements / config.ring_batches;
    let ring_costs = costs_of(&staging);
    let ring_machine = Machine { host_fn_round_trip: 0.07, host_fn_awake: 0.016, signal_wake: 0.06, ..machine };
    let ring = memory::ring::RingResults {
        batches: config.ring_batches,
        batch_elements: rn,
        slots: config.ring_slots.clone(),
        // Alone a little faster than in the pipeline; there, issuing a
        // batch's four GPU ops on top.
        produce_ms: flat(1.5 * rn as f64 / n as f64),
        cpu_per_batch_ms: flat(2.0 * rn as f64 / n as f64 + 4.0 * facts.issue_ms),
        produce_in_pipeline_ms: flat(2.0 * rn as f64 / n as f64),
        host_fn_ms: flat(0.07),
        host_fn_awake_ms: flat(0.016),
        signal_wake_ms: flat(0.06),
        staging: experiment_as_modelled(&staging, facts, ring_machine, &ring_costs).expect("costs for every op"),
    };
    MemoryResults { config, iterations: 100, probes, device_waits, stall, pairs, traces, zero_copy, ring, pin_cost }
}

/// `e` as if every variant measured exactly what the model predicts
/// from `costs` on `facts`' machine (`machine`): the fixtures' results,
/// with real timelines to draw.
pub fn experiment_as_modelled(e: &Experiment, facts: MachineFacts, machine: Machine, costs: &Costs) -> crate::Result<ExperimentResult> {
    let variants = e
        .variants
        .iter()
        .map(|plan| {
            let model = plan.dry_run()?;
            let p = plan.prediction(&model, machine, costs)?;
            let watched = e.watch.and_then(|l| p.end_of(&model.schedule, l));
            Ok(ExperimentVariant {
                name: plan.name.clone(),
                total_ms: flat(p.total_ms),
                model_ms: p.total_ms,
                watched_ms: watched.map(flat),
                watched_model_ms: watched,
                bound_ms: None,
                timeline: Timeline { title: "measured".into(), ..p.timeline.clone() },
                predicted: p.timeline,
            })
        })
        .collect::<crate::Result<Vec<_>>>()?;
    Ok(ExperimentResult::new(e, variants, facts, costs))
}

/// Lab 8 on two GPUs joined by NVLink (`two`), or on one: copies at 300
/// GB/s one way, 560 both ways, 25 staged, 50 for the host link; PyTorch
/// at 310 and 580; the four at once 1.7 ms against a host-link bound of
/// 1.6; a bubble 2 points above its model; all-reduces of 4, 16 and 64 MiB
/// buckets hiding 93.75%, 87.5% and 50% of their communication. Timelines
/// are the queue model's, on plans of 64 elements.
pub fn multi_gpu_results(two: bool) -> crate::labs::multi_gpu::MultiGpuResults {
    multi_gpu_results_on(if two { 2 } else { 1 })
}

/// [`multi_gpu_results`] over `n` GPUs (1, 2, 4, ...): every pair joined
/// alike, a pipeline stage and an all-reduce rank on each.
pub fn multi_gpu_results_on(n: usize) -> crate::labs::multi_gpu::MultiGpuResults {
    let two = n > 1;
    use crate::gpu::topology::{GpuSummary, LinkKind, PeerPath, Topology};
    use crate::labs::multi_gpu::pipeline_parallel::{self as pp, bubble_model};
    use crate::labs::multi_gpu::reference::TorchPeer;
    use crate::labs::multi_gpu::training::{self, TrainingOrder};
    use crate::labs::multi_gpu::{
        all_reduce, four_way, AllReducePoint, AllReduceResults, BubblePoint, FourWay, MultiGpuConfig, MultiGpuResults, PeerPoint, PipelineResults,
        TrainingSweep,
    };
    use crate::pipeline::op::{Link, OpKind};
    use crate::pipeline::plan::Plan;
    let cfg = MultiGpuConfig { no_reference: !two, ..MultiGpuConfig::quick() };
    let gpu = |ordinal: usize| GpuSummary { ordinal, name: "Test GPU".into(), pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + ordinal) };
    let path =
        |from, to| PeerPath { from, to, can_access: true, performance_rank: 0, native_atomics: true, link: LinkKind::NvLink { links: 18, switched: false } };
    let topology = Topology { gpus: (0..n).map(gpu).collect(), paths: (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| path(a, b))).collect() };
    let at = pp::placement(n);
    let peer = cfg
        .sizes_mib
        .iter()
        .map(|&mib| PeerPoint { bytes: (mib as u64) << 20, one_way: flat(300.0), both_ways: flat(560.0), staged: flat(25.0), host: flat(50.0) })
        .collect();
    let torch = if two {
        Ok(TorchPeer { torch: "2.11.0".into(), bytes: 64 << 20, one_way: flat(310.0), both_ways: flat(580.0) })
    } else {
        Err("--no-reference".into())
    };
    // The queue model's timeline of a small plan, as a run would draw it.
    let predicted = |plan: Plan, costs: Costs, title: &str| {
        let model = plan.dry_run().expect("the fixture's plans are valid");
        let t = plan.prediction(&model, Machine::engines(3), &costs).expect("every op is costed").timeline;
        Some(Timeline { title: title.into(), ..t })
    };
    let to: u8 = if two { 1 } else { 0 };
    let link = Link { from: 0, to };
    let four_costs: Costs = [((OpKind::H2d, 64), 1.2), ((OpKind::D2h, 64), 1.2), ((OpKind::D2d(link), 64), 0.2), ((OpKind::Kernel, 64), 1.2)].into();
    let four_way_result = FourWay {
        bytes: 64 << 20,
        peer: to as usize,
        alone_ms: vec![flat(1.2), flat(1.2), flat(0.2), flat(1.2)],
        host_link_ms: flat(1.6),
        together_ms: flat(1.7),
    };
    let points = cfg
        .micro_batches
        .iter()
        .map(|&m| {
            let model = bubble_model(at.len(), m);
            BubblePoint { micro_batches: m, model, measured: Some(flat(model + 0.02)), total_ms: flat(10.0 * (m + 1) as f64 / m as f64) }
        })
        .collect();
    let mut pipe_costs: Costs = [((OpKind::Kernel, 8), 1.25), ((OpKind::H2d, 64), 0.5), ((OpKind::D2h, 64), 0.5)].into();
    for w in at.windows(2) {
        pipe_costs.insert((OpKind::D2d(Link { from: w[0] as u8, to: w[1] as u8 }), 8), 0.05);
    }
    let pipe_plan = pp::plan_over("events only", 8, 64, std::sync::Arc::new(pp::events_only), &at);
    let drawn = if two { format!("a stage on each of GPUs {:?}", (0..n).collect::<Vec<_>>()) } else { "both stages on GPU 0".into() };
    let pipeline = PipelineResults {
        stages: at.len(),
        iterations: 4096,
        stage_ms: flat(10.0),
        points,
        timeline: predicted(pipe_plan, pipe_costs.clone(), &format!("8 micro-batches, {drawn}")),
        // Training 1 point above the model (fill-drain) and 2 (1F1B).
        training: TrainingOrder::ALL
            .iter()
            .zip([0.01, 0.02])
            .map(|(&order, above)| {
                let points = cfg
                    .micro_batches
                    .iter()
                    .map(|&m| {
                        let model = bubble_model(at.len(), m);
                        BubblePoint { micro_batches: m, model, measured: Some(flat(model + above)), total_ms: flat(20.0 * (m + 1) as f64 / m as f64) }
                    })
                    .collect();
                let mut costs = pipe_costs.clone();
                costs.insert((OpKind::Kernel, 4), 0.625);
                for w in at.windows(2) {
                    costs.insert((OpKind::D2d(Link { from: w[1] as u8, to: w[0] as u8 }), 8), 0.05);
                }
                let timeline = predicted(training::plan(order, 8, 64, &at), costs, &format!("{}, 8 micro-batches, {drawn}", order.name()));
                TrainingSweep { order, points, timeline }
            })
            .collect(),
    };
    let all_reduce = if two {
        let point = |mib: u64, buckets: usize, a: f64, k: f64, serial: f64, overlapped: f64| AllReducePoint {
            bucket_bytes: mib << 20,
            buckets,
            kernel_ms: flat(k),
            all_reduce_ms: flat(a),
            serial_ms: flat(serial),
            overlapped_ms: flat(overlapped),
            predicted_ms: overlapped - 0.05,
        };
        let shape = all_reduce::Shape { per_gpu: 64, bucket: 16, ranks: n, comm_priority: -1 };
        let costs: Costs = [((OpKind::Kernel, 16), 0.24), ((OpKind::AllReduce(n as u8), 16), 0.15), ((OpKind::H2d, 64), 0.0), ((OpKind::D2h, 64), 0.0)].into();
        Ok(AllReduceResults {
            nccl_version: "2.28.3".into(),
            ranks: n,
            iterations: 100,
            points: vec![point(4, 32, 0.05, 0.06, 3.6, 2.1), point(16, 8, 0.15, 0.24, 3.15, 2.1), point(64, 2, 0.55, 0.96, 3.05, 2.5)],
            timeline: predicted(all_reduce::plan(shape, 1, all_reduce::Sync::Overlapped), costs, "one step, 4 buckets, overlapped"),
            // 64 MiB in 0.5 ms (bus 2(n-1)/n of 134 GB/s), PyTorch's in 0.49.
            sizes: vec![(4 << 20, flat(0.05)), (64 << 20, flat(0.5))],
            torch: Some(Ok(crate::labs::multi_gpu::reference::TorchAllReduce {
                torch: "2.11.0".into(),
                nccl: "2.28.3".into(),
                gpus: (0..n).collect(),
                points: vec![(4 << 20, flat(0.048)), (64 << 20, flat(0.49))],
            })),
            // At most 8 CTAs: the layers slow less, the sums more; the
            // 4 MiB buckets' step 1.9 ms, hiding 99.4%.
            capped: vec![crate::labs::multi_gpu::CtaSweep {
                ctas: crate::gpu::nccl::NcclCtas::at_most(8),
                points: vec![point(4, 32, 0.055, 0.06, 3.65, 1.9), point(16, 8, 0.16, 0.24, 3.2, 2.0), point(64, 2, 0.6, 0.96, 3.1, 2.45)],
            }],
            skipped: Vec::new(),
            env_override: None,
        })
    } else {
        Err("one GPU here: an all-reduce sums over two or more".into())
    };
    MultiGpuResults {
        topology,
        gpus: (0..n).collect(),
        peer,
        // Every link at 300 GB/s alone, 290 with all of them busy.
        ring: (n > 2).then(|| crate::labs::multi_gpu::RingPoint { bytes: 64 << 20, per_link: flat(290.0), alone: vec![flat(300.0); n] }),
        torch,
        four_way_timeline: predicted(four_way::plan(64, to as usize, 1, &[]), four_costs, "one round of the four at once"),
        four_way: four_way_result,
        pipeline,
        all_reduce,
        config: cfg,
    }
}

/// Lab 9's results as a recording of the full preset might hold them: a
/// link-bound and a compute-bound batch (GEMMs 0.6 and 1.8 ms); one
/// layer's upload 1.2 ms at its best, though the link-bound batch's
/// uploads ran slow (1.25 to 1.4 ms: a slow phase of the host); the ring
/// passes at 97% of the bound; the host's wake-up and issue costs as lab 5
/// measured them on the H100 (6 and 3 µs). The exercise is judged at the
/// compute-bound batch, nearest the crossover, as on the recorded GPUs.
pub fn offload_results() -> crate::labs::offload::OffloadResults {
    use crate::labs::offload::{BatchPoint, OffloadConfig, OffloadResults, Shape, Variant, VariantPoint};
    let cfg = OffloadConfig::default();
    let shape = Shape { layers: cfg.layers, d: cfg.d_model };
    let uploads = |q25: f64, median: f64, q75: f64| Summary { median, min: 0.99 * q25, max: 1.02 * q75, n: 5, middle: Some((q25, q75)) };
    let point = |batch: usize, h2d_ms: Summary, layer: f64| {
        let bound = crate::lab_kit::two_stage_bound_ms(shape.layers, 1.2, layer);
        BatchPoint {
            batch,
            h2d_ms,
            h2d_pageable_ms: flat(3.0),
            layer_ms: flat(layer),
            variants: Variant::ALL
                .iter()
                .filter(|v| v.kind() == crate::labs::offload::rig::LayerKind::Separate)
                .map(|&variant| {
                    let ms = match variant {
                        Variant::Pageable => shape.layers as f64 * (3.0 + layer),
                        Variant::Pinned => shape.layers as f64 * (1.2 + layer),
                        _ => bound * 1.03,
                    };
                    VariantPoint { variant, ms: flat(ms), predicted_ms: ms * 0.98, plan: None }
                })
                .collect(),
            torch_to_ms: Some(flat(shape.layers as f64 * (3.2 + layer))),
            torch_ring_ms: Some(flat(bound * 1.05)),
            layer_fused_ms: None,
            h2d_fp8_ms: None,
            layer_fp8_ms: None,
            torch_beyond: None,
        }
    };
    let host = MachineFacts {
        copy_engines: 3,
        h2d_ms: 1.217,
        d2h_ms: 1.218,
        both_ms: 1.326,
        wake_ms: 0.006,
        kernel_ms: 0.141,
        kernels_alternating_ms: 1.015,
        issue_ms: 0.003,
    };
    OffloadResults {
        config: cfg,
        shape,
        chose: "96 layers as asked".into(),
        gpu_bytes: 800 << 20,
        cublas: "13.0.0".into(),
        copy_engines: 3,
        machine: Some(host),
        points: vec![point(4096, uploads(1.25, 1.3, 1.4), 0.6), point(16384, uploads(1.2, 1.21, 1.22), 1.8)],
        timeline: Timeline::default(),
        timeline_batch: 16384,
        timeline_untraced_ms: 120.0,
        max_error: 1e-3,
        verified_passes: 10,
        torch: Ok("2.9.0".into()),
        fp8: None,
        fp8_missing: None,
        sweeps: Vec::new(),
        timelines: Vec::new(),
    }
}

/// Lab 9's recording from the H100 (`data/nvidia-h100-80gb-hbm3/offload.json`,
/// committed): every variant past the streaming bound with its plan, the
/// placement sweep at three batches and budgets, FP8's accuracy and the
/// traced passes, as a real run holds them.
pub fn offload_results_beyond() -> crate::labs::offload::OffloadResults {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/nvidia-h100-80gb-hbm3/offload.json");
    crate::labs::offload::OffloadRecord::load(&path).expect("the committed H100 recording of lab 9").results
}
