//! Exercise 9: write the prefetch schedule of the ring. The learner's pass
//! gets a copy stream (at high priority), a compute stream and K slots,
//! and must run every layer from a slot holding its weights while the
//! next layers' weights stream in. The checker records the pass on the
//! dry run (no GPU) and times it on the queue model with this recording's
//! costs, or runs it on the GPU, and names what is wrong: a layer reading
//! a slot still being filled, an upload overwriting a slot a layer still
//! reads, a layer reading the wrong weights, layers missing or out of
//! order, too few slots to overlap, pageable weights, a CPU wait that
//! holds the GPU back (which wait, where, and what it costs). A right
//! schedule passes within 10% of the bound, whatever CPU waits it makes on
//! the way: the time is judged, not the count of waits.
//!
//! Its second part, the layers' placement under a budget, is checked in
//! [`super::exercise_placement`] (its names are handed on here:
//! [`check_placement`], [`best_placement`]).
//!
//! May use: `network`, `forward`, `variant`, `config`, `results`,
//! `exercise_placement`, `rig` and `measure` (the live check's passes and
//! costs), `lab_kit`, `pipeline`, `gpu` and `units`.

use super::config::OffloadConfig;
use super::forward::{ring_with, Books, Costs, Forward, Pass, PassFn, RingOrders, Task, Weights};
use super::measure::{pass_with, Reference, Sweep};
use super::network::{LayerKind, Precision, Shape};
use super::results::OffloadResults;
use super::rig::{Copies, OffloadRig};
use super::variant::Variant;
use crate::error::Result;
use crate::lab_kit::check::{pct, CheckReport};
use crate::lab_kit::progress::Exercise;
use crate::lab_kit::Recorded;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{EventRef, StreamRef};
use crate::pipeline::op::OpKind;
use crate::pipeline::schedule::Schedule;
use crate::units::fmt_ms;

pub use super::exercise_placement::{best_placement, check_fp16_and_4_bit, check_placement, check_placements, hint_placement, PLACEMENT_HINTS, PLACEMENT_WITHIN};

/// The exercises, as the course lists them (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[
    Exercise::in_cell("09-offload", "the ring's prefetch schedule", HINTS, prefetch_example, "may overwrite ring slot"),
    Exercise::in_cell("09-offload/placement", "resident layers and the ring's size under a budget", PLACEMENT_HINTS, placement_example, "budget left idle"),
];

/// The recording of lab 9 in `dev`, if there is one.
fn recorded(dev: &std::path::Path) -> Result<Option<OffloadResults>> {
    Ok(<crate::measure::record::Record<OffloadResults> as Recorded>::load(dev, super::LAB)?.map(|r| r.results))
}

/// The first exercise answered on the recording in `dev`: the ring's own
/// schedule, or the given one, which refills a slot still being read.
fn prefetch_example(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(r) = recorded(dev)? else { return Ok(None) };
    let pass = if right { super::forward::ring } else { given };
    Ok(Some(check_on_model(&r, &pass)))
}

/// The second exercise answered on the recording in `dev`, at its budget
/// and first batch, FP16 and 4 bits: the planner's best placements, or a
/// ring of 3 and no resident layer for both, which leaves the budget idle.
fn placement_example(dev: &std::path::Path, right: bool) -> Result<Option<CheckReport>> {
    let Some(r) = recorded(dev)? else { return Ok(None) };
    let Some(p) = r.points.first() else { return Ok(None) };
    let (budget, batch) = (r.config.gpu_budget, p.batch);
    let idle = super::network::Placement { resident: 0, ring: 3 };
    let best = |precision| best_placement(&r, budget, batch, precision).map(|b| b.placement);
    let (fp16, four_bit) = match right {
        false => (idle, idle),
        true if r.has_layers_at(batch, LayerKind::Int4) => (best(Precision::Fp16)?, best(Precision::Int4)?),
        true => (best(Precision::Fp16)?, idle),
    };
    Ok(Some(check_fp16_and_4_bit(&r, budget, batch, fp16, four_bit)))
}

/// The share of the bound a right schedule reaches.
pub const TARGET_EFFICIENCY: f64 = 0.90;

