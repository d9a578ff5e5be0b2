//! Lab 4: a callback stream and a CPU worker.
//!
//! Each iteration a `row_dot` kernel scores a query against every key on
//! the compute stream, the scores go D2H into a pinned slot, and the CPU
//! finds their argmin (its cost is the knob). Where that CPU work runs
//! decides whether GPU iteration t+1 overlaps CPU work of iteration t:
//! 1. a host function on the compute stream does the argmin: the stream
//!    waits for it, so GPU and CPU take turns;
//! 2. a host function on a separate callback stream, after an event
//!    recorded behind the D2H, does the argmin: the compute stream runs on,
//!    but every host function shares the driver's one callback thread;
//! 3. the fix (the exercise's answer): that host function only hands the job to a worker
//!    thread, which does the argmin;
//! 4. no host function: a thread waits on the event itself, then works.
//!
//! Scores land in a few pinned slots recycled through a [`slots::SlotBook`]
//! (generation-stamped leases), and each slot's scores carry the iteration
//! that wrote them, so a read too early or a slot reused too early is
//! reported, not averaged into a throughput.

pub mod charts;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod kernel;
pub mod measure;
pub mod model;
pub mod op;
pub mod order;
#[cfg(test)]
mod recorded_tests;
pub mod rig;
pub mod score_loop;
pub mod slots;
pub mod work;

use crate::error::{LabError, Result};
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

pub use score_loop::ScoreLoop;

pub const LAB: &str = "callback";

/// Where the argmin runs (the four variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// 1: a host function on the compute stream does the argmin.
    HostFnOnCompute,
    /// 2: a host function on a callback stream (after an event) does the argmin.
    HostFnOnCallbackStream,
    /// 3: the callback stream's host function hands the job to a worker thread.
    HandOffToWorker,
    /// 4: no host function; a thread waits on the event, then does the argmin.
    EventWaitingThread,
}

impl Variant {
    pub const ALL: [Variant; 4] = [Variant::HostFnOnCompute, Variant::HostFnOnCallbackStream, Variant::HandOffToWorker, Variant::EventWaitingThread];
    pub fn number(self) -> usize {
        Variant::ALL.iter().position(|&v| v == self).map_or(0, |i| i + 1)
    }
    pub fn label(self) -> &'static str {
        match self {
            Variant::HostFnOnCompute => "1: host fn on compute stream",
            Variant::HostFnOnCallbackStream => "2: host fn on callback stream",
            Variant::HandOffToWorker => "3: callback hands off to worker",
            Variant::EventWaitingThread => "4: thread waits on events",
        }
    }
    /// The variant's issue code for one iteration.
    pub fn iteration(self) -> IterationFn {
        match self {
            Variant::HostFnOnCompute => host_fn_on_compute,
            Variant::HostFnOnCallbackStream => host_fn_on_callback_stream,
            Variant::HandOffToWorker => hand_off_to_worker,
            Variant::EventWaitingThread => event_waiting_thread,
        }
    }
}

/// A stream of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    Compute,
    Callback,
}

impl On {
    pub fn name(self) -> &'static str {
        match self {
            On::Compute => "compute",
            On::Callback => "callback",
        }
    }
    /// The stream's lane in timelines.
    pub fn lane(self) -> &'static str {
        match self {
            On::Compute => "stream 0: compute",
            On::Callback => "stream 1: callback",
        }
    }
}

/// A pinned score slot (and its device twin) leased to one iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(pub usize);

impl Slot {
    /// The schedule's name for the slot's scores: their pinned copy or
    /// their device copy (what the race check and its messages speak of).
    pub fn scores(self, pinned: bool) -> String {
        format!("{} scores {}", if pinned { "pinned" } else { "device" }, self.0)
    }
}

/// One iteration of a variant (or of the learner's exercise).
pub type IterationFn = fn(&mut ScoreLoop, usize) -> Result<()>;
/// Any iteration code, a closure included (what runs and checkers take).
pub type Iteration<'a> = &'a dyn Fn(&mut ScoreLoop, usize) -> Result<()>;

