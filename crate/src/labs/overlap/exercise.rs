//! Exercise 2: write the chunked issue loop. The learner gets the buffers,
//! the streams and the chunk ranges, and issues H2D, kernel and D2H for every
//! chunk. The checker runs the loop on the GPU when there is one, else on the
//! model, and says what is wrong: wrong data (with the element and chunk),
//! a race, a CPU that waits for the GPU between chunks (the call and the
//! chunk), no overlap, or efficiency under the target.

pub use super::ChunkTask;
use super::{measure, model, Intensity, IssueOrder, OverlapResults, Parts};
use crate::error::{LabError, Result};
use crate::gpu::{Gpu, TimelineSource};
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::measure::record::Record;
use crate::measure::stats::Summary;
use crate::pipeline::cells::Cells;
use crate::pipeline::cells::Provenance;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{Issue, StreamRef};
use crate::pipeline::op::{Op, OpKind};
use crate::pipeline::plan::{self, Plan};
use crate::pipeline::schedule::{Schedule, WaitFor};

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise::in_cell("02-overlap", "make the chunks overlap", HINTS, example, "wrong data")];

/// The exercise answered on the recording in `dev` (balanced, 16 chunks
/// over 4 streams): the solution, or a loop that copies the input back
/// instead of the output.
fn example(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Record<OverlapResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    let issue = if right { solution } else { downloads_the_input };
    Ok(Some(check_on_model(&rec.results, Intensity::Balanced, 16, 4, issue)))
}

/// A pass needs this share of the bound (the bound from the stages alone).
pub const TARGET_EFFICIENCY: f64 = 0.85;

/// The reference solution: depth-first, chunk c on stream c mod S (the
/// loop notebook 02 shows, which is the lab's own depth-first order).
pub fn solution(p: &mut dyn Issue, t: &ChunkTask) -> Result<()> {
    IssueOrder::DepthFirst.issue(p, t, &OpKind::STAGES)
}

/// A deliberately wrong loop, kept for tests and demonstrations: every
/// chunk's D2H reads the input buffer, so the host gets inputs, not results.
pub fn downloads_the_input(p: &mut dyn Issue, t: &ChunkTask) -> Result<()> {
    for c in 0..t.chunks {
        let (at, n) = t.chunk(c);
        let s = t.streams[c % t.streams.len()];
        p.h2d(s, t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}"))?;
        p.compute(s, t.dev_in, at, t.dev_out, at, n, &format!("compute chunk {c}"))?;
        p.d2h(s, t.host_out, at, t.dev_in, at, n, &format!("D2H chunk {c} from the wrong buffer"))?;
    }
    Ok(())
}

/// What the loop's dry run `m` shows wrong: the first output element the
/// host does not get right (`out`, the cells of the host buffer named
/// [`plan::OUTPUT`], over `elements` in `chunks` chunks), then the first
/// race. The same findings with or without a GPU: a run on the GPU is
/// verified against this dry run, so a wrong loop whose GPU run does just
/// what it says is caught here.
fn model_findings(m: &DryRun, out: &Cells, elements: usize, chunks: usize, rep: &mut CheckReport) {
    data_findings(out, elements, chunks, &m.schedule, rep);
    race_findings(m.schedule.races(), rep);
}