/// The share of a pass a kind of CPU wait must cost, in a pass that misses
/// the target, to be named as what holds it back (below it, a note).
pub const COSTLY_WAITS: f64 = 0.01;

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "Before the first layer, fill every slot of the ring: layer j goes into slot j. From then on, slot i % K serves layer i.",
    "Two events per slot do all the ordering: one recorded on the copy stream after a slot's upload (the layer waits for it), one recorded on the compute stream after the layer that read the slot (the next upload into it waits for that).",
    "After layer i, its slot is free for layer i + K: the copy stream waits on the slot's 'freed' event, uploads layer i + K into it and records 'copied'. A wait on the CPU stops it issuing anything behind the wait: keep the waits on the streams.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

/// The notebook's starting point: the ring with one ordering left out
/// (an upload does not wait for the layer that last read its slot).
pub fn given(f: &mut dyn Forward, t: &Task) -> Result<()> {
    ring_with(f, t, RingOrders { upload_waits_for_layer: false, ..RingOrders::ALL })
}

/// A CPU wait a learner adds to the ring (the answers the tests judge).
#[derive(Clone, Copy, Debug)]
pub enum CpuWaitAt {
    /// `host_sync` on the task's copy stream.
    SyncCopy,
    /// `host_sync` on the task's compute stream.
    SyncCompute,
    /// `host_wait` on the slot's 'copied' event.
    WaitCopied,
}

/// The lab's ring with CPU waits added: `after_upload` right after each
/// upload of the loop (and its record), `after_layer` right after each
/// layer, `before_layer` right before each layer (after its stream wait).
pub fn ring_waiting(
    f: &mut dyn Forward,
    t: &Task,
    after_upload: Option<CpuWaitAt>,
    after_layer: Option<CpuWaitAt>,
    before_layer: Option<CpuWaitAt>,
) -> Result<()> {
    let k = t.slots;
    let copied = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    let freed = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    let cpu_wait = |f: &mut dyn Forward, at: Option<CpuWaitAt>, s: usize| match at {
        Some(CpuWaitAt::SyncCopy) => f.host_sync(t.copy),
        Some(CpuWaitAt::SyncCompute) => f.host_sync(t.compute),
        Some(CpuWaitAt::WaitCopied) => f.host_wait(copied[s]),
        None => Ok(()),
    };
    for (j, &e) in copied.iter().enumerate().take(t.layers) {
        f.upload(t.copy, Weights::Pinned, j, j)?;
        f.record(e, t.copy)?;
    }
    for i in 0..t.layers {
        let s = i % k;
        f.wait(t.compute, copied[s])?;
        cpu_wait(f, before_layer, s)?;
        f.layer(t.compute, i, s)?;
        cpu_wait(f, after_layer, s)?;
        f.record(freed[s], t.compute)?;
        if i + k < t.layers {
            f.wait(t.copy, freed[s])?;
            f.upload(t.copy, Weights::Pinned, i + k, s)?;
            f.record(copied[s], t.copy)?;
            cpu_wait(f, after_upload, s)?;
        }
    }
    Ok(())
}

/// A right schedule with a CPU wait per layer: the ring, the CPU
/// synchronizing the compute stream after each layer (each costs a
/// wake-up and the issue of the next layer).
pub fn syncs_after_each_layer(f: &mut dyn Forward, t: &Task) -> Result<()> {
    ring_waiting(f, t, None, Some(CpuWaitAt::SyncCompute), None)
}

/// A wrong one: the ring, the CPU synchronizing the copy stream right
/// after each upload, so each layer is issued only once the upload after
/// it is done and copies and layers take turns.
pub fn syncs_after_each_upload(f: &mut dyn Forward, t: &Task) -> Result<()> {
    ring_waiting(f, t, Some(CpuWaitAt::SyncCopy), None, None)
}