/// GPU work of iteration `t` into a fresh slot.
fn scores_into_slot(l: &mut ScoreLoop, t: usize) -> Result<Slot> {
    let s = l.take_slot(t)?;
    l.row_dot(On::Compute, t, s)?;
    l.d2h_scores(On::Compute, s)?;
    Ok(s)
}

/// Variant 1: the compute stream runs the argmin, so it waits for the CPU.
pub fn host_fn_on_compute(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = scores_into_slot(l, t)?;
    l.host_fn_argmin(On::Compute, s)
}

/// Variant 2: the callback stream waits for the scores and runs the argmin.
pub fn host_fn_on_callback_stream(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = scores_into_slot(l, t)?;
    l.record_scores_ready(On::Compute, s)?;
    l.wait_scores_ready(On::Callback, s)?;
    l.host_fn_argmin(On::Callback, s)
}

/// Variant 3 (the exercise's answer): the callback only hands the job over.
pub fn hand_off_to_worker(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = scores_into_slot(l, t)?;
    l.record_scores_ready(On::Compute, s)?;
    l.wait_scores_ready(On::Callback, s)?;
    l.host_fn_hand_off(On::Callback, s)
}

/// Variant 4: no host function; a thread waits on the event itself.
pub fn event_waiting_thread(l: &mut ScoreLoop, t: usize) -> Result<()> {
    let s = scores_into_slot(l, t)?;
    l.record_scores_ready(On::Compute, s)?;
    l.hand_to_waiting_thread(s)
}

// ---- the model -------------------------------------------------------------

/// Serial sum: n·(G + C), GPU and CPU taking turns.
pub fn serial_ms(iterations: usize, gpu_ms: f64, cpu_ms: f64) -> f64 {
    iterations as f64 * (gpu_ms + cpu_ms)
}

/// The overlapped bound: n·max(G, C) + min(G, C).
pub use crate::lab_kit::two_stage_bound_ms as bound_ms;

// ---- configuration and results ---------------------------------------------

/// Lab 4's settings; `overlap-lab callback` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct CallbackConfig {
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
    /// Key rows (scores per iteration).
    #[arg(long, default_value_t = CallbackConfig::default().rows)]
    pub rows: usize,
    /// f32 per key row (a multiple of 4).
    #[arg(long, default_value_t = CallbackConfig::default().dim)]
    pub dim: usize,
    /// Iterations per run (one query each).
    #[arg(long, default_value_t = CallbackConfig::default().iterations)]
    pub iterations: usize,
    /// Pinned score slots in the pool.
    #[arg(long, default_value_t = CallbackConfig::default().slots)]
    pub slots: usize,
    /// CPU cost per iteration over GPU time per iteration, comma-separated, one point each.
    #[arg(long, value_delimiter = ',', default_values_t = CallbackConfig::default().cpu_over_gpu)]
    pub cpu_over_gpu: Vec<f64>,
    /// Variants, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = CallbackConfig::default().variants)]
    pub variants: Vec<Variant>,
    /// Untimed runs first.
    #[arg(long, default_value_t = CallbackConfig::default().warmup)]
    pub warmup: usize,
    /// Timed runs of each variant at each point.
    #[arg(long, default_value_t = CallbackConfig::default().repeats)]
    pub repeats: usize,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        // 64 Ki keys of 4096 f32 = 1 GiB read per iteration and 256 KiB of
        // scores back: the first argmin pass over scores fresh from a DMA is
        // cheap enough that the CPU cost can go well below the GPU's, and
        // each further pass adds a little, up to several times the GPU's.
        CallbackConfig {
            device: 0,
            rows: 64 << 10,
            dim: 4096,
            iterations: 256,
            slots: 4,
            cpu_over_gpu: vec![0.25, 0.5, 1.0, 2.0, 4.0],
            variants: Variant::ALL.to_vec(),
            warmup: 1,
            repeats: 7,
        }
    }
}

