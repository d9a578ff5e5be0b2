//! Lab 5's experiments, each a few variants of one pipeline written as
//! [`Plan`]s, so the GPU and the model run the same loop.

use super::StreamsConfig;
use crate::error::Result;
use crate::pipeline::issue::{Issue, StreamRef};
use crate::pipeline::op::StreamKind;
pub use crate::pipeline::plan::WaitBy;
use crate::pipeline::plan::{chunk, stage_streams, Plan, Refs, StreamSpec};

pub use crate::lab_kit::experiment::{Effect, Experiment};

/// Elements of the tiny op on a default stream, and of the urgent job.
pub const TINY: usize = 512;
pub const URGENT: usize = 1 << 14;
/// The label of the urgent job's last op.
pub const URGENT_DONE: &str = "urgent D2H";

/// H2D, kernel and D2H of chunk `c` on stream `s` (device 0 in, device 1 out).
fn chunk_on(p: &mut dyn Issue, r: &Refs, chunks: usize, c: usize, s: StreamRef) -> Result<()> {
    let (at, n) = chunk(r.elements, chunks, c);
    p.h2d(s, r.devices[0], at, r.input, at, n, &format!("H2D {c}"))?;
    p.compute(s, r.devices[0], at, r.devices[1], at, n, &format!("kernel {c}"))?;
    p.d2h(s, r.output, at, r.devices[1], at, n, &format!("D2H {c}"))
}

fn streams(n: usize, kind: StreamKind) -> Vec<StreamSpec> {
    (0..n).map(|i| StreamSpec::new(&format!("s{i}"), kind, 0)).collect()
}

/// The legacy NULL stream: a chunked pipeline, and the same with one tiny
/// copy on a default stream in the middle.
fn legacy(cfg: &StreamsConfig) -> Experiment {
    let (chunks, k) = (cfg.chunks, cfg.streams);
    let variant = |name: &str, kind: StreamKind, tiny_on: Option<StreamKind>| {
        let mut specs = streams(k, kind);
        if let Some(d) = tiny_on {
            specs.push(StreamSpec::new(if d == StreamKind::Legacy { "NULL stream" } else { "per-thread default" }, d, 0));
        }
        Plan::new(name, specs, cfg.elements, 3, move |p, r| {
            for c in 0..chunks {
                chunk_on(p, r, chunks, c, r.streams[c % k])?;
                if c + 1 == chunks / 2 && tiny_on.is_some() {
                    p.h2d(r.streams[k], r.devices[2], 0, r.input, 0, TINY, "tiny H2D")?;
                }
            }
            Ok(())
        })
    };
    Experiment {
        name: "legacy-stream",
        shows: "one tiny copy on the legacy NULL stream waits for all earlier work of every blocking stream, and their later work waits for it; non-blocking streams and the per-thread default stream do not",
        variants: vec![
            variant("blocking streams", StreamKind::Blocking, None),
            variant("blocking streams + tiny copy on the NULL stream", StreamKind::Blocking, Some(StreamKind::Legacy)),
            variant("non-blocking + tiny copy on the NULL stream", StreamKind::NonBlocking, Some(StreamKind::Legacy)),
            variant("blocking + tiny copy on the per-thread stream", StreamKind::Blocking, Some(StreamKind::PerThread)),
        ],
        watch: None,
        effects: vec![
            Effect::new("a tiny copy on the NULL stream beside blocking streams", 0, 1, true),
            Effect::new("the same beside non-blocking streams", 0, 2, false),
            Effect::new("the same on the per-thread default stream", 0, 3, false),
        ],
        ceiling_from: None,
    }
}

/// Several CPU threads each issue their share of the chunks on "the
/// default stream": the legacy NULL stream (one stream for the whole
/// process), the per-thread default stream (one per thread), and the
/// per-thread streams again with one tiny copy on the legacy stream.
fn threads(cfg: &StreamsConfig) -> Experiment {
    let (chunks, threads) = (cfg.chunks, cfg.streams);
    let variant = |name: &str, default: StreamKind, tiny_on_legacy: bool| {
        let mut specs = vec![StreamSpec::new("the default stream", default, 0)];
        if tiny_on_legacy {
            specs.push(StreamSpec::new("NULL stream", StreamKind::Legacy, 0));
        }
        Plan::new(name, specs, cfg.elements, 3, move |p, r| {
            for c in 0..chunks {
                // Chunk c is thread (c mod threads)'s.
                p.issue_from(c % threads)?;
                chunk_on(p, r, chunks, c, r.streams[0])?;
                if tiny_on_legacy && c + 1 == chunks / 2 {
                    p.issue_from(0)?;
                    p.h2d(r.streams[1], r.devices[2], 0, r.input, 0, TINY, "tiny H2D")?;
                }
            }
            p.issue_from(0)
        })
    };
    Experiment {
        name: "threads",
        shows: "CPU threads that each issue on the default stream share one stream when it is the legacy NULL stream, and overlap when each has its own per-thread default stream (cudaStreamPerThread, or nvcc --default-stream per-thread) -- until one op lands on the legacy stream",
        variants: vec![
            variant(THREADS_LEGACY, StreamKind::Legacy, false),
            variant("per-thread default streams", StreamKind::PerThread, false),
            variant("per-thread + one tiny copy on the NULL stream", StreamKind::PerThread, true),
        ],
        watch: None,
        effects: vec![
            Effect::new("each thread on its own per-thread stream instead of the legacy one", 0, 1, true),
            Effect::new("one tiny copy on the legacy stream beside the per-thread streams", 1, 2, true),
        ],
        ceiling_from: None,
    }
}