/// What a pass's books and its recorded ops (their happens-before order,
/// in which races are found) show wrong: the same with or without a GPU.
fn findings(rep: &mut CheckReport, books: &Books, ops: &Schedule, (layers, slots): (usize, usize)) {
    if books.pageable_uploads > 0 {
        rep.problem(format!(
            "pageable weights: {} of the {} uploads read Weights::Pageable, so each one blocks the CPU until the driver has staged it",
            books.pageable_uploads, books.uploads
        ));
    }
    // Layers: each once, in order.
    let mut seen = vec![0usize; layers];
    for &l in &books.ran {
        seen[l] += 1;
    }
    if let Some(l) = seen.iter().position(|&n| n > 1) {
        rep.problem(format!("layer {l} runs {} times in one pass", seen[l]));
    }
    let missing: Vec<usize> = (0..layers).filter(|&l| seen[l] == 0).collect();
    if let Some(&first) = missing.first() {
        rep.problem(format!("{} of the {} layers never run (the first: layer {first})", missing.len(), layers));
    } else if let Some(w) = books.ran.windows(2).find(|w| w[1] < w[0]) {
        rep.problem(format!("layer {} runs after layer {}: each layer reads the activations the one before it wrote", w[1], w[0]));
    }
    if let Some(&(layer, slot, held)) = books.wrong_weights.first() {
        let what = match held {
            Some(h) => format!("layer {h}'s weights"),
            None => "nothing any upload put there".into(),
        };
        rep.problem(format!(
            "wrong weights: layer {layer} reads slot {slot}, which holds {what} ({} layers in all read the wrong slot)",
            books.wrong_weights.len()
        ));
    }
    // Races, by what they are between.
    let (mut filling, mut overwritten, mut other) = (None, None, None);
    for r in ops.races() {
        let (a, b) = (&ops.ops[r.earlier], &ops.ops[r.later]);
        match (a.kind, b.kind) {
            (OpKind::H2d, OpKind::Kernel) => filling = filling.or(Some((a.label.clone(), b.label.clone(), r.buffer.clone()))),
            (OpKind::Kernel, OpKind::H2d) => overwritten = overwritten.or(Some((a.label.clone(), b.label.clone(), r.buffer.clone()))),
            _ => other = other.or(Some(r.what.clone())),
        }
    }
    if let Some((up, layer, slot)) = filling {
        rep.problem(format!("race: {layer} reads {slot} while '{up}' may still be filling it (nothing orders the layer after that upload)"));
    }
    if let Some((layer, up, slot)) = overwritten {
        rep.problem(format!("race: '{up}' may overwrite {slot} while {layer} still reads it (nothing orders the upload after that layer)"));
    }
    if let Some(what) = other {
        rep.problem(format!("race: {what}"));
    }
    let used = books.slots_used.iter().filter(|&&u| u).count();
    if used == 1 && slots > 1 {
        rep.problem(format!(
            "one slot of the {} does all the work: an upload into it must wait for the layer reading it, so copies and layers take turns",
            slots
        ));
    }
}

/// The time against the bound (`how`: predicted or measured).
fn judge(rep: &mut CheckReport, how: &str, ms: f64, layers: usize, costs: Costs) {
    let serial = layers as f64 * (costs.h2d + costs.layer);
    let bound = crate::lab_kit::two_stage_bound_ms(layers, costs.h2d, costs.layer);
    rep.judge_overlap(
        how,
        ms,
        ("copy then compute", serial),
        bound,
        TARGET_EFFICIENCY,
        "each upload waits for a layer and each layer for its upload, so the link and the GPU take turns",
    );
}

/// The batch the exercise is judged at (the recording's timeline batch,
/// nearest the crossover, where hiding the stream matters most) and its
/// costs as the bound takes them: the run's upload and this batch's
/// GEMMs, each at its fastest quarter.
fn costs_at(r: &OffloadResults) -> Option<(usize, Costs)> {
    let p = r.points.iter().find(|p| p.batch == r.timeline_batch).or(r.points.first())?;
    let (h2d, layer) = r.bound_parts(p);
    Some((p.batch, Costs { h2d, h2d_pageable: p.h2d_pageable_ms.median, layer }))
}

// ---- the CPU's waits, where they are and what they cost ----------------

/// GPU work of a learner's pass, as a message names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Upload { layer: usize, slot: usize },
    Layer { layer: usize },
}

impl Work {
    fn describe(self) -> String {
        match self {
            Work::Upload { layer, slot } => format!("the upload of layer {layer} into slot {slot}"),
            Work::Layer { layer } => format!("layer {layer}"),
        }
    }
    /// What work of this kind is, in a few words.
    fn kind(self) -> &'static str {
        match self {
            Work::Upload { .. } => "an upload",
            Work::Layer { .. } => "a layer",
        }
    }
}

/// One CPU wait of a learner's pass, where it was made.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CpuWait {
    /// Its place among the pass's calls, from 1.
    call: usize,
    /// The call and what it waits on: "host_sync(t.copy)", "host_wait on
    /// an event recorded on t.copy".
    how: String,
    /// The GPU work it waits for (the last issued on the stream before the
    /// sync, or before the event's record), if any.
    waits_for: Option<Work>,
    /// The layer the pass issued next, if any.
    next_layer: Option<usize>,
}

