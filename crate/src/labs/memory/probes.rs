//! Which memory calls wait for the GPU, and for what: each allocate and
//! release call is timed on an idle GPU and beside busy kernels, busy
//! uploads and busy downloads on another stream. A call that takes about
//! as long as the busy work had left waited for it; the model is told
//! what was found ([`DeviceWaits`]) and times the calls so.

use super::MemoryConfig;
use crate::error::{LabError, Result};
use crate::gpu::{PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::machine::{DeviceWaits, SlowedBy, WaitsFor};
use crate::pipeline::op::{Memory, OpKind, StreamKind};
use crate::pipeline::plan::{cost_keys, Costs, Plan, StreamSpec, REUSED};
use crate::present::progress::Progress;
use crate::Bytes;
use serde::{Deserialize, Serialize};

/// The fewest GPU ops of a batch's size that keep the GPU busy in a
/// probe (about 16 batches' worth of one kind of work), and the most.
pub const BUSY_OPS: usize = 16;
pub const MAX_BUSY_OPS: usize = 1024;

/// The busy work lasts this many times the probed calls' time on an idle
/// GPU: a call slowed beside it (cuMemAlloc runs about three times as long
/// beside downloads) still ends before the work does, so the
/// release after it is tested too, and a slowdown is never read as a wait
/// (a call that waited takes most of the time left; one slowed, a few
/// times its idle time, which is then a small part of it).
pub const BUSY_OVER_CALLS: f64 = 3.0;

/// How many busy ops of `op_ms` each last [`BUSY_OVER_CALLS`] times
/// `calls_ms` (the probed calls' idle time), within [`BUSY_OPS`] and
/// [`MAX_BUSY_OPS`].
pub fn busy_ops(calls_ms: f64, op_ms: f64) -> usize {
    if op_ms.is_nan() || op_ms <= 0.0 || !calls_ms.is_finite() {
        return BUSY_OPS;
    }
    (BUSY_OVER_CALLS * calls_ms / op_ms).ceil().clamp(BUSY_OPS as f64, MAX_BUSY_OPS as f64) as usize
}

/// The memory calls the probes ask about, in order.
pub const PROBED_MEMORY: [Memory; 3] = [Memory::Device, Memory::Pool, Memory::Pinned];

/// Labels of the probes' ops: the busy work, the first pair (nothing to
/// reuse), the second (right after the first's release).
pub const BUSY: &str = "busy";
pub const PROBED: &str = "probed";
pub const PROBED_AGAIN: &str = "probed again";

/// The work a probe keeps the GPU busy with while the CPU makes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BusyWith {
    Kernels,
    Uploads,
    Downloads,
}

impl BusyWith {
    pub const ALL: [BusyWith; 3] = [BusyWith::Kernels, BusyWith::Uploads, BusyWith::Downloads];
    pub fn label(self) -> &'static str {
        match self {
            BusyWith::Kernels => "kernels",
            BusyWith::Uploads => "uploads",
            BusyWith::Downloads => "downloads",
        }
    }
    /// The ops it issues.
    pub fn kind(self) -> OpKind {
        match self {
            BusyWith::Kernels => OpKind::Kernel,
            BusyWith::Uploads => OpKind::H2d,
            BusyWith::Downloads => OpKind::D2h,
        }
    }
}