impl CallbackConfig {
    /// The headline's point (CPU = GPU) and one either side, fewer repeats.
    pub fn headline() -> Self {
        CallbackConfig { cpu_over_gpu: vec![0.5, 1.0, 2.0], repeats: 5, ..Self::default() }
    }
    /// A smaller run for notebooks.
    pub fn quick() -> Self {
        CallbackConfig { iterations: 128, cpu_over_gpu: vec![0.5, 1.0, 2.0], repeats: 3, ..Self::default() }
    }
    /// The smallest run that still touches every code path (every variant,
    /// 8 Ki keys of 64 f32, 48 iterations): for compute-sanitizer and smoke
    /// tests, not for numbers.
    pub fn small() -> Self {
        CallbackConfig { rows: 8192, dim: 64, iterations: 48, cpu_over_gpu: vec![1.0], warmup: 0, repeats: 1, ..Self::default() }
    }

    pub fn validate(&self) -> Result<()> {
        if self.rows == 0 || self.rows > 1 << 26 {
            return Err(LabError::config(format!("--rows must be 1-2^26 (got {})", self.rows)));
        }
        if self.dim == 0 || self.dim % 4 != 0 || self.dim > 4096 {
            return Err(LabError::config(format!("--dim must be a multiple of 4, 4-4096 (got {})", self.dim)));
        }
        if (self.rows as u64) * (self.dim as u64) > 1 << 31 {
            return Err(LabError::config(format!("--rows {} x --dim {} must stay under 2^31 (8 GiB of keys)", self.rows, self.dim)));
        }
        if self.iterations == 0 || self.iterations > 100_000 {
            return Err(LabError::config(format!("--iterations must be 1-100000 (got {})", self.iterations)));
        }
        if self.slots < 2 || self.slots > 64 {
            return Err(LabError::config(format!("--slots must be 2-64 (got {}): one slot cannot overlap anything", self.slots)));
        }
        if self.cpu_over_gpu.is_empty() || self.cpu_over_gpu.iter().any(|r| !(*r > 0.0 && *r <= 1000.0)) {
            return Err(LabError::config(format!("--cpu-over-gpu ratios must be in (0, 1000] (got {:?})", self.cpu_over_gpu)));
        }
        if self.variants.is_empty() {
            return Err(LabError::config("--variants needs at least one variant"));
        }
        if self.repeats == 0 || self.repeats > 1000 || self.warmup > 100 {
            return Err(LabError::config(format!("--repeats must be 1-1000 and --warmup 0-100 (got {} and {})", self.repeats, self.warmup)));
        }
        Ok(())
    }
}

/// One variant at one CPU cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: Variant,
    /// Start to the last argmin's end (host clock), per run.
    pub total_ms: Summary,
    /// Median argmin duration in each run, on the thread that ran it.
    pub cpu_ms: Summary,
}

/// One CPU cost: its calibrated argmin passes and every variant's time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostPoint {
    /// The CPU/GPU ratio asked for.
    pub cpu_over_gpu: f64,
    pub passes: u32,
    /// One iteration's argmin alone (host clock, fresh scores): what the
    /// passes were calibrated with.
    pub cpu_alone_ms: Summary,
    pub variants: Vec<VariantResult>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallbackResults {
    pub config: CallbackConfig,
    /// One iteration's GPU work alone (row_dot + D2H), and its parts.
    pub gpu_ms: Summary,
    pub kernel_ms: Summary,
    pub d2h_ms: Summary,
    /// An empty host function's round trip on a stream (events around it).
    pub host_fn_round_trip_ms: Summary,
    pub points: Vec<CostPoint>,
    /// Every variant's timeline at the point closest to balanced.
    pub timelines: Vec<Timeline>,
    /// Variant 3, timeline on over off, minus one (%): the median over
    /// alternating pairs, at the point [`Self::timeline_overhead_cpu_over_gpu`].
    pub timeline_overhead_pct: f64,
    /// Every pair's overhead (%): its spread says how much of the median is noise.
    #[serde(default)]
    pub timeline_overhead_pairs_pct: Option<Summary>,
    /// The C/G where the overhead was measured (GPU-bound, where runs repeat).
    #[serde(default = "not_recorded")]
    pub timeline_overhead_cpu_over_gpu: f64,
    pub timeline_source: String,
    /// Runs whose every argmin matched the CPU reference.
    pub verified_runs: usize,
}

