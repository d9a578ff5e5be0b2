//! Lab 8's measurements on the GPU, each a plan the rig runs verified.
//!
//! An op's time is taken by difference: the plan with `k` repeats of it
//! minus the same plan with one, over k−1 (CUDA events bracket each run).
//! The upload before and the download after — what makes the run
//! verifiable — cancel out, and no per-op timeline is needed (under
//! Nsight, which holds CUPTI, a pipeline over two GPUs has none).

use super::config::{MultiGpuConfig, LAB};
use super::pipeline_parallel::{self as pp, bubble, bubble_model};
use super::results::{AllReducePoint, AllReduceResults, BubblePoint, CtaSweep, FourWay, MultiGpuResults, PeerPoint, PipelineResults, RingPoint, TrainingSweep};
use super::training::{self, TrainingOrder};
use super::{all_reduce, four_way, peer};
use crate::error::{LabError, Result};
use crate::gpu::topology::Topology;
use crate::gpu::{Gpu, PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::OpKind;
use crate::pipeline::plan::{Costs, Plan};
use crate::pipeline::timeline::Timeline;
use crate::present::progress::{Progress, ProgressMode};

/// The ring over the rig's GPUs at `bytes` (three or more GPUs; two make
/// [`PeerPoint::both_ways`]).
pub fn ring_point(rig: &mut PlanRig, bytes: usize, gpus: usize, t: Timing) -> Result<RingPoint> {
    let elements = (bytes / 4) & !1;
    let b = (elements * 4) as f64;
    let to_gbps = |s: Summary| s.map_decreasing(|ms| b / ms / 1e6);
    let per_link = to_gbps(per_repeat_ms(rig, |k| peer::ring(elements, gpus, k), t)?);
    let mut alone = Vec::with_capacity(gpus);
    for g in 0..gpus {
        alone.push(to_gbps(per_repeat_ms(rig, |k| peer::one_way(elements, g, (g + 1) % gpus, k), t)?));
    }
    Ok(RingPoint { bytes: elements as u64 * 4, per_link, alone })
}

/// How a repeated op is timed.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Repeats in the long run (the short run has one).
    pub copies: usize,
    /// Runs of each (after one of each untimed), whose differences are summarised.
    pub runs: usize,
}

/// One repeat's time, ms, by difference ([`Timing`]): `make(k)` is the
/// plan with `k` repeats ([`PlanRig::per_repeat_ms`]).
pub fn per_repeat_ms(rig: &mut PlanRig, make: impl Fn(usize) -> Plan, t: Timing) -> Result<Summary> {
    rig.per_repeat_ms(make, t.copies, t.runs)
}

/// The three ways at `bytes` between the rig's GPUs `from` and `to` (the
/// same GPU on a machine with one: copies within it). Staging uses
/// `chunks` chunks.
pub fn peer_point(rig: &mut PlanRig, bytes: usize, (from, to): (usize, usize), chunks: usize, t: Timing) -> Result<PeerPoint> {
    let elements = (bytes / 4) & !1;
    if elements < 2 * chunks.max(1) {
        return Err(LabError::config(format!("{bytes} bytes in {chunks} chunks: give at least 8 bytes a chunk")));
    }
    let b = (elements * 4) as f64;
    // GB/s (10^9 bytes a second); every per-copy time is above zero
    // (per_repeat_ms), so every rate is finite.
    let to_gbps = |s: Summary, moved: f64| s.map_decreasing(|ms| moved / ms / 1e6);
    Ok(PeerPoint {
        bytes: elements as u64 * 4,
        one_way: to_gbps(per_repeat_ms(rig, |k| peer::one_way(elements, from, to, k), t)?, b),
        both_ways: to_gbps(per_repeat_ms(rig, |k| peer::both_ways(elements, from, to, k), t)?, b),
        staged: to_gbps(per_repeat_ms(rig, |k| peer::staged(elements, from, to, chunks, k), t)?, b),
        host: to_gbps(per_repeat_ms(rig, |k| peer::upload(elements, to, k), t)?, b),
    })
}

/// Measures the four-way overlap at `bytes` on the rig's GPU 0, the copy
/// going to its GPU `peer`.
pub fn four_way(rig: &mut PlanRig, bytes: usize, peer: usize, t: Timing) -> Result<FourWay> {
    let elements = (bytes / 4) & !1;
    if elements < 2 {
        return Err(LabError::config(format!("{bytes} bytes: give at least 8")));
    }
    let mut alone_ms = Vec::with_capacity(4);
    for kind in four_way::kinds(peer) {
        alone_ms.push(per_repeat_ms(rig, |k| four_way::plan(elements, peer, k, &[kind]), t)?);
    }
    let host_link_ms = per_repeat_ms(rig, |k| four_way::plan(elements, peer, k, &[OpKind::H2d, OpKind::D2h]), t)?;
    let together_ms = per_repeat_ms(rig, |k| four_way::plan(elements, peer, k, &[]), t)?;
    Ok(FourWay { bytes: elements as u64 * 4, peer, alone_ms, host_link_ms, together_ms })
}

