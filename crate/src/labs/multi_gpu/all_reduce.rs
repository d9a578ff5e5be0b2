//! Communication overlapping compute: data-parallel training's gradient
//! all-reduce. Every GPU holds the same model and its own batch; in the
//! backward pass each layer's kernel produces a bucket of gradients, and
//! the GPUs must sum every bucket (an NCCL all-reduce) before the
//! optimizer step. Summed after the whole backward pass, the
//! communication adds to the step ([`Sync::Serial`]). Summed bucket by
//! bucket on a separate, high-priority stream that waits (an event) for
//! the bucket's kernel, it runs while the next layers compute
//! ([`Sync::Overlapped`]); only the last bucket's sum is left exposed.
//! The bucket size trades that tail against NCCL's cost per call.
//!
//! In the vocabulary: GPU g uploads its batch (input elements g·n.. of
//! `host in`) once; then `steps` training steps, each the kernels of every
//! bucket on GPU g's compute stream and the all-reduce of every bucket,
//! the step ending when every bucket is summed (the optimizer's wait);
//! then each GPU's gradients come back to its share of `host out`, every
//! element the sum over the GPUs ([`Provenance::Summed`]), checked.
//!
//! [`Provenance::Summed`]: crate::pipeline::cells::Provenance::Summed

use crate::error::{LabError, Result};
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{chunk, Plan, StreamSpec};

/// Where the buckets are summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sync {
    /// After the whole backward pass, on the compute stream: nothing overlaps.
    Serial,
    /// Each bucket as soon as its kernel is done, on the comm stream.
    Overlapped,
}

impl Sync {
    pub const ALL: [Sync; 2] = [Sync::Serial, Sync::Overlapped];
    pub fn label(self) -> &'static str {
        match self {
            Sync::Serial => "serial: all-reduce after the backward pass",
            Sync::Overlapped => "overlapped: each bucket's all-reduce beside the next layers",
        }
    }
}

/// The experiment's shape: gradients per GPU, the bucket size, the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// f32 gradients on each GPU.
    pub per_gpu: usize,
    /// f32 gradients per bucket: it divides `per_gpu`, so every bucket
    /// is the same size and one cost times them all.
    pub bucket: usize,
    /// GPUs (ranks).
    pub ranks: usize,
    /// The comm stream's priority (CUDA's numbers: lower runs first).
    pub comm_priority: i32,
}

impl Shape {
    /// How many buckets the gradients split into.
    pub fn buckets(&self) -> usize {
        (self.per_gpu / self.bucket.max(1)).max(1)
    }
    /// Refuses a shape no run can have.
    pub fn validate(&self) -> Result<()> {
        if self.ranks == 0 || self.ranks > 255 {
            return Err(LabError::config(format!("an all-reduce over {} GPUs: give 1 to 255", self.ranks)));
        }
        if self.per_gpu < 2 || self.per_gpu % 2 != 0 || self.bucket < 2 || self.bucket > self.per_gpu || self.per_gpu % self.bucket != 0 {
            return Err(LabError::config(format!(
                "{} gradients per GPU in buckets of {}: give an even number of gradients and buckets of 2 to that many that divide it",
                self.per_gpu, self.bucket
            )));
        }
        Ok(())
    }
    /// (first element, elements) of bucket `b` within one GPU's gradients.
    pub fn bucket_range(&self, b: usize) -> (usize, usize) {
        chunk(self.per_gpu, self.buckets(), b)
    }
}

/// The labels of the plan's operations.
pub fn kernel_label(bucket: usize, gpu: usize) -> String {
    format!("layer {bucket} gradients, GPU {gpu}")
}
pub fn all_reduce_label(bucket: usize) -> String {
    format!("all-reduce bucket {bucket}")
}

