//! Lab 8: several GPUs — peer copies, cross-GPU events, communication
//! overlapping compute.
//!
//! Every part is a plan of the pipeline vocabulary, run verified by the
//! GPU's executor over the lab's GPUs (`gpu::PlanRig::over`) and by the
//! queue model, which knows each GPU's engines and the link between them:
//!
//! * [`peer`]: a copy from one GPU to another, one way and both ways at
//!   once, and staged through pinned host memory (what it costs without
//!   peer access), by size, beside the host link and PyTorch's own copy
//!   between the same GPUs ([`mod@reference`]);
//! * [`four_way`]: an upload, a download, a copy to the other GPU of the
//!   first pair and a kernel on one GPU at once, against the longest of
//!   them alone;
//! * [`pipeline_parallel`]: a stage on each GPU over micro-batches,
//!   ordered by events across the GPUs only, its bubble against
//!   (S−1)/(M+S−1); the exercise ([`exercise`]) has the learner schedule it;
//! * [`all_reduce`]: data-parallel gradients summed by NCCL, after the
//!   backward pass or bucket by bucket beside it, by bucket size.
//!
//! The lab runs on every GPU from `--device` on (`--gpus N` of them); the
//! copies and the four-way overlap use the first two. With one GPU the lab
//! runs what one GPU can (copies within it, the four operations with a
//! copy within it, two stages on it), says so, and skips
//! the all-reduce; the notebook shows a two-GPU recording where there is one.
//!
//! Its name ([`LAB`]) and settings are [`config`]'s, what a run gives
//! [`results`]'; the table the command line prints is [`table`]'s, the
//! headline rows [`headline`]'s; [`measure::run`] runs it all;
//! [`charts`] draws it. Here, above them all: its entry in the lab table
//! and the notebook's calls.
//!
//! May use: what every lab may (see `labs`), and `diagnose::ranks` (its
//! all-reduces timed alone by size, handed over as `CollectiveRates` for
//! `diagnose` on several ranks: `results::recorded_all_reduce_rates`).

pub mod all_reduce;
pub mod charts;
pub mod config;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
pub mod four_way;
#[cfg(test)]
mod gpu_tests;
pub mod headline;
pub mod measure;
pub mod peer;
pub mod pipeline_parallel;
#[cfg(test)]
mod recorded_tests;
pub mod reference;
pub mod results;
pub mod table;
pub mod training;

pub use config::{MultiGpuConfig, LAB};
pub use results::{
    AllReducePoint, AllReduceResults, BubblePoint, CtaSweep, FourWay, MultiGpuRecord, MultiGpuResults, PeerPoint, PipelineResults, RingPoint, TrainingSweep,
};

use crate::error::{LabError, Result};

/// Notebook entry points for lab 8.
impl crate::lab_kit::LabRun<MultiGpuResults> {
    /// Every measurement, as the command line prints it.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// The GPUs of the recording's machine and the path between each pair.
    pub fn topology(&self) -> String {
        self.record.results.topology.describe()
    }
    /// GB/s against size: one way, both ways, staged, the host link, PyTorch.
    pub fn peer_chart(&self) -> crate::present::chart::Figure {
        self.record.results.peer_chart(&self.origin())
    }
    /// One round of the four operations at once.
    pub fn four_way_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.four_way_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the four-way round"))
    }
    /// The bubble against micro-batches, measured and modelled.
    pub fn bubble_chart(&self) -> crate::present::chart::Figure {
        self.record.results.bubble_chart(&self.origin())
    }
    /// One run of the pipeline, a lane per GPU's stream.
    pub fn pipeline_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.pipeline_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the pipeline's run"))
    }
    /// One training run under 1F1B, a lane per GPU's stream.
    pub fn training_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        self.record.results.training_gantt(&self.origin()).ok_or_else(|| self.no_timeline("training under 1F1B"))
    }
    /// Hidden share against bucket size under each CTA setting, and bus
    /// bandwidth against size beside PyTorch's.
    pub fn all_reduce_chart(&self) -> Result<crate::present::chart::Figure> {
        self.record.results.all_reduce_chart(&self.origin()).ok_or_else(|| self.skipped_all_reduce())
    }
    /// One overlapped training step, a lane per GPU's compute and comm streams.
    pub fn all_reduce_timeline(&self) -> Result<crate::present::gantt::Gantt> {
        match &self.record.results.all_reduce {
            Ok(_) => self.record.results.all_reduce_gantt(&self.origin()).ok_or_else(|| self.no_timeline("the training step")),
            Err(_) => Err(self.skipped_all_reduce()),
        }
    }
    fn no_timeline(&self, what: &str) -> LabError {
        LabError::NothingToDraw(format!("{}: no timeline of {what} (a tool that holds CUPTI, such as Nsight or compute-sanitizer, ran it)", self.origin()))
    }
    fn skipped_all_reduce(&self) -> LabError {
        let why = self.record.results.all_reduce.as_ref().err().cloned().unwrap_or_default();
        LabError::NothingToDraw(format!("{}: the all-reduce was skipped ({why})", self.origin()))
    }
    /// Checks the learner's micro-batch loop: on the model (races, host
    /// waits, wrong GPU, the bubble predicted from the recording's stage
    /// times), and where notebooks run live, on this machine's GPUs with
    /// the bubble read off the run's timeline.
    pub fn check_micro_batches(
        &self,
        learner: impl Fn(&mut dyn crate::pipeline::issue::Issue, &pipeline_parallel::MicroBatchTask) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let learner: pipeline_parallel::Loop = std::sync::Arc::new(learner);
        let r = &self.record.results;
        let cfg = r.config.clone();
        self.check(
            exercise::EXERCISE,
            &exercise::EXERCISES[0],
            cfg.device,
            |gpu| exercise::check_live(gpu, &cfg, learner.clone()),
            || exercise::check_recorded(&self.record, learner.clone()),
        )
    }
}