/// Runs the events-only loop over `micro_batches` micro-batches of
/// `elements`, stage s on the rig's GPU `placement[s]`
/// ([`pp::placement`]), `runs` times after one untimed run, each verified.
pub fn bubble_point(rig: &mut PlanRig, elements: usize, micro_batches: usize, placement: &[usize], runs: usize) -> Result<BubblePoint> {
    if micro_batches == 0 || elements < 2 * micro_batches || runs == 0 {
        return Err(LabError::config(format!(
            "{micro_batches} micro-batches of {elements} elements, {runs} runs: give at least 1 of each and 2 elements a micro-batch"
        )));
    }
    let plan = pp::plan_over("events only", micro_batches, elements, std::sync::Arc::new(pp::events_only), placement);
    plan_bubble(rig, &plan, placement.len(), micro_batches, runs)
}

/// The bubble of `plan` (a pipeline of `stages` over `micro_batches`),
/// `runs` times after one untimed run, each verified, beside
/// (S−1)/(M+S−1).
pub fn plan_bubble(rig: &mut PlanRig, plan: &Plan, stages: usize, micro_batches: usize, runs: usize) -> Result<BubblePoint> {
    let model = plan.dry_run()?;
    rig.run_modelled(plan, &model, TimelineSource::Off)?;
    let (mut fractions, mut totals) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        // The total from an untraced run (a traced one pays CUPTI's
        // records); the bubble from a traced run beside it.
        totals.push(rig.run_modelled(plan, &model, TimelineSource::Off)?.total_ms);
        let traced = rig.run_modelled(plan, &model, TimelineSource::best())?;
        if let Some(b) = traced.full_timeline().and_then(|t| bubble(&traced.schedule, &t.span_times())) {
            fractions.push(b.fraction());
        }
    }
    Ok(BubblePoint {
        micro_batches,
        model: bubble_model(stages, micro_batches),
        measured: if fractions.is_empty() { None } else { Some(Summary::of(&fractions)?) },
        total_ms: Summary::of(&totals)?,
    })
}

/// One run of `plan` with the best timeline there is (CUPTI, else none
/// over several GPUs), verified: what the lab draws. `None` when no
/// timeline could be had (another tool holds CUPTI).
pub fn timeline_of(rig: &mut PlanRig, plan: &Plan, title: &str) -> Result<Option<Timeline>> {
    let run = rig.run(plan, TimelineSource::best())?;
    Ok(run.full_timeline().map(|t| Timeline { title: title.into(), ..t.clone() }))
}

/// The gradient all-reduce at one bucket size on the rig (made
/// [`PlanRig::with_nccl`], its kernel's iterations set): each op alone,
/// the serial and overlapped steps by difference, and the model's step.
pub fn all_reduce_point(rig: &mut PlanRig, shape: all_reduce::Shape, copy_engines: u32, t: Timing) -> Result<AllReducePoint> {
    shape.validate()?;
    let (_, n) = shape.bucket_range(0);
    let [kernel, collective] = all_reduce::kinds(shape.ranks);
    let kernel_ms = rig.alone(kernel, n, t.runs.max(3))?;
    let all_reduce_ms = rig.alone(collective, n, t.runs.max(3))?;
    let serial_ms = per_repeat_ms(rig, |k| all_reduce::plan(shape, k, all_reduce::Sync::Serial), t)?;
    let overlapped_ms = per_repeat_ms(rig, |k| all_reduce::plan(shape, k, all_reduce::Sync::Overlapped), t)?;
    // The model's step by difference too: uploads and downloads cancel.
    let costs: Costs = [
        ((kernel, n), kernel_ms.middle_range().0),
        ((collective, n), all_reduce_ms.middle_range().0),
        ((OpKind::H2d, shape.per_gpu), 0.0),
        ((OpKind::D2h, shape.per_gpu), 0.0),
    ]
    .into();
    let machine = Machine::engines(copy_engines);
    let step = |k| all_reduce::plan(shape, k, all_reduce::Sync::Overlapped).predicted_ms(machine, &costs);
    let predicted_ms = (step(2)? - step(1)?).max(0.0);
    Ok(AllReducePoint { bucket_bytes: n as u64 * 4, buckets: shape.buckets(), kernel_ms, all_reduce_ms, serial_ms, overlapped_ms, predicted_ms })
}

