//! Pipeline training over S stages, one per GPU: every micro-batch goes
//! forward through the stages and its gradient comes back, and each
//! stage keeps a micro-batch's activation from its forward step until its
//! backward step has read it. Two orders of the same steps, what the
//! literature calls pipeline schedules ([`TrainingOrder`]; not the
//! happens-before record of a run, [`crate::pipeline::schedule::Schedule`]):
//!
//! * **fill-drain** (GPipe): every forward, then every backward. A stage
//!   keeps all M micro-batches' activations.
//! * **one forward, one backward** (1F1B, PipeDream-Flush): stage s runs
//!   S−1−s forwards to fill the pipe, then alternates a forward and a
//!   backward, then drains. A stage keeps at most S−s activations.
//!
//! With forward and backward of equal time both idle (S−1)/(M+S−1) of the
//! time ([`super::pipeline_parallel::bubble_model`]); 1F1B's gain is the
//! memory ([`kept_slots`]), which the lab prints.
//!
//! The steps in the vocabulary's one-input kernel, so that both checks see
//! what a real backward needs:
//!
//! * F(s, i): the stage's input for micro-batch i (the upload on stage 0,
//!   the activation received from stage s−1 after) to slot i mod K of the
//!   stage's kept activations, then sent from that slot to stage s+1;
//! * B(s, i): the first half of the gradient from the kept slot, the
//!   second half from the gradient received from stage s+1 (the last stage
//!   has none: both halves from its slot), then sent to stage s−1.
//!
//! A slot written again before its backward read it gives wrong data; a
//! backward not ordered after its gradient arrived is a race. Every stage's
//! gradients are checked on the GPU. The steps are issued in an order
//! where every step's inputs were issued before it (round-robin over the
//! stages, each step once what it needs is issued): a
//! wait on an event not yet recorded does nothing in CUDA.

use super::pipeline_parallel::UPLOAD;
use crate::error::{LabError, Result};
use crate::pipeline::issue::{DevRef, EventRef, Issue, StreamRef};
use crate::pipeline::op::StreamKind;
use crate::pipeline::plan::{Plan, StreamSpec};
use serde::{Deserialize, Serialize};

/// The order in which each stage runs its forward and backward steps (a
/// pipeline schedule, in the literature's word).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrainingOrder {
    /// Every forward, then every backward (GPipe).
    FillDrain,
    /// One forward, one backward (PipeDream-Flush).
    OneForwardOneBackward,
}

impl TrainingOrder {
    pub const ALL: [TrainingOrder; 2] = [TrainingOrder::FillDrain, TrainingOrder::OneForwardOneBackward];
    pub fn name(self) -> &'static str {
        match self {
            TrainingOrder::FillDrain => "fill-drain",
            TrainingOrder::OneForwardOneBackward => "1F1B",
        }
    }
    /// Stage `s`'s steps, in the order its GPU runs them.
    pub fn steps(self, stages: usize, s: usize, micro_batches: usize) -> Vec<Step> {
        let m = micro_batches;
        match self {
            TrainingOrder::FillDrain => (0..m).map(Step::Forward).chain((0..m).map(Step::Backward)).collect(),
            TrainingOrder::OneForwardOneBackward => {
                let warm = (stages - 1 - s).min(m);
                let mut v: Vec<Step> = (0..warm).map(Step::Forward).collect();
                for j in 0..m - warm {
                    v.push(Step::Forward(warm + j));
                    v.push(Step::Backward(j));
                }
                v.extend((m - warm..m).map(Step::Backward));
                v
            }
        }
    }
}

/// Elements of one micro-batch of `elements` split into `micro_batches`
/// of one even size (so that any one fits any slot; the few left over
/// are dropped).
pub fn micro_batch_elements(elements: usize, micro_batches: usize) -> usize {
    (elements / micro_batches.max(1)) & !1
}

/// How many micro-batches' activations stage `s` keeps at once under
/// `order`: the slots it needs.
pub fn kept_slots(order: TrainingOrder, stages: usize, s: usize, micro_batches: usize) -> usize {
    match order {
        TrainingOrder::FillDrain => micro_batches,
        TrainingOrder::OneForwardOneBackward => (stages - s).min(micro_batches),
    }
}