/// `steps` training steps of the experiment (see the module doc), summed
/// as `sync` says. Buffers: GPU g's batch is device buffer 2g, its
/// gradients 2g+1, each of one rank's `per_gpu` elements and placed on
/// GPU g alone (a GPU holds its own rank's two, whatever the GPU count);
/// its streams are compute (2g) and comm (2g+1).
pub fn plan(shape: Shape, steps: usize, sync: Sync) -> Plan {
    let Shape { per_gpu, ranks, comm_priority, .. } = shape;
    let mut specs = Vec::with_capacity(2 * ranks);
    for g in 0..ranks {
        specs.push(StreamSpec::new("compute", StreamKind::NonBlocking, 0).on_gpu(g));
        specs.push(StreamSpec::new("comm", StreamKind::NonBlocking, comm_priority).on_gpu(g));
    }
    let name = format!("{} step(s), {} buckets, {}", steps.max(1), shape.buckets(), sync.label());
    Plan::new(&name, specs, per_gpu * ranks, 2 * ranks, move |p, r| {
        let compute = |g: usize| r.streams[2 * g];
        let comm = |g: usize| r.streams[2 * g + 1];
        let (batch, grads) = (|g: usize| r.devices[2 * g], |g: usize| r.devices[2 * g + 1]);
        for g in 0..ranks {
            p.h2d(compute(g), batch(g), 0, r.input, g * per_gpu, per_gpu, &format!("upload GPU {g}'s batch"))?;
        }
        let on = |s: &dyn Fn(usize) -> crate::pipeline::issue::StreamRef| (0..ranks).map(|g| (s(g), grads(g))).collect::<Vec<_>>();
        for _ in 0..steps.max(1) {
            for b in 0..shape.buckets() {
                let (at, n) = shape.bucket_range(b);
                for g in 0..ranks {
                    p.compute(compute(g), batch(g), at, grads(g), at, n, &kernel_label(b, g))?;
                }
                if sync == Sync::Overlapped {
                    for g in 0..ranks {
                        p.wait_for(comm(g), compute(g))?;
                    }
                    p.all_reduce(&on(&comm), at, n, &all_reduce_label(b))?;
                }
            }
            if sync == Sync::Serial {
                for b in 0..shape.buckets() {
                    let (at, n) = shape.bucket_range(b);
                    p.all_reduce(&on(&compute), at, n, &all_reduce_label(b))?;
                }
            }
            // The optimizer step needs every bucket summed, and the next
            // step's kernels overwrite the gradients.
            for g in 0..ranks {
                p.wait_for(compute(g), comm(g))?;
            }
        }
        for g in 0..ranks {
            p.d2h(compute(g), r.output, g * per_gpu, grads(g), 0, per_gpu, &format!("download GPU {g}'s gradients"))?;
        }
        Ok(())
    })
    .placed((0..ranks).flat_map(|g| [g, g]).collect())
    .with_device_buffers_of(per_gpu)
}

/// The device memory the experiment's plan asks of each GPU, bytes: a
/// rank's batch and its gradients (NCCL's own buffers besides).
pub fn device_bytes_per_gpu(shape: Shape) -> u64 {
    2 * 4 * shape.per_gpu as u64
}

/// The op kinds the experiment's bound is costed by: the kernel of a
/// bucket and its all-reduce, at `elements`.
pub fn kinds(ranks: usize) -> [OpKind; 2] {
    [OpKind::Kernel, OpKind::AllReduce(ranks.min(255) as u8)]
}