/// Sets the rig's kernel so that one kernel over `n` elements alone takes
/// about `target_ms` (`labs::calibrate_iterations`).
fn calibrate_kernel(rig: &mut PlanRig, target_ms: f64, n: usize) -> Result<()> {
    rig.iterations = crate::lab_kit::calibrate_iterations(target_ms, |i| {
        rig.iterations = i;
        Ok(rig.alone(OpKind::Kernel, n, 3)?.median)
    })?;
    Ok(())
}

/// The lab's GPUs: `gpu` (the command line's --device), then the ones
/// after it ([`MultiGpuConfig::lab_gpus`]).
pub fn open_gpus(gpu: &Gpu, cfg: &MultiGpuConfig, topology: &Topology) -> Result<Vec<Gpu>> {
    let mut gpus = vec![gpu.clone()];
    for ordinal in cfg.lab_gpus(topology.gpus.len())?.into_iter().skip(1) {
        gpus.push(Gpu::open(ordinal)?);
    }
    gpu.bind()?;
    Ok(gpus)
}

/// A rig over `gpus` for the pipeline of `cfg` (a stage per GPU), its
/// kernel calibrated so that one stage over all the data takes
/// `--stage-ms`: the rig and that stage's time alone.
pub fn pipeline_rig(gpus: &[Gpu], cfg: &MultiGpuConfig) -> Result<(PlanRig, Summary)> {
    let n = cfg.pipeline_mib << 18;
    // Two buffers a stage: its activation (or the input) and what it receives (or the output).
    let mut rig = PlanRig::over(gpus, n, 2 * pp::placement(gpus.len()).len(), 1)?;
    calibrate_kernel(&mut rig, cfg.stage_ms, n)?;
    let stage_ms = rig.alone(OpKind::Kernel, n, cfg.repeats.max(3))?;
    Ok((rig, stage_ms))
}

