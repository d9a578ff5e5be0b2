//! Lab 8's fixture: made-up results (no GPU ran them), on one GPU, two or
//! more, for its unit tests and the table's check of every lab's parts.

use crate::pipeline::machine::Machine;
use crate::pipeline::plan::Costs;
use crate::pipeline::timeline::Timeline;
use crate::testing::flat;

/// On two GPUs ([`results_on`]).
pub fn results() -> super::MultiGpuResults {
    results_on(2)
}

/// Lab 8 on two GPUs joined by NVLink (`two`), or on one: copies at 300
/// GB/s one way, 560 both ways, 25 staged, 50 for the host link; PyTorch
/// at 310 and 580; the four at once 1.7 ms against a host-link bound of
/// 1.6; a bubble 2 points above its model; all-reduces of 4, 16 and 64 MiB
/// buckets hiding 93.75%, 87.5% and 50% of their communication. Timelines
/// are the queue model's, on plans of 64 elements.
pub fn results_two_or_one(two: bool) -> crate::labs::multi_gpu::MultiGpuResults {
    results_on(if two { 2 } else { 1 })
}

/// [`results_two_or_one`] over `n` GPUs (1, 2, 4, ...): every pair joined
/// alike, a pipeline stage and an all-reduce rank on each.
pub fn results_on(n: usize) -> crate::labs::multi_gpu::MultiGpuResults {
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
            // Each GPU a rank's batch and gradients of the config's 64 MiB;
            // the others one 64 MiB bucket's sum timed alone besides.
            device_bytes: (0..n).map(|g| (128 << 20) + if g == 0 { 0 } else { 64 << 20 }).collect(),
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
