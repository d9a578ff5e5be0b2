//! Exercise 6: memory that does not stall the pipeline. The learner gets
//! the two-stream pipeline of the lab with per-batch scratch memory: each
//! batch's scratch holds its input and the kernel's output, the compute
//! stream uploads and computes into it, the download stream copies the
//! result out of it. The given loop gets the scratch with cuMemAlloc and
//! gives it back with cuMemFree once the CPU has seen the download end (a
//! cuMemFree of memory still in use is an error). The learner rewrites the
//! loop so no memory call stalls the other stream; the checker runs it on
//! the GPU when there is one, else on the queue model with the recorded
//! costs and what the probes found, and names what is wrong: a release
//! before the download has read the memory, memory never released, a
//! call that still waits.

use super::{MemoryConfig, MemoryResults};
use crate::error::Result;
use crate::gpu::{Gpu, MemPool, PlanRig};
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::loop_check;
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::measure::record::Record;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{HostRef, Issue, StreamRef};
use crate::pipeline::op::{Lane, Memory, OpKind, StreamKind};
use crate::pipeline::plan::{chunk, Plan, StreamSpec};
use std::sync::Arc;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise::in_cell("06-memory", "memory calls that do not stall the pipeline", HINTS, example, "cuMemFree")];

/// The exercise answered on the recording in `dev`: the solution, or the
/// loop as the notebook gives it.
fn example(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Record<MemoryResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    Ok(Some(check_on_model(&rec.results, Arc::new(if right { solution } else { given }))))
}

/// A pass: no slower than the fix by more than this share.
pub const SLACK: f64 = 0.10;

/// What the learner's loop is handed.
#[derive(Clone, Debug)]
pub struct ScratchTask {
    pub batches: usize,
    pub elements: usize,
    /// Uploads and kernels.
    pub compute: StreamRef,
    /// Downloads.
    pub download: StreamRef,
    pub host_in: HostRef,
    pub host_out: HostRef,
}

impl ScratchTask {
    /// (first element, element count) of batch `b`.
    pub fn batch(&self, b: usize) -> (usize, usize) {
        chunk(self.elements, self.batches, b)
    }
    /// Batch `b`'s work in `scratch` (2 x its elements: its input, then the
    /// kernel's output): the upload and the kernel on the compute stream,
    /// the download on the download stream after the kernel (an event).
    /// Returns nothing; the download is the last use of `scratch`.
    pub fn work(&self, p: &mut dyn Issue, b: usize, scratch: crate::pipeline::issue::DevRef) -> Result<()> {
        let (at, n) = self.batch(b);
        p.h2d(self.compute, scratch, 0, self.host_in, at, n, &format!("H2D {b}"))?;
        p.compute(self.compute, scratch, 0, scratch, n, n, &format!("kernel {b}"))?;
        let computed = p.event()?;
        p.record(computed, self.compute)?;
        p.wait(self.download, computed)?;
        p.d2h(self.download, self.host_out, at, scratch, n, n, &format!("D2H {b}"))
    }
}

/// A learner's loop.
pub type Loop = Arc<dyn Fn(&mut dyn Issue, &ScratchTask) -> Result<()> + Send + Sync>;

/// The loop the learner is given: cuMemAlloc per batch; once the CPU has
/// seen the batch's download end, cuMemFree.
pub fn given(p: &mut dyn Issue, t: &ScratchTask) -> Result<()> {
    for b in 0..t.batches {
        let scratch = p.alloc(2 * t.batch(b).1, &format!("scratch {b}"))?;
        t.work(p, b, scratch)?;
        let downloaded = p.event()?;
        p.record(downloaded, t.download)?;
        p.host_wait(downloaded)?;
        p.free(scratch)?;
    }
    Ok(())
}

/// The fix: the stream-ordered pair. Allocated on the compute stream,
/// given back on the download stream right after the download, its last
/// use (stream order makes that safe, and the pool lets the compute
/// stream take the block again). The CPU never waits, and no stream
/// waits for a release.
pub fn solution(p: &mut dyn Issue, t: &ScratchTask) -> Result<()> {
    for b in 0..t.batches {
        let scratch = p.alloc_async(t.compute, 2 * t.batch(b).1, &format!("scratch {b}"))?;
        t.work(p, b, scratch)?;
        p.free_async(t.download, scratch)?;
    }
    Ok(())
}