impl CpuWait {
    /// What waits alike share: the call, its stream and the kind of work
    /// it waits for.
    fn kind(&self) -> String {
        format!("{}, waiting for {}", self.how, self.waits_for.map_or("no GPU work", Work::kind))
    }
    /// Where it was made, for a learner to find it.
    fn place(&self) -> String {
        let waits = self.waits_for.map_or("no GPU work".into(), Work::describe);
        let next = self.next_layer.map_or("with no layer after it".into(), |l| format!("before layer {l} is issued"));
        format!("call number {} of your pass, waiting for {waits}, {next}", self.call)
    }
}

/// Which of the learner's CPU waits a replay of the pass leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Leave {
    Nothing,
    /// Every wait of this [`CpuWait::kind`].
    Kind(String),
}

/// The streams a pass issued its uploads and its layers on.
#[derive(Clone, Debug, Default)]
struct StreamsUsed {
    uploads: Vec<StreamRef>,
    layers: Vec<StreamRef>,
}

/// The learner's calls on their way to the pass: counted, each CPU wait
/// noted where it was made, and those `leave` names not passed on (the
/// same pass without them: what they cost).
struct Watch<'a> {
    inner: &'a mut dyn Forward,
    task: Task,
    calls: usize,
    /// Per stream, the GPU work issued on it last.
    last_on: Vec<(StreamRef, Work)>,
    /// Per event, its stream and the work before it when it was last recorded.
    recorded: Vec<(EventRef, StreamRef, Option<Work>)>,
    waits: Vec<CpuWait>,
    /// The streams uploads and layers were issued on.
    streams: StreamsUsed,
    leave: Leave,
}

impl<'a> Watch<'a> {
    fn new(inner: &'a mut dyn Forward, task: Task, leave: Leave) -> Watch<'a> {
        Watch { inner, task, calls: 0, last_on: Vec::new(), recorded: Vec::new(), waits: Vec::new(), streams: StreamsUsed::default(), leave }
    }
    fn stream_name(&self, s: StreamRef) -> String {
        if s == self.task.copy {
            "t.copy".into()
        } else if s == self.task.compute {
            "t.compute".into()
        } else {
            format!("stream {}", s.0)
        }
    }
    fn last_on(&self, s: StreamRef) -> Option<Work> {
        self.last_on.iter().rev().find(|(on, _)| *on == s).map(|&(_, w)| w)
    }
    fn issued(&mut self, s: StreamRef, w: Work) {
        let on = match w {
            Work::Upload { .. } => &mut self.streams.uploads,
            Work::Layer { .. } => &mut self.streams.layers,
        };
        if !on.contains(&s) {
            on.push(s);
        }
        self.last_on.retain(|(on, _)| *on != s);
        self.last_on.push((s, w));
        if let Work::Layer { layer } = w {
            for wait in self.waits.iter_mut().filter(|w| w.next_layer.is_none()) {
                wait.next_layer = Some(layer);
            }
        }
    }
    /// Notes a CPU wait; whether the pass makes it.
    fn cpu_wait(&mut self, how: String, waits_for: Option<Work>) -> bool {
        let wait = CpuWait { call: self.calls, how, waits_for, next_layer: None };
        let made = match &self.leave {
            Leave::Nothing => true,
            Leave::Kind(k) => *k != wait.kind(),
        };
        self.waits.push(wait);
        made
    }
}

impl Forward for Watch<'_> {
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()> {
        self.calls += 1;
        self.inner.upload(s, from, layer, slot)?;
        self.issued(s, Work::Upload { layer, slot });
        Ok(())
    }
    fn layer(&mut self, s: StreamRef, layer: usize, slot: usize) -> Result<()> {
        self.calls += 1;
        self.inner.layer(s, layer, slot)?;
        self.issued(s, Work::Layer { layer });
        Ok(())
    }
    fn event(&mut self) -> Result<EventRef> {
        self.calls += 1;
        self.inner.event()
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        self.calls += 1;
        self.inner.record(e, s)?;
        let before = self.last_on(s);
        self.recorded.retain(|(ev, _, _)| *ev != e);
        self.recorded.push((e, s, before));
        Ok(())
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        self.calls += 1;
        self.inner.wait(s, e)
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.calls += 1;
        let (how, before) = match self.recorded.iter().find(|(ev, _, _)| *ev == e) {
            Some(&(_, s, w)) => (format!("host_wait on an event recorded on {}", self.stream_name(s)), w),
            None => ("host_wait on an event never recorded".to_string(), None),
        };
        if self.cpu_wait(how, before) {
            self.inner.host_wait(e)
        } else {
            Ok(())
        }
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.calls += 1;
        let how = format!("host_sync({})", self.stream_name(s));
        if self.cpu_wait(how, self.last_on(s)) {
            self.inner.host_sync(s)
        } else {
            Ok(())
        }
    }
}