/// The newest recording in `data/` made on two GPUs or more: what a
/// machine with one GPU shows of a pair (`None` while there is none).
pub fn recorded_pair() -> Result<Option<crate::lab_kit::LabRun<MultiGpuResults>>> {
    crate::lab_kit::LabRun::recorded_where(LAB, "it is the newest recording made on two GPUs or more, shown on any machine", MultiGpuResults::several_gpus)
}

/// The report's files for a recording: the charts, the timelines (with
/// Chrome traces) and the table.
pub fn report(rec: &MultiGpuRecord, dir: &std::path::Path, origin: &str) -> Result<Vec<std::path::PathBuf>> {
    charts::report(&rec.results, dir, origin)
}

/// Lab 8's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<MultiGpuConfig, MultiGpuResults> = crate::lab_kit::Entry {
    number: 8,
    name: LAB,
    module: module_path!(),
    teaches: "Several GPUs: peer copies, cross-GPU events in a pipeline, an all-reduce overlapping compute",
    builds_on: &[(2, "a pipeline over streams"), (5, "which waits stop whom")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("micro-batch, bubble", "a slice of a batch that moves through the pipeline's stages; the time a stage sits idle"),
        crate::lab_kit::Word::new("all-reduce, bucket", "every GPU's buffers summed in place (NCCL); the gradients handed to it at a time"),
    ],
    about: "Lab 8: copies between GPUs, four-way overlap, a pipeline with a stage per GPU, NCCL's all-reduce beside compute",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: report,
    headline: MultiGpuResults::headline,
    headline_figures: MultiGpuResults::headline_figures,
    timelines: |rec, o| {
        [rec.results.four_way_gantt(o), rec.results.pipeline_gantt(o), rec.results.training_gantt(o), rec.results.all_reduce_gantt(o)]
            .into_iter()
            .flatten()
            .collect()
    },
    fixture: fixture::results,
};

#[cfg(test)]
mod tests {
    use super::fixture::results_two_or_one as multi_gpu_results;
    use super::*;
    use crate::pipeline::issue::Issue;
    use crate::pipeline::op::{Link, OpKind};
    use crate::testing::fails_with;
    use pipeline_parallel::{events_only, host_synchronized, MicroBatchTask};

    #[test]
    fn training_is_tabled_by_schedule_beside_the_model_with_the_activations_kept() {
        let r = crate::labs::multi_gpu::fixture::results_on(4);
        let t = r.table();
        assert!(t.contains("training, the forward and backward of every micro-batch (4 stages)"), "{t}");
        // 32 MiB over 8 micro-batches: 4 MiB each; 1F1B keeps 4, 3, 2, 1 of them.
        assert!(t.contains("fill-drain 32 MiB, 32 MiB, 32 MiB, 32 MiB; 1F1B 16 MiB, 12 MiB, 8 MiB, 4 MiB"), "{t}");
        // At 8 micro-batches the model is 3/11; measured 1 and 2 points above.
        assert!(t.contains("+1.0") && t.contains("+2.0") && t.contains("27.3%"), "{t}");
        let g = r.training_gantt("test").unwrap();
        assert!(g.title.contains("1F1B, 4 stages over 8 micro-batches"), "{}", g.title);
        let lanes = g.timelines[0].lanes();
        assert!((0..4).all(|s| lanes.iter().any(|l| l.starts_with(&format!("GPU {s} ·")))), "{lanes:?}");
    }

