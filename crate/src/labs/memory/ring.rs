//! Pinned staging for a CPU producer: per batch, the CPU writes the batch
//! into page-locked memory, which the upload copies from. Either a new
//! pinned buffer per batch (cuMemHostAlloc, then cuMemFreeHost once its
//! upload is done), or a ring of pinned slots made once and handed back to
//! the CPU by a host function after each slot's upload (cuLaunchHostFunc:
//! the CPU sleeps until then, nothing polls). Swept by slot count: the
//! fewest slots that keep the pipeline as fast as more would.

use super::MemoryConfig;
use crate::error::{LabError, Result};
use crate::gpu::plan::BACK_TO_BACK;
use crate::gpu::{MachineFacts, PlanRig, TimelineSource};
use crate::lab_kit::experiment::{self, Effect, Experiment, ExperimentResult};
use crate::measure::stats::Summary;
use crate::pipeline::issue::{HostRef, SignalRef};
use crate::pipeline::machine::{DeviceWaits, Machine};
use crate::pipeline::op::{Lane, Memory, OpKind, StreamKind};
use crate::pipeline::plan::{Plan, StreamSpec};
use crate::present::progress::Progress;
use serde::{Deserialize, Serialize};

/// How the producer's batches are staged in pinned memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// cuMemHostAlloc per batch; cuMemFreeHost once its upload is done
    /// (the CPU waits for the previous batch's upload before freeing it).
    PerBatch,
    /// A ring of this many slots in pinned memory made before the loop.
    Ring(usize),
}

impl Staging {
    pub fn label(self) -> String {
        match self {
            Staging::PerBatch => "cuMemHostAlloc + cuMemFreeHost per batch".into(),
            Staging::Ring(1) => "a ring of 1 pinned slot".into(),
            Staging::Ring(k) => format!("a ring of {k} pinned slots"),
        }
    }
}

/// Label prefix of the host functions that hand a slot back.
pub const SLOT_FREE: &str = "slot free";

/// The producer pipeline over `batches` batches of `elements / batches`:
/// per batch the CPU produces it into pinned staging memory, the upload
/// stream copies it to the device, the compute stream runs the kernel and
/// the download stream brings the result back. With a ring, the CPU waits
/// before reusing a slot until the host function after that slot's last
/// upload ran; the ring's slots are `host in`, pinned once by the program
/// before the loop (the lab's own pinned buffer).
pub fn plan(elements: usize, batches: usize, staging: Staging) -> Plan {
    let n = elements / batches;
    let specs = vec![
        StreamSpec::new("upload", StreamKind::NonBlocking, 0),
        StreamSpec::new("compute", StreamKind::NonBlocking, 0),
        StreamSpec::new("download", StreamKind::NonBlocking, 0),
    ];
    Plan::new(&staging.label(), specs, elements, 2, move |p, r| {
        let (up, compute, down) = (r.streams[0], r.streams[1], r.streams[2]);
        let slots = match staging {
            Staging::Ring(k) => k,
            Staging::PerBatch => 0,
        };
        let mut handed_back: Vec<Option<SignalRef>> = vec![None; slots];
        let mut previous: Option<(HostRef, crate::pipeline::issue::EventRef)> = None;
        for b in 0..batches {
            let at = b * n;
            // Where this batch is staged: (buffer, offset).
            let (staged, staged_at) = match staging {
                Staging::PerBatch => (p.alloc_pinned(n, &format!("staging {b}"))?, 0),
                Staging::Ring(k) => {
                    let slot = b % k;
                    if let Some(g) = handed_back[slot].take() {
                        p.host_wait_signal(g)?;
                    }
                    (r.input, slot * n)
                }
            };
            p.produce(staged, staged_at, n, b, &format!("produce {b}"))?;
            p.h2d(up, r.devices[0], at, staged, staged_at, n, &format!("H2D {b}"))?;
            let uploaded = p.event()?;
            p.record(uploaded, up)?;
            match staging {
                Staging::Ring(k) => handed_back[b % k] = Some(p.signal(up, &format!("{SLOT_FREE} {}", b % k))?),
                Staging::PerBatch => {
                    // The previous batch's staging is free once its upload is done.
                    if let Some((h, e)) = previous.replace((staged, uploaded)) {
                        p.host_wait(e)?;
                        p.free_pinned(h)?;
                    }
                }
            }
            p.wait(compute, uploaded)?;
            p.compute(compute, r.devices[0], at, r.devices[1], at, n, &format!("kernel {b}"))?;
            let computed = p.event()?;
            p.record(computed, compute)?;
            p.wait(down, computed)?;
            p.d2h(down, r.output, at, r.devices[1], at, n, &format!("D2H {b}"))?;
        }
        if let Some((h, e)) = previous {
            p.host_wait(e)?;
            p.free_pinned(h)?;
        }
        Ok(())
    })
    .with_producer(n)
}

