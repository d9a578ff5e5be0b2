//! Pipeline parallelism over S stages, one per GPU: stage s runs on GPU s,
//! its output (the activation) is copied GPU to GPU to stage s+1, over
//! micro-batches so that every GPU works at once. The loop orders the
//! GPUs with events only: a stream of GPU s+1 waits for an event a stream
//! of GPU s recorded (cuStreamWaitEvent works across devices), and the
//! CPU never waits.
//!
//! The bubble: with S stages of equal time and M micro-batches, the run
//! takes M+S−1 stage slots and each GPU works M of them, so each idles
//! (S−1)/(M+S−1) of the time ([`bubble_model`]); [`bubble`] measures it
//! from a run's (or the queue model's) timeline.

use crate::error::{LabError, Result};
use crate::pipeline::issue::{DevRef, Issue, StreamRef};
use crate::pipeline::op::{Lane, OpKind, StreamKind};
use crate::pipeline::plan::{chunk, Plan, StreamSpec};
use crate::pipeline::schedule::Schedule;
use std::sync::Arc;

/// Labels of the plan's own operations around the learner's loop.
pub const UPLOAD: &str = "upload the input to GPU 0";
/// The download's label, from the last stage's GPU.
pub fn download_label(last: usize) -> String {
    format!("download the output from GPU {last}")
}

/// A GPU's two streams.
#[derive(Clone, Copy, Debug)]
pub struct GpuStreams {
    /// For the stage's kernels.
    pub compute: StreamRef,
    /// For copies, so that they run beside the kernels.
    pub copy: StreamRef,
}

/// What the loop is handed: the micro-batches, the stages, each stage's
/// GPU's streams and the device buffers (the input is on GPU 0 before the
/// loop starts, and the output is downloaded from the last stage's GPU
/// after it ends). Stage s runs on `gpus[s]`'s streams; its steps are
/// [`Self::stage`] and [`Self::send`].
#[derive(Clone, Debug)]
pub struct MicroBatchTask {
    pub micro_batches: usize,
    pub elements: usize,
    /// How many stages: one per GPU (two on a machine with one GPU, which
    /// then runs both).
    pub stages: usize,
    /// Stage s's streams, on stage s's GPU.
    pub gpus: Vec<GpuStreams>,
    /// The input, in GPU 0's memory.
    pub input: DevRef,
    /// `activations[s]`: stage s's output, in its own GPU's memory (every
    /// stage but the last).
    pub activations: Vec<DevRef>,
    /// `received[s]`: where stage s+1's GPU receives `activations[s]`.
    pub received: Vec<DevRef>,
    /// The last stage's output, in its GPU's memory.
    pub output: DevRef,
}

impl MicroBatchTask {
    /// (first element, element count) of micro-batch `i`.
    pub fn micro_batch(&self, i: usize) -> (usize, usize) {
        chunk(self.elements, self.micro_batches, i)
    }
    /// Micro-batch `i` for `what` (a stage or the send), or an error naming
    /// the micro-batch (or stage) a loop asked for past the last.
    fn existing(&self, i: usize, what: &str) -> Result<(usize, usize)> {
        if i >= self.micro_batches {
            return Err(LabError::config(format!(
                "{what} of micro-batch {i}: there is no micro-batch {i}, the loop has {} (0 to {})",
                self.micro_batches,
                self.micro_batches.saturating_sub(1)
            )));
        }
        Ok(self.micro_batch(i))
    }
    fn existing_stage(&self, s: usize, what: &str) -> Result<()> {
        if s >= self.stages {
            return Err(LabError::config(format!("{what}: there is no stage {s}, the pipeline has {} (0 to {})", self.stages, self.stages - 1)));
        }
        Ok(())
    }
    /// Stage `s` of micro-batch `i` on `stream` (a stream of stage s's
    /// GPU): the input (stage 0) or the activation received from stage
    /// s−1, to stage s's activation (or the output, at the last stage).
    pub fn stage(&self, p: &mut dyn Issue, s: usize, stream: StreamRef, i: usize) -> Result<()> {
        self.existing_stage(s, &format!("stage {s}"))?;
        let (at, n) = self.existing(i, &format!("stage {s}"))?;
        let from = if s == 0 { self.input } else { self.received[s - 1] };
        let to = if s + 1 == self.stages { self.output } else { self.activations[s] };
        p.compute(stream, from, at, to, at, n, &stage_label(s, i))
    }
    /// Copies micro-batch `i`'s activation from stage `s`'s GPU to stage
    /// s+1's on `stream` (a stream of either GPU).
    pub fn send(&self, p: &mut dyn Issue, s: usize, stream: StreamRef, i: usize) -> Result<()> {
        if s + 1 >= self.stages {
            return Err(LabError::config(format!(
                "the send of stage {s}: the last stage (stage {}) has no stage after it; its output stays for the download",
                self.stages - 1
            )));
        }
        let (at, n) = self.existing(i, &format!("the send of stage {s}"))?;
        p.d2d(stream, self.received[s], at, self.activations[s], at, n, &send_label(s, i))
    }
}