/// A deliberately slow fix, kept for tests and the notebook: the release
/// goes on the compute stream after it waited (on the GPU) for the
/// download, so batch b+1's upload waits for batch b's download.
pub fn frees_on_the_compute_stream(p: &mut dyn Issue, t: &ScratchTask) -> Result<()> {
    for b in 0..t.batches {
        let scratch = p.alloc_async(t.compute, 2 * t.batch(b).1, &format!("scratch {b}"))?;
        t.work(p, b, scratch)?;
        let downloaded = p.event()?;
        p.record(downloaded, t.download)?;
        p.wait(t.compute, downloaded)?;
        p.free_async(t.compute, scratch)?;
    }
    Ok(())
}

/// A learner's loop as a plan on the lab's buffers and streams.
pub fn plan(name: &str, cfg: &MemoryConfig, learner: Loop) -> Plan {
    let batches = cfg.batches;
    let specs = vec![StreamSpec::new("compute", StreamKind::NonBlocking, 0), StreamSpec::new("download", StreamKind::NonBlocking, 0)];
    Plan::new(name, specs, cfg.elements, 0, move |p, r| {
        let task = ScratchTask { batches, elements: r.elements, compute: r.streams[0], download: r.streams[1], host_in: r.input, host_out: r.output };
        learner(p, &task)
    })
}

/// The lab's measured facts, for the messages: (cuMemFree beside busy work
/// and idle, cuMemAlloc idle), median ms.
fn measured(rec: &MemoryResults) -> Option<(f64, f64, f64)> {
    let device = rec.probes.iter().find(|p| p.memory == Memory::Device)?;
    let busy_free = device.beside.iter().map(|b| b.free_ms.median).fold(0.0, f64::max);
    Some((busy_free, device.free_idle_ms.median, device.alloc_idle_ms.median))
}

/// What the model says is wrong with the loop, before timing it: data,
/// races, memory ([`loop_check::shape`]), and the blocking calls the
/// probes found waiting on `probed`, the GPU they ran on ("this GPU" for
/// a live check, "the recorded GPU" on a recording with no GPU here).
fn shape_findings(plan: &Plan, rec: &MemoryResults, probed: &str, rep: &mut CheckReport) -> Option<DryRun> {
    let model = loop_check::shape(plan, rep)?;
    let count = |kind: OpKind| model.schedule.ops.iter().filter(|o| o.kind == kind).count();
    let facts = measured(rec);
    // A cuMemFree with GPU work issued after it stalls that work (one at
    // the very end stalls nothing).
    let ops = &model.schedule.ops;
    let frees = ops
        .iter()
        .enumerate()
        .filter(|(i, o)| o.kind == OpKind::Free(Memory::Device) && ops[i + 1..].iter().any(|later| matches!(later.lane, Lane::Stream(_))))
        .count();
    let waits = rec.device_waits.free;
    let cpu_waits = model.schedule.cpu_waited_for_gpu();
    if frees > 0 && (waits.any() || cpu_waits) {
        // Two costs, and the first is the larger: memory may be given back
        // only once the GPU is done with it, so the CPU waits for the
        // download before each cuMemFree; and the call itself waits.
        let mut why = String::from("cuMemFree may only give back memory the GPU has finished with");
        if cpu_waits {
            why += ", so your loop makes the CPU wait for each batch's download before it";
        }
        if waits.any() {
            why += &format!(
                "{}{probed} cuMemFree itself waits for {} already issued (lab 6's probes{})",
                if cpu_waits { "; and on " } else { ", and on " },
                waits.describe(),
                facts.map_or(String::new(), |(busy, idle, _)| format!(": {busy:.3} ms beside busy work, {idle:.3} ms on an idle GPU"))
            );
        }
        rep.problem(format!(
            "your loop still calls cuMemFree between batches ({frees} calls): {why}. The CPU cannot issue the next batch until the download stream is done"
        ));
    }
    let allocs = count(OpKind::Alloc(Memory::Device));
    if allocs > 0 {
        rep.note(format!(
            "your loop calls cuMemAlloc {allocs} times{}: each one costs its own time, every batch",
            facts.map_or(String::new(), |(_, _, alloc)| format!(" ({alloc:.3} ms each on an idle GPU, measured)"))
        ));
    }
    if cpu_waits {
        rep.note("your loop makes the CPU wait for the GPU: each wait stops it issuing the next batch until the GPU catches up");
    }
    Some(model)
}

