//! Lab 10's fixture: SYNTHETIC torch.profiler traces, for tests only (no
//! GPU ran these), and a recording made of them ([`results`]). Each
//! is the trace the five programs of lab 10 would leave (issue 51: pageable
//! `.to()` then compute; pinned on one stream; pinned and double-buffered
//! on a copy stream; a sync read in the loop; thousands of tiny ops), or a
//! loop whose CPU builds each batch before uploading it (issue 61), built
//! event by event in Kineto's format with the field names and layout
//! `torch.profiler`'s `export_chrome_trace` writes (`libkineto`'s
//! `output_json.cpp` and `CuptiActivity.cpp`: `schemaVersion`,
//! `deviceProperties`, `baseTimeNanoseconds`, complete events with `cat`
//! `cpu_op`, `user_annotation`, `cuda_runtime`, `kernel`, `gpu_memcpy`,
//! their `args` with `device`, `stream`, `correlation`, `bytes` and
//! `memory bandwidth (GB/s)`, `ac2g` flow events, the closing "Record
//! Window End"). The times are made up to be plausible for an H100 and
//! chosen so that every figure the diagnosis reports is known from how the
//! trace was built ([`Known`]). They are fixtures, never recordings: they
//! are written to temporary folders, and never to `data/`.

use super::recording::{Recording, PROGRAMS_FILE};
use serde_json::{json, Value};

/// The GPU the synthetic traces say they ran on.
pub const GPU_NAME: &str = "NVIDIA H100 80GB HBM3";
/// The CPU process and thread that issue everything.
const PID: u64 = 48213;
/// PyTorch's default stream (the legacy NULL stream) as CUPTI numbers it.
pub const DEFAULT_STREAM: u64 = 7;
/// A `torch.cuda.Stream()` for copies.
pub const COPY_STREAM: u64 = 13;
/// One batch: 64 MiB.
pub const BATCH_BYTES: u64 = 64 << 20;
/// Copy rates the traces give their copies, GB/s (1e3 bytes per µs).
pub const PAGEABLE_GBPS: f64 = 20.0;
pub const PINNED_GBPS: f64 = 53.0;
/// One batch's compute kernel, µs.
pub const KERNEL_US: f64 = 2000.0;
/// That kernel, as cuBLAS names its GEMM on an H100.
const GEMM: &str = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1";
/// The kernel of one tiny `x + 1`, as PyTorch names it.
const ADD: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)";

/// CUPTI's callback ids of the runtime calls used (`cupti_runtime_cbid.h`).
fn cbid(call: &str) -> u64 {
    match call {
        "cudaMemcpyAsync" => 41,
        "cudaMemsetAsync" => 51,
        "cudaStreamSynchronize" => 131,
        "cudaEventRecord" => 135,
        "cudaEventSynchronize" => 137,
        "cudaStreamWaitEvent" => 147,
        "cudaDeviceSynchronize" => 165,
        "cudaLaunchKernel" => 211,
        _ => 0,
    }
}

/// Kineto writes times in µs with three decimals (ns).
fn ns(t: f64) -> f64 {
    (t * 1000.0).round() / 1000.0
}

/// What a synthetic trace's diagnosis must report, known from its making.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Known {
    /// The first GPU op's start and the last one's end, µs.
    pub window: (f64, f64),
    /// The union of every GPU op, µs.
    pub busy_us: f64,
    /// Per copy kind ("H2D pageable"): count, bytes, time, exposed µs.
    pub copies: Vec<(String, usize, u64, f64, f64)>,
    /// Synchronizing calls, and the GPU idle they caused in all, µs.
    pub sync_calls: usize,
    pub sync_idle_us: f64,
    /// Idle while the GPU waited for launches, µs (0: none).
    pub issue_idle_us: f64,
    /// Idle stretches in which the CPU did the program's own work (CPU ops
    /// that launch nothing) more than anything else, µs (0: none).
    pub host_work_idle_us: f64,
}

/// A trace as it is built: its events, and ids handed out as torch.profiler does.
pub struct Builder {
    events: Vec<Value>,
    correlation: u64,
    external: u64,
    /// GPU ops so far: (start, end as the trace writes them, copy kind or
    /// "kernel", bytes).
    ops: Vec<(f64, f64, String, u64)>,
    /// The CPU thread the next events are on (the program's main thread
    /// unless set).
    pub tid: u64,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        let mut events = vec![
            json!({"name": "process_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": 0, "args": {"name": "python3"}}),
            json!({"name": "process_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}),
            json!({"name": "process_labels", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}}),
            json!({"name": "thread_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": PID, "args": {"name": "thread 48213 (python3)"}}),
        ];
        for s in [DEFAULT_STREAM, COPY_STREAM] {
            events.push(json!({"name": "thread_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": s, "args": {"name": format!("stream {s}")}}));
        }
        Builder { events, correlation: 1000, external: 1, ops: Vec::new(), tid: PID }
    }

    /// A CPU op (`aten::to`) over `[ts, ts + dur]`.
    pub fn cpu_op(&mut self, name: &str, ts: f64, dur: f64) {
        self.external += 1;
        self.events.push(json!({
            "ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": self.tid, "ts": ns(ts), "dur": ns(dur),
            "args": {"External id": self.external, "Record function id": 0, "Ev Idx": self.external - 1}
        }));
    }