pub type CallbackRecord = crate::measure::record::Record<CallbackResults>;

fn not_recorded() -> f64 {
    f64::NAN
}

impl CostPoint {
    /// CPU per iteration for the model: the median over every variant's
    /// runs of the argmin's duration where it really ran. (Measured alone
    /// right after a sync, the same argmin takes longer: the model must use
    /// what the pipeline's threads see.)
    pub fn cpu_ms(&self) -> f64 {
        let v: Vec<f64> = self.variants.iter().map(|r| r.cpu_ms.median).collect();
        Summary::of(&v).map_or(self.cpu_alone_ms.median, |s| s.median)
    }
    pub fn result(&self, v: Variant) -> Option<&VariantResult> {
        self.variants.iter().find(|r| r.variant == v)
    }
}

impl CallbackResults {
    /// CPU per iteration of `v` at `p` (its own runs), else the point's.
    fn cpu_of(&self, p: &CostPoint, v: Variant) -> f64 {
        p.result(v).map_or(p.cpu_ms(), |r| r.cpu_ms.median)
    }
    /// n·max(G, C) + min(G, C), with the variant's own C, each at its
    /// fast end (the point's C where the variant did not run).
    pub fn bound_ms(&self, p: &CostPoint, v: Variant) -> f64 {
        let n = self.config.iterations;
        p.result(v).map_or_else(|| bound_ms(n, self.gpu_ms.fast_end(), p.cpu_ms()), |r| crate::lab_kit::two_stage_bound(n, &self.gpu_ms, &r.cpu_ms))
    }
    /// n·(G + C), with the variant's own C.
    pub fn serial_ms(&self, p: &CostPoint, v: Variant) -> f64 {
        serial_ms(self.config.iterations, self.gpu_ms.median, self.cpu_of(p, v))
    }
    /// The queue model's costs: the recorded GPU parts and host function
    /// round trip, with `cpu_ms` per argmin.
    pub fn model_costs(&self, cpu_ms: f64) -> model::ModelCosts {
        model::ModelCosts {
            kernel_ms: (self.gpu_ms.median - self.d2h_ms.median).max(0.0),
            d2h_ms: self.d2h_ms.median,
            cpu_ms,
            host_fn_ms: self.host_fn_round_trip_ms.median,
        }
    }
    /// What the queue model predicts for `v` at `p`: the variant's own
    /// iteration code recorded as a pipeline schedule and timed by
    /// [`crate::pipeline::predict::predict`] with the recorded costs (the
    /// GPU's parts, the variant's own C, the host function's round trip).
    pub fn model_ms(&self, p: &CostPoint, v: Variant) -> f64 {
        model::ModelRun::run(self.model_costs(self.cpu_of(p, v)), self.config.slots, self.config.iterations, &v.iteration()).map_or(f64::NAN, |m| m.total_ms())
    }
    /// Bound over measured (the bound from G and the variant's own C).
    pub fn efficiency(&self, p: &CostPoint, v: Variant) -> Option<Efficiency> {
        p.result(v).map(|r| crate::lab_kit::two_stage_efficiency(self.config.iterations, &self.gpu_ms, &r.cpu_ms, &r.total_ms))
    }
    /// Iterations per second.
    pub fn throughput(&self, p: &CostPoint, v: Variant) -> Option<f64> {
        p.result(v).map(|r| self.config.iterations as f64 / (r.total_ms.median / 1e3))
    }
    /// The point whose CPU cost is closest to the GPU's.
    pub fn balanced(&self) -> Option<&CostPoint> {
        self.point_near(1.0)
    }
    /// The point whose C/G (as the runs saw it) is closest to `cpu_over_gpu`.
    pub fn point_near(&self, cpu_over_gpu: f64) -> Option<&CostPoint> {
        let off = |p: &CostPoint| (p.cpu_ms() / self.gpu_ms.median / cpu_over_gpu).ln().abs();
        self.points.iter().min_by(|a, b| off(a).total_cmp(&off(b)))
    }

