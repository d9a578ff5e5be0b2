//! Exercise 5: find the hidden legacy-stream operation. The learner gets a
//! chunked pipeline on blocking streams (made without the non-blocking
//! flag, as `cudaStreamCreate` makes them) that uploads the kernels'
//! parameters once, in the middle, on "the default stream" — which, in a
//! program built the usual way, is the legacy NULL stream. The learner
//! rewrites the loop so nothing serializes; the checker runs it on the GPU
//! when there is one (and measures the overlap it restores), else on the
//! queue model with the recorded costs, and names what is wrong.

use super::experiments::TINY;
use super::{StreamsConfig, StreamsResults};
use crate::error::Result;
use crate::gpu::{Gpu, PlanRig};
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::loop_check;
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::measure::record::Record;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{DevRef, HostRef, Issue, StreamRef};
use crate::pipeline::op::{Lane, StreamKind};
use crate::pipeline::plan::{chunk, Plan, StreamSpec};
use std::sync::Arc;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise::in_cell("05-streams", "the operation that drains the pipeline", HINTS, example, "NULL stream")];

/// The exercise answered on the recording in `dev`: the solution, or the
/// loop as the notebook gives it.
fn example(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(rec) = <Record<StreamsResults> as Recorded>::load(dev, super::LAB)? else { return Ok(None) };
    Ok(Some(check_on_model(&rec.results, Arc::new(if right { solution } else { given }))))
}

/// The label of the parameters' upload: the loop must keep it.
pub const PARAMS: &str = "params H2D";

/// A pass: no slower than the fixed loop by more than this share.
pub const SLACK: f64 = 0.10;

/// What the learner's loop is handed.
#[derive(Clone, Debug)]
pub struct StreamsTask {
    pub chunks: usize,
    pub elements: usize,
    /// Blocking streams (created without CU_STREAM_NON_BLOCKING).
    pub streams: Vec<StreamRef>,
    /// "The default stream": the legacy NULL stream (stream 0 in a
    /// program compiled without `--default-stream per-thread`).
    pub default_stream: StreamRef,
    /// This thread's per-thread default stream (`cudaStreamPerThread`).
    pub per_thread_stream: StreamRef,
    pub host_in: HostRef,
    pub host_out: HostRef,
    pub dev_in: DevRef,
    pub dev_out: DevRef,
    /// Where the kernels' parameters go (`TINY` elements from `host_in`).
    pub params: DevRef,
}

impl StreamsTask {
    /// (first element, element count) of chunk `c`.
    pub fn chunk(&self, c: usize) -> (usize, usize) {
        chunk(self.elements, self.chunks, c)
    }
    /// Uploads the kernels' parameters on stream `s`.
    pub fn upload_params(&self, p: &mut dyn Issue, s: StreamRef) -> Result<()> {
        p.h2d(s, self.params, 0, self.host_in, 0, TINY, PARAMS)
    }
}

/// A learner's loop.
pub type Loop = Arc<dyn Fn(&mut dyn Issue, &StreamsTask) -> Result<()> + Send + Sync>;

/// The loop the learner is given: chunk `c` on stream `c mod S`, and the
/// parameters uploaded halfway through on the default stream.
pub fn given(p: &mut dyn Issue, t: &StreamsTask) -> Result<()> {
    issue_chunks(p, t, |p, t| t.upload_params(p, t.default_stream))
}

/// The fix: the same loop with the upload on a stream that does not
/// serialize (one of the pipeline's own).
pub fn solution(p: &mut dyn Issue, t: &StreamsTask) -> Result<()> {
    issue_chunks(p, t, |p, t| t.upload_params(p, t.streams[0]))
}

/// A deliberately wrong fix, kept for tests and demonstrations (the "make
/// it safe" reflex): the parameters leave the NULL stream, but the CPU
/// synchronizes the device after every chunk, so nothing overlaps.
pub fn syncs_every_chunk(p: &mut dyn Issue, t: &StreamsTask) -> Result<()> {
    for c in 0..t.chunks {
        let (at, n) = t.chunk(c);
        let s = t.streams[c % t.streams.len()];
        p.h2d(s, t.dev_in, at, t.host_in, at, n, &format!("H2D {c}"))?;
        p.compute(s, t.dev_in, at, t.dev_out, at, n, &format!("kernel {c}"))?;
        p.d2h(s, t.host_out, at, t.dev_out, at, n, &format!("D2H {c}"))?;
        p.sync_device()?;
    }
    t.upload_params(p, t.streams[0])
}