/// A probe of `memory`'s allocate and release calls: `ops` ops of `busy`
/// over the whole buffer keep the GPU busy (an idle GPU when `None`), then the CPU allocates `n` elements and releases them, twice
/// (a stream-ordered pair on another stream): the second allocation can
/// reuse what the first released. A call that returns only when the busy
/// work is done waited for it.
pub fn probe(memory: Memory, elements: usize, n: usize, busy: Option<BusyWith>, ops: usize) -> Plan {
    let specs = vec![StreamSpec::new("busy", StreamKind::NonBlocking, 0), StreamSpec::new("calls", StreamKind::NonBlocking, 0)];
    let name =
        format!("{} then {} {}", memory.call(true), memory.call(false), busy.map_or("on an idle GPU".to_string(), |b| format!("beside busy {}", b.label())));
    Plan::new(&name, specs, elements, 2, move |p, r| {
        let (s, all) = (r.streams[0], r.elements);
        match busy {
            None => {}
            Some(BusyWith::Kernels) => {
                for i in 0..ops {
                    p.compute(s, r.devices[0], 0, r.devices[1], 0, all, &format!("{BUSY} kernel {i}"))?;
                }
            }
            Some(BusyWith::Uploads) => {
                for i in 0..ops {
                    p.h2d(s, r.devices[0], 0, r.input, 0, all, &format!("{BUSY} upload {i}"))?;
                }
            }
            Some(BusyWith::Downloads) => {
                // Something to download first (the output is checked); the
                // CPU waits for it, so that its calls are made while the
                // downloads run, not during this upload.
                p.h2d(s, r.devices[0], 0, r.input, 0, all, &format!("{BUSY} upload"))?;
                let uploaded = p.event()?;
                p.record(uploaded, s)?;
                p.host_wait(uploaded)?;
                for i in 0..ops {
                    p.d2h(s, r.output, 0, r.devices[0], 0, all, &format!("{BUSY} download {i}"))?;
                }
            }
        }
        for name in [PROBED, PROBED_AGAIN] {
            match memory {
                Memory::Pool => {
                    let d = p.alloc_async(r.streams[1], n, name)?;
                    p.free_async(r.streams[1], d)?;
                }
                Memory::Pinned => {
                    let h = p.alloc_pinned(n, name)?;
                    p.free_pinned(h)?;
                }
                _ => {
                    let d = p.alloc(n, name)?;
                    p.free(d)?;
                }
            }
        }
        Ok(())
    })
}

/// One memory call pair timed beside one kind of busy work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Beside {
    pub busy: BusyWith,
    /// Host time of the allocate and the release calls, ms.
    pub alloc_ms: Summary,
    pub free_ms: Summary,
    /// How long the busy work still had to run when each call began, ms.
    pub alloc_left_ms: Summary,
    pub free_left_ms: Summary,
}

impl Beside {
    fn of(&self, alloc: bool) -> (&Summary, &Summary) {
        if alloc {
            (&self.alloc_ms, &self.alloc_left_ms)
        } else {
            (&self.free_ms, &self.free_left_ms)
        }
    }
}

/// One memory call pair probed on an idle GPU and beside each kind of busy work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallProbe {
    pub memory: Memory,
    pub bytes: u64,
    /// Host time of the allocate and the release calls on an idle GPU, ms.
    pub alloc_idle_ms: Summary,
    pub free_idle_ms: Summary,
    /// The allocate call right after the release, idle: it can reuse the block.
    pub alloc_again_idle_ms: Summary,
    pub beside: Vec<Beside>,
}