/// The staging experiment: per-batch pinned allocation, then the ring by
/// each slot count of `cfg.ring_slots`.
pub fn staging(cfg: &MemoryConfig) -> Experiment {
    let mut variants = vec![plan(cfg.elements, cfg.ring_batches, Staging::PerBatch)];
    variants.extend(cfg.ring_slots.iter().map(|&k| plan(cfg.elements, cfg.ring_batches, Staging::Ring(k))));
    let mut effects = Vec::new();
    if let Some(i) = cfg.ring_slots.iter().position(|&k| k == 2) {
        effects.push(Effect::new("cuMemHostAlloc + cuMemFreeHost per batch instead of a ring of 2 slots", 1 + i, 0, true));
    }
    if let (Some(one), Some(two)) = (cfg.ring_slots.iter().position(|&k| k == 1), cfg.ring_slots.iter().position(|&k| k == 2)) {
        effects.push(Effect::new("1 slot instead of 2: the CPU waits for each upload before producing the next batch", 1 + two, 1 + one, true));
    }
    Experiment {
        name: "pinned-staging",
        shows: "a pinned buffer per batch pays cuMemHostAlloc and cuMemFreeHost every batch; a ring of pinned slots made once, handed back by host functions, pays neither, and needs only enough slots for the producer to fill one while another uploads",
        variants,
        watch: None,
        effects,
        ceiling_from: None,
    }
}

/// What the ring's measurement found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RingResults {
    pub batches: usize,
    /// Elements per batch.
    pub batch_elements: usize,
    /// The slot count of each ring, in the order of the variants after
    /// the first (per-batch allocation).
    pub slots: Vec<usize>,
    /// The CPU producing one batch into pinned memory alone, batch after
    /// batch, ms.
    pub produce_ms: Summary,
    /// The CPU's time per batch in a ring with a slot for every batch (it
    /// never waits), ms: producing the batch and issuing its GPU work,
    /// inside the running pipeline; and of it, producing the batch (its
    /// median batch in each run). The model is told both: the rest is
    /// issuing ([`Self::issue_per_op_ms`]).
    pub cpu_per_batch_ms: Summary,
    pub produce_in_pipeline_ms: Summary,
    /// A host function's round trip on its stream right after a copy (the
    /// callback thread had gone to sleep), and each one more right after
    /// another (awake), ms.
    pub host_fn_ms: Summary,
    pub host_fn_awake_ms: Summary,
    /// A CPU thread's wake-up after the host function it waited on ran, ms.
    pub signal_wake_ms: Summary,
    pub staging: ExperimentResult,
}