/// Every chunk's H2D, kernel and D2H on stream `c mod S`, with `params`
/// issued after the first half of the chunks.
fn issue_chunks(p: &mut dyn Issue, t: &StreamsTask, params: impl Fn(&mut dyn Issue, &StreamsTask) -> Result<()>) -> Result<()> {
    for c in 0..t.chunks {
        let (at, n) = t.chunk(c);
        let s = t.streams[c % t.streams.len()];
        p.h2d(s, t.dev_in, at, t.host_in, at, n, &format!("H2D {c}"))?;
        p.compute(s, t.dev_in, at, t.dev_out, at, n, &format!("kernel {c}"))?;
        p.d2h(s, t.host_out, at, t.dev_out, at, n, &format!("D2H {c}"))?;
        if c + 1 == t.chunks / 2 {
            params(p, t)?;
        }
    }
    Ok(())
}

/// A learner's loop as a plan on the lab's buffers and streams.
pub fn plan(name: &str, cfg: &StreamsConfig, learner: Loop) -> Plan {
    let (chunks, k) = (cfg.chunks, cfg.streams);
    let mut specs: Vec<StreamSpec> = (0..k).map(|i| StreamSpec::new(&format!("s{i}"), StreamKind::Blocking, 0)).collect();
    specs.push(StreamSpec::new("NULL stream", StreamKind::Legacy, 0));
    specs.push(StreamSpec::new("per-thread default", StreamKind::PerThread, 0));
    Plan::new(name, specs, cfg.elements, 3, move |p, r| {
        let task = StreamsTask {
            chunks,
            elements: r.elements,
            streams: r.streams[..k].to_vec(),
            default_stream: r.streams[k],
            per_thread_stream: r.streams[k + 1],
            host_in: r.input,
            host_out: r.output,
            dev_in: r.devices[0],
            dev_out: r.devices[1],
            params: r.devices[2],
        };
        learner(p, &task)
    })
    .with_device_buffers(&[("device in", cfg.elements), ("device out", cfg.elements), ("parameters", cfg.elements)])
}

/// What the model says is wrong with the loop, before timing it: data,
/// races, memory ([`loop_check::shape`]), the parameters' upload (gone, or
/// issued more than once over `chunks` chunks: named first), anything left
/// on the NULL stream.
fn shape_findings(plan: &Plan, chunks: usize, rep: &mut CheckReport) -> Option<DryRun> {
    let before = rep.findings.len();
    let model = loop_check::shape(plan, rep)?;
    let uploads: Vec<_> = model.schedule.ops.iter().filter(|o| o.label == PARAMS).collect();
    if uploads.is_empty() {
        rep.problem(format!("the parameters' upload ('{PARAMS}') is gone: the kernels read the parameters it uploads"));
    }
    if uploads.len() > 1 {
        // Named first: the races between the uploads (each writes the same
        // parameters) follow from it.
        rep.problem_at(before, repeated_upload(&model, chunks));
    }
    // An op on the legacy NULL stream drains the pipeline only between
    // work of the blocking streams: it waits for all of it issued before,
    // and all issued after waits for it. Before the first of their work or
    // after the last it holds nothing up: what the exercise asks for (the
    // overlap) is there, whatever stream the upload took.
    let legacy = |o: &crate::pipeline::op::Op| matches!(o.lane, Lane::Stream(s) if plan.streams.get(s).is_some_and(|x| x.kind == StreamKind::Legacy));
    let ops = &model.schedule.ops;
    // Where the other streams' work starts and ends, in issue order.
    let mut others = ops.iter().enumerate().filter(|(_, o)| matches!(o.lane, Lane::Stream(_)) && !legacy(o)).map(|(i, _)| i);
    let (first, last) = (others.next(), others.next_back());
    let between = |i: usize| first.is_some_and(|f| f < i) && last.is_some_and(|l| l > i);
    let on_legacy: Vec<(usize, &crate::pipeline::op::Op)> = ops.iter().enumerate().filter(|(_, o)| legacy(o)).collect();
    if let Some((_, o)) = on_legacy.iter().find(|(i, _)| between(*i)) {
        rep.problem(format!(
            "'{}' is still on t.default_stream, the legacy NULL stream, between the chunks' work: it waits for all earlier work of every blocking stream, and their later work waits for it, so the pipeline drains there",
            o.label
        ));
    } else if let Some((_, o)) = on_legacy.first() {
        rep.note(format!(
            "'{}' is on the legacy NULL stream, but before or after all of the chunks' work, where it holds nothing up (anywhere between, it would drain the pipeline)",
            o.label
        ));
    }
    if let Some(waits) = cpu_waits(&model) {
        rep.note(format!("your loop makes the CPU wait for the GPU {waits}: each wait stops it issuing the next chunk until the GPU catches up"));
    } else if model.schedule.cpu_waited_for_gpu() {
        rep.note("your loop makes the CPU wait (a synchronize): each wait stops it issuing the next chunk until the GPU catches up");
    }
    Some(model)
}