    /// The measured numbers behind [`Self::headline`]: every variant's time
    /// at the CPU cost closest to the GPU's.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let Some(b) = self.balanced() else {
            return Vec::new();
        };
        b.variants
            .iter()
            .map(|r| crate::lab_kit::headline::HeadlineFigure::new(format!("at CPU = GPU: variant {}", r.variant.label()), "ms", r.total_ms))
            .collect()
    }
    /// The lab's headline numbers, as (what, value) rows for the report's
    /// table of GPUs side by side.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = Vec::new();
        if let Some(b) = self.balanced() {
            let c_over_g = b.cpu_ms() / self.gpu_ms.median;
            let time = |v| b.result(v).map_or("-".to_string(), |r| format!("{:.1}", r.total_ms.median));
            rows.push((
                "at CPU = GPU: variant 1 / variant 3 (ms)".into(),
                format!("{} / {} (C/G {c_over_g:.2}, {} iterations)", time(Variant::HostFnOnCompute), time(Variant::HandOffToWorker), self.config.iterations),
            ));
            for v in [Variant::HostFnOnCompute, Variant::HandOffToWorker] {
                if let Some(e) = self.efficiency(b, v) {
                    rows.push((format!("at CPU = GPU: variant {} against the overlap bound", v.number()), format!("{:.1}%", 100.0 * e.ratio)));
                }
            }
        }
        rows.push(("timeline overhead, median of pairs".into(), format!("{:+.2}% ({})", self.timeline_overhead_pct, self.timeline_source)));
        rows
    }

    /// The model next to the measurement, one row per CPU cost and variant.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} iterations; GPU per iteration {:.3} ms (row_dot {:.3} + D2H {:.3}); {} slots; empty host function round trip {:.3} ms\n\
             C = median argmin time in the runs (alone: calibration, host clock after a sync); asked: the C/G the sweep asked for\n\
             bound: from G and the variant's own C, each at its fastest quarter; eff.: bound / measured (the middle half of the runs)\n\
             {:>5} {:>6} {:>7} {:>8} {:>8}  {:<34} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>21}\n",
            self.config.iterations,
            self.gpu_ms.median,
            self.kernel_ms.median,
            self.d2h_ms.median,
            self.config.slots,
            self.host_fn_round_trip_ms.median,
            "asked",
            "C/G",
            "passes",
            "C alone",
            "C ms",
            "variant",
            "its C",
            "measured",
            "serial",
            "bound",
            "model",
            "it/s",
            "eff."
        );
        let mut effs = Vec::new();
        for p in &self.points {
            for r in &p.variants {
                let e = self.efficiency(p, r.variant);
                effs.extend(e);
                s += &format!(
                    "{:>5.2} {:>6.2} {:>7} {:>8.3} {:>8.3}  {:<34} {:>8.3} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.0} {:>21}\n",
                    p.cpu_over_gpu,
                    p.cpu_ms() / self.gpu_ms.median,
                    p.passes,
                    p.cpu_alone_ms.median,
                    p.cpu_ms(),
                    r.variant.label(),
                    r.cpu_ms.median,
                    r.total_ms.median,
                    self.serial_ms(p, r.variant),
                    self.bound_ms(p, r.variant),
                    self.model_ms(p, r.variant),
                    self.throughput(p, r.variant).unwrap_or(0.0),
                    e.map_or("n/a".into(), |e| e.cell())
                );
            }
        }
        if let Some(why) = Efficiency::note(&effs) {
            s += &format!("{why}\n");
        }
        s + &format!(
            "{}, variant 3 at C/G {:.2}; timelines drawn at C/G {:.2}\n",
            crate::pipeline::timeline::overhead_line(self.timeline_overhead_pct, self.timeline_overhead_pairs_pct.as_ref(), &self.timeline_source),
            self.timeline_overhead_cpu_over_gpu,
            self.balanced().map_or(f64::NAN, |p| p.cpu_ms() / self.gpu_ms.median)
        )
    }
}