/// "stage 1, micro-batch 3".
pub fn stage_label(stage: usize, i: usize) -> String {
    format!("stage {stage}, micro-batch {i}")
}

/// "send micro-batch 3 to GPU 2" (from stage 1's GPU to stage 2's).
pub fn send_label(stage: usize, i: usize) -> String {
    format!("send micro-batch {i} to GPU {}", stage + 1)
}

/// A loop over the micro-batches.
pub type Loop = Arc<dyn Fn(&mut dyn Issue, &MicroBatchTask) -> Result<()> + Send + Sync>;

/// The loop as a program written the safe way first is: after each stage
/// the CPU waits for it (cuStreamSynchronize) before issuing the next, so
/// only one GPU works at a time.
pub fn host_synchronized(p: &mut dyn Issue, t: &MicroBatchTask) -> Result<()> {
    for i in 0..t.micro_batches {
        for s in 0..t.stages {
            if s > 0 {
                t.send(p, s - 1, t.gpus[s].compute, i)?;
            }
            t.stage(p, s, t.gpus[s].compute, i)?;
            p.host_sync(t.gpus[s].compute)?;
        }
    }
    Ok(())
}

/// The pipeline: each GPU runs its stage of every micro-batch back to
/// back; each micro-batch's activation is sent once its stage is done (an
/// event), on that GPU's copy stream so the copy runs beside the next
/// micro-batch's stage; the next GPU runs its stage once the copy is done
/// (another event).
pub fn events_only(p: &mut dyn Issue, t: &MicroBatchTask) -> Result<()> {
    for i in 0..t.micro_batches {
        for s in 0..t.stages {
            t.stage(p, s, t.gpus[s].compute, i)?;
            if s + 1 == t.stages {
                break;
            }
            let computed = p.event()?;
            p.record(computed, t.gpus[s].compute)?;
            p.wait(t.gpus[s].copy, computed)?;
            t.send(p, s, t.gpus[s].copy, i)?;
            let sent = p.event()?;
            p.record(sent, t.gpus[s].copy)?;
            p.wait(t.gpus[s + 1].compute, sent)?;
        }
    }
    Ok(())
}

/// The loop `learner` as a plan over two GPUs ([`plan_over`] with stage s
/// on GPU s).
pub fn plan(name: &str, micro_batches: usize, elements: usize, learner: Loop) -> Plan {
    plan_over(name, micro_batches, elements, learner, &[0, 1])
}