impl CallProbe {
    fn idle(&self, alloc: bool) -> &Summary {
        if alloc {
            &self.alloc_idle_ms
        } else {
            &self.free_idle_ms
        }
    }
    /// Whether the allocate (or the release) call waited for `b`'s busy
    /// work: beside it, the call took longer than on an idle GPU by more
    /// than half of what the work still had to run.
    pub fn waits_beside(&self, alloc: bool, b: &Beside) -> bool {
        let (busy, left) = b.of(alloc);
        left.median > 0.0 && busy.median - self.idle(alloc).median > 0.5 * left.median
    }
    /// What the allocate (or the release) call waits for.
    pub fn waits(&self, alloc: bool) -> WaitsFor {
        let mut w = WaitsFor::NOTHING;
        for b in self.beside.iter().filter(|b| self.waits_beside(alloc, b)) {
            match b.busy {
                BusyWith::Kernels => w.kernels = true,
                BusyWith::Uploads => w.uploads = true,
                BusyWith::Downloads => w.downloads = true,
            }
        }
        w
    }
    /// How much slower the allocate (or the release) call ran beside each
    /// kind of busy work it does not wait for: its median there over its
    /// median idle, where even its fastest quarter of runs there was slower
    /// than its slowest quarter idle (else 1, within the runs' spread).
    pub fn slowed(&self, alloc: bool) -> SlowedBy {
        slowed_beside(self.idle(alloc), self.beside.iter().filter(|b| !self.waits_beside(alloc, b) && !Self::ended(alloc, b)).map(|b| (b.busy, b.of(alloc).0)))
    }
    /// Whether `b`'s busy work had ended before the call began (in most
    /// runs): beside it, the call was not tested (an allocation that
    /// outlasts the busy work leaves its release nothing to wait for).
    fn ended(alloc: bool, b: &Beside) -> bool {
        b.of(alloc).1.median <= 0.0
    }
    /// The call's name, e.g. "cuMemFree".
    pub fn call(&self, alloc: bool) -> &'static str {
        self.memory.call(alloc)
    }
    /// One line per call: idle, beside each kind of work, the verdict.
    pub fn lines(&self) -> Vec<String> {
        [true, false]
            .into_iter()
            .map(|alloc| {
                let mut line = format!("{} of {}: {:.3} ms idle", self.call(alloc), Bytes(self.bytes), self.idle(alloc).median);
                if alloc {
                    line += &format!(" ({:.3} right after a release)", self.alloc_again_idle_ms.median);
                }
                for b in &self.beside {
                    let (busy, left) = b.of(alloc);
                    line += &format!("; beside {} {:.3} ({:.3} left)", b.busy.label(), busy.median, left.median);
                }
                let (w, slowed) = (self.waits(alloc), self.slowed(alloc));
                let untested: Vec<&str> = self.beside.iter().filter(|b| Self::ended(alloc, b)).map(|b| b.busy.label()).collect();
                if !self.beside.is_empty() && untested.len() == self.beside.len() {
                    return line + ": NOT TESTED (the busy work had ended before the call began)";
                }
                line += &if w.any() { format!(": WAITS for {}", w.describe()) } else { ": waits for nothing".to_string() };
                if slowed.any() {
                    line += &format!(", but runs {}", slowed.describe());
                }
                if !untested.is_empty() {
                    line += &format!(" (not tested beside {}: that work had ended before the call began)", untested.join(", "));
                }
                line
            })
            .collect()
    }
}

/// How much slower something ran beside each kind of busy work than idle
/// (`idle`): its median there over its median idle, where even its fastest
/// quarter of runs there was slower than its slowest quarter idle (else
/// 1, within the runs' spread); kinds not given: 1.
pub fn slowed_beside<'a>(idle: &Summary, beside: impl IntoIterator<Item = (BusyWith, &'a Summary)>) -> SlowedBy {
    let mut slowed = SlowedBy::NOT;
    for (kind, busy) in beside {
        let f = if busy.middle_range().0 > idle.middle_range().1 && idle.median > 0.0 { busy.median / idle.median } else { 1.0 };
        match kind {
            BusyWith::Kernels => slowed.kernels = f,
            BusyWith::Uploads => slowed.uploads = f,
            BusyWith::Downloads => slowed.downloads = f,
        }
    }
    slowed
}

/// What the probes found, as the model takes it.
pub fn device_waits(probes: &[CallProbe]) -> DeviceWaits {
    let waits = |m: Memory, alloc: bool| probes.iter().find(|p| p.memory == m).map_or(WaitsFor::NOTHING, |p| p.waits(alloc));
    DeviceWaits {
        alloc: waits(Memory::Device, true),
        free: waits(Memory::Device, false),
        pinned_alloc: waits(Memory::Pinned, true),
        pinned_free: waits(Memory::Pinned, false),
        alloc_slowed: probes.iter().find(|p| p.memory == Memory::Device).map_or(SlowedBy::NOT, |p| p.slowed(true)),
        ..DeviceWaits::default()
    }
}

/// Runs of the idle calls and of each busy op alone that size the busy work.
const SIZING_RUNS: usize = 3;

/// One probe run's (allocate, release, allocate again) host times and how
/// long the busy work still had to run when each call began, ms.
pub struct ProbeRun {
    calls: [f64; 3],
    left: [f64; 3],
}