/// Lab 8 on this machine's GPUs: the copies by size and PyTorch's, the
/// four-way overlap, the pipeline's bubble by micro-batches, the gradient
/// all-reduce by bucket size. Every run is verified.
pub fn run(gpu: &Gpu, cfg: &MultiGpuConfig, mode: ProgressMode) -> Result<MultiGpuResults> {
    cfg.validate()?;
    let topology = Topology::discover()?;
    let gpus = open_gpus(gpu, cfg, &topology)?;
    let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
    // Copies and the four-way overlap between the first two GPUs (within
    // GPU 0 with one).
    let pair = &gpus[..gpus.len().min(2)];
    let second = usize::from(gpus.len() > 1);
    let t = Timing { copies: cfg.copies, runs: cfg.repeats };
    // A step per size, PyTorch's reference, the four-way overlap, a step per
    // micro-batch count, and with two GPUs a step per bucket size.
    let buckets = if gpus.len() > 1 { 1 + cfg.buckets_mib.len() * cfg.nccl_ctas.len() } else { 0 };
    let steps = cfg.sizes_mib.len() + usize::from(gpus.len() > 2) + 2 + (1 + TrainingOrder::ALL.len()) * cfg.micro_batches.len() + buckets;
    let mut progress = Progress::new(mode, steps as u64, LAB);
    let _r = crate::gpu::trace::range("lab 8: several GPUs");

    // Copies between the GPUs (within GPU 0 with one), by size.
    let largest = cfg.sizes_mib.iter().copied().max().unwrap_or(1) << 20;
    let mut peer = Vec::with_capacity(cfg.sizes_mib.len());
    {
        let mut rig = PlanRig::over(pair, largest / 4, 2, 1)?;
        for &mib in &cfg.sizes_mib {
            let _r = crate::gpu::trace::range(&format!("copies of {mib} MiB"));
            peer.push(peer_point(&mut rig, mib << 20, (0, second), cfg.staging_chunks, t)?);
            progress.step(&format!("copies of {mib} MiB"));
        }
    }
    // Every GPU to the next at once, at the largest size (three GPUs or more).
    let ring = if gpus.len() > 2 {
        let _r = crate::gpu::trace::range("ring of copies");
        let mut rig = PlanRig::over(&gpus, largest / 4, 2 * gpus.len(), 1)?;
        let r = ring_point(&mut rig, largest, gpus.len(), t)?;
        progress.step("a ring of copies");
        Some(r)
    } else {
        None
    };
    let torch = if cfg.no_reference {
        Err("--no-reference".to_string())
    } else {
        progress.step_note("PyTorch's copy between the same GPUs");
        super::reference::torch_peer(&cfg.python, (ordinals[0], ordinals[second]), largest, (t.copies, t.runs))
    };
    progress.step("PyTorch's reference");

    // Four at once on GPU 0, the kernel as long as an upload.
    let (four_way_result, four_way_timeline) = {
        let _r = crate::gpu::trace::range("four-way overlap");
        let n = cfg.four_way_mib << 18;
        let mut rig = PlanRig::over(pair, n, 5, 1)?;
        let upload_ms = rig.alone(OpKind::H2d, n, 3)?.median;
        calibrate_kernel(&mut rig, upload_ms, n)?;
        let f = four_way(&mut rig, n * 4, second, t)?;
        let timeline = timeline_of(&mut rig, &four_way::plan(n, second, 1, &[]), "one round of the four at once")?;
        (f, timeline)
    };
    progress.step("four-way overlap");

    // The pipeline, a stage per GPU, by micro-batches.
    let pipeline = {
        let _r = crate::gpu::trace::range("pipeline over the GPUs");
        let (mut rig, stage_ms) = pipeline_rig(&gpus, cfg)?;
        let n = cfg.pipeline_mib << 18;
        let placement = pp::placement(gpus.len());
        let mut points = Vec::with_capacity(cfg.micro_batches.len());
        for &m in &cfg.micro_batches {
            points.push(bubble_point(&mut rig, n, m, &placement, cfg.repeats)?);
            progress.step(&format!("pipeline, {m} micro-batches"));
        }
        let m = PipelineResults::drawn(&cfg.micro_batches);
        let plan = pp::plan_over("events only", m, n, std::sync::Arc::new(pp::events_only), &placement);
        let on = if gpus.len() > 1 { format!("a stage on each of GPUs {ordinals:?}") } else { format!("both stages on GPU {}", ordinals[0]) };
        let timeline = timeline_of(&mut rig, &plan, &format!("{m} micro-batches, {on}"))?;
        let pipeline_iterations = rig.iterations;
        drop(rig);
        // Training: forward and backward of every micro-batch, in each
        // order, on a rig with a buffer for each of a stage's four.
        let mut training = Vec::with_capacity(TrainingOrder::ALL.len());
        {
            let mut rig = PlanRig::over(&gpus, n, 4 * placement.len(), 1)?;
            rig.iterations = pipeline_iterations;
            for order in TrainingOrder::ALL {
                let mut points = Vec::with_capacity(cfg.micro_batches.len());
                for &m in &cfg.micro_batches {
                    points.push(plan_bubble(&mut rig, &training::plan(order, m, n, &placement), placement.len(), m, cfg.repeats)?);
                    progress.step(&format!("{}, {m} micro-batches", order.name()));
                }
                let m = PipelineResults::drawn(&cfg.micro_batches);
                let timeline = timeline_of(&mut rig, &training::plan(order, m, n, &placement), &format!("{}, {m} micro-batches, {on}", order.name()))?;
                training.push(TrainingSweep { order, points, timeline });
            }
        }
        PipelineResults { stages: placement.len(), iterations: pipeline_iterations, stage_ms, points, timeline, training }
    };

    // The gradient all-reduce, with two GPUs and NCCL.
    let all_reduce = if gpus.len() < 2 {
        Err("one GPU here: an all-reduce sums over two or more".to_string())
    } else {
        let _r = crate::gpu::trace::range("gradient all-reduce");
        match all_reduce_sweep(&gpus, cfg, t, &mut progress) {
            Ok(a) => Ok(a),
            // No NCCL on this machine: a line in the results, not a failed lab.
            Err(LabError::MissingLibrary { library, why }) => Err(format!("{library} could not be loaded: {}", why.lines().last().unwrap_or(""))),
            // Any other failure is said in the results too, so the parts
            // already measured are kept (the recorded-data test fails a
            // two-GPU recording without its all-reduce).
            Err(e) => Err(format!("the all-reduce failed: {e}")),
        }
    };
    progress.finish();
    gpu.bind()?;
    Ok(MultiGpuResults { config: cfg.clone(), topology, gpus: ordinals, peer, ring, torch, four_way: four_way_result, four_way_timeline, pipeline, all_reduce })
}