/// The loop `learner` as a plan of `placement.len()` stages, stage s on
/// the plan's GPU `placement[s]` (`[0, 1, 2, 3]` over four GPUs; `[0, 0]`
/// runs two stages on one GPU, how a machine with one runs the same loop:
/// the stages then share its SMs, so only the code path is the same).
/// Each stage's GPU has a compute and a copy stream; `elements` are split
/// into `micro_batches`. Before the loop the input is uploaded to GPU 0
/// (both of its streams wait for that); after it, the last stage's copy
/// stream waits for every other stream and downloads the output. Every
/// output element has been through the kernel once per stage.
pub fn plan_over(name: &str, micro_batches: usize, elements: usize, learner: Loop, placement: &[usize]) -> Plan {
    let stages = placement.len().max(1);
    let gpu = |s: usize| placement.get(s).copied().unwrap_or(0);
    let specs: Vec<StreamSpec> = (0..stages)
        .flat_map(|s| {
            [StreamSpec::new("compute", StreamKind::NonBlocking, 0).on_gpu(gpu(s)), StreamSpec::new("copy", StreamKind::NonBlocking, 0).on_gpu(gpu(s))]
        })
        .collect();
    // Buffers: the input, then each hop's activation and where the next
    // GPU receives it, then the output. Named by role as well as GPU: with
    // the stages on one GPU the names must still tell them apart.
    let mut buffers: Vec<(String, usize)> = vec![("input on GPU 0".into(), gpu(0))];
    for s in 0..stages - 1 {
        buffers.push((activation_name(s, gpu(s), stages, placement), gpu(s)));
        buffers.push((received_name(s, gpu(s + 1), stages, placement), gpu(s + 1)));
    }
    buffers.push((format!("output on GPU {}", gpu(stages - 1)), gpu(stages - 1)));
    let names: Vec<(&str, usize)> = buffers.iter().map(|(n, _)| (n.as_str(), elements)).collect();
    let last = gpu(stages - 1);
    Plan::new(name, specs, elements, buffers.len(), move |p, r| {
        let s = &r.streams;
        let d = &r.devices;
        let t = MicroBatchTask {
            micro_batches,
            elements: r.elements,
            stages,
            gpus: (0..stages).map(|g| GpuStreams { compute: s[2 * g], copy: s[2 * g + 1] }).collect(),
            input: d[0],
            activations: (0..stages - 1).map(|h| d[1 + 2 * h]).collect(),
            received: (0..stages - 1).map(|h| d[2 + 2 * h]).collect(),
            output: d[d.len() - 1],
        };
        p.h2d(t.gpus[0].copy, t.input, 0, r.input, 0, r.elements, UPLOAD)?;
        p.wait_for(t.gpus[0].compute, t.gpus[0].copy)?;
        learner(p, &t)?;
        let download = t.gpus[stages - 1].copy;
        for g in &t.gpus {
            for other in [g.compute, g.copy] {
                if other != download {
                    p.wait_for(download, other)?;
                }
            }
        }
        p.d2h(download, r.output, 0, t.output, 0, r.elements, &download_label(last))
    })
    .placed(buffers.iter().map(|b| b.1).collect())
    .with_device_buffers(&names)
    .with_passes(stages as u8)
}

/// Where the stages run over `gpus` GPUs of a plan: stage s on GPU s, or
/// two stages on GPU 0 where there is one.
pub fn placement(gpus: usize) -> Vec<usize> {
    if gpus > 1 {
        (0..gpus).collect()
    } else {
        vec![0, 0]
    }
}

/// Stage s's activation buffer: "activation on GPU 1" where each stage has
/// its own GPU, else named by its stage too.
fn activation_name(s: usize, g: usize, stages: usize, placement: &[usize]) -> String {
    if own_gpus(stages, placement) {
        format!("activation on GPU {g}")
    } else {
        format!("stage {s}'s activation on GPU {g}")
    }
}

/// Where stage s+1's GPU receives stage s's activation.
fn received_name(s: usize, g: usize, stages: usize, placement: &[usize]) -> String {
    if own_gpus(stages, placement) {
        format!("activation received by GPU {g}")
    } else {
        format!("activation received by stage {} on GPU {g}", s + 1)
    }
}

/// Whether every stage has a GPU of its own.
fn own_gpus(stages: usize, placement: &[usize]) -> bool {
    let mut v = placement.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len() == stages
}

/// The share of the time each GPU idles in a pipeline of `stages` stages
/// of equal time over `micro_batches` micro-batches: (S−1)/(M+S−1).
pub fn bubble_model(stages: usize, micro_batches: usize) -> f64 {
    stages.saturating_sub(1) as f64 / (micro_batches + stages).saturating_sub(1).max(1) as f64
}

/// How much of a run each GPU's SMs sat idle.
#[derive(Clone, Debug, PartialEq)]
pub struct Bubble {
    /// From the first kernel's start to the last kernel's end, in the times' units.
    pub window: (f64, f64),
    /// Per GPU that ran kernels: its idle share of the window.
    pub per_gpu: Vec<(usize, f64)>,
}

impl Bubble {
    /// The GPUs' mean idle share: the bubble fraction.
    pub fn fraction(&self) -> f64 {
        self.per_gpu.iter().map(|g| g.1).sum::<f64>() / self.per_gpu.len().max(1) as f64
    }
}