/// One step of a stage: the forward or the backward of a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Forward(usize),
    Backward(usize),
}

/// "forward of micro-batch 3 on stage 1".
pub fn step_label(step: Step, s: usize) -> String {
    match step {
        Step::Forward(i) => format!("forward, stage {s}, micro-batch {i}"),
        Step::Backward(i) => format!("backward, stage {s}, micro-batch {i}"),
    }
}

/// Stage s's streams and buffers.
struct StageRefs {
    compute: StreamRef,
    forward_copy: StreamRef,
    backward_copy: StreamRef,
    /// The stage's input: the upload (stage 0) or what stage s−1 sent.
    input: DevRef,
    /// Its kept activations, `slots` of a micro-batch each.
    kept: DevRef,
    slots: usize,
    /// The gradient stage s+1 sent (none on the last stage).
    grad_in: Option<DevRef>,
    /// Its own gradients, by micro-batch: what it sends to stage s−1.
    grad_out: DevRef,
}

/// The training plan: `order` over `micro_batches` of `elements` (as
/// many as split into micro-batches of one even size),
/// stage s on the plan's GPU `placement[s]`, each GPU with a compute
/// stream and a stream for each direction's sends. The input is uploaded
/// to GPU 0 first; every stage's gradients are checked on its GPU.
pub fn plan(order: TrainingOrder, micro_batches: usize, elements: usize, placement: &[usize]) -> Plan {
    let slots = (0..placement.len().max(1)).map(|s| kept_slots(order, placement.len().max(1), s, micro_batches)).collect();
    plan_keeping(order, micro_batches, elements, placement, slots)
}

/// [`plan`] with stage s keeping `slots[s]` activations (what the order
/// needs, or fewer to show what that breaks).
fn plan_keeping(order: TrainingOrder, micro_batches: usize, elements: usize, placement: &[usize], slots: Vec<usize>) -> Plan {
    let stages = placement.len().max(1);
    let gpu = |s: usize| placement.get(s).copied().unwrap_or(0);
    let per = micro_batch_elements(elements, micro_batches);
    let elements = per * micro_batches;
    let specs: Vec<StreamSpec> = (0..stages)
        .flat_map(|s| ["compute", "forward sends", "backward sends"].map(|n| StreamSpec::new(n, StreamKind::NonBlocking, 0).on_gpu(gpu(s))))
        .collect();
    // Per stage: its input, its kept slots, the gradient received (all but
    // the last), its gradients out.
    let mut buffers: Vec<(String, usize, usize)> = Vec::new();
    let mut checked = Vec::new();
    for s in 0..stages {
        let g = gpu(s);
        let input = if s == 0 { format!("input on GPU {g}") } else { format!("stage {s}'s input on GPU {g}") };
        buffers.push((input, elements, g));
        let kept = slots.get(s).copied().unwrap_or(1) * per;
        buffers.push((format!("stage {s}'s kept activations on GPU {g}"), kept, g));
        if s + 1 < stages {
            buffers.push((format!("gradient received by stage {s} on GPU {g}"), elements, g));
        }
        checked.push(buffers.len());
        buffers.push((format!("stage {s}'s gradients on GPU {g}"), elements, g));
    }
    let names: Vec<(&str, usize)> = buffers.iter().map(|(n, e, _)| (n.as_str(), *e)).collect();
    let gpus: Vec<usize> = buffers.iter().map(|b| b.2).collect();
    Plan::new(&format!("{} over {stages} stages", order.name()), specs, elements, buffers.len(), move |p, r| {
        let (st, d) = (&r.streams, &r.devices);
        let mut at = 0;
        let refs: Vec<StageRefs> = (0..stages)
            .map(|s| {
                let input = d[at];
                let kept = d[at + 1];
                let grad_in = (s + 1 < stages).then(|| d[at + 2]);
                let grad_out = d[at + 2 + usize::from(s + 1 < stages)];
                at += 3 + usize::from(s + 1 < stages);
                StageRefs { compute: st[3 * s], forward_copy: st[3 * s + 1], backward_copy: st[3 * s + 2], input, kept, slots: slots[s], grad_in, grad_out }
            })
            .collect();
        p.h2d(refs[0].forward_copy, refs[0].input, 0, r.input, 0, r.elements, UPLOAD)?;
        p.wait_for(refs[0].compute, refs[0].forward_copy)?;
        let steps: Vec<Vec<Step>> = (0..stages).map(|s| order.steps(stages, s, micro_batches)).collect();
        issue_in_order(p, &refs, &steps, micro_batches, r.elements)
    })
    .placed(gpus)
    .with_device_buffers(&names)
    .checked_on_devices(&checked)
}