/// `schedule`: the loop's, for which D2H wrote an output element to the
/// host and which kernel read what no H2D wrote.
fn data_findings(cells: &Cells, elements: usize, chunks: usize, schedule: &Schedule, rep: &mut CheckReport) {
    let copied = |j: usize| crate::lab_kit::loop_check::last_d2h_into_output(schedule, j).is_some();
    // A run of elements is right when its first is: both step by one.
    for j in cells.runs().map(|(r, _)| r.start).filter(|&j| j < elements) {
        let c = chunk_holding(elements, chunks, j);
        let msg = match cells.get(j) {
            Provenance::Output(i) if i as usize == j => continue,
            Provenance::Output(i) => format!("wrong data: output element {j} (chunk {c}) holds the result for element {i}: an offset is wrong"),
            // Copied, but before anything was written there: the D2H was
            // issued before the kernel that writes it.
            Provenance::Unset if copied(j) => {
                format!(
                    "wrong data: output element {j} (chunk {c}) was copied to the host before its kernel wrote it: the chunk's D2H is issued before its kernel"
                )
            }
            Provenance::Unset => format!("wrong data: output element {j} (chunk {c}) never reached the host: a D2H is missing or covers too little"),
            Provenance::Input(_) => format!("wrong data: output element {j} (chunk {c}) holds an input, not a result: the D2H reads the wrong buffer"),
            Provenance::Repeated(_, k) => {
                format!(
                    "wrong data: output element {j} (chunk {c}) went through the kernel {k} times: a kernel reads the output buffer, not the uploaded input"
                )
            }
            // Anything else (a sum, garbage) was not computed from an upload.
            _ => match crate::lab_kit::loop_check::first_unwritten_read(schedule) {
                Some(u) => format!("wrong data: output element {j} (chunk {c}) was computed from data never uploaded: {}", u.describe(schedule)),
                None => format!("wrong data: output element {j} (chunk {c}) was computed from data never uploaded: the kernel reads a range no H2D wrote"),
            },
        };
        rep.problem(msg);
        return;
    }
}

fn race_findings(races: &[crate::pipeline::schedule::Race], rep: &mut CheckReport) {
    if let Some(r) = races.first() {
        rep.problem(format!("race: {} ({} in all)", r.what, races.len()));
    }
}

/// Why the loop overlaps nothing, from its shape (`cpu_waits`:
/// it makes the CPU wait for the GPU between chunks, named above).
fn no_overlap_advice(chunks: usize, streams_used: usize, cpu_waits: bool) -> &'static str {
    if cpu_waits {
        "the CPU waits for the GPU between chunks (the host synchronization above), so what it issues after a wait never runs beside what it waited for"
    } else if chunks <= 1 {
        "with one chunk each stage needs all of the previous one's data, so nothing can run at once"
    } else if streams_used <= 1 {
        "every operation is on one stream, so each waits for the one before"
    } else {
        "the pipeline takes as long as running everything in order: something makes each stream's work wait for the others'"
    }
}

/// A wait of the CPU's for the GPU between two GPU operations of a
/// learner's loop.
#[derive(Clone, Debug, PartialEq)]
struct HostWait {
    /// The call as the loop makes it: "p.host_sync(t.streams[1])".
    call: String,
    /// The GPU operation issued last before it: its label and chunk.
    after: (String, usize),
    /// The first GPU operation issued after it: its label and chunk.
    before: (String, usize),
}

/// The chunk of `elements` cut in `chunks` ([`ChunkTask::chunk`]) that
/// holds element `j` (chunk 0 for an element past them).
fn chunk_holding(elements: usize, chunks: usize, j: usize) -> usize {
    (0..chunks)
        .position(|c| {
            let (first, n) = crate::pipeline::plan::chunk(elements, chunks, c);
            (first..first + n).contains(&j)
        })
        .unwrap_or(0)
}

/// The CPU's waits for the GPU between GPU operations of a loop, read
/// from its schedule: which call, after which chunk's operation and before
/// which, for a loop over `elements` in `chunks` on `streams` (named
/// `t.streams[k]`). A wait before the first GPU operation or after the
/// last orders nothing of the loop.
fn host_waits(schedule: &Schedule, elements: usize, chunks: usize, streams: &[StreamRef]) -> Vec<HostWait> {
    let named = |o: &Op| {
        // Accesses are in bytes; chunks in f32 elements.
        let at = o.accesses.first().map_or(0, |a| a.start as usize / 4);
        (o.label.clone(), chunk_holding(elements, chunks, at))
    };
    let stream = |k: usize| streams.iter().position(|s| s.0 == k).map_or(format!("stream {k}"), |i| format!("t.streams[{i}]"));
    schedule
        .cpu_waits
        .iter()
        .filter(|w| w.thread == 0)
        .filter_map(|w| {
            let after = schedule.ops[..w.after_ops].iter().rev().find(|o| o.is_gpu_work())?;
            let before = schedule.ops[w.after_ops..].iter().find(|o| o.is_gpu_work())?;
            let call = match w.on {
                WaitFor::Event(_) => "p.host_wait(event)".to_string(),
                WaitFor::Stream(k) => format!("p.host_sync({})", stream(k)),
                WaitFor::Device => "p.sync_device()".into(),
                WaitFor::Signal(_) => "p.host_wait_signal(signal)".into(),
                WaitFor::Restart => "p.timed_from_here()".into(),
            };
            Some(HostWait { call, after: named(after), before: named(before) })
        })
        .collect()
}