/// What the learner's loop is judged against.
fn judge(cfg: &MemoryConfig) -> loop_check::Judge {
    loop_check::Judge { given: plan("given", cfg, Arc::new(given)), fixed: plan("fix", cfg, Arc::new(solution)), slack: SLACK, slow_means: SLOW }
}

/// What a loop slower than the fix usually still does.
const SLOW: &str = "something still waits: a memory call that waits for the GPU or costs its own time each batch (cuMemFree, cuMemAlloc), a CPU wait before a release, or a stream made to wait for the other one's download before its next batch";

/// Checks `learner` with no GPU: the model's data, races and releases, and
/// its time from the costs and waits recorded in `rec`.
pub fn check_on_model(rec: &MemoryResults, learner: Loop) -> CheckReport {
    let mut rep = CheckReport::new("memory that does not stall the pipeline (queue model, no GPU)");
    let cfg = &rec.config;
    let mine = plan("your loop", cfg, learner);
    let Some(model) = shape_findings(&mine, rec, "the recorded GPU", &mut rep) else { return rep };
    let judge = judge(cfg);
    let Some(facts) = &rec.stall.machine else {
        rep.problem("this recording has no machine facts to predict with: it was made before lab 6 kept them (a new `overlap-lab memory` run has them)");
        return rep;
    };
    let machine = crate::pipeline::machine::Machine { device_waits: rec.device_waits, ..facts.machine() };
    judge.on_model(&mut rep, &mine, &model, machine, &rec.stall.costs_map());
    rep
}