/// The threads experiment's first variant (its lanes are drawn per thread).
pub const THREADS_LEGACY: &str = "legacy default stream, shared by the threads";

/// The weight of a wait: the stage-per-stream pipeline, each chunk's
/// kernel ordered after its upload in four ways.
fn sync_weight(cfg: &StreamsConfig) -> Experiment {
    // Each CPU wait costs its chunk a wake-up and the issue of what
    // follows: as many chunks as the three-way overlap, so the sum stands
    // clear of the runs' spread.
    let chunks = three_way_chunks(cfg);
    Experiment {
        name: "sync-weight",
        shows: "a wait on the GPU (cuStreamWaitEvent) blocks only the stream that waits; a wait on the CPU also stops the CPU issuing the next chunk, and cuCtxSynchronize waits for every stream",
        variants: WaitBy::ALL.into_iter().map(|by| stage_streams(by.label(), cfg.elements, chunks, by)).collect(),
        watch: None,
        effects: vec![
            Effect::new("the CPU waits on an event per chunk", 0, 1, true),
            Effect::new("the CPU synchronizes the upload stream per chunk", 0, 2, true),
            Effect::new("the CPU synchronizes the context per chunk", 0, 3, true),
        ],
        ceiling_from: None,
    }
}

/// The three-way overlap's variant: the one judged against a bound.
pub const THREE_WAY: &str = "three-way: H2D, kernel, D2H on three streams";

/// Chunks of the three-way overlap: more than the other pipelines, so its
/// fill and drain (a first H2D and a last D2H nothing hides) stay small.
pub fn three_way_chunks(cfg: &StreamsConfig) -> usize {
    4 * cfg.chunks
}

/// The copy engines: H2D and D2H one after the other and at once, and
/// three-way overlap (uploads, kernels, downloads on three streams).
fn copy_engines(cfg: &StreamsConfig) -> Experiment {
    let chunks = three_way_chunks(cfg);
    let whole = cfg.elements;
    let two = |name: &str, apart: bool| {
        let specs = vec![StreamSpec::new("up", StreamKind::NonBlocking, 0), StreamSpec::new("down", StreamKind::NonBlocking, 0)];
        Plan::new(name, specs, whole, 2, move |p, r| {
            p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, r.elements, "H2D")?;
            p.d2h(r.streams[if apart { 0 } else { 1 }], r.output, 0, r.devices[1], 0, r.elements, "D2H")
        })
    };
    let three_way = stage_streams(THREE_WAY, whole, chunks, WaitBy::StreamWaitEvent);
    Experiment {
        name: "copy-engines",
        shows: "H2D and D2H run at once on separate copy engines, each a little slower than alone (the bidirectional ceiling); three streams overlap all three stages",
        variants: vec![two("H2D then D2H, one stream", true), two("H2D and D2H at once, two streams", false), three_way],
        watch: None,
        effects: vec![Effect::new("both directions at once instead of one after the other", 0, 1, true)],
        ceiling_from: Some(1),
    }
}