impl RingResults {
    /// Each ring variant's slot count and result, in the sweep's order.
    pub fn rings(&self) -> Vec<(usize, &crate::lab_kit::experiment::VariantResult)> {
        self.slots.iter().copied().zip(self.staging.variants.iter().skip(1)).collect()
    }
    /// The fewest slots whose median is within the spread of the fastest
    /// ring (its upper quartile, and at least 2% over its median): more
    /// slots than that only hold more pinned memory.
    pub fn fewest_slots(&self) -> Option<usize> {
        self.fewest().map(|(k, _)| k)
    }
    /// [`Self::fewest_slots`] with that ring's result.
    pub fn fewest(&self) -> Option<(usize, &crate::lab_kit::experiment::VariantResult)> {
        let rings = self.rings();
        let best = rings.iter().map(|(_, v)| v).min_by(|a, b| a.total_ms.median.total_cmp(&b.total_ms.median))?;
        let enough = best.total_ms.middle_range().1.max(1.02 * best.total_ms.median);
        rings.into_iter().filter(|(_, v)| v.total_ms.median <= enough).min_by_key(|&(k, _)| k)
    }
    /// The model's fewest slots by the same rule on its own totals.
    pub fn fewest_slots_modelled(&self) -> Option<usize> {
        let rings = self.rings();
        let best = rings.iter().map(|(_, v)| v.model_ms).fold(f64::INFINITY, f64::min);
        rings.iter().filter(|(_, v)| v.model_ms <= 1.02 * best).map(|&(k, _)| k).min()
    }
    /// Per-batch allocation's variant.
    pub fn per_batch(&self) -> Option<&crate::lab_kit::experiment::VariantResult> {
        self.staging.variant(&Staging::PerBatch.label())
    }
    /// Issuing one GPU op of a batch in the ring, as the model was told
    /// it: the CPU's time per batch in the ring that never waits, less
    /// producing the batch, over the batch's GPU ops (`issue_in_ring`), ms.
    pub fn issue_per_op_ms(&self) -> f64 {
        gpu_ops_per_batch(self.batches).map_or(f64::NAN, |ops| issue_in_ring(ops, self.cpu_per_batch_ms.median, self.produce_in_pipeline_ms.median))
    }
    /// Lines for the table: per batch, measured and model, and the verdicts.
    pub fn lines(&self) -> Vec<String> {
        let per = |ms: f64| ms / self.batches as f64;
        let mut out = vec![format!(
            "{} batches of {}; the CPU's time per batch in a ring that never waits {:.3} ms: producing the batch {:.3} (alone, batch after batch: {:.3}), issuing each of its GPU ops {:.3}; a host function's round trip {:.3} ms after a copy, {:.3} ms right after another; the CPU resumes {:.3} ms after the one it waited on",
            self.batches,
            crate::Bytes(4 * self.batch_elements as u64),
            self.cpu_per_batch_ms.median,
            self.produce_in_pipeline_ms.median,
            self.produce_ms.median,
            self.issue_per_op_ms(),
            self.host_fn_ms.median,
            self.host_fn_awake_ms.median,
            self.signal_wake_ms.median
        )];
        for v in &self.staging.variants {
            let (lo, hi) = v.total_ms.middle_range();
            out.push(format!(
                "{:<42} {:>8.3} ms per batch ({:.3}-{:.3})   model {:>8.3}   error {:+.1}%",
                v.name,
                per(v.total_ms.median),
                per(lo),
                per(hi),
                per(v.model_ms),
                100.0 * (v.model_ms / v.total_ms.median - 1.0)
            ));
        }
        match (self.fewest(), self.per_batch()) {
            (Some((k, ring)), Some(p)) => {
                let ring = ring.total_ms.median;
                out.push(format!(
                    "fewest slots that keep the pipeline full: {k} (the model says {}); per-batch cuMemHostAlloc costs {:.3} ms more per batch than that ring ({:.1}x its time)",
                    self.fewest_slots_modelled().map_or("-".into(), |m| m.to_string()),
                    per(p.total_ms.median - ring),
                    p.total_ms.median / ring
                ));
            }
            _ => out.push("no ring was measured".into()),
        }
        out
    }
}

