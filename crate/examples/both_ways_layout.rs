//! Diagnostic: why lab 8's copy within one GPU both ways ran at 87-89% of
//! PyTorch's. Times, by difference as the lab does (`PlanRig::per_repeat_ms`),
//! the lab's both-ways plan (two buffers, each half crossing into the
//! other), the same copies between four buffers (PyTorch's reference
//! layout), and one way, at 64 MiB on GPU 0.
//!
//! Run: `cargo run --release --example both_ways_layout`

use overlap_lab::gpu::{Gpu, PlanRig};
use overlap_lab::labs::multi_gpu::peer::{both_ways, one_way};
use overlap_lab::pipeline::op::StreamKind;
use overlap_lab::pipeline::plan::{chunk, Plan, StreamSpec};

/// Both ways between four buffers: half from buffer 0 to 1 on one stream,
/// the other half from buffer 2 to 3 on another.
fn four_buffers(elements: usize, repeats: usize) -> Plan {
    let specs = vec![StreamSpec::new("there", StreamKind::NonBlocking, 0), StreamSpec::new("back", StreamKind::NonBlocking, 0)];
    Plan::new("both ways, four buffers", specs, elements, 4, move |p, r| {
        let (there, back) = (r.streams[0], r.streams[1]);
        let half = chunk(r.elements, 2, 1).0;
        let rest = r.elements - half;
        p.h2d(there, r.devices[0], 0, r.input, 0, half, "upload first half")?;
        p.h2d(back, r.devices[2], half, r.input, half, rest, "upload second half")?;
        p.wait_for(there, back)?;
        p.wait_for(back, there)?;
        for _ in 0..repeats.max(1) {
            p.d2d(there, r.devices[1], 0, r.devices[0], 0, half, "copy")?;
            p.d2d(back, r.devices[3], half, r.devices[2], half, rest, "copy")?;
        }
        p.wait_for(back, there)?;
        p.d2h(back, r.output, 0, r.devices[1], 0, half, "download first half")?;
        p.wait_for(there, back)?;
        p.d2h(there, r.output, half, r.devices[3], half, rest, "download second half")
    })
}

fn main() -> overlap_lab::Result<()> {
    let gpu = Gpu::open(0)?;
    let elements = (64 << 20) / 4;
    let mut rig = PlanRig::new(&gpu, elements, 4, 1)?;
    let gbps = |ms: f64| (64u64 << 20) as f64 / ms / 1e6;
    for round in 0..2 {
        let one = rig.per_repeat_ms(|k| one_way(elements, 0, 0, k), 11, 7)?;
        let lab = rig.per_repeat_ms(|k| both_ways(elements, 0, 0, k), 11, 7)?;
        let four = rig.per_repeat_ms(|k| four_buffers(elements, k), 11, 7)?;
        println!(
            "round {round}: one way {:.0} GB/s | both ways, the lab's two buffers {:.0} GB/s | both ways, four buffers {:.0} GB/s",
            gbps(one.median),
            gbps(lab.median),
            gbps(four.median)
        );
    }
    Ok(())
}