/// A problem naming the first of `waits` (the CPU waiting for the GPU
/// between chunks' work) and how often the loop waits; whether there was one.
fn host_wait_findings(waits: &[HostWait], chunks: usize, rep: &mut CheckReport) -> bool {
    let Some(w) = waits.first() else { return false };
    let mut after: Vec<usize> = waits.iter().map(|w| w.after.1).collect();
    after.dedup();
    let often = if chunks > 1 && after.len() + 1 >= chunks {
        format!(", and so after every chunk ({} waits)", waits.len())
    } else if waits.len() > 1 {
        format!(" ({} such waits in the loop)", waits.len())
    } else {
        String::new()
    };
    rep.problem(format!(
        "host synchronization in the loop: {} after chunk {} ('{}') makes the CPU wait for the GPU before it issues chunk {} ('{}'){often}: nothing issued after a wait can run beside what it waited for",
        w.call, w.after.1, w.after.0, w.before.1, w.before.0
    ));
    true
}

/// Streams a learner may ask for (the GPU rig makes each one).
pub const MAX_STREAMS: usize = 64;

/// A data size for `chunks` chunks that they do not divide evenly (unless
/// `chunks` is 1, or 2 with `even`), so a loop that drops the remainder
/// leaves elements out and the check sees it. `even`: a whole number of
/// 8-byte words, as pinned buffers need.
pub fn uneven_elements(at_least: usize, chunks: usize, even: bool) -> usize {
    let step = if even { 2 } else { 1 };
    let mut e = at_least.max(chunks);
    for _ in 0..=2 * chunks {
        if chunks <= 1 || e % chunks != 0 {
            return e;
        }
        e += step;
    }
    e
}

/// The sizes a learner can ask for, checked before anything is built.
fn sizes_in_range(rep: &mut CheckReport, chunks: usize, streams: usize) -> bool {
    rep.count("chunks", chunks, 1..=super::MAX_CHUNKS) & rep.count("streams", streams, 1..=MAX_STREAMS)
}