/// Priorities: a small urgent job issued behind big kernels queued on
/// several background streams, on a stream of default or of high priority.
fn priorities(cfg: &StreamsConfig, greatest: i32) -> Experiment {
    let (background, lanes) = (2 * cfg.chunks, cfg.streams);
    let variant = |name: &str, priority: i32| {
        let mut specs: Vec<StreamSpec> = (0..lanes).map(|i| StreamSpec::new(&format!("background {i}"), StreamKind::NonBlocking, 0)).collect();
        specs.push(StreamSpec::new("urgent", StreamKind::NonBlocking, priority));
        Plan::new(name, specs, cfg.elements, 4, move |p, r| {
            let urgent = r.streams[lanes];
            for b in 0..background {
                // Each background stream computes its own share of the data.
                let (at, n) = chunk(r.elements, lanes, b % lanes);
                p.compute(r.streams[b % lanes], r.devices[0], at, r.devices[1], at, n, &format!("background kernel {b}"))?;
                if b + 1 == lanes {
                    p.h2d(urgent, r.devices[2], 0, r.input, 0, URGENT, "urgent H2D")?;
                    p.compute(urgent, r.devices[2], 0, r.devices[3], 0, URGENT, "urgent kernel")?;
                    p.d2h(urgent, r.output, 0, r.devices[3], 0, URGENT, URGENT_DONE)?;
                }
            }
            Ok(())
        })
    };
    Experiment {
        name: "priorities",
        shows: "the SMs take the kernel that has waited longest; a small job on a high-priority stream goes ahead of every waiting kernel as soon as the running one ends",
        variants: vec![variant("urgent stream at the default priority", 0), variant("urgent stream at the highest priority", greatest)],
        watch: Some(URGENT_DONE),
        effects: vec![
            Effect { watched: true, ..Effect::new("the urgent job's finish on the highest-priority stream", 0, 1, true) },
            Effect::new("the whole run's time with priority", 0, 1, false),
        ],
        ceiling_from: None,
    }
}

/// Every experiment of the lab, in order; `greatest` is the GPU's highest
/// stream priority.
pub fn all(cfg: &StreamsConfig, greatest: i32) -> Vec<Experiment> {
    vec![legacy(cfg), threads(cfg), sync_weight(cfg), copy_engines(cfg), priorities(cfg, greatest)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::op::OpKind;
    use crate::pipeline::plan::Costs;

    fn costs(cfg: &StreamsConfig, plans: &[&Plan]) -> Costs {
        let mut c = Costs::new();
        for p in plans {
            for (kind, n) in p.distinct_ops().unwrap() {
                // 1 ms per chunk of H2D, kernel and D2H alike.
                c.insert((kind, n), n as f64 * cfg.chunks as f64 / cfg.elements as f64);
            }
        }
        c
    }

    #[test]
    fn every_variant_verifies_on_the_model_and_the_model_tells_them_apart() {
        // The default chunks and streams, fewer elements (the model keeps a cell per element).
        let cfg = StreamsConfig { elements: 1 << 16, ..StreamsConfig::default() };
        let machine = Machine { host_wake: 0.05, ..Machine::engines(2) };
        for e in all(&cfg, -5) {
            let plans: Vec<&Plan> = e.variants.iter().collect();
            let c = costs(&cfg, &plans);
            let mut totals = Vec::new();
            for v in &e.variants {
                let m = v.dry_run().unwrap();
                assert!(m.schedule.races().is_empty(), "{}: {:?}", v.name, m.schedule.races());
                let out = v.expected_output().unwrap();
                assert!(out.iter().all(|p| !matches!(p, Provenance::Garbage)), "{}", v.name);
                totals.push((v.name.clone(), v.predicted_ms(machine, &c).unwrap()));
            }
            let t = |i: usize| totals[i].1;
            match e.name {
                "legacy-stream" => {
                    assert!(t(1) > t(0) * 1.2, "the NULL stream collapses blocking streams: {totals:?}");
                    assert!((t(2) - t(0)).abs() < 0.1 && (t(3) - t(0)).abs() < 0.1, "but not non-blocking ones, nor the per-thread stream: {totals:?}");
                }
                "threads" => {
                    assert!(t(1) < t(0) * 0.7, "per-thread streams overlap the threads' chunks: {totals:?}");
                    assert!(t(2) > t(1) * 1.15, "one op on the legacy stream drains them: {totals:?}");
                    let lanes = e.variants[1].dry_run().unwrap().stream_names();
                    assert_eq!(lanes.len(), cfg.streams, "a per-thread stream for each thread: {lanes:?}");
                }
                "sync-weight" => {
                    let wakes = three_way_chunks(&cfg) as f64 * machine.host_wake;
                    assert!(t(0) < t(1) && t(1) <= t(0) + wakes + 1e-9, "a CPU wait costs at most a wake-up per chunk: {totals:?}");
                    assert!(t(3) > 1.3 * t(0), "cuCtxSynchronize also waits for the other streams: {totals:?}");
                }
                "copy-engines" => assert!(t(1) < t(0), "two engines run both directions at once: {totals:?}"),
                "priorities" => {
                    let done = |v: &Plan| {
                        let (s, times) = v.predict(machine, &c).unwrap();
                        let i = s.ops.iter().position(|o| o.label == URGENT_DONE).unwrap();
                        times[i].1
                    };
                    let (low, high) = (done(&e.variants[0]), done(&e.variants[1]));
                    assert!(high + 1.0 < low, "priority lets the urgent job through: {high} vs {low}");
                }
                other => panic!("unexpected experiment {other}"),
            }
            assert!(e.variants.iter().all(|v| v.distinct_ops().unwrap().iter().all(|(k, _)| OpKind::STAGES.contains(k))));
        }
    }
}