/// Measures the staging experiment on `rig` (whose kernel is balanced):
/// a host function's round trips and the producer alone first; then every
/// variant, taking turns run by run, and after each round what the model
/// is told of the CPU (its time per batch in a ring that never waits, and
/// the pinned calls of a batch's size on an idle GPU), so that those are
/// measured in the same conditions as the runs they predict (the CPU's
/// time per batch moves with what ran before it; the data README of each
/// GPU tells by how much). Then each variant beside its prediction.
pub fn measure(rig: &mut PlanRig, cfg: &MemoryConfig, facts: MachineFacts, waits: DeviceWaits, progress: &mut Progress) -> Result<RingResults> {
    let (e, reps) = (staging(cfg), cfg.repeats);
    let (batches, n) = (cfg.ring_batches, cfg.elements / cfg.ring_batches);
    let (host_fn_ms, host_fn_awake_ms, signal_wake_ms) = host_fn_costs(rig, n, reps)?;
    let produce_ms = producer_alone(rig, n, (cfg.elements / n - 1).clamp(1, BACK_TO_BACK), reps)?;
    let machine = Machine {
        host_fn_round_trip: host_fn_ms.median,
        host_fn_awake: host_fn_awake_ms.median,
        signal_wake: signal_wake_ms.median,
        device_waits: waits,
        ..facts.machine()
    };
    let mut costs = rig.costs(&e.variants.iter().collect::<Vec<_>>(), reps)?;
    let models = e.variants.iter().map(Plan::dry_run).collect::<Result<Vec<_>>>()?;
    let wide = plan(cfg.elements, batches, Staging::Ring(batches));
    let wide_model = wide.dry_run()?;
    let pinned_probe = super::probes::idle_probe(Memory::Pinned, n)?;
    let (mut cpu, mut producing, mut pinned_runs) = (Vec::new(), Vec::new(), Vec::new());
    let totals = experiment::interleaved_with(rig, &e.variants, &models, reps, |rig, timed| {
        // The loop's host time untraced; the producer's spans traced (the
        // events cost the CPU time of their own between its batches).
        let per_batch = rig.run_modelled(&wide, &wide_model, TimelineSource::Off)?.issue_ms / batches as f64;
        let producing_ms = median_produce(rig, &wide, &wide_model)?;
        let pinned = super::probes::probe_run(rig, &pinned_probe, Memory::Pinned)?;
        if timed {
            cpu.push(per_batch);
            producing.push(producing_ms);
            pinned_runs.push(pinned);
        }
        Ok(())
    })?;
    let (cpu_per_batch_ms, produce_in_pipeline_ms) = (Summary::of(&cpu)?, Summary::of(&producing)?);
    costs.insert((OpKind::Host, n), produce_in_pipeline_ms.median);
    let machine = Machine { issue: issue_in_ring(gpu_ops_per_batch(batches)?, cpu_per_batch_ms.median, produce_in_pipeline_ms.median), ..machine };
    let (pinned, pinned_costs) = super::probes::idle_costs(&pinned_probe, Memory::Pinned, n, &pinned_runs)?;
    costs.extend(pinned_costs);
    progress.step(&format!(
        "pinned staging: the CPU's time per batch in a ring that never waits {:.3} ms: producing the batch {:.3} (alone {:.3}), issuing each GPU op {:.3}; a host function's round trip {:.3} ms ({:.3} awake), the CPU woken by one {:.3} ms; {}",
        cpu_per_batch_ms.median,
        produce_in_pipeline_ms.median,
        produce_ms.median,
        machine.issue,
        host_fn_ms.median,
        host_fn_awake_ms.median,
        signal_wake_ms.median,
        pinned.lines()[0]
    ));
    let staging = experiment::traced_and_predicted(rig, &e, &models, &totals, facts, machine, &costs, reps)?;
    let r = RingResults {
        batches,
        batch_elements: n,
        slots: cfg.ring_slots.clone(),
        produce_ms,
        cpu_per_batch_ms,
        produce_in_pipeline_ms,
        host_fn_ms,
        host_fn_awake_ms,
        signal_wake_ms,
        staging,
    };
    progress.step(r.lines().last().map_or("", |l| l.as_str()));
    Ok(r)
}

/// The producer writing `batches` batches of `n` elements in turn.
fn produce_alone(n: usize, batches: usize) -> Plan {
    Plan::new("the producer alone", vec![StreamSpec::new("unused", StreamKind::NonBlocking, 0)], n * (batches + 1), 2, move |p, r| {
        for b in 0..batches {
            p.produce(r.input, 0, n, b, PRODUCE)?;
        }
        Ok(())
    })
    .with_producer(n)
}

/// Label (or label prefix) of the producer's batches.
const PRODUCE: &str = "produce";

/// The producer's time per batch of `n` elements alone, batch after batch
/// (each run's median batch, `reps` runs after a warm-up), ms.
fn producer_alone(rig: &mut PlanRig, n: usize, batches: usize, reps: usize) -> Result<Summary> {
    let plan = produce_alone(n, batches);
    let model = plan.dry_run()?;
    rig.run_modelled(&plan, &model, TimelineSource::Off)?;
    Summary::of_runs(reps, || median_produce(rig, &plan, &model))
}