/// A learner's pass recorded on the dry run, and what the checker saw of it.
struct DryPass {
    pass: Pass<DryRun>,
    waits: Vec<CpuWait>,
    /// Where every upload and every layer ran on one stream: its name in
    /// the learner's code.
    one_stream: Option<String>,
}

/// Records `schedule` on the dry run over `r`'s network at `batch`,
/// leaving out the CPU waits `leave` names; None (and a problem in `rep`)
/// where the learner's code stops or panics.
fn dry_run(rep: &mut CheckReport, r: &OffloadResults, batch: usize, schedule: &dyn Fn(&mut dyn Forward, &Task) -> Result<()>, leave: Leave) -> Option<DryPass> {
    let mut pass = Pass::dry_run(r.shape, batch, Variant::RingK.setup(r.config.ring, None));
    let task = pass.task;
    let mut watch = Watch::new(&mut pass, task, leave);
    rep.learner("your schedule", || schedule(&mut watch, &task))?;
    let waits = std::mem::take(&mut watch.waits);
    let streams = std::mem::take(&mut watch.streams);
    let one_stream = match (&streams.uploads[..], &streams.layers[..]) {
        ([u], [l]) if u == l => Some(watch.stream_name(*u)),
        _ => None,
    };
    Some(DryPass { pass, waits, one_stream })
}

/// Each kind of CPU wait `first` made, in the order first made: what it
/// costs the queue model's pass of `ms`, named as a problem where the pass
/// misses the target and the kind costs [`COSTLY_WAITS`] of it or more,
/// else as a note where it costs anything.
fn judge_waits(rep: &mut CheckReport, first: &DryPass, ms: f64, predict_without: impl Fn(Leave) -> Option<f64>) {
    let mut kinds: Vec<String> = Vec::new();
    for w in &first.waits {
        if !kinds.contains(&w.kind()) {
            kinds.push(w.kind());
        }
    }
    let on_time = rep.passed;
    for kind in kinds {
        let Some(without) = predict_without(Leave::Kind(kind.clone())) else { continue };
        let cost = ms - without;
        if cost <= 1e-9 * ms {
            continue;
        }
        let alike: Vec<&CpuWait> = first.waits.iter().filter(|w| w.kind() == kind).collect();
        let first_one = alike[0];
        let (n, share) = (alike.len(), cost / ms);
        let what = format!("{n} CPU wait{}, {} (the first is {})", if n == 1 { "" } else { "s" }, kind, first_one.place());
        let share_text = if share < 0.001 { "under 0.1%".to_string() } else { pct(share) };
        let cost_line = format!("{}, {share_text} of the queue model's pass ({} a wait)", fmt_ms(cost), fmt_ms(cost / n as f64));
        if !on_time && share >= COSTLY_WAITS {
            rep.problem(format!(
                "a CPU wait holds the GPU back: {what} cost {cost_line}; while the CPU waits it issues nothing behind the wait, so the GPU's queues run dry"
            ));
        } else {
            rep.note(format!("{what} cost {cost_line}: the pass ends that much later than without them"));
        }
    }
}

/// Checks a prefetch schedule with no GPU: the pass recorded on the dry
/// run (its books, its races), then timed by the queue model with the
/// recording's costs against the bound, and what each kind of CPU wait
/// in it costs.
pub fn check_on_model(r: &OffloadResults, schedule: &dyn Fn(&mut dyn Forward, &Task) -> Result<()>) -> CheckReport {
    let (shape, k) = (r.shape, r.config.ring);
    let mut rep = CheckReport::new(&format!("prefetch schedule, {} layers, a ring of {k} (dry run and queue model, no GPU)", shape.layers));
    let Some((batch, costs)) = costs_at(r) else {
        rep.problem("the recording holds no batch to judge the schedule at");
        return rep;
    };
    let (machine, note) = r.checker_machine();
    if let Some(note) = note {
        rep.note(note);
    }
    let Some(first) = dry_run(&mut rep, r, batch, schedule, Leave::Nothing) else {
        return rep;
    };
    let task = first.pass.task;
    let ops = first.pass.ops();
    findings(&mut rep, &first.pass.books, ops, (task.layers, task.slots));
    if let Some(one) = &first.one_stream {
        rep.problem(format!(
            "one stream, {one}, carries every upload and every layer: a stream runs its work in the order it was issued, so copies and layers take turns"
        ));
    }
    if !rep.passed {
        return rep;
    }
    let ms = first.pass.predicted_ms(costs, machine);
    judge(&mut rep, &format!("predicted at {batch} tokens"), ms, shape.layers, costs);
    judge_waits(&mut rep, &first, ms, |leave| {
        // The learner's code ran once already: a replay that stops now is left unjudged.
        let again = dry_run(&mut CheckReport::new("replay"), r, batch, schedule, leave)?;
        Some(again.pass.predicted_ms(costs, machine))
    });
    rep
}