/// The CPU's waits for the GPU between the loop's GPU operations, in
/// words: how many, and the first (its call, after which operation and
/// before which); `None` where there is none.
fn cpu_waits(model: &DryRun) -> Option<String> {
    use crate::pipeline::schedule::WaitFor;
    let ops = &model.schedule.ops;
    let gpu = |o: &&crate::pipeline::op::Op| o.is_gpu_work();
    let between: Vec<_> = model
        .schedule
        .cpu_waits
        .iter()
        .filter(|w| w.thread == 0 && ops[..w.after_ops].iter().any(|o| gpu(&o)) && ops[w.after_ops..].iter().any(|o| gpu(&o)))
        .collect();
    let w = between.first()?;
    let (after, before) = (ops[..w.after_ops].iter().rev().find(gpu)?, ops[w.after_ops..].iter().find(gpu)?);
    let call = match w.on {
        WaitFor::Device => "p.sync_device()",
        WaitFor::Stream(_) => "p.host_sync(stream)",
        WaitFor::Event(_) => "p.host_wait(event)",
        _ => "a wait",
    };
    let times = if between.len() == 1 { "once".to_string() } else { format!("{} times", between.len()) };
    Some(format!("{times} between its operations (the first, {call}, after '{}' and before '{}')", after.label, before.label))
}

/// The parameters' upload issued more than once over `chunks` chunks, in
/// words: how often, after which operations the first two come, and
/// whether they race.
fn repeated_upload(model: &DryRun, chunks: usize) -> String {
    let ops = &model.schedule.ops;
    let uploads: Vec<_> = ops.iter().filter(|o| o.label == PARAMS).collect();
    // Where an upload comes: after the last other work issued before it.
    let place = |id: usize| {
        ops[..id]
            .iter()
            .rev()
            .find(|o| o.label != PARAMS && matches!(o.lane, Lane::Stream(_)))
            .map_or("before any other work".to_string(), |o| format!("after '{}'", o.label))
    };
    let more = if uploads.len() > 2 { ", ..." } else { "" };
    let places = format!("'{PARAMS}' {}, again {}{more}", place(uploads[0].id), place(uploads[1].id));
    let how = if uploads.len() >= chunks { format!(", once per chunk: t.upload_params is inside the chunk loop ({places})") } else { format!(" ({places})") };
    let unordered = if uploads.iter().any(|o| o.lane != uploads[0].lane) { ", and uploads on different streams write them unordered" } else { "" };
    format!(
        "the parameters are uploaded {} times{how}, where the given loop uploads them once: each upload after the first copies the same parameters again{unordered}",
        uploads.len()
    )
}

/// What the learner's loop is judged against; what a loop slower than the
/// fix is said to do comes from its model ([`slow_means`]).
fn judge(cfg: &StreamsConfig, model: &DryRun) -> loop_check::Judge {
    loop_check::Judge { given: plan("given", cfg, Arc::new(given)), fixed: plan("fix", cfg, Arc::new(solution)), slack: SLACK, slow_means: slow_means(model) }
}

/// What a loop slower than the fix does, read from its model where the
/// model shows it: the parameters uploaded more than once (named above),
/// the CPU waiting for the GPU inside the loop (named above), every
/// chunk's work on one stream; else what usually still serializes a loop.
fn slow_means(model: &DryRun) -> &'static str {
    if uploads_repeated(model) {
        SLOW_REPEATED
    } else if cpu_waits(model).is_some() {
        SLOW_CPU_WAITS
    } else if chunk_streams(model) == 1 {
        SLOW_ONE_STREAM
    } else {
        SLOW
    }
}

/// What a loop slower than the fix usually still does.
const SLOW: &str = "something still serializes it (a wait on the CPU, one stream for everything, or the NULL stream)";
/// The same, for a loop that uploads the parameters more than once.
const SLOW_REPEATED: &str =
    "the parameters' extra uploads (above) take their time on the streams, and something else may still serialize it (a wait on the CPU, one stream for everything, or the NULL stream)";