/// The bubble of a run of `schedule` whose ops took `times`: over the
/// window from the first kernel's start to the last one's end, the share
/// of it each GPU ran no kernel (copies do not count as work: they are
/// what the pipeline adds). `None` when no kernel ran or the window is empty.
pub fn bubble(schedule: &Schedule, times: &[(f64, f64)]) -> Option<Bubble> {
    let kernels: Vec<(usize, (f64, f64))> =
        schedule.ops.iter().zip(times).filter(|(o, _)| o.kind == OpKind::Kernel && matches!(o.lane, Lane::Stream(_))).map(|(o, &t)| (o.gpu, t)).collect();
    let start = kernels.iter().map(|k| k.1 .0).fold(f64::INFINITY, f64::min);
    let end = kernels.iter().map(|k| k.1 .1).fold(f64::NEG_INFINITY, f64::max);
    if end.partial_cmp(&start) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let per_gpu = schedule
        .gpus()
        .into_iter()
        .filter_map(|g| {
            let mut spans: Vec<(f64, f64)> = kernels.iter().filter(|k| k.0 == g).map(|k| k.1).collect();
            if spans.is_empty() {
                return None;
            }
            spans.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The union of the GPU's kernels (two streams' kernels may overlap).
            let (mut busy, mut reach) = (0.0, f64::NEG_INFINITY);
            for (a, b) in spans {
                let from = a.max(reach);
                if b > from {
                    busy += b - from;
                }
                reach = reach.max(b);
            }
            Some((g, 1.0 - busy / (end - start)))
        })
        .collect();
    Some(Bubble { window: (start, end), per_gpu })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::op::Link;
    use crate::pipeline::plan::Costs;

    /// Stage kernels of 1 ms per micro-batch, copies GPU to GPU of 0.05 ms,
    /// the upload and download 2 ms each.
    pub(crate) fn costs(micro_batches: usize, elements: usize) -> Costs {
        let n = elements / micro_batches;
        [((OpKind::Kernel, n), 1.0), ((OpKind::D2d(Link { from: 0, to: 1 }), n), 0.05), ((OpKind::H2d, elements), 2.0), ((OpKind::D2h, elements), 2.0)].into()
    }

    #[test]
    fn every_output_goes_through_both_stages_and_the_plan_spans_two_gpus() {
        for f in [events_only as fn(&mut dyn Issue, &MicroBatchTask) -> Result<()>, host_synchronized] {
            let plan = plan("p", 4, 64, Arc::new(f));
            assert_eq!(plan.gpus(), [0, 1]);
            let m = plan.dry_run().unwrap();
            assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
            assert!(Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == Provenance::Repeated(i as u32, 2)));
            let sends: Vec<_> = m.schedule.ops.iter().filter(|o| matches!(o.kind, OpKind::D2d(l) if l.is_peer())).collect();
            assert_eq!(sends.len(), 4);
        }
        assert!(!plan("p", 4, 64, Arc::new(events_only)).dry_run().unwrap().schedule.cpu_waited_for_gpu());
        assert!(plan("p", 4, 64, Arc::new(host_synchronized)).dry_run().unwrap().schedule.cpu_waited_for_gpu());
        // Both stages on one GPU: the same loop, the same data.
        let one = plan_over("p", 4, 64, Arc::new(events_only), &[0, 0]);
        assert_eq!(one.gpus(), [0]);
        let m = one.dry_run().unwrap();
        assert!(m.schedule.races().is_empty() && Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == Provenance::Repeated(i as u32, 2)));
        let bad = plan("p", 4, 64, Arc::new(events_only)).placed(vec![0, 1]);
        assert!(bad.validate().unwrap_err().to_string().contains("give one GPU per buffer"));
    }

    #[test]
    fn over_s_gpus_every_output_goes_through_every_stage_with_no_race() {
        for stages in [3, 4] {
            let placement: Vec<usize> = (0..stages).collect();
            for m in [1, 2, 3, 8] {
                for f in [events_only as fn(&mut dyn Issue, &MicroBatchTask) -> Result<()>, host_synchronized] {
                    let plan = plan_over("p", m, 64, Arc::new(f), &placement);
                    assert_eq!(plan.gpus(), placement);
                    let model = plan.dry_run().unwrap();
                    assert!(model.schedule.races().is_empty(), "{stages} stages, {m}: {:?}", model.schedule.races());
                    let want = |i: usize| Provenance::Repeated(i as u32, stages as u8);
                    assert!(Plan::output_cells(&model).iter().enumerate().all(|(i, c)| c == want(i)), "{stages} stages, {m}");
                    let sends = model.schedule.ops.iter().filter(|o| matches!(o.kind, OpKind::D2d(l) if l.is_peer())).count();
                    assert_eq!(sends, m * (stages - 1));
                }
            }
            // With copies that cost nothing, the queue model's bubble is the
            // formula's exactly.
            let (m, n) = (8, 64);
            let mut costs: Costs = [((OpKind::Kernel, n / m), 1.0), ((OpKind::H2d, n), 2.0), ((OpKind::D2h, n), 2.0)].into();
            for s in 0..stages - 1 {
                costs.insert((OpKind::D2d(Link { from: s as u8, to: s as u8 + 1 }), n / m), 0.0);
            }
            let (sched, times) = plan_over("p", m, n, Arc::new(events_only), &placement).predict(Machine::engines(2), &costs).unwrap();
            let b = bubble(&sched, &times).unwrap();
            assert!((b.fraction() - bubble_model(stages, m)).abs() < 1e-9, "{stages}: {b:?}");
        }
        // Four stages on one GPU: named apart, the same data.
        let one = plan_over("p", 4, 64, Arc::new(events_only), &[0; 4]);
        let m = one.dry_run().unwrap();
        assert!(Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == Provenance::Repeated(i as u32, 4)));
    }

    #[test]
    fn a_stage_or_send_past_the_last_is_named() {
        let plan = plan_over(
            "p",
            2,
            8,
            Arc::new(|p: &mut dyn Issue, t: &MicroBatchTask| {
                t.stage(p, 0, t.gpus[0].compute, 0)?;
                t.send(p, 1, t.gpus[1].copy, 0)
            }),
            &[0, 1],
        );
        let e = plan.dry_run().err().unwrap().to_string();
        assert!(e.contains("the send of stage 1: the last stage (stage 1) has no stage after it"), "{e}");
        let plan = plan_over("p", 2, 8, Arc::new(|p: &mut dyn Issue, t: &MicroBatchTask| t.stage(p, 2, t.gpus[1].compute, 0)), &[0, 1]);
        let e = plan.dry_run().err().unwrap().to_string();
        assert!(e.contains("stage 2: there is no stage 2, the pipeline has 2 (0 to 1)"), "{e}");
    }

    #[test]
    fn the_model_of_the_bubble_is_s_minus_1_over_m_plus_s_minus_1() {
        assert_eq!(bubble_model(2, 1), 0.5);
        assert_eq!(bubble_model(2, 8), 1.0 / 9.0);
        assert_eq!(bubble_model(4, 4), 3.0 / 7.0);
        assert_eq!(bubble_model(1, 8), 0.0);
        assert_eq!(bubble_model(0, 0), 0.0);
    }

    #[test]
    fn events_only_leave_the_bubble_the_model_gives_and_host_waits_leave_half() {
        let (mb, n) = (8, 64);
        let machine = Machine::engines(2);
        let run = |f: fn(&mut dyn Issue, &MicroBatchTask) -> Result<()>| {
            let plan = plan("p", mb, n, Arc::new(f));
            let (s, t) = plan.predict(machine, &costs(mb, n)).unwrap();
            bubble(&s, &t).unwrap()
        };
        let piped = run(events_only);
        // Stage 1 back to back 0..8 ms (after the 2 ms upload); micro-batch
        // i's stage 2 runs after its 0.05 ms copy: the last ends 1.05 ms
        // after stage 1's last. Each GPU idles 1.05 of 9.05 ms.
        assert!((piped.window.1 - piped.window.0 - 9.05).abs() < 1e-9, "{piped:?}");
        for &(_, idle) in &piped.per_gpu {
            assert!((idle - 1.05 / 9.05).abs() < 1e-9, "{piped:?}");
        }
        assert!((piped.fraction() - bubble_model(2, mb)).abs() < 0.01);
        // The CPU waits after each stage: one GPU works at a time, and the
        // copies add to the wait (8 of 16.4 ms busy on each GPU).
        let serial = run(host_synchronized);
        assert!((serial.fraction() - 8.4 / 16.4).abs() < 1e-9, "{serial:?}");
    }

    #[test]
    fn two_streams_kernels_overlapping_on_one_gpu_count_once() {
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::Kernel, "a", vec![]);
        s.gpu_op(0, 1, OpKind::Kernel, "b", vec![]);
        s.gpu_op(0, 1, OpKind::H2d, "copy", vec![]);
        let b = bubble(&s, &[(0.0, 4.0), (2.0, 6.0), (6.0, 20.0)]).unwrap();
        assert_eq!((b.window, b.per_gpu.clone()), ((0.0, 6.0), vec![(0, 0.0)]));
        assert!(bubble(&s, &[(1.0, 1.0), (1.0, 1.0), (0.0, 3.0)]).is_none(), "an empty window has no bubble");
    }
}