/// Notebook entry points for lab 4.
impl crate::lab_kit::LabRun<CallbackResults> {
    /// The model next to the measurement.
    pub fn summary(&self) -> String {
        self.record.results.table()
    }
    pub fn throughput_chart(&self) -> crate::present::chart::Figure {
        charts::throughput_and_efficiency(&self.record, &self.origin())
    }
    /// Variant 1 above variant 3, `iterations` from the middle of the run.
    pub fn timeline_chart(&self, iterations: usize) -> Result<crate::present::gantt::Gantt> {
        charts::timelines(&self.record, &self.origin(), iterations).ok_or_else(|| LabError::config("this recording has no timelines of variants 1 and 3"))
    }
    /// Checks a learner's iteration: live on a GPU, else on the queue model.
    pub fn check_iteration(&self, iteration: impl Fn(&mut ScoreLoop, usize) -> Result<()>) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        self.check(
            "callback-stream wiring",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, &r.config, &iteration),
            || exercise::check_on_model(r, &iteration),
        )
    }
}

/// Lab 4's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<CallbackConfig, CallbackResults> = crate::lab_kit::Entry {
    number: 4,
    name: LAB,
    module: module_path!(),
    teaches: "A callback stream and a CPU worker: where host-side work runs",
    builds_on: &[(3, "events between streams and the two-stage bound")],
    kernels: &[&kernel::ROW_DOT],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("host function", "a CPU function the driver runs when a stream reaches it (cuLaunchHostFunc); the stream waits for it"),
        crate::lab_kit::Word::new("G, C, C/G", "the GPU time and CPU (argmin) time per iteration, and their ratio"),
    ],
    about: "Lab 4: where a CPU argmin runs (host function, callback stream, worker thread, event wait) and what it costs the GPU",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: charts::report,
    headline: CallbackResults::headline,
    headline_figures: CallbackResults::headline_figures,
    // 12 iterations: as the report draws them.
    timelines: |rec, o| charts::timelines(rec, o, 12).into_iter().collect(),
    fixture: fixture::results,
};

crate::lab_config!(CallbackConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_the_slower_side_n_times_plus_the_faster_once() {
        assert_eq!(bound_ms(10, 1.0, 3.0), 31.0);
        assert_eq!(bound_ms(10, 3.0, 1.0), 31.0);
        assert_eq!(serial_ms(10, 1.0, 3.0), 40.0);
        // Balanced, many iterations: overlap halves the serial time.
        assert!((serial_ms(1000, 1.0, 1.0) / bound_ms(1000, 1.0, 1.0) - 2.0).abs() < 0.01);
    }

    #[test]
    fn bad_configurations_are_refused_with_a_reason() {
        CallbackConfig::default().validate().unwrap();
        CallbackConfig::quick().validate().unwrap();
        let bad = |f: fn(&mut CallbackConfig), want: &str| {
            let mut c = CallbackConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(|c| c.rows = 0, "rows");
        bad(|c| c.dim = 6, "multiple of 4");
        bad(|c| c.slots = 1, "one slot");
        bad(|c| c.iterations = 0, "iterations");
        bad(|c| c.cpu_over_gpu = vec![0.0], "ratios");
        bad(|c| c.cpu_over_gpu = vec![f64::NAN], "ratios");
        bad(|c| c.variants.clear(), "variant");
        bad(|c| (c.rows, c.dim) = (1 << 26, 4096), "8 GiB");
    }
}