/// NCCL's bus bandwidth of an all-reduce of `bytes` over `ranks` GPUs
/// that took `ms`, GB/s: the algorithm's bandwidth (bytes / time) times
/// 2(R−1)/R, the share of the data each GPU's link carries in a ring, so
/// that it compares with the link's own speed whatever the GPU count
/// (nccl-tests' definition). NaN where `ms` is 0 or less: a time by
/// difference lost in the noise has no rate.
pub fn bus_gbps(bytes: f64, ms: f64, ranks: usize) -> f64 {
    if ms <= 0.0 {
        return f64::NAN;
    }
    let r = ranks.max(1) as f64;
    bytes / ms / 1e6 * 2.0 * (r - 1.0) / r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::plan::{device_name, Costs};

    fn shape(buckets: usize) -> Shape {
        Shape { per_gpu: 64, bucket: 64 / buckets, ranks: 2, comm_priority: -1 }
    }

    /// Kernels of 1 ms a bucket of 16, all-reduces of 1 ms, copies free.
    fn costs(s: Shape) -> Costs {
        let (_, n) = s.bucket_range(0);
        [((OpKind::Kernel, n), 1.0), ((OpKind::AllReduce(2), n), 1.0), ((OpKind::H2d, s.per_gpu), 0.0), ((OpKind::D2h, s.per_gpu), 0.0)].into()
    }

    #[test]
    fn every_gpu_ends_with_the_sum_of_every_gpus_gradients_race_free() {
        for sync in Sync::ALL {
            for steps in [1, 3] {
                let p = plan(shape(4), steps, sync);
                assert_eq!(p.gpus(), [0, 1]);
                let m = p.dry_run().unwrap();
                assert!(m.schedule.races().is_empty(), "{sync:?}: {:?}", m.schedule.races());
                let out = Plan::output_cells(&m);
                for (i, c) in out.iter().enumerate() {
                    let j = (i % 64) as u32;
                    assert_eq!(c, Provenance::Summed { first: j, stride: 64, ranks: 2, passes: 1 }, "{sync:?} element {i}");
                }
                let sums = m.schedule.ops.iter().filter(|o| o.kind == OpKind::AllReduce(2)).count();
                assert_eq!(sums, 4 * 2 * steps, "a part per rank per bucket per step");
                assert!(!m.schedule.cpu_waited_for_gpu());
                // Each GPU holds its own rank's batch and gradients: two
                // buffers of one rank's elements, whatever the rank count.
                assert_eq!(p.devices, 4);
                for i in 0..p.devices {
                    assert_eq!((p.device_gpu(i), p.device_buffer(i)), (i / 2, (device_name(i), 64)), "{sync:?} buffer {i}");
                }
            }
        }
        assert_eq!(device_bytes_per_gpu(shape(4)), 2 * 4 * 64);
        assert_eq!(shape(4).buckets(), 4);
        assert!(Shape { bucket: 30, ..shape(1) }.validate().unwrap_err().to_string().contains("that divide it"), "buckets of one size");
        assert!(Shape { bucket: 0, ..shape(1) }.validate().is_err());
        assert!(Shape { ranks: 0, ..shape(1) }.validate().unwrap_err().to_string().contains("0 GPUs"));
        shape(4).validate().unwrap();
    }

    #[test]
    fn overlapped_the_sums_hide_behind_the_next_layers_and_leave_the_last_exposed() {
        let s = shape(4);
        let c = costs(s);
        let step = |sync| {
            let one = plan(s, 1, sync).predicted_ms(Machine::engines(2), &c).unwrap();
            let two = plan(s, 2, sync).predicted_ms(Machine::engines(2), &c).unwrap();
            two - one
        };
        // 4 kernels of 1 then 4 sums of 1: 8 a step. Overlapped: 4 kernels,
        // the last bucket's sum after them: 5.
        assert!((step(Sync::Serial) - 8.0).abs() < 1e-9, "{}", step(Sync::Serial));
        assert!((step(Sync::Overlapped) - 5.0).abs() < 1e-9, "{}", step(Sync::Overlapped));
        assert!((bus_gbps(1e9, 10.0, 2) - 100.0).abs() < 1e-9);
        assert_eq!(bus_gbps(1e9, 10.0, 1), 0.0, "one GPU moves nothing");
        assert_eq!(kinds(2), [OpKind::Kernel, OpKind::AllReduce(2)]);
    }
}
