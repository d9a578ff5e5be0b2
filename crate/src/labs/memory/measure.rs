//! Lab 6 on the GPU: which memory calls wait for the GPU (probed), the
//! two-stream pipeline with each kind of scratch memory beside the model
//! (told what the probes found), the release-threshold sweeps and
//! zero-copy.

use super::experiments;
use super::{pin_line, pool, probes, ring, zero_copy, MemoryConfig, MemoryResults};
use crate::error::Result;
use crate::gpu::{Gpu, MemPool, PlanRig};
use crate::lab_kit::experiment::{self, balance};
use crate::lab_kit::host_memory;
use crate::pipeline::machine::Machine;
use crate::pipeline::plan::chunk;
use crate::present::progress::{Progress, ProgressMode};
use crate::Bytes;

/// Samples of each pinned-memory call per size (after the first).
const PIN_REPEATS: usize = 5;

pub fn run(gpu: &Gpu, cfg: &MemoryConfig, mode: ProgressMode) -> Result<MemoryResults> {
    cfg.validate()?;
    let e = experiments::stall(cfg);
    let steps = 5 + probes::PROBED_MEMORY.len() + cfg.sizes_mib.len() + cfg.pinned_sizes_mib.len() + 3 + cfg.passes.len();
    let mut progress = Progress::new(mode, steps as u64, "memory");
    let reps = cfg.repeats;
    let n = chunk(cfg.elements, cfg.batches, 0).1;
    // The probes and the pipeline run with a pool that keeps its memory
    // (threshold max, as the release-threshold part below recommends), so
    // each stream-ordered allocation reuses what an earlier one released;
    // that part measures what threshold 0 costs instead.
    let pool = MemPool::default_of(gpu)?;
    let keep = pool.threshold_for_now(u64::MAX)?;
    let mut rig = PlanRig::new(gpu, cfg.elements, 2, 1)?;
    let iterations = balance(&mut rig, n, reps)?;
    rig.iterations = iterations;
    progress.step(&format!("kernel balanced against a batch's H2D: {iterations} FMAs per element"));
    let (probes, memory_costs) = probes::measure(&mut rig, cfg, n, &mut progress)?;
    let waits = probes::device_waits(&probes);
    let facts = rig.machine(n, reps)?;
    let mut costs = rig.costs(&e.variants.iter().collect::<Vec<_>>(), reps)?;
    costs.extend(memory_costs);
    let machine = Machine { device_waits: waits, ..facts.machine() };
    progress.step(&format!("machine: {}; {} ops measured alone", crate::lab_kit::experiment::machine_line(&facts), costs.len()));
    let stall = experiment::measure(&mut rig, &e, facts, machine, &costs, reps)?;
    progress.step(&format!(
        "{}: {}",
        stall.name,
        stall.variants.iter().map(|v| format!("{:.3} ms (model {:.3})", v.total_ms.median, v.model_ms)).collect::<Vec<_>>().join(", ")
    ));
    let ring = ring::measure(&mut rig, cfg, facts, waits, &mut progress)?;
    drop(rig);
    drop(keep);
    let (pairs, traces) = pool::measure(gpu, cfg, &mut progress)?;
    let zero_copy = zero_copy::measure(gpu, cfg, &mut progress)?;
    // Pinned host memory by size: the first allocation of a size apart
    // from the later ones (a few samples: a pinned GiB takes a while).
    let mut pin_cost = Vec::new();
    for &mib in &cfg.pinned_sizes_mib {
        let point = host_memory::price(gpu, Bytes((mib as u64) << 20), cfg.repeats.min(PIN_REPEATS))?;
        progress.step(&pin_line(&point));
        pin_cost.push(point);
    }
    progress.finish();
    Ok(MemoryResults { config: cfg.clone(), iterations, probes, device_waits: waits, stall, pairs, traces, zero_copy, ring, pin_cost })
}