/// Timed passes of a learner's schedule on the GPU (after a verified one).
const TIMED_PASSES: usize = 3;

/// Checks a prefetch schedule on the GPU: its dry run and queue model
/// first (a schedule with a race or wrong weights never reaches the GPU,
/// and one whose CPU waits hold the GPU back is named there), then
/// verified passes of a 24-layer network at the recording's width and
/// batch, timed against the bound from costs measured alone beside them
/// (each at its fastest quarter).
pub fn check_on_gpu(gpu: &crate::gpu::Gpu, r: &OffloadResults, schedule: PassFn) -> Result<CheckReport> {
    let on_queue_model = check_on_model(r, &*schedule);
    if !on_queue_model.passed {
        return Ok(on_queue_model);
    }
    let k = r.config.ring;
    let shape = Shape { layers: 24, d: r.shape.d };
    let batch = costs_at(r).map_or(1024, |c| c.0);
    let mut rep = CheckReport::new(&format!("prefetch schedule, {} layers, a ring of {k}, {batch} tokens (live on {})", shape.layers, gpu.name()));
    // The ring's pinned FP16 weights alone: no pageable upload reaches the
    // GPU (the dry run refused them above), and no FP8 layer runs.
    let mut rig = OffloadRig::new(gpu, shape, batch, k, Copies::PINNED)?;
    let cfg = OffloadConfig { warmup: 1, repeats: TIMED_PASSES, ..r.config.clone() };
    let reference = Reference::fresh(&mut rig, batch);
    let mut sweep = Sweep::new(&mut rig, &cfg, &reference, false)?;
    let alone = sweep.costs(batch, LayerKind::Separate, None)?;
    let costs = Costs { h2d: alone.upload.fast_end(), h2d_pageable: f64::NAN, layer: alone.layer.fast_end() };
    let mut fastest = f64::INFINITY;
    for attempt in 0..=TIMED_PASSES {
        let (run, books) = pass_with(sweep.rig, batch, Variant::RingK.setup(k, None), &*schedule, crate::gpu::TimelineSource::Off)?;
        if attempt == 0 {
            findings(&mut rep, &books, &run.schedule, (shape.layers, k));
            if !rep.passed {
                return Ok(rep);
            }
        }
        if let Err(e) = sweep.check(batch, "your schedule") {
            rep.problem(format!("wrong data: {e}"));
            return Ok(rep);
        }
        if attempt > 0 {
            fastest = fastest.min(run.total_ms);
        }
    }
    judge(&mut rep, "measured (fastest pass)", fastest, shape.layers, costs);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::super::forward::{copy_then_compute, ring, Weights};
    use super::*;

    /// The fixture's batches: GEMMs longer than an upload (the one it is
    /// judged at, as on the recorded GPUs), and shorter.
    const COMPUTE_BOUND: usize = 16384;
    const LINK_BOUND: usize = 4096;

    /// The check at batch `at` of the fixture.
    fn check_at(at: usize, f: impl Fn(&mut dyn Forward, &Task) -> Result<()>) -> CheckReport {
        check_on_model(&OffloadResults { timeline_batch: at, ..crate::labs::offload::fixture::results() }, &f)
    }
    fn check(f: impl Fn(&mut dyn Forward, &Task) -> Result<()>) -> CheckReport {
        check_at(COMPUTE_BOUND, f)
    }
    fn fails_with(r: &CheckReport, what: &str) {
        assert!(!r.passed, "{r}");
        assert!(r.to_string().contains(what), "wanted '{what}' in:\n{r}");
    }
    /// The efficiency a report noted, as a ratio.
    fn efficiency(r: &CheckReport) -> f64 {
        let line = r.findings.iter().find(|f| f.contains("efficiency")).unwrap_or_else(|| panic!("no efficiency in:\n{r}"));
        let at = line.find("efficiency ").unwrap() + "efficiency ".len();
        line[at..].split('%').next().unwrap().parse::<f64>().unwrap() / 100.0
    }

    #[test]
    fn the_ring_passes_and_the_first_programs_do_not() {
        let r = check(ring);
        assert!(r.passed, "{r}");
        assert!(efficiency(&r) > 0.99, "the ring is at its bound on the queue model: {r}");
        assert!(check_at(LINK_BOUND, ring).passed);
        fails_with(&check(|f, t| copy_then_compute(f, t, Weights::Pinned)), "one slot of the 3 does all the work");
        let r = check(|f, t| copy_then_compute(f, t, Weights::Pageable));
        fails_with(&r, "pageable weights: 96 of the 96 uploads");
    }

    #[test]
    fn the_notebooks_given_schedule_fails_on_its_race() {
        fails_with(&check(given), "race: 'H2D layer 3' may overwrite ring slot 0 while layer 0 still reads it");
    }

    #[test]
    fn each_missing_order_is_named_as_the_race_it_allows() {
        let with = |o| move |f: &mut dyn Forward, t: &Task| ring_with(f, t, o);
        let all = RingOrders::ALL;
        fails_with(
            &check(with(RingOrders { layer_waits_for_upload: false, ..all })),
            "race: layer 0 reads ring slot 0 while 'H2D layer 0' may still be filling it",
        );
        fails_with(
            &check(with(RingOrders { upload_waits_for_layer: false, ..all })),
            "race: 'H2D layer 3' may overwrite ring slot 0 while layer 0 still reads it",
        );
    }

    /// A CPU wait whose GPU work is done or nearly done by the time the
    /// CPU reaches it costs a wake-up at most: the ring with `host_wait`
    /// on each layer's upload before issuing it (the upload ended long
    /// before its layer can start), or with `host_sync(t.compute)` after
    /// each layer (each layer issued a wake-up and an issue after the one
    /// before), is a right schedule within 10% of the bound. The check
    /// says what the waits cost, and judges the time, not their count.
    #[test]
    fn cpu_waits_that_keep_the_gpu_busy_pass_and_say_what_they_cost() {
        for at in [COMPUTE_BOUND, LINK_BOUND] {
            let before = check_at(at, |f, t| ring_with(f, t, RingOrders { cpu_waits_for_upload: true, ..RingOrders::ALL }));
            assert!(before.passed, "{before}");
            assert!(efficiency(&before) > 0.99, "{before}");
            let after = check_at(at, syncs_after_each_layer);
            assert!(after.passed, "{after}");
            assert!(efficiency(&after) > 0.98, "{after}");
            assert_eq!(after.problems().count(), 0, "{after}");
        }
        // At the compute-bound batch, each sync after a layer costs its
        // wake-up and the issue of the next layer: 6 + 3 µs of each 1.8 ms
        // layer, about half a percent of the pass, and says so.
        let after = check(syncs_after_each_layer);
        let e = efficiency(&after);
        assert!((0.99..0.999).contains(&e), "about 99.5% of the bound: {after}");
        let note = after.findings.iter().find(|f| f.contains("host_sync(t.compute)")).unwrap_or_else(|| panic!("no note on the waits:\n{after}"));
        assert!(note.starts_with("96 CPU waits, host_sync(t.compute), waiting for a layer (the first is call number 15 of your pass, waiting for layer 0, before layer 1 is issued) cost 8"), "{note}");
        assert!(
            note.contains("µs, 0.5% of the queue model's pass (8.8 µs a wait)") && note.contains("the pass ends that much later than without them"),
            "{note}"
        );
    }

    /// A CPU wait that drains the pipeline fails, named with where it is
    /// and what it costs: the CPU waiting for each upload right after
    /// issuing it (as `host_sync(t.copy)` or as `host_wait` on its event)
    /// issues the next layer only once that upload is done, so copies and
    /// layers take turns.
    #[test]
    fn a_wait_that_drains_the_pipeline_fails_naming_the_wait_where_and_its_cost() {
        let r = check(syncs_after_each_upload);
        fails_with(&r, "no overlap");
        let named = r.problems().find(|p| p.starts_with("a CPU wait holds the GPU back")).unwrap_or_else(|| panic!("the wait is not named:\n{r}"));
        assert!(
            named.contains(
                "93 CPU waits, host_sync(t.copy), waiting for an upload (the first is call number 19 of your pass, waiting for the upload of layer 3 into slot 0, before layer 1 is issued) cost "
            ),
            "{named}"
        );
        assert!(named.contains("% of the queue model's pass (1.") && named.contains("ms a wait") && named.contains("the GPU's queues run dry"), "{named}");
        // The cost is what the pass would save without those waits: about
        // one upload (1.2 ms) for each of them.
        let cost: f64 = named.split(" cost ").nth(1).unwrap().split(" ms").next().unwrap().parse().unwrap();
        assert!((0.9 * 93.0 * 1.2..1.1 * 93.0 * 1.2).contains(&cost), "{named}");

        let r = check(|f, t| ring_waiting(f, t, Some(CpuWaitAt::WaitCopied), None, None));
        fails_with(
            &r,
            "a CPU wait holds the GPU back: 93 CPU waits, host_wait on an event recorded on t.copy, waiting for an upload (the first is call number 19",
        );
        // Link-bound, the same waits leave the copy engine idle between uploads.
        fails_with(&check_at(LINK_BOUND, syncs_after_each_upload), "93 CPU waits, host_sync(t.copy), waiting for an upload");
        // Beside a harmless wait, the costly one is named as the problem.
        let r = check(|f, t| ring_waiting(f, t, Some(CpuWaitAt::SyncCopy), Some(CpuWaitAt::SyncCompute), None));
        assert!(!r.passed, "{r}");
        assert!(r.problems().any(|p| p.contains("host_sync(t.copy), waiting for an upload")), "{r}");
        assert!(!r.problems().any(|p| p.contains("host_sync(t.compute)")), "the harmless wait is not the problem:\n{r}");
        // Every layer waited for on the CPU before the next is issued, and
        // each upload too: the CPU walks the GPU through the pass.
        let r = check(|f, t| ring_waiting(f, t, Some(CpuWaitAt::SyncCopy), None, Some(CpuWaitAt::SyncCompute)));
        fails_with(&r, "host_sync(t.copy), waiting for an upload");
    }

    #[test]
    fn wrong_slots_missing_and_reordered_layers_are_named() {
        // Every layer from slot 0, though the ring put them in i % K.
        fails_with(
            &check(|f, t| {
                for j in 0..t.slots {
                    f.upload(t.copy, Weights::Pinned, j, j)?;
                }
                f.host_sync(t.copy)?;
                for i in 0..t.slots {
                    f.layer(t.compute, i, 0)?;
                }
                Ok(())
            }),
            "wrong weights: layer 1 reads slot 0, which holds layer 0's weights",
        );
        fails_with(&check(|f, t| ring(f, &Task { layers: t.layers - 1, ..*t })), "1 of the 96 layers never run (the first: layer 95)");
        fails_with(&check(|_, _| Err(crate::LabError::config("a bad slot"))), "a bad slot");
        fails_with(&check(|f, t| ring(f, &Task { slots: 1, ..*t })), "one slot of the 3 does all the work");
        // Every slot of the ring, but uploads and layers in one stream.
        let one_stream = check(|f, t| {
            for i in 0..t.layers {
                f.upload(t.compute, Weights::Pinned, i, i % t.slots)?;
                f.layer(t.compute, i, i % t.slots)?;
            }
            Ok(())
        });
        fails_with(&one_stream, "one stream, t.compute, carries every upload and every layer: a stream runs its work in the order it was issued");
        assert!(!one_stream.to_string().contains("one slot"), "{one_stream}");
        // The first program: one slot and one stream, both named.
        fails_with(&check(|f, t| copy_then_compute(f, t, Weights::Pinned)), "one stream, t.compute, carries every upload");
    }

    #[test]
    fn a_recording_without_host_costs_is_judged_with_free_waits_and_says_so() {
        let old = OffloadResults { machine: None, ..crate::labs::offload::fixture::results() };
        let r = check_on_model(&old, &ring);
        assert!(r.passed && r.to_string().contains("no measured host costs"), "{r}");
        let r = check_on_model(&old, &syncs_after_each_upload);
        fails_with(&r, "host_sync(t.copy), waiting for an upload");
    }

    #[test]
    fn no_message_dictates_the_fix() {
        // CheckReport::problem asserts it on every problem above; this names the promise.
        assert!(crate::lab_kit::check::dictated_fix("race: layer 0 reads ring slot 0 while 'H2D layer 0' may still be filling it").is_none());
    }
}