    #[test]
    fn the_all_reduce_by_size_stands_beside_pytorch_and_the_cta_setting_is_chosen_by_measurement() {
        let r = multi_gpu_results(true);
        let t = r.table();
        // 64 MiB in 0.5 ms over 2 GPUs: 134.2 GB/s of bus; PyTorch's 0.49 ms: 137.0.
        assert!(t.contains("134.2") && t.contains("137.0") && t.contains("98.0%"), "{t}");
        assert!(t.contains("PyTorch 2.11.0 with NCCL 2.28.3"), "{t}");
        assert!(t.contains("at most 8 CTAs") && t.contains("NCCL's choice"), "{t}");
        assert!(t.contains("chosen by measurement (the setting that hid the most): at most 8 CTAs, buckets of 4 MiB"), "{t}");
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "all-reduce hidden, CTAs chosen by measurement" && v.contains("at most 8 CTAs")), "{h:?}");
    }

    #[test]
    fn over_four_gpus_the_table_says_each_stage_and_the_links() {
        let r = crate::labs::multi_gpu::fixture::results_on(4);
        let t = r.table();
        assert!(t.contains("the lab's GPUs: GPUs 0, 1, 2, 3 (every pair NVLink x18, peer access); copies and the four-way overlap GPU 0 -> GPU 1"), "{t}");
        assert!(t.contains("pipeline of 4 stages") && t.contains("stage 0 on GPU 0, stage 1 on GPU 1, stage 2 on GPU 2, stage 3 on GPU 3"), "{t}");
        assert!(t.contains("over 4 GPUs"), "{t}");
        assert!(t.contains("ring of 4 at 64 MiB: every GPU sends to the next at once, 290.0 GB/s a link (290.0..290.0); each alone 0->1 300.0, 1->2 300.0, 2->3 300.0, 3->0 300.0 GB/s"), "{t}");
        assert!(!multi_gpu_results(true).table().contains("ring of"), "two GPUs: both ways is the ring");
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "GPUs the lab ran on" && v == "4: every pair NVLink x18, peer access"), "{h:?}");
    }

    #[test]
    fn the_table_and_headline_give_each_part_beside_its_reference() {
        let r = multi_gpu_results(true);
        let t = r.table();
        assert!(t.contains("the lab's GPUs: GPU 0 -> GPU 1 (NVLink x18, peer access)"), "{t}");
        assert!(t.contains("300.0 (300.0..300.0)") && t.contains("560.0") && t.contains("25.0") && t.contains("50.0"), "{t}");
        // 300 of 310 one way, 560 of 580 both ways.
        assert!(t.contains("one way 310.0 GB/s (ours 96.8%), both ways 580.0 GB/s (ours 96.6%)"), "{t}");
        // Four-way: 1.7 ms against a bound of 1.6 (H2D and D2H together),
        // serial 3.8, alone bound 1.2: it saved 2.1 of 2.6.
        assert!(t.contains("reached 94.1% (94.1..94.1) of the bound with the link measured"), "{t}");
        assert!(t.contains("and saved 80.8% of what overlap could save"), "{t}");
        assert!(t.contains("diff") && t.contains("+2.0"), "{t}");
        assert!(t.contains("NCCL 2.28.3 over 2 GPUs"), "{t}");
        assert!(t.contains("buckets of 4 MiB hid 93.8% of the communication (96.9% at most), NCCL's bus bandwidth 83.9 GB/s"), "{t}");
        assert!(t.contains("device memory of the buffers on each GPU: GPU 0 128 MiB, GPU 1 192 MiB (a rank's batch and gradients, 64 MiB each"), "{t}");
        let h = r.headline();
        let row = |what: &str| h.iter().find(|(k, _)| k.starts_with(what)).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{what}: {h:?}"));
        assert_eq!(row("GPUs the lab ran on"), "2: NVLink x18, peer access");
        assert_eq!(row("peer copy one way"), "300 GB/s (96.8% of PyTorch)");
        assert_eq!(row("pipeline bubble, 8 micro-batches"), "13.1% (model 11.1%)");
        assert!(row("all-reduce hidden").starts_with("93.8% at 4 MiB buckets, bus 84 GB/s"), "{h:?}");
        assert!(row("four-way").contains("1.70 ms vs bound 1.60 ms (serial 3.80 ms)"), "{h:?}");
    }

    #[test]
    fn with_one_gpu_the_lab_says_what_it_could_not_run() {
        let r = multi_gpu_results(false);
        let t = r.table();
        assert!(t.contains("ONE GPU") && t.contains("within GPU 0") && t.contains("one GPU: no peer"), "{t}");
        assert!(t.contains("no PyTorch reference: --no-reference"), "{t}");
        assert!(t.contains("gradient all-reduce: skipped: one GPU here"), "{t}");
        assert!(t.contains("does not apply") && !t.contains("model (S-1)"), "no model column where the model does not apply: {t}");
        let chart = r.bubble_chart("test");
        let labels = |c: &crate::present::chart::Figure| c.panels[0].series.iter().map(|s| s.label.clone()).collect::<Vec<_>>();
        assert!(!labels(&chart).iter().any(|l| l.starts_with("model")), "no model line on one GPU: {:?}", labels(&chart));
        let two = multi_gpu_results(true);
        assert!(two.table().contains("model (S-1)/(M+S-1)"));
        assert_eq!(
            labels(&two.bubble_chart("test")),
            [
                "forward only, measured (CUPTI timeline)",
                "training, fill-drain (forward and backward)",
                "training, 1F1B (forward and backward)",
                "model (S-1)/(M+S-1)"
            ]
        );
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k == "GPUs the lab ran on" && v.starts_with("1:")), "{h:?}");
        assert!(h.iter().any(|(k, _)| k.starts_with("copy within GPU 0 one way")), "{h:?}");
        assert!(!h.iter().any(|(k, _)| k.starts_with("pipeline bubble")), "no bubble row for one GPU: {h:?}");
        assert!(h.iter().any(|(k, v)| k.starts_with("all-reduce") && v.starts_with("skipped: one GPU")), "{h:?}");
        assert!(r.all_reduce_chart("test").is_none() && r.all_reduce_gantt("test").is_none());
    }

    #[test]
    fn the_report_draws_every_chart_and_timeline_with_chrome_traces() {
        for two in [true, false] {
            let r = multi_gpu_results(two);
            let dir = crate::testing::temp_dir("multi-gpu-report");
            let files = charts::report(&r, &dir, "test").unwrap();
            let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
            for want in ["multi-gpu-peer.svg", "multi-gpu-bubble.png", "multi-gpu-four-way.svg", "multi-gpu-pipeline.trace.json", "multi-gpu-summary.txt"] {
                assert!(names.contains(&want.to_string()), "{want}: {names:?}");
            }
            assert_eq!(names.contains(&"multi-gpu-all-reduce.svg".to_string()), two, "{names:?}");
            assert_eq!(names.contains(&"multi-gpu-all-reduce-step.trace.json".to_string()), two, "{names:?}");
            assert!(names.iter().all(|n| n.starts_with("multi-gpu-")), "{names:?}");
        }
        let r = multi_gpu_results(true);
        let svg = crate::present::chart::render_svg(&r.peer_chart("test")).unwrap();
        assert!(svg.contains("PyTorch 2.11.0: one way") && svg.contains("staged through pinned host memory"), "the legend names each line");
        let g = r.all_reduce_gantt("test").unwrap();
        let lanes = g.timelines[0].lanes();
        assert!(lanes.iter().any(|l| l.starts_with("GPU 0 ·") && l.ends_with("comm")) && lanes.iter().any(|l| l.starts_with("GPU 1 ·")), "{lanes:?}");
        let svg = crate::present::chart::Chart::to_svg(&g).unwrap();
        assert!(svg.contains("all-reduce") && svg.contains("kernel"), "the legend names the all-reduce");
    }

    #[test]
    fn the_notebook_check_on_recorded_costs_passes_events_and_names_host_waits() {
        let mut rec = crate::measure::record::Record::new(LAB, crate::testing::fingerprint(), multi_gpu_results(true));
        let r = &rec.results;
        let costs = exercise::recorded_costs(r, exercise::MICRO_BATCHES);
        // 10 ms a stage over all the data: 1.25 ms a micro-batch of 8; a
        // 4 MiB activation at 300 GB/s: 0.014 ms; the 32 MiB upload at 50 GB/s.
        let n = (r.config.pipeline_mib << 18) / 8;
        assert!((costs[&(OpKind::Kernel, n)] - 1.25).abs() < 1e-9, "{costs:?}");
        assert!((costs[&(OpKind::D2d(Link { from: 0, to: 1 }), n)] - 4.0 * 1048576.0 / 300e6).abs() < 1e-9, "{costs:?}");
        assert!((costs[&(OpKind::H2d, 8 * n)] - 32.0 * 1048576.0 / 50e6).abs() < 1e-9, "{costs:?}");
        let good = exercise::check_recorded(&rec, std::sync::Arc::new(events_only));
        assert!(good.passed, "{good}");
        let bad = exercise::check_recorded(&rec, std::sync::Arc::new(host_synchronized));
        fails_with(&bad, "host synchronization in the loop");
        fails_with(&bad, "bubble");
        let panics = exercise::check_recorded(
            &rec,
            std::sync::Arc::new(|_: &mut dyn Issue, t: &MicroBatchTask| {
                let v: Vec<usize> = vec![];
                let _ = v[t.micro_batches];
                Ok(())
            }),
        );
        fails_with(&panics, "your loop panicked");
        rec.results = multi_gpu_results(false);
        let one = exercise::check_recorded(&rec, std::sync::Arc::new(events_only));
        assert!(one.passed && one.to_string().contains("the recording is of one GPU"), "{one}");
    }
}