pub fn probe_run(rig: &mut PlanRig, (plan, model): &(Plan, DryRun), memory: Memory) -> Result<ProbeRun> {
    let run = rig.run_modelled(plan, model, TimelineSource::Events)?;
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

/// Probes each memory call on an idle GPU and beside each kind of busy
/// work, all taking turns run by run; and the model's cost of each call
/// (its lower quartile on the idle GPU) of `n` elements.
pub fn measure(rig: &mut PlanRig, cfg: &MemoryConfig, n: usize, progress: &mut Progress) -> Result<(Vec<CallProbe>, Costs)> {
    let mut probes = Vec::new();
    let mut costs = Costs::new();
    let of = |runs: &[ProbeRun], f: &dyn Fn(&ProbeRun) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>());
    // Each kind of busy op alone, to size the busy work by.
    let op_ms = BusyWith::ALL.iter().map(|b| Ok(rig.alone(b.kind(), n, SIZING_RUNS)?.median)).collect::<Result<Vec<f64>>>()?;
    for memory in PROBED_MEMORY {
        // Each plan with its model, made once (a cell per element).
        let modelled = |busy, ops| -> Result<(Plan, DryRun)> {
            let plan = probe(memory, n, n, busy, ops);
            let model = plan.dry_run()?;
            Ok((plan, model))
        };
        let idle = idle_probe(memory, n)?;
        // The calls on an idle GPU first, to size the busy work by: the
        // allocate, release and allocate again timed, the last release as
        // the first.
        probe_run(rig, &idle, memory)?;
        let sizing = (0..SIZING_RUNS).map(|_| probe_run(rig, &idle, memory)).collect::<Result<Vec<_>>>()?;
        let calls_ms = of(&sizing, &|r| r.calls[0] + 2.0 * r.calls[1] + r.calls[2])?.median;
        let busy = BusyWith::ALL.iter().zip(&op_ms).map(|(&b, &op)| modelled(Some(b), busy_ops(calls_ms, op))).collect::<Result<Vec<_>>>()?;
        let (mut idle_runs, mut busy_runs): (Vec<ProbeRun>, Vec<Vec<ProbeRun>>) = (Vec::new(), busy.iter().map(|_| Vec::new()).collect());
        for rep in 0..=cfg.repeats {
            let i = probe_run(rig, &idle, memory)?;
            let b = busy.iter().map(|plan| probe_run(rig, plan, memory)).collect::<Result<Vec<_>>>()?;
            if rep > 0 {
                idle_runs.push(i);
                for (runs, run) in busy_runs.iter_mut().zip(b) {
                    runs.push(run);
                }
            }
        }
        let beside = BusyWith::ALL
            .iter()
            .zip(&busy_runs)
            .map(|(&busy, runs)| {
                Ok(Beside {
                    busy,
                    alloc_ms: of(runs, &|r| r.calls[0])?,
                    free_ms: of(runs, &|r| r.calls[1])?,
                    alloc_left_ms: of(runs, &|r| r.left[0])?,
                    free_left_ms: of(runs, &|r| r.left[1])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (idle_probe, idle_costs) = idle_costs(&idle, memory, n, &idle_runs)?;
        let p = CallProbe { beside, ..idle_probe };
        progress.step(&p.lines().join("; "));
        costs.extend(idle_costs);
        probes.push(p);
    }
    Ok((probes, costs))
}

/// The model's cost of each call of probe `p` (its median on the idle
/// GPU): by the elements its op covers, as the probe's schedule
/// (`idle_model`) counts them. A median, not the lower quartile the GPU's
/// ops are costed by: a blocking call is the CPU's work (the driver and the
/// OS mapping pages), which varies call to call within a run as much as
/// run to run, and a pipeline's total sums many calls.
fn call_costs(idle_model: &DryRun, p: &CallProbe, costs: &mut Costs) {
    for (o, key) in idle_model.schedule.ops.iter().zip(cost_keys(&idle_model.schedule)) {
        let ms = match o.kind {
            OpKind::Alloc(_) if key & REUSED != 0 => p.alloc_again_idle_ms,
            OpKind::Alloc(_) => p.alloc_idle_ms,
            OpKind::Free(_) => p.free_idle_ms,
            _ => continue,
        };
        costs.entry((o.kind, key)).or_insert(ms.median);
    }
}

/// `memory`'s calls of `n` elements on an idle GPU: the probe plan (with
/// its model) that [`probe_run`] runs, and what its `runs` found, with
/// the model's costs of them.
pub fn idle_probe(memory: Memory, n: usize) -> Result<(Plan, DryRun)> {
    let plan = probe(memory, n, n, None, 0);
    let model = plan.dry_run()?;
    Ok((plan, model))
}

/// [`idle_probe`]'s runs as a probe with no busy work, and the model's costs.
pub fn idle_costs(idle: &(Plan, DryRun), memory: Memory, n: usize, runs: &[ProbeRun]) -> Result<(CallProbe, Costs)> {
    let of = |i: usize| Summary::of(&runs.iter().map(|r| r.calls[i]).collect::<Vec<_>>());
    let p = CallProbe { memory, bytes: 4 * n as u64, alloc_idle_ms: of(0)?, free_idle_ms: of(1)?, alloc_again_idle_ms: of(2)?, beside: Vec::new() };
    let mut costs = Costs::new();
    call_costs(&idle.1, &p, &mut costs);
    Ok((p, costs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flat;

    fn beside(busy: BusyWith, alloc: f64, free: f64, left: f64) -> Beside {
        Beside { busy, alloc_ms: flat(alloc), free_ms: flat(free), alloc_left_ms: flat(left), free_left_ms: flat(left) }
    }

    #[test]
    fn a_call_waits_for_the_work_it_took_most_of_the_time_left_of() {
        let p = CallProbe {
            memory: Memory::Device,
            bytes: 1 << 20,
            alloc_idle_ms: flat(0.2),
            free_idle_ms: flat(0.1),
            alloc_again_idle_ms: flat(0.07),
            beside: vec![beside(BusyWith::Kernels, 0.21, 5.1, 5.0), beside(BusyWith::Uploads, 0.25, 4.9, 5.0), beside(BusyWith::Downloads, 4.8, 5.0, 5.0)],
        };
        assert_eq!(p.waits(true), WaitsFor { downloads: true, ..WaitsFor::NOTHING });
        assert_eq!(p.waits(false), WaitsFor::EVERYTHING);
        let lines = p.lines();
        assert!(lines[0].starts_with("cuMemAlloc of 1 MiB: 0.200 ms idle (0.070 right after a release); beside kernels 0.210 (5.000 left)"), "{lines:?}");
        // (flat runs: the 5% beside kernels and 25% beside uploads are beyond their spread)
        assert!(lines[0].ends_with(": WAITS for downloads, but runs 1.05x beside kernels, 1.25x beside uploads"), "{lines:?}");
        assert!(lines[1].ends_with(": WAITS for all GPU work"), "{lines:?}");
        let w = device_waits(std::slice::from_ref(&p));
        assert_eq!((w.alloc, w.free, w.pinned_free), (p.waits(true), WaitsFor::EVERYTHING, WaitsFor::NOTHING));
        // Nothing left to wait for: no verdict of waiting, however slow.
        let idle = CallProbe { beside: vec![beside(BusyWith::Kernels, 9.0, 9.0, 0.0)], ..p };
        assert!(!idle.waits(true).any() && idle.lines()[1].ends_with(": NOT TESTED (the busy work had ended before the call began)"), "{:?}", idle.lines());
        assert!(!idle.slowed(false).any());
    }

    #[test]
    fn a_call_slowed_beyond_its_spread_beside_work_it_does_not_wait_for_is_slowed_by_it() {
        let spread = |median: f64, lo: f64, hi: f64| Summary { median, min: lo, max: hi, n: 9, middle: Some((lo, hi)) };
        let mut p = CallProbe {
            memory: Memory::Device,
            bytes: 32 << 20,
            alloc_idle_ms: spread(0.30, 0.28, 0.33),
            free_idle_ms: flat(0.1),
            alloc_again_idle_ms: flat(0.08),
            beside: vec![beside(BusyWith::Kernels, 0.31, 5.0, 5.0), beside(BusyWith::Uploads, 0.34, 9.6, 9.8), beside(BusyWith::Downloads, 0.96, 10.2, 10.4)],
        };
        // Beside kernels and uploads within the idle spread; downloads 3.2x.
        p.beside[1].alloc_ms = spread(0.34, 0.32, 0.36);
        p.beside[2].alloc_ms = spread(0.96, 0.90, 1.0);
        let slowed = p.slowed(true);
        assert_eq!((slowed.kernels, slowed.uploads), (1.0, 1.0));
        assert!((slowed.downloads - 3.2).abs() < 1e-9, "{slowed:?}");
        assert!(p.lines()[0].ends_with(": waits for nothing, but runs 3.20x beside downloads"), "{:?}", p.lines());
        assert_eq!(device_waits(std::slice::from_ref(&p)).alloc_slowed, slowed);
        // A call that waited for the work is not also slowed by it.
        assert!(!p.slowed(false).any(), "{:?}", p.slowed(false));
        assert!(!p.waits(true).any() && p.waits(false) == WaitsFor::EVERYTHING);
        // The kernels had ended before the release began: untested there, said so.
        p.beside[0].free_left_ms = flat(0.0);
        assert!(p.lines()[1].ends_with("(not tested beside kernels: that work had ended before the call began)"), "{:?}", p.lines());
        assert_eq!(p.waits(false), WaitsFor { kernels: false, ..WaitsFor::EVERYTHING });
    }

    #[test]
    fn the_busy_work_outlasts_the_calls_three_times_within_its_limits() {
        // cuMemHostAlloc of 32 MiB (17 ms) and its release (5): 16 uploads of
        // 0.6 ms ended before the release; 3 x (17 + 2 x 5 + 17) / 0.6 = 220.
        assert_eq!(busy_ops(17.0 + 2.0 * 5.0 + 17.0, 0.6), 220);
        assert_eq!(busy_ops(0.3, 0.6), BUSY_OPS);
        assert_eq!(busy_ops(1e6, 0.6), MAX_BUSY_OPS);
        assert_eq!(busy_ops(1.0, 0.0), BUSY_OPS);
        assert_eq!(busy_ops(f64::NAN, 0.6), BUSY_OPS);
        let ops = probe(Memory::Pinned, 1 << 10, 256, Some(BusyWith::Uploads), 220).dry_run().unwrap().schedule.ops;
        assert_eq!(ops.iter().filter(|o| o.label.starts_with(BUSY)).count(), 220);
    }

    #[test]
    fn a_probe_issues_its_pair_after_the_busy_work() {
        for m in PROBED_MEMORY {
            for busy in BusyWith::ALL {
                let p = probe(m, 1 << 10, 256, Some(busy), BUSY_OPS);
                let model = p.dry_run().unwrap();
                let labels: Vec<&str> = model.schedule.ops.iter().map(|o| o.label.as_str()).collect();
                let first = if busy == BusyWith::Downloads { BUSY_OPS + 1 } else { BUSY_OPS };
                assert_eq!(labels.len(), first + 4, "{labels:?}");
                assert!(labels[..first].iter().all(|l| l.starts_with(BUSY)), "{labels:?}");
                assert!(model.schedule.ops[first - 1].kind == busy.kind(), "{labels:?}");
                assert!(labels[first].ends_with(PROBED) && labels[first + 1].ends_with(PROBED), "{labels:?}");
                assert!(labels[first + 2].ends_with(PROBED_AGAIN) && labels[first + 3].ends_with(PROBED_AGAIN), "{labels:?}");
                let reused = crate::pipeline::plan::reuses(&model.schedule);
                assert!(reused[first + 2] && !reused[first], "the second allocation reuses the first's block");
                if busy == BusyWith::Downloads {
                    // Issued once the CPU saw the upload end: its calls come while the downloads run.
                    assert!(!model.schedule.ops[1].after_host_wait.is_empty(), "{labels:?}");
                }
                assert!(model.schedule.races().is_empty());
                assert!(p.expected_output().is_ok());
            }
            assert!(!probe(m, 1 << 10, 256, None, 0).dry_run().unwrap().schedule.ops.iter().any(|o| o.label.starts_with(BUSY)));
        }
    }
}
