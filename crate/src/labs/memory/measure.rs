//! Lab 6 on the GPU: which memory calls wait for the GPU (probed), the
//! two-stream pipeline with each kind of scratch memory beside the model
//! (told what the probes found), the release-threshold sweeps and
//! zero-copy.

use super::experiments::{self, probe, BUSY, PROBED, PROBED_AGAIN, PROBED_MEMORY};
use super::{pool, zero_copy, CallProbe, MemoryConfig, MemoryResults};
use crate::error::{LabError, Result};
use crate::gpu::{Gpu, MemPool, PlanRig, TimelineSource};
use crate::labs::experiment::{self, balance};
use crate::measure::stats::Summary;
use crate::pipeline::plan::{chunk, op_elements, reuses, Costs, Plan, REUSED};
use crate::pipeline::schedule::{DeviceWaits, Machine, Memory, OpKind};
use crate::present::progress::{Progress, ProgressMode};

/// Kernels of a batch's size that keep the GPU busy in a probe (about
/// 20 batches' worth of kernel time).
const BUSY_KERNELS: usize = 16;
/// (for the table's heading)
pub const BUSY_KERNELS_SHOWN: usize = BUSY_KERNELS;

/// One probe run's (allocate, release) host times and, beside busy
/// kernels, how long the kernels still had to run when each call began, ms.
struct ProbeRun {
    calls: [f64; 3],
    left: [f64; 3],
}

fn probe_run(rig: &mut PlanRig, plan: &Plan, memory: Memory) -> Result<ProbeRun> {
    let run = rig.run(plan, TimelineSource::Events)?;
    let t = run.timeline.ok_or_else(|| LabError::config("a probe left no timeline"))?;
    let busy_end = t.spans.iter().filter(|s| s.label.starts_with(BUSY)).map(|s| s.end_us).fold(f64::NEG_INFINITY, f64::max);
    let mut out = ProbeRun { calls: [0.0; 3], left: [0.0; 3] };
    for (i, (alloc, name)) in [(true, PROBED), (false, PROBED), (true, PROBED_AGAIN)].into_iter().enumerate() {
        let label = memory.label(alloc, name);
        let s = t.spans.iter().find(|s| s.label == label).ok_or_else(|| LabError::config(format!("a probe lost its '{label}'")))?;
        out.calls[i] = (s.end_us - s.start_us) / 1e3;
        out.left[i] = if busy_end.is_finite() { ((busy_end - s.start_us) / 1e3).max(0.0) } else { 0.0 };
    }
    Ok(out)
}

/// Probes each memory call on an idle GPU and beside busy kernels, the two
/// taking turns run by run; and the model's cost of each call (its lower
/// quartile on the idle GPU) of `n` elements.
fn probe_calls(rig: &mut PlanRig, cfg: &MemoryConfig, n: usize, progress: &mut Progress) -> Result<(Vec<CallProbe>, Costs)> {
    let mut probes = Vec::new();
    let mut costs = Costs::new();
    for memory in PROBED_MEMORY {
        let (idle, busy) = (probe(memory, n, n, 0), probe(memory, n, n, BUSY_KERNELS));
        let (mut idle_runs, mut busy_runs) = (Vec::new(), Vec::new());
        for rep in 0..=cfg.repeats {
            let (i, b) = (probe_run(rig, &idle, memory)?, probe_run(rig, &busy, memory)?);
            if rep > 0 {
                idle_runs.push(i);
                busy_runs.push(b);
            }
        }
        let of = |runs: &[ProbeRun], f: &dyn Fn(&ProbeRun) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>());
        let p = CallProbe {
            memory,
            alloc_idle_ms: of(&idle_runs, &|r| r.calls[0])?,
            free_idle_ms: of(&idle_runs, &|r| r.calls[1])?,
            alloc_busy_ms: of(&busy_runs, &|r| r.calls[0])?,
            free_busy_ms: of(&busy_runs, &|r| r.calls[1])?,
            alloc_again_idle_ms: of(&idle_runs, &|r| r.calls[2])?,
            alloc_left_ms: of(&busy_runs, &|r| r.left[0])?,
            free_left_ms: of(&busy_runs, &|r| r.left[1])?,
            bytes: 4 * n as u64,
        };
        progress.step(&p.line());
        // The model's cost of each call: the elements its op covers, as the
        // plan's schedule counts them.
        let model = idle.model()?;
        let reused = reuses(&model.schedule);
        for o in model.schedule.ops.iter().filter(|o| matches!(o.kind, OpKind::Alloc(_) | OpKind::Free(_))) {
            let (ms, key) = match o.kind {
                OpKind::Alloc(_) if reused[o.id] => (p.alloc_again_idle_ms, op_elements(o) | REUSED),
                OpKind::Alloc(_) => (p.alloc_idle_ms, op_elements(o)),
                _ => (p.free_idle_ms, op_elements(o)),
            };
            costs.entry((o.kind, key)).or_insert(ms.middle_range().0);
        }
        probes.push(p);
    }
    Ok((probes, costs))
}

/// What the probes found, as the model takes it.
pub fn device_waits(probes: &[CallProbe]) -> DeviceWaits {
    let waits = |m: Memory, alloc: bool| probes.iter().find(|p| p.memory == m).is_some_and(|p| p.waits(alloc));
    DeviceWaits {
        alloc: waits(Memory::Device, true),
        free: waits(Memory::Device, false),
        pinned_alloc: waits(Memory::Pinned, true),
        pinned_free: waits(Memory::Pinned, false),
        ..DeviceWaits::default()
    }
}

pub fn run(gpu: &Gpu, cfg: &MemoryConfig, mode: ProgressMode) -> Result<MemoryResults> {
    cfg.validate()?;
    let e = experiments::stall(cfg);
    let steps = 3 + PROBED_MEMORY.len() + cfg.sizes_mib.len() + 3 + cfg.passes.len();
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
    let (probes, memory_costs) = probe_calls(&mut rig, cfg, n, &mut progress)?;
    let waits = device_waits(&probes);
    let facts = rig.machine(n, reps)?;
    let (mut costs, _) = rig.costs_and_fastest(&e.variants.iter().collect::<Vec<_>>(), reps)?;
    costs.extend(memory_costs);
    let machine = Machine { device_waits: waits, ..facts.machine() };
    progress.step(&format!("machine: {}; {} ops measured alone", crate::labs::experiment::machine_line(&facts), costs.len()));
    let stall = experiment::measure(&mut rig, &e, facts, machine, &costs, reps)?;
    progress.step(&format!(
        "{}: {}",
        stall.name,
        stall.variants.iter().map(|v| format!("{:.3} ms (model {:.3})", v.total_ms.median, v.model_ms)).collect::<Vec<_>>().join(", ")
    ));
    drop(rig);
    drop(keep);
    let (pairs, traces) = pool::measure(gpu, cfg, &mut progress)?;
    let zero_copy = zero_copy::measure(gpu, cfg, &mut progress)?;
    progress.finish();
    Ok(MemoryResults { config: cfg.clone(), iterations, probes, device_waits: waits, stall, pairs, traces, zero_copy })
}