/// One traced run of `plan`: its median batch of producing, ms.
fn median_produce(rig: &mut PlanRig, plan: &Plan, model: &crate::pipeline::dry_run::DryRun) -> Result<f64> {
    let t = rig.run_modelled(plan, model, TimelineSource::Events)?.timeline.ok_or_else(|| LabError::config("no timeline"))?;
    let each: Vec<f64> = t.spans.iter().filter(|s| s.label.starts_with(PRODUCE)).map(|s| (s.end_us - s.start_us) / 1e3).collect();
    Ok(Summary::of(&each)?.median)
}

/// Issuing one GPU op in `wide` (a ring of `batches` batches that never
/// waits), ms: the CPU's time per batch `cpu_per_batch` less producing the
/// batch (`produce`), over the batch's GPU ops (its upload, the host
/// function handing its slot back, its kernel and its download). Not the
/// machine's issue cost measured on a loop of copies and kernels: this
/// loop also launches host functions and keeps the CPU's own work in the
/// schedule, and the model puts that time where it happens, after the
/// batch is produced and while its upload runs (a ring of one slot waits
/// for that upload).
///
/// Timed alone, batch after batch, the producer is faster or slower than
/// inside a pipeline, by host: its threads sleep between batches and the
/// copy engines share the host's memory. The ring's pace
/// is the CPU's, so the model takes both from where they run.
fn issue_in_ring(ops_per_batch: f64, cpu_per_batch: f64, produce: f64) -> f64 {
    ((cpu_per_batch - produce) / ops_per_batch).max(0.0)
}

/// GPU ops per batch (the stream ops) of a ring of `batches` batches that
/// never waits, counted on its model at two elements a batch: the count
/// does not depend on the batch's size, and a model keeps a cell per element.
fn gpu_ops_per_batch(batches: usize) -> Result<f64> {
    let small = plan(2 * batches, batches, Staging::Ring(batches)).dry_run()?;
    Ok(small.schedule.ops.iter().filter(|o| matches!(o.lane, Lane::Stream(_))).count() as f64 / batches as f64)
}

/// From the end of the op labelled `from` to the start of the one
/// labelled `to` in `plan` (ms, `reps` runs after a warm-up, CUDA events
/// on the GPU's ops, the host clock on the CPU's).
fn gap(rig: &mut PlanRig, plan: &Plan, from: &str, to: &str, reps: usize) -> Result<Summary> {
    let model = plan.dry_run()?;
    rig.run_modelled(plan, &model, TimelineSource::Off)?;
    Summary::of_runs(reps, || {
        let t = rig.run_modelled(plan, &model, TimelineSource::Events)?.timeline.ok_or_else(|| LabError::config("no timeline"))?;
        let span = |label: &str| t.spans.iter().find(|s| s.label == label).ok_or_else(|| LabError::config(format!("{} lost its '{label}'", plan.name)));
        Ok((span(to)?.start_us - span(from)?.end_us) / 1e3)
    })
}

/// An upload of `n` elements, `count` host functions after it on its
/// stream, then either another upload there (`cpu_waits` false: the
/// stream's round trip) or the CPU waiting for the last host function's
/// signal and producing a batch (its wake-up).
fn after_host_functions(n: usize, count: usize, cpu_waits: bool) -> Plan {
    let specs = vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)];
    Plan::new("host functions after an upload", specs, n.max(2), 1, move |p, r| {
        let s = r.streams[0];
        p.h2d(s, r.devices[0], 0, r.input, 0, n, "before")?;
        let mut last = None;
        for i in 0..count {
            last = Some(p.signal(s, &format!("{SLOT_FREE} {i}"))?);
        }
        match (cpu_waits, last) {
            (true, Some(g)) => {
                p.host_wait_signal(g)?;
                p.produce(r.input, 0, n.min(WOKEN_ELEMENTS), 0, "after")
            }
            _ => p.h2d(s, r.devices[0], 0, r.input, 0, n, "after"),
        }
    })
    .with_producer(n.clamp(2, WOKEN_ELEMENTS))
}

/// What the CPU produces to show it woke (a few µs of work).
const WOKEN_ELEMENTS: usize = 1024;