/// Checks `issue` with no GPU: data by provenance, races from the schedule,
/// time from the queue model with the parts recorded in `rec`.
pub fn check_on_model(
    rec: &OverlapResults,
    intensity: Intensity,
    chunks: usize,
    streams: usize,
    issue: impl Fn(&mut dyn Issue, &ChunkTask) -> Result<()>,
) -> CheckReport {
    let mut rep = CheckReport::new(&format!("chunked issue loop, {chunks} chunks on {streams} streams (queue model, no GPU)"));
    let Some(ir) = rec.intensity(intensity) else {
        rep.problem(format!("the recording has no {} runs", intensity.label()));
        return rep;
    };
    if !sizes_in_range(&mut rep, chunks, streams) {
        return rep;
    }
    // Not a multiple of the chunks: a loop must cover the remainder too.
    let elements = uneven_elements(2048 * chunks + chunks / 2, chunks, false);
    let mut m = DryRun::new();
    let task = ChunkTask {
        elements,
        chunks,
        streams: (0..streams).map(|_| m.stream()).collect(),
        host_in: m.host(plan::INPUT, elements, true),
        host_out: m.host(plan::OUTPUT, elements, false),
        dev_in: m.device("device in", elements),
        dev_out: m.device("device out", elements),
    };
    if rep.learner("your issue loop", || issue(&mut m, &task)).is_none() {
        return rep;
    }
    model_findings(&m, m.host_cells(task.host_out), elements, chunks, &mut rep);
    let cpu_waits = host_wait_findings(&host_waits(&m.schedule, elements, chunks, &task.streams), chunks, &mut rep);
    // Each op lasts its share of the recorded whole-data part.
    let parts = ir.point(chunks, streams, IssueOrder::DepthFirst).map_or(&ir.parts, |p| &p.parts);
    let machine = parts.machine(rec.copy_engines);
    let times = crate::pipeline::predict::predict(&m.schedule, machine, |op| parts.op_ms(op, elements));
    let total = times.iter().map(|t| t.1).fold(0.0, f64::max);
    let (h, k, d) = (parts.h2d_ms.median, parts.kernel_ms.median, parts.d2h_ms.median);
    // The model slows each direction while both run, as measured, so its bound does too.
    let bound = model::Bounds::new(h, k, d, parts.both_copies_ms.median, chunks).for_engines(rec.copy_engines);
    let used = m.schedule.streams_used();
    rep.judge_overlap("predicted", total, ("one stream", h + k + d), bound, TARGET_EFFICIENCY, no_overlap_advice(chunks, used, cpu_waits));
    rep
}

/// Timed runs of a learner's loop on the GPU (after one verified run).
const TIMED_RUNS: usize = 5;

