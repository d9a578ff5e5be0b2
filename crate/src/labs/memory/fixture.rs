//! Lab 6's fixture: results shaped like the H100's (no GPU ran them), for
//! its unit tests and the table's check of every lab's parts.

use super::{self as memory, MemoryConfig, MemoryResults};
use crate::gpu::MachineFacts;
use crate::lab_kit::host_memory::PinCostPoint;
use crate::pipeline::machine::Machine;
use crate::pipeline::plan::{chunk, Costs};
use crate::testing::{experiment_as_modelled, flat};
use crate::Bytes;

/// Lab 6's results for a small run (2^16 elements in the default batches)
/// with the H100's findings: cuMemFree waits for all GPU work, cuMemAlloc
/// for nothing (0.3 ms a call, 0.1 right after a release), the pool's
/// pair 20 µs; the stall experiment "measured" as the model predicts it;
/// release-threshold points shaped like the H100's (threshold 0 costs
/// more with size, threshold max stays flat); zero-copy winning at one
/// read and losing beyond, as with a kernel half as long as the upload.
pub fn results() -> MemoryResults {
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
    let pin_cost = config.pinned_sizes_mib.iter().map(|&m| PinCostPoint { bytes: Bytes(mib(m)), ..PinCostPoint::made_up() }).collect();
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