/// The all-reduce sweep over the lab's GPUs: one all-reduce alone by
/// message size (NCCL's bus bandwidth) beside PyTorch's on the same GPUs;
/// then the layer kernel calibrated to `--compute-ratio` times one
/// all-reduce at the largest bucket, and each bucket size under each of
/// `--nccl-ctas` (the layers calibrated once, so that steps compare
/// across settings); one overlapped step drawn at the middle size.
fn all_reduce_sweep(gpus: &[Gpu], cfg: &MultiGpuConfig, t: Timing, progress: &mut Progress) -> Result<AllReduceResults> {
    let ranks = gpus.len();
    let per_gpu = cfg.grad_mib << 18;
    let nccl_version = crate::gpu::nccl::Nccl::load()?.version()?;
    let env_override = crate::gpu::nccl::nccl_ctas_env_override();
    let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();

    // Bus bandwidth by size: rank g's buffer is the plan's buffer g.
    let largest = cfg.all_reduce_mib.iter().copied().max().unwrap_or(1) << 18;
    let mut sizes = Vec::with_capacity(cfg.all_reduce_mib.len());
    {
        let mut rig = PlanRig::over(gpus, largest, ranks, 1)?.with_nccl()?;
        for &mib in &cfg.all_reduce_mib {
            sizes.push(((mib as u64) << 20, rig.alone(OpKind::AllReduce(ranks as u8), mib << 18, t.runs.max(3))?));
        }
    }
    progress.step("all-reduce by size");
    let torch = (!cfg.no_reference).then(|| {
        progress.step_note("PyTorch's all_reduce on the same GPUs");
        let bytes: Vec<u64> = sizes.iter().map(|s| s.0).collect();
        super::reference::torch_all_reduce(&cfg.python, &ordinals, &bytes, (t.copies, t.runs))
    });

    // The layers' kernels in many short blocks, as a network's are: NCCL's
    // kernel, on a stream of higher priority, takes the next SMs that free
    // up and runs beside them (one resident wave would hold every SM until
    // it ends, and each sum would wait for a whole layer).
    let mut rig = PlanRig::over(gpus, per_gpu * ranks, 2 * ranks, 1)?.with_kernel_blocks(crate::gpu::Blocks::Waves).with_nccl()?;
    let (_, greatest) = gpus[0].stream_priority_range()?;
    let shape = |mib: usize| all_reduce::Shape { per_gpu, bucket: mib << 18, ranks, comm_priority: greatest };
    let biggest = shape(cfg.buckets_mib.iter().copied().max().unwrap_or(1));
    let (_, n) = biggest.bucket_range(0);
    let one_sum = rig.alone(OpKind::AllReduce(ranks as u8), n, 3)?.median;
    calibrate_kernel(&mut rig, cfg.compute_ratio * one_sum, n)?;
    let copy_engines = gpus[0].copy_engines()?;
    let mut sweeps = Vec::with_capacity(cfg.nccl_ctas.len());
    let mut sorted = cfg.buckets_mib.clone();
    sorted.sort_unstable();
    let middle = shape(sorted[sorted.len() / 2]);
    let (mut skipped, mut timeline) = (Vec::new(), None);
    for &ctas in &cfg.nccl_ctas {
        if let Err(e) = rig.set_nccl_ctas(ctas) {
            // A cap this NCCL cannot make (before 2.17) is a line in the
            // results; NCCL's own choice failing fails the sweep.
            if ctas == crate::gpu::nccl::NcclCtas::Default {
                return Err(e);
            }
            skipped.push(format!("{ctas}: {e}"));
            rig.set_nccl_ctas(crate::gpu::nccl::NcclCtas::Default)?;
            continue;
        }
        let mut points = Vec::with_capacity(cfg.buckets_mib.len());
        for &mib in &cfg.buckets_mib {
            points.push(all_reduce_point(&mut rig, shape(mib), copy_engines, t)?);
            progress.step(&format!("all-reduce, {ctas}, buckets of {mib} MiB"));
        }
        sweeps.push(CtaSweep { ctas, points });
        // The timeline under NCCL's own choice (the first setting), while
        // its communicators are the rig's.
        if ctas == crate::gpu::nccl::NcclCtas::Default {
            timeline = timeline_of(
                &mut rig,
                &all_reduce::plan(middle, 1, all_reduce::Sync::Overlapped),
                &format!("one step, {} buckets of {} MiB, overlapped", middle.buckets(), sorted[sorted.len() / 2]),
            )?;
        }
    }
    // validate() puts NCCL's own choice first.
    let points = sweeps.remove(0).points;
    let device_bytes = rig.device_bytes();
    Ok(AllReduceResults { nccl_version, ranks, iterations: rig.iterations, points, timeline, sizes, torch, capped: sweeps, skipped, env_override, device_bytes })
}
