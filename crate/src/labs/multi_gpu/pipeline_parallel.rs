//! Two-stage pipeline parallelism: stage 1 on GPU 0, its output (the
//! activation) copied GPU to GPU, stage 2 on GPU 1, over micro-batches so
//! that both GPUs work at once. The loop orders the two GPUs with events
//! only: a stream of GPU 1 waits for an event a stream of GPU 0 recorded
//! (cuStreamWaitEvent works across devices), and the CPU never waits.
//!
//! The bubble: with S stages of equal time and M micro-batches, the run
//! takes M+S−1 stage slots and each GPU works M of them, so each idles
//! (S−1)/(M+S−1) of the time ([`bubble_model`]); [`bubble`] measures it
//! from a run's (or the queue model's) timeline.

use crate::error::Result;
use crate::pipeline::issue::{DevRef, Issue, StreamRef};
use crate::pipeline::op::{Lane, OpKind, StreamKind};
use crate::pipeline::plan::{chunk, Plan, StreamSpec};
use crate::pipeline::schedule::Schedule;
use std::sync::Arc;

/// The pipeline's stages: one per GPU.
pub const STAGES: usize = 2;

/// Labels of the plan's own operations around the learner's loop.
pub const UPLOAD: &str = "upload the input to GPU 0";
pub const DOWNLOAD: &str = "download the output from GPU 1";

/// A GPU's two streams.
#[derive(Clone, Copy, Debug)]
pub struct GpuStreams {
    /// For the stage's kernels.
    pub compute: StreamRef,
    /// For copies, so that they run beside the kernels.
    pub copy: StreamRef,
}

/// What the loop is handed: the micro-batches, each GPU's streams and the
/// device buffers (the input is on GPU 0 before the loop starts, and the
/// output is downloaded from GPU 1 after it ends).
#[derive(Clone, Debug)]
pub struct MicroBatchTask {
    pub micro_batches: usize,
    pub elements: usize,
    pub gpu0: GpuStreams,
    pub gpu1: GpuStreams,
    /// The input, in GPU 0's memory.
    pub input: DevRef,
    /// Stage 1's output, in GPU 0's memory.
    pub activation0: DevRef,
    /// Where GPU 1 receives the activation, in GPU 1's memory.
    pub activation1: DevRef,
    /// Stage 2's output, in GPU 1's memory.
    pub output: DevRef,
}

impl MicroBatchTask {
    /// (first element, element count) of micro-batch `i`.
    pub fn micro_batch(&self, i: usize) -> (usize, usize) {
        chunk(self.elements, self.micro_batches, i)
    }
    /// Micro-batch `i` for `what` (a stage or the send), or an error naming
    /// the micro-batch a loop asked for past its last.
    fn existing(&self, i: usize, what: &str) -> Result<(usize, usize)> {
        if i >= self.micro_batches {
            return Err(crate::error::LabError::config(format!(
                "{what} of micro-batch {i}: there is no micro-batch {i}, the loop has {} (0 to {})",
                self.micro_batches,
                self.micro_batches.saturating_sub(1)
            )));
        }
        Ok(self.micro_batch(i))
    }
    /// Stage 1 of micro-batch `i` on `s` (a stream of GPU 0): input to activation.
    pub fn stage1(&self, p: &mut dyn Issue, s: StreamRef, i: usize) -> Result<()> {
        let (at, n) = self.existing(i, "stage 1")?;
        p.compute(s, self.input, at, self.activation0, at, n, &stage_label(1, i))
    }
    /// Copies micro-batch `i`'s activation from GPU 0 to GPU 1 on `s` (a
    /// stream of either GPU).
    pub fn send(&self, p: &mut dyn Issue, s: StreamRef, i: usize) -> Result<()> {
        let (at, n) = self.existing(i, "the send")?;
        p.d2d(s, self.activation1, at, self.activation0, at, n, &format!("send micro-batch {i} to GPU 1"))
    }
    /// Stage 2 of micro-batch `i` on `s` (a stream of GPU 1): activation to output.
    pub fn stage2(&self, p: &mut dyn Issue, s: StreamRef, i: usize) -> Result<()> {
        let (at, n) = self.existing(i, "stage 2")?;
        p.compute(s, self.activation1, at, self.output, at, n, &stage_label(2, i))
    }
}

/// "stage 2, micro-batch 3".
pub fn stage_label(stage: usize, i: usize) -> String {
    format!("stage {stage}, micro-batch {i}")
}

/// A loop over the micro-batches.
pub type Loop = Arc<dyn Fn(&mut dyn Issue, &MicroBatchTask) -> Result<()> + Send + Sync>;

