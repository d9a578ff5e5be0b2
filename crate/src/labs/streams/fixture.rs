//! Lab 5's fixture: the lab's own plans "measured" as the queue model
//! predicts them (no GPU ran them), for its unit tests and the table's
//! check of every lab's parts.

use super::experiments as streams_experiments;
use super::issue_cost::{self as streams_issue, IssueCost, IssuePoint};
use super::{StreamsConfig, StreamsResults};
use crate::gpu::MachineFacts;
use crate::pipeline::plan::{chunk, Costs};
use crate::pipeline::timeline::Timeline;
use crate::testing::{experiment_as_modelled, flat};

/// Lab 5's results for a small run (2^14 elements, the default chunks and
/// streams) where every op costs its share of 1 ms per chunk and each
/// variant "measured" exactly what the model predicts: the experiments'
/// own plans, so every figure and table has real timelines to draw.
pub fn results() -> StreamsResults {
    let config = StreamsConfig { elements: 1 << 14, issue_chunks: vec![2, 4], ..StreamsConfig::default() };
    let exps = streams_experiments::all(&config, -5);
    let mut costs = Costs::new();
    for plan in exps.iter().flat_map(|e| e.variants.iter()) {
        for (kind, n) in plan.distinct_ops().expect("the lab's plans model") {
            costs.insert((kind, n), n as f64 * config.chunks as f64 / config.elements as f64);
        }
    }
    let machine =
        MachineFacts { copy_engines: 3, h2d_ms: 8.0, d2h_ms: 8.0, both_ms: 8.0, wake_ms: 0.05, kernel_ms: 2.0, kernels_alternating_ms: 16.0, issue_ms: 0.003 };
    let experiments = exps
        .iter()
        .map(|e| {
            let mut r = experiment_as_modelled(e, machine, machine.machine(), &costs).expect("costs for every op");
            r.costs = Vec::new();
            for v in r.variants.iter_mut().filter(|v| v.name == streams_experiments::THREE_WAY) {
                v.bound_ms = Some(v.model_ms);
            }
            r
        })
        .collect();
    let issue_cost = Some(issue_cost(&config, machine));
    StreamsResults {
        config,
        machine,
        iterations: 100,
        priority_range: (0, -5),
        costs: costs.into_iter().map(|((k, n), ms)| (k, n, ms)).collect(),
        experiments,
        issue_cost,
    }
}

/// Lab 5's issue-cost sweep at `config`'s chunk counts as the model sees
/// it, each way "measured" at its prediction: ops cost as in
/// [`results`], issuing an op 0.4 ms (so the graph wins at the
/// smaller chunks), a graph launch 20 µs.
fn issue_cost(config: &StreamsConfig, machine: MachineFacts) -> IssueCost {
    let machine = MachineFacts { issue_ms: 0.4, ..machine };
    let n = streams_issue::elements(config);
    let mut points = Vec::new();
    let mut drawn = None;
    for &chunks in &config.issue_chunks {
        let (gated, live) = streams_issue::plans(n, chunks);
        let (gm, lm) = (gated.dry_run().expect("models"), live.dry_run().expect("models"));
        let costs: Costs =
            gated.distinct_ops().expect("models").into_iter().map(|(k, e)| ((k, e), e as f64 * config.chunks as f64 / config.elements as f64)).collect();
        let live_model = live.prediction(&lm, machine.machine(), &costs).expect("costs");
        let model_gated = gated.prediction(&gm, machine.machine(), &costs).expect("costs").total_ms;
        let model_live = live_model.total_ms;
        let model_graph = 0.02 + model_gated;
        let ops = gm.schedule.ops.len();
        points.push(IssuePoint {
            chunks,
            chunk_bytes: 4 * chunk(n, chunks, 0).1 as u64,
            ops,
            live: flat(model_live),
            graph: flat(model_graph),
            issue_us_per_op: flat(400.0),
            plain: Some(flat(model_live * 0.98)),
            plain_issue_us_per_op: Some(flat(380.0)),
            driver_us_per_op: None,
            launch_us: flat(20.0),
            capture_ms: 0.5,
            instantiate_ms: 1.5,
            nodes: ops + 2 * chunks,
            model_gated,
            model_live,
            model_graph,
        });
        let t = live_model.timeline;
        drawn = Some((chunks, Timeline { title: "measured".into(), ..t.clone() }, t));
    }
    let (timeline_chunks, timeline, predicted) = drawn.expect("at least one chunk count");
    IssueCost { elements: n, machine, points, timeline_chunks, timeline, predicted }
}