/// Checks `learner` on the GPU: verified data, then the given loop, the
/// fix and yours timed in turn (`cfg.repeats` runs each, medians), with
/// the pool keeping its memory (release threshold max) as the lab runs it.
pub fn check_on_gpu(gpu: &Gpu, rec: &MemoryResults, learner: Loop) -> Result<CheckReport> {
    let mut rep = CheckReport::new(&format!("memory that does not stall the pipeline (live on {})", gpu.name()));
    let cfg = &rec.config;
    let mine = plan("your loop", cfg, learner);
    let Some(model) = shape_findings(&mine, rec, "this GPU", &mut rep) else { return Ok(rep) };
    if !rep.passed {
        rep.note("judged by its shape (the model of your loop, and what lab 6's probes found), before timing it: the checker times your loop on the GPU once nothing above is wrong");
        return Ok(rep);
    }
    let pool = MemPool::default_of(gpu)?;
    let _keep = pool.threshold_for_now(u64::MAX)?;
    let mut rig = PlanRig::new(gpu, cfg.elements, 0, rec.iterations)?;
    let judge = judge(cfg);
    judge.on_gpu(&mut rep, &mut rig, &mine, &model, cfg.repeats)?;
    Ok(rep)
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "cuMemFree waits for the whole device, and the CPU must first know the download has finished: both hold the other stream up.",
    "The stream-ordered pair allocates and frees in stream order, so neither the CPU nor the other stream has to wait.",
    "Free each batch's scratch on the stream that reads it last, after that read, and give back every scratch you allocate.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::super::fixture::results as memory_results;
    use super::*;
    use crate::pipeline::issue::DevRef;
    use crate::testing::fails_with;

    fn check(f: impl Fn(&mut dyn Issue, &ScratchTask) -> Result<()> + Send + Sync + 'static) -> CheckReport {
        check_on_model(&memory_results(), Arc::new(f))
    }

    /// Each batch with its scratch from `get` and given back by `give`.
    fn each_batch(
        p: &mut dyn Issue,
        t: &ScratchTask,
        get: impl Fn(&mut dyn Issue, &ScratchTask, usize) -> Result<DevRef>,
        give: impl Fn(&mut dyn Issue, &ScratchTask, DevRef) -> Result<()>,
    ) -> Result<()> {
        for b in 0..t.batches {
            let s = get(p, t, b)?;
            t.work(p, b, s)?;
            give(p, t, s)?;
        }
        Ok(())
    }

    #[test]
    fn the_fix_passes_and_the_given_loop_fails_naming_cumemfree() {
        let rep = check(solution);
        assert!(rep.passed, "{rep}");
        assert!(rep.to_string().contains("won back"), "{rep}");
        let rep = check(given);
        fails_with(&rep, "still calls cuMemFree between batches");
        // The CPU's wait before each release is named first, the call's own wait after it.
        fails_with(&rep, "makes the CPU wait for each batch's download before it; and on the recorded GPU cuMemFree itself waits for all GPU work");
        fails_with(&rep, "more than the fix");
    }

    #[test]
    fn the_same_name_for_every_batch_is_an_honest_fix_and_waiting_on_the_compute_stream_is_slow() {
        let rep = check(|p, t| each_batch(p, t, |p, t, b| p.alloc_async(t.compute, 2 * t.batch(b).1, "scratch"), |p, t, s| p.free_async(t.download, s)));
        assert!(rep.passed, "{rep}");
        let rep = check(frees_on_the_compute_stream);
        fails_with(&rep, "more than the fix");
        fails_with(&rep, "a stream made to wait for the other one's download");
    }

    #[test]
    fn a_release_before_the_download_has_read_the_memory_is_a_race() {
        // The classic slip: cuMemFreeAsync on the compute stream with no event from the download.
        let rep = check(|p, t| each_batch(p, t, |p, t, b| p.alloc_async(t.compute, 2 * t.batch(b).1, "scratch"), |p, t, s| p.free_async(t.compute, s)));
        fails_with(&rep, "race");
        fails_with(&rep, "cuMemFreeAsync");
    }

    #[test]
    fn memory_never_released_is_named() {
        fails_with(&check(|p, t| each_batch(p, t, |p, t, b| p.alloc_async(t.compute, 2 * t.batch(b).1, "scratch"), |_, _, _| Ok(()))), "memory never released");
    }

    #[test]
    fn cumemalloc_kept_with_every_free_after_the_loop_is_judged_by_its_time() {
        // cuMemAlloc per batch, cuMemFree after the loop (no CPU wait per
        // batch): the probes found cuMemAlloc does not wait, so it costs
        // its own call time only. The note names it either way.
        let rep = check(|p, t| {
            let mut held = Vec::new();
            for b in 0..t.batches {
                let s = p.alloc(2 * t.batch(b).1, "scratch")?;
                t.work(p, b, s)?;
                held.push(s);
            }
            p.sync_device()?;
            held.into_iter().try_for_each(|s| p.free(s))
        });
        assert!(rep.passed, "an honest answer: {rep}");
        assert!(rep.to_string().contains("calls cuMemAlloc 4 times (0.300 ms each"), "{rep}");
    }

    #[test]
    fn a_cpu_wait_before_a_stream_ordered_release_is_too_slow() {
        let rep = check(|p, t| {
            each_batch(
                p,
                t,
                |p, t, b| p.alloc_async(t.compute, 2 * t.batch(b).1, "scratch"),
                |p, t, s| {
                    p.host_sync(t.download)?;
                    p.free_async(t.compute, s)
                },
            )
        });
        fails_with(&rep, "more than the fix");
        assert!(rep.to_string().contains("makes the CPU wait"), "{rep}");
    }

    #[test]
    fn wrong_streams_wrong_data_and_panics_are_failed_checks() {
        // Allocated on the download stream, used on the compute stream with no event.
        fails_with(
            &check(|p, t| each_batch(p, t, |p, t, b| p.alloc_async(t.download, 2 * t.batch(b).1, "scratch"), |p, t, s| p.free_async(t.download, s))),
            "race",
        );
        // Too small a scratch: the kernel's output does not fit.
        fails_with(
            &check(|p, t| each_batch(p, t, |p, t, b| p.alloc_async(t.compute, t.batch(b).1, "scratch"), |p, t, s| p.free_async(t.download, s))),
            "your loop stopped with",
        );
        fails_with(&check(|_, _| panic!("oops")), "panicked: oops");
        // Each scratch freed twice: named as a double free, not a use after free.
        let rep = check(|p, t| {
            each_batch(
                p,
                t,
                |p, t, b| p.alloc_async(t.compute, 2 * t.batch(b).1, "scratch"),
                |p, t, s| {
                    p.free_async(t.download, s)?;
                    p.free_async(t.download, s)
                },
            )
        });
        fails_with(&rep, "is released twice");
        let said = rep.to_string();
        assert!(said.contains("double free") && !said.contains("used after") && !said.contains("use after free"), "{rep}");
        // The last batch forgotten.
        fails_with(
            &check(|p, t| {
                for b in 0..t.batches - 1 {
                    let s = p.alloc_async(t.compute, 2 * t.batch(b).1, "s")?;
                    t.work(p, b, s)?;
                    p.free_async(t.download, s)?;
                }
                Ok(())
            }),
            "never reached the host",
        );
        // A batch count of zero.
        fails_with(&check(|p, t| solution(p, &ScratchTask { batches: 0, ..t.clone() })), "never reached the host");
    }
}