/// Checks `issue` on the GPU: its dry run first (races), then real data
/// verified, and the measured time against the bound of this chunking
/// measured now.
pub fn check_on_gpu(gpu: &Gpu, intensity: Intensity, elements: usize, chunks: usize, streams: usize, issue: measure::ChunkLoop) -> Result<CheckReport> {
    let mut rep = CheckReport::new(&format!("chunked issue loop, {chunks} chunks on {streams} streams (live on {})", gpu.name()));
    if !sizes_in_range(&mut rep, chunks, streams) {
        return Ok(rep);
    }
    let elements = uneven_elements(elements, chunks, true);
    let plan = measure::learner_plan(elements, chunks, streams, issue);
    let Some(model) = rep.learner("your issue loop", || plan.dry_run()) else {
        return Ok(rep);
    };
    // Wrong data or a race shows in the dry run already, and the rig would
    // refuse a loop that races: nothing of such a loop runs on the GPU.
    // Nor does one that makes the CPU wait between chunks: it cannot overlap.
    model_findings(&model, Plan::output_cells(&model), elements, chunks, &mut rep);
    // The plan hands its loop its streams in order.
    let refs: Vec<StreamRef> = (0..streams).map(StreamRef).collect();
    host_wait_findings(&host_waits(&model.schedule, elements, chunks, &refs), chunks, &mut rep);
    if !rep.passed {
        return Ok(rep);
    }
    let streams_used = model.schedule.streams_used();
    let mut sweep = measure::Sweep::new(gpu, elements)?;
    let h2d = Summary::of_runs(3, || sweep.timed_alone(OpKind::H2d))?;
    sweep.calibrate(h2d.median, intensity.kernel_over_copy())?;
    let (mut totals, mut samples) = (Vec::new(), Vec::new());
    // One verified run, then timed runs, each followed by one sample of
    // the stages alone with this chunking: the bound from the same moments.
    for attempt in 0..=TIMED_RUNS {
        let run = match sweep.rig.run_modelled(&plan, &model, TimelineSource::Off) {
            Ok(run) => run,
            Err(e @ LabError::Verification { .. }) => {
                rep.problem(format!("wrong data: {e}"));
                return Ok(rep);
            }
            Err(e) => return Err(e),
        };
        if attempt > 0 {
            totals.push(run.total_ms);
            samples.push(sweep.parts_once(chunks, streams, IssueOrder::DepthFirst)?);
        }
    }
    let parts = Parts::of_samples(&samples)?;
    // The fastest run: noise only ever slows a run, so the best one says
    // what the loop can do (and the bound uses each part's fastest too).
    let measured = Summary::of(&totals)?.min;
    let bound = model::Bounds::of(&parts, chunks).for_engines(gpu.copy_engines()?);
    let serial = parts.h2d_ms.median + parts.kernel_ms.median + parts.d2h_ms.median;
    rep.judge_overlap(
        &format!("measured, fastest of {TIMED_RUNS}"),
        measured,
        ("one stream", serial),
        bound,
        TARGET_EFFICIENCY,
        no_overlap_advice(chunks, streams_used, false),
    );
    Ok(rep)
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "Work on one stream runs in order, one op after another: only work on different streams can overlap.",
    "Keep each chunk's H2D, kernel and D2H together on one stream (they depend on each other) and give different chunks different streams.",
    "Nothing in the loop should make the CPU wait for the GPU, and every element must be in some chunk: `t.chunk(c)` gives each chunk's range, remainder included.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_solution_passes() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 16, 4, solution);
        assert!(rep.passed, "{rep}");
        assert!(rep.to_string().contains("predicted"));
    }

    /// The GPU check judges the data from the loop's plan before running
    /// it: the run on the GPU is verified against that plan, so a loop that
    /// downloads the wrong buffer runs "correctly" there.
    #[test]
    fn the_live_check_names_wrong_data_from_the_plan_it_runs() {
        let (chunks, elements) = (4, uneven_elements(4096, 4, true));
        let judge = |issue: measure::ChunkLoop| {
            let plan = measure::learner_plan(elements, chunks, 2, issue);
            let model = plan.dry_run().unwrap();
            let mut rep = CheckReport::new("t");
            model_findings(&model, Plan::output_cells(&model), elements, chunks, &mut rep);
            rep
        };
        let wrong = judge(std::sync::Arc::new(downloads_the_input));
        assert!(!wrong.passed && wrong.to_string().contains("output element 0 (chunk 0) holds an input, not a result"), "{wrong}");
        let right = judge(std::sync::Arc::new(solution));
        assert!(right.passed, "{right}");
    }

    #[test]
    fn everything_on_one_stream_is_no_overlap() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 16, 4, |p, t| {
            let one = ChunkTask { streams: vec![t.streams[0]], ..t.clone() };
            solution(p, &one)
        });
        assert!(!rep.passed);
        assert!(rep.to_string().contains("no overlap: every operation is on one stream"), "{rep}");
    }

    #[test]
    fn a_wrong_offset_is_wrong_data() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 8, 2, |p, t| {
            for c in 0..t.chunks {
                let (at, n) = t.chunk(c);
                let s = t.streams[c % t.streams.len()];
                p.h2d(s, t.dev_in, at, t.host_in, at, n, "up")?;
                p.compute(s, t.dev_in, at, t.dev_out, at, n, "k")?;
                // Bug: every chunk lands at the start of the output.
                p.d2h(s, t.host_out, 0, t.dev_out, at, n, "down")?;
            }
            Ok(())
        });
        assert!(!rep.passed);
        let text = rep.to_string();
        assert!(text.contains("wrong data: output element 0 (chunk 0) holds the result for element"), "{text}");
    }

    #[test]
    fn kernel_on_another_stream_without_an_event_is_a_race() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 4, 2, |p, t| {
            for c in 0..t.chunks {
                let (at, n) = t.chunk(c);
                p.h2d(t.streams[0], t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}"))?;
                p.compute(t.streams[1], t.dev_in, at, t.dev_out, at, n, &format!("compute chunk {c}"))?;
                p.d2h(t.streams[1], t.host_out, at, t.dev_out, at, n, &format!("D2H chunk {c}"))?;
            }
            Ok(())
        });
        assert!(!rep.passed);
        assert!(rep.to_string().contains("race: 'compute chunk 0' reads"), "{rep}");
        // With the event, the same split is correct.
        let fixed = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 4, 2, |p, t| {
            for c in 0..t.chunks {
                let (at, n) = t.chunk(c);
                p.h2d(t.streams[0], t.dev_in, at, t.host_in, at, n, "up")?;
                let e = p.event()?;
                p.record(e, t.streams[0])?;
                p.wait(t.streams[1], e)?;
                p.compute(t.streams[1], t.dev_in, at, t.dev_out, at, n, "k")?;
                p.d2h(t.streams[1], t.host_out, at, t.dev_out, at, n, "down")?;
            }
            Ok(())
        });
        assert!(!fixed.to_string().contains("race"), "{fixed}");
    }

    #[test]
    fn a_missing_chunk_is_named() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 4, 2, |p, t| {
            for c in 0..t.chunks - 1 {
                let (at, n) = t.chunk(c);
                let s = t.streams[c % 2];
                p.h2d(s, t.dev_in, at, t.host_in, at, n, "up")?;
                p.compute(s, t.dev_in, at, t.dev_out, at, n, "k")?;
                p.d2h(s, t.host_out, at, t.dev_out, at, n, "down")?;
            }
            Ok(())
        });
        assert!(rep.to_string().contains("(chunk 3) never reached the host"), "{rep}");
    }

    /// Issues every chunk with `f(c, at, n)` choosing the streams.
    fn each_chunk(p: &mut dyn Issue, t: &ChunkTask, mut f: impl FnMut(usize) -> (usize, usize, usize)) -> Result<()> {
        for c in 0..t.chunks {
            let (at, n) = t.chunk(c);
            let (up, k, down) = f(c);
            p.h2d(t.streams[up], t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}"))?;
            p.compute(t.streams[k], t.dev_in, at, t.dev_out, at, n, &format!("compute chunk {c}"))?;
            p.d2h(t.streams[down], t.host_out, at, t.dev_out, at, n, &format!("D2H chunk {c}"))?;
        }
        Ok(())
    }

    #[test]
    fn honest_issue_loops_pass() {
        let r = crate::labs::overlap::fixture::results();
        // A stream per stage, linked by events: the lab's own third layout.
        let per_stage = |p: &mut dyn Issue, t: &ChunkTask| IssueOrder::StageStreams.issue(p, t, &OpKind::STAGES);
        let rep = check_on_model(&r, Intensity::Balanced, 16, 3, per_stage);
        assert!(rep.passed, "{rep}");
        // 1024 chunks (the most there are) is judged, and quickly.
        let t = std::time::Instant::now();
        let big = check_on_model(&r, Intensity::Balanced, 1024, 4, solution);
        assert!(big.passed, "{big}");
        eprintln!("1024 chunks judged in {:.2} s", t.elapsed().as_secs_f64());
    }

    /// Wrong answers a student gives, each with the words its message must hold.
    #[test]
    fn wrong_issue_loops_fail_naming_the_mistake() {
        let r = crate::labs::overlap::fixture::results();
        type Loop = Box<dyn Fn(&mut dyn Issue, &ChunkTask) -> Result<()>>;
        let cases: Vec<(&str, usize, usize, Loop, &[&str])> = vec![
            (
                "drops the remainder",
                16,
                4,
                Box::new(|p, t| {
                    let n = t.elements / t.chunks;
                    for c in 0..t.chunks {
                        let s = t.streams[c % t.streams.len()];
                        p.h2d(s, t.dev_in, c * n, t.host_in, c * n, n, "up")?;
                        p.compute(s, t.dev_in, c * n, t.dev_out, c * n, n, "k")?;
                        p.d2h(s, t.host_out, c * n, t.dev_out, c * n, n, "down")?;
                    }
                    Ok(())
                }),
                &["wrong data", "never reached the host"],
            ),
            ("everything on stream 0", 16, 4, Box::new(|p, t| each_chunk(p, t, |_| (0, 0, 0))), &["no overlap: every operation is on one stream"]),
            ("one chunk", 1, 4, Box::new(solution), &["no overlap: with one chunk", "nothing can run at once"]),
            ("kernel on another stream, no event", 8, 2, Box::new(|p, t| each_chunk(p, t, |_| (0, 1, 1))), &["race: 'compute chunk 0' reads"]),
            ("D2H on another stream, no event", 8, 2, Box::new(|p, t| each_chunk(p, t, |_| (0, 0, 1))), &["race: 'D2H chunk 0' reads"]),
            ("D2H of the input buffer", 8, 2, Box::new(downloads_the_input), &["holds an input, not a result"]),
            (
                "D2H issued before the kernel",
                8,
                2,
                Box::new(|p, t| {
                    for c in 0..t.chunks {
                        let (at, n) = t.chunk(c);
                        let s = t.streams[c % 2];
                        p.h2d(s, t.dev_in, at, t.host_in, at, n, "up")?;
                        p.d2h(s, t.host_out, at, t.dev_out, at, n, "down")?;
                        p.compute(s, t.dev_in, at, t.dev_out, at, n, "k")?;
                    }
                    Ok(())
                }),
                &["(chunk 0) was copied to the host before its kernel wrote it", "D2H is issued before its kernel"],
            ),
            (
                "kernel on data never uploaded",
                8,
                2,
                Box::new(|p, t| {
                    for c in 0..t.chunks {
                        let (at, n) = t.chunk(c);
                        let s = t.streams[c % 2];
                        p.h2d(s, t.dev_in, 0, t.host_in, at, n, "up to the start")?;
                        p.compute(s, t.dev_in, at, t.dev_out, at, n, "k")?;
                        p.d2h(s, t.host_out, at, t.dev_out, at, n, "down")?;
                    }
                    Ok(())
                }),
                &["(chunk 1) was computed from data never uploaded: 'k' reads elements", "of device in, and no copy or kernel issued before it writes there"],
            ),
            (
                "an offset past the end",
                4,
                2,
                Box::new(|p, t| p.h2d(t.streams[0], t.dev_in, usize::MAX, t.host_in, 0, 8, "up")),
                &["your issue loop stopped with", "do not fit"],
            ),
            ("panics", 4, 2, Box::new(|_, t| panic!("chunk {} is odd", t.chunks)), &["your issue loop panicked: chunk 4 is odd"]),
            ("100000 streams", 16, 100_000, Box::new(solution), &["100000 streams is out of range"]),
            ("2000 chunks", 2000, 4, Box::new(solution), &["2000 chunks is out of range"]),
            ("0 chunks", 0, 4, Box::new(solution), &["0 chunks is out of range"]),
        ];
        for (what, chunks, streams, f, words) in cases {
            let rep = check_on_model(&r, Intensity::Balanced, chunks, streams, f);
            let text = rep.to_string();
            assert!(!rep.passed, "{what} passed: {text}");
            for w in words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
            assert!(!text.contains("inf%") && !text.contains("NaN"), "{what}: {text}");
            // A copy issued too early is not a missing copy.
            if what == "D2H issued before the kernel" {
                assert!(!text.contains("a D2H is missing"), "{what}: {text}");
            }
        }
    }

    /// The "make it safe" reflex: a wait of the CPU's after every chunk.
    /// The verdict names the call and the chunk, not the streams.
    #[test]
    fn a_host_wait_after_every_chunk_is_named_with_its_call_and_chunk() {
        let r = crate::labs::overlap::fixture::results();
        type Wait = fn(&mut dyn Issue, &ChunkTask, usize) -> Result<()>;
        let cases: [(&str, Wait, &str); 3] = [
            ("sync_device", |p, _, _| p.sync_device(), "p.sync_device() after chunk 0 ('D2H chunk 0')"),
            (
                "host_sync of the chunk's stream",
                |p, t, c| p.host_sync(t.streams[c % t.streams.len()]),
                "p.host_sync(t.streams[0]) after chunk 0 ('D2H chunk 0')",
            ),
            (
                "host_wait on an event",
                |p, t, c| {
                    let e = p.event()?;
                    p.record(e, t.streams[c % t.streams.len()])?;
                    p.host_wait(e)
                },
                "p.host_wait(event) after chunk 0 ('D2H chunk 0')",
            ),
        ];
        for (what, wait, call) in cases {
            let rep = check_on_model(&r, Intensity::Balanced, 16, 4, move |p, t| {
                for c in 0..t.chunks {
                    each_one(p, t, c, c % t.streams.len())?;
                    wait(p, t, c)?;
                }
                Ok(())
            });
            let text = rep.to_string();
            assert!(!rep.passed, "{what} passed: {text}");
            for w in [
                &format!("host synchronization in the loop: {call} makes the CPU wait for the GPU before it issues chunk 1 ('H2D chunk 1'), and so after every chunk (15 waits)"),
                "no overlap: the CPU waits for the GPU between chunks",
            ] {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
            assert!(!text.contains("are the streams waiting") && !text.contains("every operation is on one stream"), "{what}: {text}");
        }
        // One wait in the middle is named where it is.
        let once = check_on_model(&r, Intensity::Balanced, 8, 2, |p, t| {
            for c in 0..t.chunks {
                each_one(p, t, c, c % 2)?;
                if c == 3 {
                    p.host_sync(t.streams[1])?;
                }
            }
            Ok(())
        });
        crate::testing::fails_with(
            &once,
            "p.host_sync(t.streams[1]) after chunk 3 ('D2H chunk 3') makes the CPU wait for the GPU before it issues chunk 4 ('H2D chunk 4'):",
        );
        // The live check reads the waits off the same loop, through its
        // plan's dry run, with the stream the loop named.
        let elements = uneven_elements(4096, 4, true);
        let plan = measure::learner_plan(
            elements,
            4,
            2,
            std::sync::Arc::new(|p, t| {
                for c in 0..t.chunks {
                    each_one(p, t, c, c % t.streams.len())?;
                    if c == 1 {
                        p.host_sync(t.streams[1])?;
                    } else {
                        p.sync_device()?;
                    }
                }
                Ok(())
            }),
        );
        let waits = host_waits(&plan.dry_run().unwrap().schedule, elements, 4, &[StreamRef(0), StreamRef(1)]);
        assert_eq!(waits.len(), 3, "{waits:?}");
        assert_eq!(waits[1], HostWait { call: "p.host_sync(t.streams[1])".into(), after: ("D2H chunk 1".into(), 1), before: ("H2D chunk 2".into(), 2) });
        assert_eq!(waits[2], HostWait { call: "p.sync_device()".into(), after: ("D2H chunk 2".into(), 2), before: ("H2D chunk 3".into(), 3) });
    }

    #[test]
    fn a_wait_after_the_last_chunk_holds_nothing_up_and_passes() {
        let rep = check_on_model(&crate::labs::overlap::fixture::results(), Intensity::Balanced, 16, 4, |p, t| {
            p.sync_device()?;
            solution(p, t)?;
            p.sync_device()
        });
        assert!(rep.passed, "{rep}");
    }

    /// Chunk `c`'s H2D, kernel and D2H on stream `s`.
    fn each_one(p: &mut dyn Issue, t: &ChunkTask, c: usize, s: usize) -> Result<()> {
        let (at, n) = t.chunk(c);
        p.h2d(t.streams[s], t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}"))?;
        p.compute(t.streams[s], t.dev_in, at, t.dev_out, at, n, &format!("compute chunk {c}"))?;
        p.d2h(t.streams[s], t.host_out, at, t.dev_out, at, n, &format!("D2H chunk {c}"))
    }

    #[test]
    fn chunkings_never_divide_the_data_evenly() {
        for chunks in [3, 4, 7, 16, 64, 1024] {
            assert_ne!(uneven_elements(2048 * chunks, chunks, false) % chunks, 0);
            let even = uneven_elements(1 << 25, chunks, true);
            assert!(even % 2 == 0 && even % chunks != 0, "{chunks}: {even}");
        }
        assert_eq!(uneven_elements(1 << 25, 1, true), 1 << 25);
    }
}