/// Issues every stage's steps, round-robin over the stages, each step once
/// what it needs has been issued: F(s, i) the send of F(s−1, i), B(s, i)
/// the send of B(s+1, i). An order where no stage can go on is an error
/// naming the steps each waits at.
fn issue_in_order(p: &mut dyn Issue, refs: &[StageRefs], steps: &[Vec<Step>], m: usize, elements: usize) -> Result<()> {
    let stages = refs.len();
    // The event each send recorded, by (stage, micro-batch).
    let mut sent_forward: Vec<Vec<Option<EventRef>>> = vec![vec![None; m]; stages];
    let mut sent_backward: Vec<Vec<Option<EventRef>>> = vec![vec![None; m]; stages];
    let mut next = vec![0usize; stages];
    let per = elements / m;
    let micro = |i: usize| (i * per, per);
    loop {
        let mut progressed = false;
        for s in 0..stages {
            let Some(&step) = steps[s].get(next[s]) else { continue };
            let me = &refs[s];
            match step {
                Step::Forward(i) => {
                    if s > 0 {
                        let Some(e) = sent_forward[s - 1][i] else { continue };
                        p.wait(me.compute, e)?;
                    }
                    let (at, n) = micro(i);
                    let slot = (i % me.slots) * per;
                    p.compute(me.compute, me.input, at, me.kept, slot, n, &step_label(step, s))?;
                    if s + 1 < stages {
                        p.wait_for(me.forward_copy, me.compute)?;
                        p.d2d(me.forward_copy, refs[s + 1].input, at, me.kept, slot, n, &format!("send micro-batch {i}'s activation to stage {}", s + 1))?;
                        let e = p.event()?;
                        p.record(e, me.forward_copy)?;
                        sent_forward[s][i] = Some(e);
                    }
                }
                Step::Backward(i) => {
                    let (at, n) = micro(i);
                    let slot = (i % me.slots) * per;
                    let label = step_label(step, s);
                    match me.grad_in {
                        Some(grad_in) => {
                            let Some(e) = sent_backward[s + 1][i] else { continue };
                            p.wait(me.compute, e)?;
                            // Half from the kept activation, half from the gradient.
                            let half = (n / 2) & !1;
                            p.compute(me.compute, me.kept, slot, me.grad_out, at, half, &format!("{label} (activation)"))?;
                            p.compute(me.compute, grad_in, at + half, me.grad_out, at + half, n - half, &format!("{label} (gradient)"))?;
                        }
                        None => p.compute(me.compute, me.kept, slot, me.grad_out, at, n, &label)?,
                    }
                    if s > 0 {
                        p.wait_for(me.backward_copy, me.compute)?;
                        let to = refs[s - 1].grad_in.expect("every stage but the last receives a gradient");
                        p.d2d(me.backward_copy, to, at, me.grad_out, at, n, &format!("send micro-batch {i}'s gradient to stage {}", s - 1))?;
                        let e = p.event()?;
                        p.record(e, me.backward_copy)?;
                        sent_backward[s][i] = Some(e);
                    }
                }
            }
            next[s] += 1;
            progressed = true;
        }
        if (0..stages).all(|s| next[s] == steps[s].len()) {
            return Ok(());
        }
        if !progressed {
            let stuck: Vec<String> = (0..stages).filter_map(|s| steps[s].get(next[s]).map(|&st| step_label(st, s))).collect();
            return Err(LabError::config(format!("the schedule cannot go on: every stage waits ({})", stuck.join("; "))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labs::multi_gpu::pipeline_parallel::{bubble, bubble_model};
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::op::{Link, OpKind};
    use crate::pipeline::plan::Costs;

    #[test]
    fn one_f_one_b_fills_alternates_and_drains_and_keeps_fewer_activations() {
        use Step::{Backward as B, Forward as F};
        let s = TrainingOrder::OneForwardOneBackward;
        assert_eq!(s.steps(4, 0, 4), [F(0), F(1), F(2), F(3), B(0), B(1), B(2), B(3)]);
        assert_eq!(s.steps(4, 2, 4), [F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)]);
        assert_eq!(s.steps(4, 3, 4), [F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)]);
        assert_eq!(s.steps(4, 0, 2), [F(0), F(1), B(0), B(1)], "fewer micro-batches than the pipe is deep");
        assert_eq!(TrainingOrder::FillDrain.steps(2, 1, 3), [F(0), F(1), F(2), B(0), B(1), B(2)]);
        assert_eq!((0..4).map(|st| kept_slots(s, 4, st, 32)).collect::<Vec<_>>(), [4, 3, 2, 1]);
        assert_eq!(kept_slots(TrainingOrder::FillDrain, 4, 0, 32), 32);
    }

    #[test]
    fn both_schedules_run_race_free_with_every_gradient_right() {
        for stages in [2, 3, 4] {
            let at: Vec<usize> = (0..stages).collect();
            for m in [1, 2, 3, 8] {
                for order in TrainingOrder::ALL {
                    let p = plan(order, m, 64, &at);
                    let per = (64 / m) & !1;
                    let model = p.dry_run().unwrap_or_else(|e| panic!("{order:?} {stages}x{m}: {e}"));
                    assert!(model.schedule.races().is_empty(), "{order:?} {stages}x{m}: {:?}", model.schedule.races());
                    // Stage s's gradient: the first half of each micro-batch
                    // after s+2 kernels (the forwards to s, its backward), the
                    // second after 2S-s (down the forwards, back up the
                    // backwards); the last stage's all after S+1.
                    let cells = p.checked_cells(&model);
                    for (s, c) in cells.iter().enumerate() {
                        for i in 0..m {
                            let (first, n) = (i * per, per);
                            let half = (n / 2) & !1;
                            for e in first..first + n {
                                let passes = if s + 1 == stages {
                                    stages + 1
                                } else if e < first + half {
                                    s + 2
                                } else {
                                    2 * stages - s
                                };
                                assert_eq!(c.get(e), Provenance::Repeated(e as u32, passes as u8), "{order:?} {stages}x{m}, stage {s}, element {e}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn too_few_kept_slots_give_wrong_data() {
        // Fill-drain with 1F1B's slots: stage 0 overwrites micro-batch 0's
        // activation before its backward reads it.
        let (m, at) = (4, [0, 1]);
        let right = plan(TrainingOrder::FillDrain, m, 64, &at);
        let short = plan_keeping(TrainingOrder::FillDrain, m, 64, &at, vec![2, 1]);
        let (good, bad) = (right.dry_run().unwrap(), short.dry_run().unwrap());
        assert_eq!(right.checked_cells(&good)[0].get(0), Provenance::Repeated(0, 2));
        assert_ne!(short.checked_cells(&bad)[0].get(0), Provenance::Repeated(0, 2), "micro-batch 0's kept activation was overwritten");
    }

    #[test]
    fn the_queue_models_bubble_is_the_formulas_for_both_schedules() {
        for stages in [2, 4] {
            let at: Vec<usize> = (0..stages).collect();
            for m in [1, 4, 8, 32] {
                let (n, per) = (64 * m, 64);
                let mut costs: Costs = [((OpKind::Kernel, per), 1.0), ((OpKind::Kernel, per / 2), 0.5), ((OpKind::H2d, n), 2.0)].into();
                for s in 0..stages - 1 {
                    costs.insert((OpKind::D2d(Link { from: s as u8, to: s as u8 + 1 }), per), 0.0);
                    costs.insert((OpKind::D2d(Link { from: s as u8 + 1, to: s as u8 }), per), 0.0);
                }
                for order in TrainingOrder::ALL {
                    let (sched, times) = plan(order, m, n, &at).predict(Machine::engines(2), &costs).unwrap();
                    let b = bubble(&sched, &times).unwrap();
                    assert!((b.fraction() - bubble_model(stages, m)).abs() < 1e-9, "{order:?} {stages}x{m}: {} vs {}", b.fraction(), bubble_model(stages, m));
                }
            }
        }
    }
}