/// The same, for a loop whose CPU waits for the GPU between chunks.
const SLOW_CPU_WAITS: &str =
    "the CPU waits for the GPU inside the loop (the waits noted above), so it issues each chunk only once the work before it has run, and nothing overlaps";
/// The same, for a loop with every chunk's work on one stream.
const SLOW_ONE_STREAM: &str = "every chunk's work is on one stream, so each chunk's copies and kernel wait for the chunk before";

/// Whether the loop of `model` uploads the parameters more than once.
fn uploads_repeated(model: &DryRun) -> bool {
    model.schedule.ops.iter().filter(|o| o.label == PARAMS).nth(1).is_some()
}

/// How many streams the chunks' work (all but the parameters' upload) is on.
fn chunk_streams(model: &DryRun) -> usize {
    let mut lanes: Vec<Lane> = model.schedule.ops.iter().filter(|o| o.is_gpu_work() && o.label != PARAMS).map(|o| o.lane).collect();
    lanes.sort();
    lanes.dedup();
    lanes.len()
}

/// Checks `learner` with no GPU: the model's data and races, and its
/// time from the costs recorded in `rec`.
pub fn check_on_model(rec: &StreamsResults, learner: Loop) -> CheckReport {
    let mut rep = CheckReport::new("the hidden legacy-stream operation (queue model, no GPU)");
    let cfg = &rec.config;
    let mine = plan("your loop", cfg, learner);
    let Some(model) = shape_findings(&mine, cfg.chunks, &mut rep) else { return rep };
    let judge = judge(cfg, &model);
    judge.on_model(&mut rep, &mine, &model, rec.machine.machine(), &rec.costs_map());
    rep
}