    /// A `record_function` range or `ProfilerStep#N`.
    pub fn annotation(&mut self, name: &str, ts: f64, dur: f64) {
        self.external += 1;
        self.events.push(json!({
            "ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": self.tid, "ts": ns(ts), "dur": ns(dur),
            "args": {"External id": self.external, "Record function id": 0, "Ev Idx": self.external - 1}
        }));
    }

    /// A CUDA runtime call with no GPU work of its own (a sync, an event).
    pub fn runtime(&mut self, name: &str, ts: f64, dur: f64) -> u64 {
        self.correlation += 1;
        self.events.push(json!({
            "ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": self.tid, "ts": ns(ts), "dur": ns(dur),
            "args": {"External id": self.external, "cbid": cbid(name), "correlation": self.correlation}
        }));
        self.correlation
    }

    /// The ac2g flow from the call at `cpu_ts` to its GPU op at `gpu_ts`.
    fn flow(&mut self, id: u64, cpu_ts: f64, stream: u64, gpu_ts: f64) {
        self.events.push(json!({"ph": "s", "id": id, "pid": PID, "tid": self.tid, "ts": ns(cpu_ts), "cat": "ac2g", "name": "ac2g"}));
        self.events.push(json!({"ph": "f", "id": id, "pid": 0, "tid": stream, "ts": ns(gpu_ts), "cat": "ac2g", "name": "ac2g", "bp": "e"}));
    }