/// The loop as a program written the safe way first is: after each stage
/// the CPU waits for it (cuStreamSynchronize) before issuing the next, so
/// one GPU is always idle.
pub fn host_synchronized(p: &mut dyn Issue, t: &MicroBatchTask) -> Result<()> {
    for i in 0..t.micro_batches {
        t.stage1(p, t.gpu0.compute, i)?;
        p.host_sync(t.gpu0.compute)?;
        t.send(p, t.gpu1.compute, i)?;
        t.stage2(p, t.gpu1.compute, i)?;
        p.host_sync(t.gpu1.compute)?;
    }
    Ok(())
}

/// The pipeline: GPU 0 runs stage 1 of every micro-batch back to back;
/// each micro-batch's activation is sent once its stage 1 is done (an
/// event), on GPU 0's copy stream so the copy runs beside the next stage
/// 1; GPU 1 runs stage 2 once the copy is done (another event).
pub fn events_only(p: &mut dyn Issue, t: &MicroBatchTask) -> Result<()> {
    for i in 0..t.micro_batches {
        t.stage1(p, t.gpu0.compute, i)?;
        let computed = p.event()?;
        p.record(computed, t.gpu0.compute)?;
        p.wait(t.gpu0.copy, computed)?;
        t.send(p, t.gpu0.copy, i)?;
        let sent = p.event()?;
        p.record(sent, t.gpu0.copy)?;
        p.wait(t.gpu1.compute, sent)?;
        t.stage2(p, t.gpu1.compute, i)?;
    }
    Ok(())
}

/// The loop `learner` as a plan over two GPUs: two streams and two buffers
/// on each, `elements` split into `micro_batches`. Before the loop the
/// input is uploaded to GPU 0 (both of its streams wait for that); after
/// it, GPU 1's copy stream waits for every stream and downloads the
/// output. Every output element has been through the kernel twice.
pub fn plan(name: &str, micro_batches: usize, elements: usize, learner: Loop) -> Plan {
    plan_on(name, micro_batches, elements, learner, 1)
}

/// [`plan`] with stage 2 on GPU `second` of the plan: 1, or 0 to run both
/// stages on one GPU (how a machine with one runs the same loop: the two
/// stages then share its SMs, so only the code path is the same).
pub fn plan_on(name: &str, micro_batches: usize, elements: usize, learner: Loop, second: usize) -> Plan {
    let specs = vec![
        StreamSpec::new("compute", StreamKind::NonBlocking, 0).on_gpu(0),
        StreamSpec::new("copy", StreamKind::NonBlocking, 0).on_gpu(0),
        StreamSpec::new("compute", StreamKind::NonBlocking, 0).on_gpu(second),
        StreamSpec::new("copy", StreamKind::NonBlocking, 0).on_gpu(second),
    ];
    Plan::new(name, specs, elements, 4, move |p, r| {
        let s = &r.streams;
        let t = MicroBatchTask {
            micro_batches,
            elements: r.elements,
            gpu0: GpuStreams { compute: s[0], copy: s[1] },
            gpu1: GpuStreams { compute: s[2], copy: s[3] },
            input: r.devices[0],
            activation0: r.devices[1],
            activation1: r.devices[2],
            output: r.devices[3],
        };
        p.h2d(t.gpu0.copy, t.input, 0, r.input, 0, r.elements, UPLOAD)?;
        p.wait_for(t.gpu0.compute, t.gpu0.copy)?;
        learner(p, &t)?;
        for s in [t.gpu0.compute, t.gpu0.copy, t.gpu1.compute] {
            p.wait_for(t.gpu1.copy, s)?;
        }
        p.d2h(t.gpu1.copy, r.output, 0, t.output, 0, r.elements, DOWNLOAD)
    })
    .placed(vec![0, 0, second, second])
    .with_device_buffers(&[
        // Named by role as well as GPU: with both stages on GPU 0 the
        // names must still tell the four buffers apart.
        ("input on GPU 0", elements),
        ("activation on GPU 0", elements),
        (&format!("activation received by GPU {second}"), elements),
        (&format!("output on GPU {second}"), elements),
    ])
    .with_passes(STAGES as u8)
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
        let one = plan_on("p", 4, 64, Arc::new(events_only), 0);
        assert_eq!(one.gpus(), [0]);
        let m = one.dry_run().unwrap();
        assert!(m.schedule.races().is_empty() && Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == Provenance::Repeated(i as u32, 2)));
        let bad = plan("p", 4, 64, Arc::new(events_only)).placed(vec![0, 1]);
        assert!(bad.validate().unwrap_err().to_string().contains("give one GPU per buffer"));
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
        assert!((piped.fraction() - bubble_model(STAGES, mb)).abs() < 0.01);
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