/// A host function's costs after an upload of `n` elements, ms: its
/// round trip as its stream sees it (the callback thread had gone to
/// sleep during the upload), each further one right after another
/// (awake), and a CPU thread's wake-up after one ran: from the upload's
/// end to the CPU's next work, less half a round trip (the host function
/// runs halfway through it).
pub fn host_fn_costs(rig: &mut PlanRig, n: usize, reps: usize) -> Result<(Summary, Summary, Summary)> {
    const MORE: usize = 8;
    let one = gap(rig, &after_host_functions(n, 1, false), "before", "after", reps)?;
    let many = gap(rig, &after_host_functions(n, 1 + MORE, false), "before", "after", reps)?;
    let woken = gap(rig, &after_host_functions(n, 1, true), "before", "after", reps)?;
    let awake = Summary::of(&[((many.median - one.median) / MORE as f64).max(0.0)])?;
    let wake = Summary::of(&[(woken.median - one.median / 2.0).max(0.0)])?;
    Ok((one, awake, wake))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::op::Lane;
    use crate::pipeline::plan::Costs;

    fn cfg() -> MemoryConfig {
        MemoryConfig { elements: 1 << 12, ring_batches: 8, ring_slots: vec![1, 2, 3, 4], ..MemoryConfig::small() }
    }

    /// Produce 2, upload 1, kernel 1, download 1 per batch; a pinned
    /// allocation 3 and its release 1; a host function's round trip 0.2.
    fn predicted(plan: &Plan) -> f64 {
        let n = cfg().elements / cfg().ring_batches;
        let mut c = Costs::new();
        for (kind, ms) in [
            (OpKind::H2d, 1.0),
            (OpKind::Kernel, 1.0),
            (OpKind::D2h, 1.0),
            (OpKind::Host, 2.0),
            (OpKind::Alloc(Memory::Pinned), 3.0),
            (OpKind::Free(Memory::Pinned), 1.0),
        ] {
            c.insert((kind, n), ms);
        }
        let machine = Machine { host_fn_round_trip: 0.2, host_fn_awake: 0.1, host_wake: 0.01, ..Machine::engines(2) };
        plan.predicted_ms(machine, &c).unwrap()
    }

    #[test]
    fn every_staging_verifies_with_no_race_and_frees_what_it_allocates() {
        for plan in &staging(&cfg()).variants {
            let m = plan.dry_run().unwrap();
            assert!(m.schedule.races().is_empty(), "{}: {:?}", plan.name, m.schedule.races());
            assert!(m.unreleased().is_empty(), "{}: {:?}", plan.name, m.unreleased());
            let out = plan.expected_output().unwrap();
            assert!(out.iter().enumerate().all(|(i, p)| *p == Provenance::Output(i as u32)), "{}", plan.name);
        }
    }

    #[test]
    fn producing_into_a_slot_before_its_upload_handed_it_back_is_a_race() {
        // The ring without its waits: the producer overwrites a slot the
        // upload may still be reading.
        let n = 256;
        let racy = Plan::new("no waits", vec![StreamSpec::new("up", StreamKind::NonBlocking, 0)], 4 * n, 1, move |p, r| {
            for b in 0..4 {
                p.produce(r.input, 0, n, b, "produce")?;
                p.h2d(r.streams[0], r.devices[0], b * n, r.input, 0, n, "H2D")?;
                p.signal(r.streams[0], SLOT_FREE)?;
            }
            Ok(())
        })
        .with_producer(n);
        let m = racy.dry_run().unwrap();
        assert!(!m.schedule.races().is_empty());
        // Waiting for the signal orders the next produce after the upload.
        let fixed = plan(4 * n, 4, Staging::Ring(1));
        let m = fixed.dry_run().unwrap();
        assert!(m.schedule.races().is_empty());
        let waits = m.schedule.ops.iter().filter(|o| o.label.starts_with(SLOT_FREE) && matches!(o.lane, Lane::Stream(0))).count();
        assert_eq!(waits, 4, "one host function per upload, on the upload stream");
    }

    #[test]
    fn a_ring_needs_two_slots_when_producing_is_the_slowest_stage_and_per_batch_allocation_pays_every_batch() {
        let e = staging(&cfg());
        let t: Vec<f64> = e.variants.iter().map(predicted).collect();
        let (per_batch, one, two, three) = (t[0], t[1], t[2], t[3]);
        // One slot: produce, then wait for its upload and the round trip.
        assert!(one > two + 7.0 * 1.0, "{t:?}");
        // Two slots: the producer (2 per batch) sets the pace; more do not help.
        assert!((two - three).abs() < 0.05 * two, "{t:?}");
        assert!((two - (8.0 * 2.0 + 3.0)).abs() < 1.5, "{t:?}");
        // Per batch: an allocation of 3 and a release of 1 on the producer's thread.
        assert!(per_batch > two + 8.0 * 3.0, "{t:?}");
    }

    #[test]
    fn the_cpus_pace_less_producing_is_issuing_four_ops_and_the_model_gives_the_pace_back() {
        // The CPU's pace 2.4 per batch, producing 2 of it: issuing each of
        // the batch's 4 GPU ops (upload, host function, kernel, download)
        // 0.1. The model of the ring runs at that pace: 8 batches, then the
        // last batch's GPU work (3).
        let c = cfg();
        let n = c.elements / c.ring_batches;
        let wide = plan(c.elements, c.ring_batches, Staging::Ring(c.ring_batches));
        let issue = issue_in_ring(gpu_ops_per_batch(c.ring_batches).unwrap(), 2.4, 2.0);
        assert!((issue - 0.1).abs() < 1e-9, "{issue}");
        let machine = Machine { issue, host_fn_round_trip: 0.2, host_fn_awake: 0.1, ..Machine::engines(2) };
        let mut costs = Costs::new();
        for kind in [OpKind::H2d, OpKind::Kernel, OpKind::D2h] {
            costs.insert((kind, n), 1.0);
        }
        costs.insert((OpKind::Host, n), 2.0);
        let t = wide.predicted_ms(machine, &costs).unwrap();
        assert!((t - (8.0 * 2.4 + 3.0)).abs() < 0.5, "{t}");
        // Producing timed longer than the whole pace: issuing is 0, not negative.
        assert_eq!(issue_in_ring(gpu_ops_per_batch(c.ring_batches).unwrap(), 1.0, 2.0), 0.0);
    }

    #[test]
    fn the_fewest_slots_are_the_fewest_within_the_best_rings_spread() {
        let e = staging(&cfg());
        let flat = crate::testing::flat;
        let ring = |ms: [f64; 5]| {
            let variants = e
                .variants
                .iter()
                .zip(ms)
                .map(|(p, t)| crate::lab_kit::experiment::VariantResult {
                    name: p.name.clone(),
                    total_ms: flat(t),
                    model_ms: t,
                    watched_ms: None,
                    watched_model_ms: None,
                    bound_ms: None,
                    timeline: Default::default(),
                    predicted: Default::default(),
                })
                .collect();
            let facts = crate::gpu::MachineFacts {
                copy_engines: 2,
                h2d_ms: 1.0,
                d2h_ms: 1.0,
                both_ms: 1.0,
                wake_ms: 0.0,
                kernel_ms: 1.0,
                kernels_alternating_ms: 1.0,
                issue_ms: 0.0,
            };
            RingResults {
                batches: 8,
                batch_elements: 512,
                slots: vec![1, 2, 3, 4],
                produce_ms: flat(2.0),
                cpu_per_batch_ms: flat(2.2),
                produce_in_pipeline_ms: flat(2.0),
                host_fn_ms: flat(0.07),
                host_fn_awake_ms: flat(0.02),
                signal_wake_ms: flat(0.06),
                staging: ExperimentResult::new(&e, variants, facts, &Costs::new()),
            }
        };
        let r = ring([50.0, 30.0, 20.1, 20.0, 20.3]);
        assert_eq!(r.fewest_slots(), Some(2));
        assert_eq!(ring([50.0, 30.0, 25.0, 20.0, 20.3]).fewest_slots(), Some(3));
        let lines = r.lines();
        assert!(
            lines
                .last()
                .unwrap()
                .starts_with("fewest slots that keep the pipeline full: 2 (the model says 2); per-batch cuMemHostAlloc costs 3.737 ms more per batch"),
            "{lines:?}"
        );
        assert_eq!(
            r.rings().iter().map(|(k, v)| (*k, v.name.as_str())).collect::<Vec<_>>()[..2],
            [(1, "a ring of 1 pinned slot"), (2, "a ring of 2 pinned slots")]
        );
    }
}