/// Checks `learner` on the GPU: verified data, then the given loop, the
/// fix and yours timed in turn (`cfg.repeats` runs each, medians).
pub fn check_on_gpu(gpu: &Gpu, rec: &StreamsResults, learner: Loop) -> Result<CheckReport> {
    let mut rep = CheckReport::new(&format!("the hidden legacy-stream operation (live on {})", gpu.name()));
    let cfg = &rec.config;
    let mine = plan("your loop", cfg, learner);
    let Some(model) = shape_findings(&mine, cfg.chunks, &mut rep) else { return Ok(rep) };
    if !rep.passed {
        return Ok(rep);
    }
    let mut rig = PlanRig::new(gpu, cfg.elements, 3, rec.iterations)?;
    let judge = judge(cfg, &model);
    judge.on_gpu(&mut rep, &mut rig, &mine, &model, cfg.repeats)?;
    Ok(rep)
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "In a program built the usual way, \"the default stream\" is the legacy NULL stream, and blocking streams synchronize with it.",
    "An op on the legacy stream waits for all earlier work on every blocking stream, and their later work waits for it: find the op that sits between the chunks.",
    "Move that op onto one of the pipeline's own streams, or to where it holds nothing up, keeping what the kernels read in place before they read it.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::super::fixture::results as streams_results;
    use super::*;
    use crate::testing::fails_with;

    fn check(f: impl Fn(&mut dyn Issue, &StreamsTask) -> Result<()> + Send + Sync + 'static) -> CheckReport {
        check_on_model(&streams_results(), Arc::new(f))
    }

    /// `body` for every chunk (its stream, offset and length) in turn, the
    /// chunks' streams taken round, then the parameters' upload.
    fn each_chunk(p: &mut dyn Issue, t: &StreamsTask, body: impl Fn(&mut dyn Issue, StreamRef, usize, usize) -> Result<()>) -> Result<()> {
        for c in 0..t.chunks {
            let (at, n) = t.chunk(c);
            body(p, t.streams[c % t.streams.len()], at, n)?;
        }
        t.upload_params(p, t.streams[0])
    }

    #[test]
    fn the_fix_passes_and_the_given_loop_fails_naming_the_null_stream() {
        let rep = check(solution);
        assert!(rep.passed, "{rep}");
        assert!(rep.to_string().contains("won back"), "{rep}");
        fails_with(&check(given), "still on t.default_stream, the legacy NULL stream");
    }

    #[test]
    fn the_per_thread_default_stream_or_any_own_stream_is_an_honest_fix() {
        assert!(check(|p, t| issue_chunks(p, t, |p, t| t.upload_params(p, t.per_thread_stream))).passed);
        assert!(check(|p, t| issue_chunks(p, t, |p, t| t.upload_params(p, t.streams[t.streams.len() - 1]))).passed);
        // Uploaded once before the loop on the legacy stream itself: nothing
        // is drained, the overlap is there; it passes with a note.
        let rep = check(|p, t| {
            t.upload_params(p, t.default_stream)?;
            issue_chunks(p, t, |_, _| Ok(()))
        });
        assert!(rep.passed, "the upload before the loop on the NULL stream: {rep}");
        assert!(rep.to_string().contains("before or after all of the chunks' work"), "{rep}");
        // Uploaded first, before any chunk: also fine.
        assert!(
            check(|p, t| {
                t.upload_params(p, t.streams[1])?;
                issue_chunks(p, t, |_, _| Ok(()))
            })
            .passed
        );
    }

    #[test]
    fn dropping_the_upload_is_named() {
        fails_with(&check(|p, t| issue_chunks(p, t, |_, _| Ok(()))), "the parameters' upload ('params H2D') is gone");
    }

    #[test]
    fn a_cpu_wait_instead_is_too_slow_and_says_why() {
        let rep = check(syncs_every_chunk);
        fails_with(&rep, "more than the fix");
        fails_with(&rep, "the CPU waits for the GPU inside the loop");
        let chunks = streams_results().config.chunks;
        // After every chunk: the last wait comes before the parameters' upload.
        let where_ =
            format!("makes the CPU wait for the GPU {chunks} times between its operations (the first, p.sync_device(), after 'D2H 0' and before 'H2D 1')");
        assert!(rep.to_string().contains(&where_), "{rep}");
        // One wait, on a stream, is said once, with its call.
        let once = check(|p, t| {
            issue_chunks(p, t, |p, t| {
                p.host_sync(t.streams[1])?;
                t.upload_params(p, t.streams[0])
            })
        });
        assert!(once.to_string().contains("wait for the GPU once between its operations (the first, p.host_sync(stream), after 'D2H"), "{once}");
    }

    /// The exercise uploads the parameters once; a learner who moves the
    /// upload into the chunk loop is told that, before the races it makes.
    #[test]
    fn the_parameters_uploaded_inside_the_chunk_loop_are_named() {
        let chunks = streams_results().config.chunks;
        type Upload = fn(&mut dyn Issue, &StreamsTask, StreamRef) -> Result<()>;
        let cases: [(&str, Upload, &[&str]); 3] = [
            (
                "on each chunk's stream",
                |p, t, s| t.upload_params(p, s),
                &[
                    ", once per chunk: t.upload_params is inside the chunk loop ('params H2D' after 'D2H 0', again after 'D2H 1', ...)",
                    "uploads on different streams write them unordered",
                ],
            ),
            (
                "on one stream",
                |p, t, _| t.upload_params(p, t.streams[0]),
                &[", once per chunk: t.upload_params is inside the chunk loop ('params H2D' after 'D2H 0', again after 'D2H 1', ...)"],
            ),
            ("on the default stream", |p, t, _| t.upload_params(p, t.default_stream), &["once per chunk", "still on t.default_stream"]),
        ];
        for (what, upload, words) in cases {
            let rep = check(move |p, t| {
                for c in 0..t.chunks {
                    let (at, n) = t.chunk(c);
                    let s = t.streams[c % t.streams.len()];
                    p.h2d(s, t.dev_in, at, t.host_in, at, n, &format!("H2D {c}"))?;
                    p.compute(s, t.dev_in, at, t.dev_out, at, n, &format!("kernel {c}"))?;
                    p.d2h(s, t.host_out, at, t.dev_out, at, n, &format!("D2H {c}"))?;
                    upload(p, t, s)?;
                }
                Ok(())
            });
            fails_with(&rep, &format!("the parameters are uploaded {chunks} times, once per chunk"));
            for w in words {
                fails_with(&rep, w);
            }
            // Named first: a race between two uploads follows from it.
            assert!(rep.findings[0].starts_with("the parameters are uploaded"), "{what}: {rep}");
            let said = rep.to_string();
            assert!(!said.contains("more than the fix") || said.contains("the parameters' extra uploads (above) take their time"), "{what}: {rep}");
        }
        // Twice, outside the loop: said how often, not "inside the chunk loop".
        let twice = check(|p, t| {
            t.upload_params(p, t.streams[0])?;
            solution(p, t)
        });
        fails_with(
            &twice,
            "the parameters are uploaded 2 times ('params H2D' before any other work, again after 'D2H 3'), where the given loop uploads them once",
        );
        assert!(!twice.to_string().contains("inside the chunk loop"), "{twice}");
    }

    #[test]
    fn everything_on_one_stream_is_too_slow_and_says_so() {
        let rep = check(|p, t| issue_chunks(p, &StreamsTask { streams: vec![t.streams[0]], ..t.clone() }, |p, t| t.upload_params(p, t.streams[0])));
        fails_with(&rep, "more than the fix");
        fails_with(&rep, "every chunk's work is on one stream, so each chunk's copies and kernel wait for the chunk before");
        // The parameters on another stream do not make it two.
        let rep = check(|p, t| issue_chunks(p, &StreamsTask { streams: vec![t.streams[0]], ..t.clone() }, |p, t| t.upload_params(p, t.per_thread_stream)));
        fails_with(&rep, "every chunk's work is on one stream");
    }

    #[test]
    fn wrong_data_and_panics_are_failed_checks() {
        fails_with(
            &check(|p, t| {
                each_chunk(p, t, |p, s, at, n| {
                    p.h2d(s, t.dev_in, at, t.host_in, at, n, "H2D")?;
                    p.compute(s, t.dev_in, at, t.dev_out, at, n, "kernel")?;
                    p.d2h(s, t.host_out, at, t.dev_in, at, n, "D2H")
                })
            }),
            "holds an input",
        );
        fails_with(&check(|p, t| issue_chunks(p, t, |_, _| panic!("oops"))), "panicked: oops");
        // Each chunk's D2H issued before its kernel: the copy is there, too early.
        let early = check(|p, t| {
            each_chunk(p, t, |p, s, at, n| {
                p.h2d(s, t.dev_in, at, t.host_in, at, n, "H2D")?;
                p.d2h(s, t.host_out, at, t.dev_out, at, n, "D2H")?;
                p.compute(s, t.dev_in, at, t.dev_out, at, n, "kernel")
            })
        });
        fails_with(&early, "output element 0 was copied to the host ('D2H') before 'kernel' wrote it: the D2H is issued before");
        assert!(!early.to_string().contains("a D2H is missing"), "{early}");
        // The last chunk forgotten.
        fails_with(
            &check(|p, t| {
                for c in 0..t.chunks - 1 {
                    let (at, n) = t.chunk(c);
                    let s = t.streams[c % t.streams.len()];
                    p.h2d(s, t.dev_in, at, t.host_in, at, n, "H2D")?;
                    p.compute(s, t.dev_in, at, t.dev_out, at, n, "kernel")?;
                    p.d2h(s, t.host_out, at, t.dev_out, at, n, "D2H")?;
                }
                t.upload_params(p, t.streams[0])
            }),
            "never reached the host",
        );
    }

    #[test]
    fn absurd_sizes_are_failed_checks_that_say_so() {
        // Twice the data in one upload, and a chunk count of zero.
        fails_with(
            &check(|p, t| {
                p.h2d(t.streams[0], t.dev_in, 0, t.host_in, 0, 2 * t.elements, "everything twice")?;
                issue_chunks(p, t, |p, t| t.upload_params(p, t.streams[0]))
            }),
            "do not fit",
        );
        fails_with(&check(|p, t| issue_chunks(p, &StreamsTask { chunks: 0, ..t.clone() }, |p, t| t.upload_params(p, t.streams[0]))), "never reached the host");
    }

    #[test]
    fn a_fix_that_races_is_named() {
        // Each chunk's kernel on another stream than its upload, no event.
        fails_with(
            &check(|p, t| {
                for c in 0..t.chunks {
                    let (at, n) = t.chunk(c);
                    let k = t.streams.len();
                    p.h2d(t.streams[c % k], t.dev_in, at, t.host_in, at, n, "H2D")?;
                    p.compute(t.streams[(c + 1) % k], t.dev_in, at, t.dev_out, at, n, "kernel")?;
                    p.d2h(t.streams[(c + 1) % k], t.host_out, at, t.dev_out, at, n, "D2H")?;
                }
                t.upload_params(p, t.streams[0])
            }),
            "race",
        );
    }

    #[test]
    fn a_loop_that_chunks_differently_is_still_judged() {
        let rep = check(|p, t| issue_chunks(p, &StreamsTask { chunks: 2 * t.chunks, ..t.clone() }, |p, t| t.upload_params(p, t.streams[0])));
        assert!(rep.passed, "{rep}");
    }
}