    /// `cudaLaunchKernel` over `cpu`, its kernel on `stream` over `gpu`.
    pub fn kernel(&mut self, name: &str, cpu: (f64, f64), stream: u64, gpu: (f64, f64)) {
        let k = self.runtime("cudaLaunchKernel", cpu.0, cpu.1 - cpu.0);
        self.events.push(json!({
            "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ns(gpu.0), "dur": ns(gpu.1 - gpu.0),
            "args": {
                "External id": self.external, "queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": k,
                "registers per thread": 32, "shared memory": 0, "blocks per SM": 8.0, "warps per SM": 32.0,
                "grid": [1056, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 50
            }
        }));
        self.flow(k, cpu.0, stream, gpu.0);
        self.ops.push((ns(gpu.0), ns(gpu.0) + ns(gpu.1 - gpu.0), "kernel".into(), 0));
    }

    /// `cudaMemcpyAsync` over `cpu`, its copy (`kind` as CUPTI names it,
    /// "HtoD (Pageable -> Device)") on `stream` over `gpu`.
    pub fn copy(&mut self, kind: &str, bytes: u64, cpu: (f64, f64), stream: u64, gpu: (f64, f64)) {
        let k = self.runtime("cudaMemcpyAsync", cpu.0, cpu.1 - cpu.0);
        let dur = gpu.1 - gpu.0;
        self.events.push(json!({
            "ph": "X", "cat": "gpu_memcpy", "name": format!("Memcpy {kind}"), "pid": 0, "tid": stream, "ts": ns(gpu.0), "dur": ns(dur),
            "args": {
                "External id": self.external, "device": 0, "context": 1, "stream": stream, "correlation": k,
                "bytes": bytes, "memory bandwidth (GB/s)": bytes as f64 / (dur * 1e3)
            }
        }));
        self.flow(k, cpu.0, stream, gpu.0);
        let label = match kind {
            "HtoD (Pageable -> Device)" => "H2D pageable",
            "HtoD (Pinned -> Device)" => "H2D pinned",
            "DtoH (Device -> Pageable)" => "D2H pageable",
            "DtoH (Device -> Pinned)" => "D2H pinned",
            other => panic!("no label for {other}"),
        };
        self.ops.push((ns(gpu.0), ns(gpu.0) + ns(dur), label.into(), bytes));
    }

    /// One tiny `x + 1` issued at `c`: `aten::add` and its launch, then its
    /// 2 µs kernel on the default stream, ending at `c + 10.5`.
    pub fn tiny_add(&mut self, c: f64) {
        self.cpu_op("aten::add", c, 9.0);
        self.kernel(ADD, (c + 3.0, c + 7.0), DEFAULT_STREAM, (c + 8.5, c + 10.5));
    }

    /// The `back`-th GPU op from the last (0: the last) as the trace writes
    /// it: (start, end).
    pub fn op(&self, back: usize) -> (f64, f64) {
        let o = &self.ops[self.ops.len() - 1 - back];
        (o.0, o.1)
    }

    /// The document torch.profiler writes around the events.
    pub fn finish(mut self, end_ts: f64) -> Value {
        self.events.push(json!({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": ns(end_ts)}));
        json!({
            "schemaVersion": 1,
            "deviceProperties": [{
                "id": 0, "name": GPU_NAME, "totalGlobalMem": 85045346304u64,
                "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
                "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472
            }],
            "cupti_version": 26,
            "cuda_runtime_version": 12080,
            "cuda_driver_version": 13000,
            "record_shapes": 0,
            "with_stack": 0,
            "trace_id": "5B1E4F1A8E7C4D2B9F6A3C0D1E2F3A4B",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1764201600000000000u64,
            "traceEvents": self.events,
            "traceName": "/tmp/synthetic-trace.pt.trace.json"
        })
    }

    /// What the ops built so far add up to (busy, and per copy kind:
    /// count, bytes, time, exposed), from the intervals as built.
    pub fn known(&self) -> Known {
        let spans: Vec<(f64, f64)> = self.ops.iter().map(|o| (o.0, o.1)).collect();
        let start = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let end = spans.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
        let kernels: Vec<(f64, f64)> = self.ops.iter().filter(|o| o.2 == "kernel").map(|o| (o.0, o.1)).collect();
        let mut copies: Vec<(String, usize, u64, f64, f64)> = Vec::new();
        for o in self.ops.iter().filter(|o| o.2 != "kernel") {
            let (s, e) = (o.0, o.1);
            // The kernels never overlap each other in these programs.
            let hidden: f64 = kernels.iter().map(|k| (e.min(k.1) - s.max(k.0)).max(0.0)).sum();
            match copies.iter_mut().find(|c| c.0 == o.2) {
                Some(c) => {
                    c.1 += 1;
                    c.2 += o.3;
                    c.3 += e - s;
                    c.4 += e - s - hidden;
                }
                None => copies.push((o.2.clone(), 1, o.3, e - s, e - s - hidden)),
            }
        }
        copies.sort_by(|a, b| a.0.cmp(&b.0));
        Known { window: (start, end), busy_us: union_length(spans), copies, ..Known::default() }
    }
}

/// The length of the union of `spans` (the synthetic programs' own count,
/// kept apart from the crate's).
fn union_length(mut spans: Vec<(f64, f64)>) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut sum, mut cur) = (0.0, None::<(f64, f64)>);
    for (s, e) in spans {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                sum += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    sum + cur.map_or(0.0, |(s, e)| e - s)
}

/// The time `bytes` take at `gbps`, µs.
fn copy_us(bytes: u64, gbps: f64) -> f64 {
    bytes as f64 / (gbps * 1e3)
}

/// The start of everything, µs after the trace's base time.
const T0: f64 = 2_000_000.0;

/// One synthetic program's trace and what its diagnosis must say.
pub struct Synthetic {
    /// The file name it is written under (always "synthetic-...").
    pub file: &'static str,
    pub trace: Value,
    pub known: Known,
}

impl Synthetic {
    /// Writes the trace into `dir` under its (synthetic-...) name; returns its path.
    pub fn write(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join(self.file);
        std::fs::write(&path, serde_json::to_string(&self.trace).unwrap()).unwrap();
        path
    }
}

/// `x.to("cuda")` from pageable memory, then compute, `iters` times, all on
/// the default stream. PyTorch's blocking copy is a `cudaMemcpyAsync` that
/// holds the CPU while the driver stages the pageable memory, then a
/// `cudaStreamSynchronize`: the GPU idles from the copy's end until the
/// CPU, back from the sync, launches the kernel (18 µs each time).
pub fn pageable_to_then_compute(iters: usize) -> Synthetic {
    let mut b = Builder::new();
    let copy = copy_us(BATCH_BYTES, PAGEABLE_GBPS);
    let (mut cpu, mut kernel_end) = (T0, T0);
    let mut sync_idle = 0.0;
    for i in 0..iters {
        let step_start = cpu;
        let copy_start = (cpu + 12.0).max(kernel_end + 2.0);
        let copy_end = copy_start + copy;
        b.cpu_op("aten::to", cpu, copy_end + 8.0 - cpu);
        b.cpu_op("aten::_to_copy", cpu + 2.0, copy_end + 6.0 - cpu);
        b.cpu_op("aten::copy_", cpu + 5.0, copy_end + 3.0 - cpu);
        b.copy("HtoD (Pageable -> Device)", BATCH_BYTES, (cpu + 10.0, copy_end - 5.0), DEFAULT_STREAM, (copy_start, copy_end));
        b.runtime("cudaStreamSynchronize", copy_end - 4.0, 10.0);
        let mm = copy_end + 10.0;
        b.cpu_op("aten::mm", mm, 8.0);
        b.kernel(GEMM, (mm + 2.0, mm + 6.0), DEFAULT_STREAM, (copy_end + 18.0, copy_end + 18.0 + KERNEL_US));
        // 18 µs, as the trace writes the two ops.
        sync_idle += b.op(0).0 - b.op(1).1;
        kernel_end = copy_end + 18.0 + KERNEL_US;
        cpu = copy_end + 30.0;
        b.annotation(&format!("ProfilerStep#{i}"), step_start, cpu - 1.0 - step_start);
    }
    // torch.cuda.synchronize() at the end: the GPU ends its last kernel
    // inside it, and nothing follows, so it costs nothing.
    b.runtime("cudaDeviceSynchronize", cpu, kernel_end + 5.0 - cpu);
    let mut known = b.known();
    known.sync_calls = iters + 1;
    known.sync_idle_us = sync_idle;
    Synthetic { file: "synthetic-pageable-to-then-compute.json", trace: b.finish(kernel_end + 20.0), known }
}

/// Pinned memory, `non_blocking=True`, but copies and compute on the one
/// default stream: the CPU runs ahead, and each copy waits for the kernel
/// before it. No sync costs anything; the copies are all exposed.
pub fn pinned_one_stream(iters: usize) -> Synthetic {
    let mut b = Builder::new();
    let copy = copy_us(BATCH_BYTES, PINNED_GBPS);
    let (mut cpu, mut gpu_free) = (T0, T0);
    for i in 0..iters {
        let step_start = cpu;
        b.cpu_op("aten::to", cpu, 20.0);
        b.cpu_op("aten::_to_copy", cpu + 2.0, 17.0);
        b.cpu_op("aten::copy_", cpu + 5.0, 12.0);
        let copy_start = (cpu + 14.0).max(gpu_free + 1.0);
        b.copy("HtoD (Pinned -> Device)", BATCH_BYTES, (cpu + 8.0, cpu + 14.0), DEFAULT_STREAM, (copy_start, copy_start + copy));
        let k_start = (cpu + 36.0).max(copy_start + copy + 1.0);
        b.cpu_op("aten::mm", cpu + 25.0, 14.0);
        b.kernel(GEMM, (cpu + 28.0, cpu + 33.0), DEFAULT_STREAM, (k_start, k_start + KERNEL_US));
        gpu_free = k_start + KERNEL_US;
        cpu += 60.0;
        b.annotation(&format!("ProfilerStep#{i}"), step_start, 59.0);
    }
    b.runtime("cudaDeviceSynchronize", cpu, gpu_free + 5.0 - cpu);
    let mut known = b.known();
    known.sync_calls = 1;
    Synthetic { file: "synthetic-pinned-one-stream.json", trace: b.finish(gpu_free + 20.0), known }
}

/// Pinned and double-buffered: batch i+1 is copied on a copy stream while
/// batch i computes on the default stream, ordered by events. Before it
/// refills a pinned slot, the CPU waits (`cudaEventSynchronize`) for the
/// copy that last read it: a sync that costs nothing, since the compute
/// stream is busy throughout. With `item_each_step`, each step ends with
/// `loss.item()`: a 4-byte copy back and a `cudaStreamSynchronize` that
/// drains both streams, so the GPU idles until the CPU issues the next
/// batch (the sync read in the loop).
pub fn double_buffered(iters: usize, item_each_step: bool) -> Synthetic {
    let mut b = Builder::new();
    let copy = copy_us(BATCH_BYTES, PINNED_GBPS);
    // GPU times of each batch's copy and kernel.
    let mut copies: Vec<(f64, f64)> = Vec::new();
    let mut kernels: Vec<(f64, f64)> = Vec::new();
    let mut cpu = T0;
    let mut sync_calls = 0;
    let mut sync_idle = 0.0;
    // When the GPU last went idle on a sync, and whether the next op ends it.
    let mut drained_at: Option<f64> = None;
    let mut gpu_end = T0;
    // Issues batch n's copy from the CPU at `cpu`: waits on the copy
    // stream for the kernel that last read its device slot.
    let issue_copy = |b: &mut Builder, cpu: f64, n: usize, copies: &mut Vec<(f64, f64)>, kernels: &[(f64, f64)]| -> f64 {
        b.cpu_op("aten::copy_", cpu, 20.0);
        b.runtime("cudaStreamWaitEvent", cpu + 2.0, 3.0);
        let after_copy = copies.last().map_or(f64::NEG_INFINITY, |c| c.1 + 1.0);
        let after_kernel = if n >= 2 { kernels.get(n - 2).map_or(f64::NEG_INFINITY, |k| k.1 + 1.0) } else { f64::NEG_INFINITY };
        let start = (cpu + 14.0).max(after_copy).max(after_kernel);
        b.copy("HtoD (Pinned -> Device)", BATCH_BYTES, (cpu + 6.0, cpu + 12.0), COPY_STREAM, (start, start + copy));
        b.runtime("cudaEventRecord", cpu + 14.0, 3.0);
        copies.push((start, start + copy));
        cpu + 22.0
    };
    cpu = issue_copy(&mut b, cpu, 0, &mut copies, &kernels);
    for i in 0..iters {
        let step_start = cpu;
        // The pinned slot of batch i+1 was last read by copy i-1.
        if i >= 1 {
            let wait_end = (cpu + 3.0).max(copies[i - 1].1 + 3.0);
            b.runtime("cudaEventSynchronize", cpu, wait_end - cpu);
            sync_calls += 1;
            cpu = wait_end;
        }
        b.cpu_op("fill_batch", cpu, 150.0);
        cpu += 152.0;
        if i + 1 < iters {
            cpu = issue_copy(&mut b, cpu, i + 1, &mut copies, &kernels);
        }
        b.runtime("cudaStreamWaitEvent", cpu, 3.0);
        b.cpu_op("aten::mm", cpu + 4.0, 10.0);
        let k_start = (cpu + 12.0).max(copies[i].1 + 1.0).max(kernels.last().map_or(f64::NEG_INFINITY, |k| k.1 + 1.0));
        b.kernel(GEMM, (cpu + 6.0, cpu + 11.0), DEFAULT_STREAM, (k_start, k_start + KERNEL_US));
        kernels.push((k_start, k_start + KERNEL_US));
        b.runtime("cudaEventRecord", cpu + 15.0, 3.0);
        cpu += 20.0;
        if let Some(a) = drained_at.take() {
            // The gap the last .item() left: until the first op issued after
            // it (this step's copy, if it has one, and its kernel), as written.
            let next = if i + 1 < iters { b.op(0).0.min(b.op(1).0) } else { b.op(0).0 };
            sync_idle += next - a;
        }
        gpu_end = k_start + KERNEL_US;
        if item_each_step {
            // loss.item(): the 4 bytes come back on the default stream after
            // the kernel, and the CPU waits for them.
            let d2h = (gpu_end + 1.0, gpu_end + 3.0);
            let sync_end = (cpu + 12.0).max(d2h.1 + 4.0);
            b.cpu_op("aten::item", cpu, sync_end + 3.0 - cpu);
            b.cpu_op("aten::_local_scalar_dense", cpu + 2.0, sync_end - 1.0 - cpu);
            b.copy("DtoH (Device -> Pageable)", 4, (cpu + 4.0, cpu + 9.0), DEFAULT_STREAM, d2h);
            b.runtime("cudaStreamSynchronize", cpu + 10.0, sync_end - cpu - 10.0);
            sync_calls += 1;
            gpu_end = d2h.1;
            if i + 1 < iters {
                drained_at = Some(b.op(0).1);
            }
            cpu = sync_end + 5.0;
        }
        b.annotation(&format!("ProfilerStep#{i}"), step_start, cpu - 1.0 - step_start);
    }
    b.runtime("cudaDeviceSynchronize", cpu, (gpu_end + 5.0).max(cpu + 3.0) - cpu);
    sync_calls += 1;
    let mut known = b.known();
    known.sync_calls = sync_calls;
    known.sync_idle_us = sync_idle;
    let file = if item_each_step { "synthetic-sync-read-in-the-loop.json" } else { "synthetic-pinned-double-buffered.json" };
    Synthetic { file, trace: b.finish(gpu_end + 20.0), known }
}

/// `x = x + 1` `ops` times on small tensors: each op costs the CPU 10 µs
/// (Python, dispatch, `cudaLaunchKernel`) and the GPU 2 µs, so the GPU
/// waits 8 µs before every op but the first: issue-bound.
pub fn tiny_ops(ops: usize) -> Synthetic {
    let mut b = Builder::new();
    let mut end = T0;
    for i in 0..ops {
        let c = T0 + 10.0 * i as f64;
        if i % 1000 == 0 {
            let steps = (ops - i).min(1000) as f64;
            b.annotation(&format!("ProfilerStep#{}", i / 1000), c - 0.5, 10.0 * steps);
        }
        b.tiny_add(c);
        end = c + 10.5;
    }
    let c = T0 + 10.0 * ops as f64;
    b.runtime("cudaDeviceSynchronize", c, (end + 5.0).max(c + 3.0) - c);
    let mut known = b.known();
    known.sync_calls = 1;
    known.issue_idle_us = 8.0 * (ops as f64 - 1.0);
    Synthetic { file: "synthetic-tiny-ops.json", trace: b.finish(end + 20.0), known }
}

/// One batch of the host-prepared loop: 4 MiB.
pub const HOST_BATCH_BYTES: u64 = 4 << 20;

/// The CPU's work on each batch of the host-prepared loop, before its
/// upload: (op, start after the step's start, µs it runs), on CPU tensors,
/// so no op launches anything.
pub const HOST_PREP_OPS: [(&str, f64, f64); 2] = [("aten::randn", 0.0, 1000.0), ("aten::mul", 1002.0, 450.0)];

/// A loop whose CPU builds each batch (`torch.randn(...) * 2` on CPU
/// tensors, as a data loader that cannot keep up does) before uploading it
/// from pinned memory and computing on it, all on the default stream, one
/// step every 1.5 ms: the GPU's 79 µs copy and 400 µs kernel leave it idle
/// some 1020 µs of each step, while the CPU builds the next batch.
pub fn host_prepared_batches(iters: usize) -> Synthetic {
    let mut b = Builder::new();
    let copy = copy_us(HOST_BATCH_BYTES, PINNED_GBPS);
    let (mut cpu, mut gpu_free) = (T0, T0);
    // The idle from each kernel's end to the next step's copy.
    let (mut host_idle, mut last_kernel_end) = (0.0, None::<f64>);
    for i in 0..iters {
        let step_start = cpu;
        for (op, at, dur) in HOST_PREP_OPS {
            b.cpu_op(op, cpu + at, dur);
        }
        b.cpu_op("aten::to", cpu + 1455.0, 25.0);
        let copy_start = (cpu + 1468.0).max(gpu_free + 1.0);
        b.copy("HtoD (Pinned -> Device)", HOST_BATCH_BYTES, (cpu + 1460.0, cpu + 1466.0), DEFAULT_STREAM, (copy_start, copy_start + copy));
        if let Some(end) = last_kernel_end {
            // The GPU idles from the last kernel's end to this copy, as written.
            host_idle += b.op(0).0 - end;
        }
        b.cpu_op("aten::mm", cpu + 1482.0, 10.0);
        let k_start = (cpu + 1491.0).max(b.op(0).1 + 1.0);
        b.kernel(GEMM, (cpu + 1484.0, cpu + 1489.0), DEFAULT_STREAM, (k_start, k_start + 400.0));
        gpu_free = b.op(0).1;
        last_kernel_end = Some(gpu_free);
        cpu += 1500.0;
        b.annotation(&format!("ProfilerStep#{i}"), step_start, 1499.0);
    }
    b.runtime("cudaDeviceSynchronize", cpu, (gpu_free + 5.0).max(cpu + 3.0) - cpu);
    let mut known = b.known();
    known.sync_calls = 1;
    known.host_work_idle_us = host_idle;
    Synthetic { file: "synthetic-host-prepared-batches.json", trace: b.finish(gpu_free + 20.0), known }
}

/// The CPU thread autograd launches the backward's kernels from.
pub const BACKWARD_TID: u64 = 48290;
/// One training step's kernels: (name, the thread that launches it, µs):
/// the forward on the main thread, the backward from autograd's, the
/// optimizer's step on the main thread.
pub const TRAINING_KERNELS: [(&str, u64, f64); 5] =
    [("forward_0", PID, 500.0), ("forward_1", PID, 500.0), ("backward_1", BACKWARD_TID, 500.0), ("backward_0", BACKWARD_TID, 500.0), ("sgd_step", PID, 200.0)];

/// A training loop, `steps` steps on the default stream: each batch
/// uploaded from pageable memory (a 64 MiB `.to()` that holds the CPU for
/// the copy), the forward's kernels launched from the main thread, the
/// backward's from autograd's thread, the optimizer's step from the main
/// thread again. Each kernel's op takes the CPU `op_us` (10 µs: Python and
/// dispatch; more for a model whose ops cost the CPU more), ending in its
/// 4 µs launch 2 µs before the op's end. With 10 µs the kernels queue and
/// each upload waits for the step before (starting as its last kernel
/// ends); the GPU idles 9 µs a step, from an upload's end to the launch of
/// the kernel after it.
pub fn training_step(steps: usize, op_us: f64) -> Synthetic {
    let mut b = Builder::new();
    b.events.push(json!({"name": "thread_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": BACKWARD_TID, "args": {"name": "thread 48290 (autograd)"}}));
    let copy = copy_us(BATCH_BYTES, PAGEABLE_GBPS);
    let (mut cpu, mut gpu_free) = (T0, T0);
    for step in 0..steps {
        let step_start = cpu;
        let s = (cpu + 5.0).max(gpu_free);
        b.cpu_op("aten::to", cpu, s + copy + 3.0 - cpu);
        b.copy("HtoD (Pageable -> Device)", BATCH_BYTES, (cpu + 2.0, s + copy + 1.0), DEFAULT_STREAM, (s, s + copy));
        (gpu_free, cpu) = (s + copy, s + copy + 5.0);
        for (name, tid, dur) in TRAINING_KERNELS {
            b.tid = tid;
            let launch = cpu + op_us - 6.0;
            let k = (launch + 5.0).max(gpu_free);
            b.kernel(name, (launch, launch + 4.0), DEFAULT_STREAM, (k, k + dur));
            (gpu_free, cpu) = (k + dur, cpu + op_us);
        }
        b.tid = PID;
        b.annotation(&format!("ProfilerStep#{step}"), step_start, cpu - step_start);
    }
    b.runtime("cudaDeviceSynchronize", cpu, (gpu_free + 5.0).max(cpu + 3.0) - cpu);
    let mut known = b.known();
    known.sync_calls = 1;
    Synthetic { file: "synthetic-training-step.json", trace: b.finish(gpu_free + 20.0), known }
}

/// The side streams of the multi-stream step ([`multi_stream_tiny_ops`]):
/// four `torch.cuda.Stream()`s.
pub const SIDE_STREAMS: [u64; 4] = [21, 25, 29, 33];

/// A step of tiny ops over four streams, `steps` times: one `x + 1` on the
/// default stream, an event recorded there and waited for by each side
/// stream (the fork); on each side stream in turn, `per_stream` tiny ops
/// and an event recorded after them (`with torch.cuda.stream(s): ...;
/// e.record()`); the default stream waits for the four (the join) and
/// runs one more `x + 1`. Every kernel is issued 10 µs after the one
/// before and runs 2 µs: launch-bound, so the kernels never wait for each
/// other's streams on the GPU and the joins leave no mark on its times
/// (only the calls say where they are). Each event call takes the CPU 2 µs.
pub fn multi_stream_tiny_ops(steps: usize, per_stream: usize) -> Synthetic {
    let mut b = Builder::new();
    for s in SIDE_STREAMS {
        b.events.push(json!({"name": "thread_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": s, "args": {"name": format!("stream {s}")}}));
    }
    let mut c = T0;
    let tiny = |b: &mut Builder, c: &mut f64, stream: u64| {
        b.cpu_op("aten::add", *c, 9.0);
        b.kernel(ADD, (*c + 3.0, *c + 7.0), stream, (*c + 8.5, *c + 10.5));
        *c += 10.0;
    };
    let event = |b: &mut Builder, c: &mut f64, call: &str| {
        b.runtime(call, *c, 2.0);
        *c += 3.0;
    };
    for step in 0..steps {
        let step_start = c;
        tiny(&mut b, &mut c, DEFAULT_STREAM);
        event(&mut b, &mut c, "cudaEventRecord");
        for _ in SIDE_STREAMS {
            event(&mut b, &mut c, "cudaStreamWaitEvent");
        }
        for s in SIDE_STREAMS {
            for _ in 0..per_stream {
                tiny(&mut b, &mut c, s);
            }
            event(&mut b, &mut c, "cudaEventRecord");
        }
        for _ in SIDE_STREAMS {
            event(&mut b, &mut c, "cudaStreamWaitEvent");
        }
        tiny(&mut b, &mut c, DEFAULT_STREAM);
        b.annotation(&format!("ProfilerStep#{step}"), step_start - 0.5, c - step_start);
    }
    let end = b.op(0).1;
    b.runtime("cudaDeviceSynchronize", c, (end + 5.0).max(c + 3.0) - c);
    let mut known = b.known();
    known.sync_calls = 1;
    Synthetic { file: "synthetic-multi-stream-tiny-ops.json", trace: b.finish(end + 20.0), known }
}

/// One step's result brought back: 8 MiB.
pub const RESULT_BYTES: u64 = 8 << 20;
/// The rate the trace's pageable downloads move at, GB/s (a pageable
/// `.cpu()` of a large tensor on a busy host).
pub const PAGEABLE_D2H_GBPS: f64 = 1.5;

/// A kernel, then its result brought back with `y.cpu()`, `iters` times,
/// all on the default stream. PyTorch's `.cpu()` into pageable memory is a
/// `cudaMemcpyAsync` that holds the CPU until the copy is done (it waits
/// for the kernel first), then a `cudaStreamSynchronize`, all inside
/// `aten::to`; the CPU then launches the next step, and the GPU idles
/// from the download's end to the next kernel's start (20 µs each step).
pub fn cpu_results_each_step(iters: usize) -> Synthetic {
    let mut b = Builder::new();
    let download = copy_us(RESULT_BYTES, PAGEABLE_D2H_GBPS);
    let (mut cpu, mut gpu_free) = (T0, T0);
    let mut sync_idle = 0.0;
    for i in 0..iters {
        let step_start = cpu;
        b.cpu_op("aten::mm", cpu, 8.0);
        let k_start = (cpu + 8.0).max(gpu_free + 1.0);
        b.kernel(GEMM, (cpu + 2.0, cpu + 6.0), DEFAULT_STREAM, (k_start, k_start + KERNEL_US));
        if i > 0 {
            sync_idle += b.op(0).0 - b.op(1).1;
        }
        let to = cpu + 10.0;
        let copy_start = k_start + KERNEL_US + 2.0;
        let copy_end = copy_start + download;
        b.cpu_op("aten::to", to, copy_end + 12.0 - to);
        b.cpu_op("aten::_to_copy", to + 2.0, copy_end + 11.0 - to - 2.0);
        b.cpu_op("aten::copy_", to + 5.0, copy_end + 10.0 - to - 5.0);
        b.copy("DtoH (Device -> Pageable)", RESULT_BYTES, (to + 10.0, copy_end + 4.0), DEFAULT_STREAM, (copy_start, copy_end));
        b.runtime("cudaStreamSynchronize", copy_end + 5.0, 4.0);
        gpu_free = copy_end;
        cpu = copy_end + 12.0;
        b.annotation(&format!("ProfilerStep#{i}"), step_start, cpu - 1.0 - step_start);
    }
    b.runtime("cudaDeviceSynchronize", cpu, 3.0);
    let mut known = b.known();
    known.sync_calls = iters + 1;
    known.sync_idle_us = sync_idle;
    Synthetic { file: "synthetic-cpu-results-each-step.json", trace: b.finish(gpu_free + 20.0), known }
}

/// A GPU no recording here describes (issue 61: a stranger's trace).
pub const STRANGER_GPU: &str = "NVIDIA A100-SXM4-80GB";
/// The rate the stranger's pinned copies run at, GB/s: not the typical
/// Gen4 figure, so a price taken from them can be told from one assumed.
pub const STRANGER_PINNED_GBPS: f64 = 22.0;

/// The pageable loop ([`pageable_to_then_compute`]) as an A100 would
/// leave it ([`STRANGER_GPU`] in `deviceProperties`, compute capability
/// 8.0), with its first `pinned` copies made from pinned memory at
/// [`STRANGER_PINNED_GBPS`] (each keeps its start and ends sooner; the
/// CPU's calls stay as they were). Its [`Known`] figures are not kept:
/// the trace for pricing's tests.
pub fn on_stranger_gpu(iters: usize, pinned: usize) -> Value {
    let mut trace = pageable_to_then_compute(iters).trace;
    let props = &mut trace["deviceProperties"][0];
    (props["name"], props["computeMajor"]) = (json!(STRANGER_GPU), json!(8));
    let copies = trace["traceEvents"].as_array_mut().into_iter().flatten().filter(|e| e["cat"] == "gpu_memcpy");
    for e in copies.take(pinned) {
        let dur = ns(copy_us(BATCH_BYTES, STRANGER_PINNED_GBPS));
        (e["name"], e["dur"]) = (json!("Memcpy HtoD (Pinned -> Device)"), json!(dur));
        e["args"]["memory bandwidth (GB/s)"] = json!(BATCH_BYTES as f64 / (dur * 1e3));
    }
    trace
}

/// The programs at the sizes the tests use: lab 10's five, then the
/// host-prepared loop and the training loop.
pub fn all() -> Vec<Synthetic> {
    vec![
        pageable_to_then_compute(20),
        pinned_one_stream(20),
        double_buffered(20, false),
        double_buffered(20, true),
        tiny_ops(5000),
        host_prepared_batches(20),
        training_step(10, 10.0),
    ]
}

/// Writes the tiny-ops program's trace for `ops` ops to `path` event by
/// event, never holding it whole (the test of a trace of hundreds of MB).
pub fn write_tiny_ops(path: &std::path::Path, ops: usize) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut b = Builder::new();
    let end = T0 + 10.0 * ops as f64 + 20.0;
    let mut frame = Builder::new().finish(end);
    let head = frame["traceEvents"].take();
    frame["traceEvents"] = json!([]);
    let text = frame.to_string();
    let (before, after) = text.split_once("\"traceEvents\":[]").expect("the frame has traceEvents");
    write!(w, "{before}\"traceEvents\":[")?;
    let mut first = true;
    let mut put = |w: &mut std::io::BufWriter<std::fs::File>, e: &Value| -> std::io::Result<()> {
        if !first {
            w.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *w, e).map_err(std::io::Error::other)
    };
    for e in head.as_array().into_iter().flatten() {
        put(&mut w, e)?;
    }
    b.events.clear();
    for i in 0..ops {
        let c = T0 + 10.0 * i as f64;
        b.tiny_add(c);
        for e in b.events.drain(..) {
            put(&mut w, &e)?;
        }
        b.ops.clear();
    }
    write!(w, "]{after}")?;
    w.flush()
}

/// A recording made of the synthetic programs (no GPU ran them), written
/// to a folder of the system's temporary files and priced by nothing but
/// its own traces: the table's fixture for lab 10. The programs the
/// course runs as the double-buffered loop with its losses read once
/// (`sync_read_deferred`) and the graph (`tiny_ops_graph`) have no
/// synthetic trace of their own; the first is timed untraced only, as the
/// headline run (`--untraced-fixes`) records it, with the double-buffered
/// trace's times, the second is left out. Each untraced run is the trace's
/// window, a little faster (tracing costs), ±1%.
pub fn results() -> Recording {
    let dir = crate::testing::temp_dir("pytorch-trace-fixture");
    let programs = [
        ("pageable_then_compute", pageable_to_then_compute(20), vec![]),
        ("pinned_one_stream", pinned_one_stream(20), vec![("pageable_then_compute", "pinned")]),
        ("pinned_double_buffered", double_buffered(20, false), vec![("pageable_then_compute", "pinned + copy stream"), ("pinned_one_stream", "copy stream")]),
        ("sync_read_in_loop", double_buffered(20, true), vec![]),
        ("sync_read_deferred", double_buffered(20, false), vec![("sync_read_in_loop", "sync removed")]),
        ("tiny_ops", tiny_ops(5000), vec![]),
    ];
    let mut listed = serde_json::Map::new();
    for (name, s, fixes) in programs {
        let traced = name != "sync_read_deferred";
        let file = traced.then(|| format!("{name}.json"));
        if let Some(file) = &file {
            std::fs::write(dir.join(file), serde_json::to_string(&s.trace).expect("a trace serializes")).expect("the fixture's folder is writable");
        }
        let ms = 0.98e-3 * (s.known.window.1 - s.known.window.0);
        let fix_of: Vec<Value> = fixes.iter().map(|(p, f)| json!({"program": p, "fix": f})).collect();
        listed.insert(
            name.to_string(),
            json!({
                "what": format!("synthetic: {}", s.file), "iterations": 20, "sizes": {"batch_bytes": BATCH_BYTES},
                "untraced": {"device_ms": {"samples": [0.99 * ms, ms, 1.01 * ms]}}, "trace": file, "fix_of": fix_of
            }),
        );
    }
    let doc = json!({
        "command": "made up for tests (overlap_lab::labs::pytorch_trace::fixture)", "date": "2026-11-27 00:00 UTC", "torch": "none",
        "gpu": GPU_NAME, "driver": "580.0", "calibration": {"graph_gap_us": 0.5}, "programs": listed, "problems": []
    });
    std::fs::write(dir.join(PROGRAMS_FILE), serde_json::to_string_pretty(&doc).expect("serializes")).expect("the fixture's folder is writable");
    Recording::priced(&dir, super::prices::Prices::default()).expect("the fixture's own programs.json reads")
}
