"""Lab 10's real programs: small PyTorch loops that lose copy/compute overlap
the way learners' own code does, each beside the program that applies the fix
a diagnosis of its trace would suggest. `lab10_trace.py` (beside this file)
runs, times and traces them; `overlap-lab diagnose` reads the traces.

The copy programs: each iteration brings one batch (bfloat16, `batch_rows` x
`width`) from host memory to the GPU and computes one step on it: `blocks`
residual MLP blocks (layer norm, width -> hidden, GELU, hidden -> width, add)
and a loss (the output's mean square), kept per iteration on the GPU.

* pageable_then_compute: batches in ordinary (pageable) host memory, moved
  with `.to(device)`: a blocking copy (PyTorch synchronizes the stream after
  it), then the step. Copy and compute never overlap.
* pinned_one_stream: pinned batches, `.to(device, non_blocking=True)`, still
  on one stream: the CPU runs ahead, but each copy waits for the step before
  it in stream order. Fixes the above by "pinned".
* pinned_double_buffered: pinned batches copied on a copy stream of their own
  into two GPU buffers, one iteration ahead, with events both ways (copied:
  the step may read the buffer; consumed: the copy may overwrite it). Fixes
  both above ("pinned + copy stream", "copy stream").
* sync_read_in_loop: the double-buffered loop plus `loss.item()` each
  iteration, as a loop that logs its loss does: the CPU waits for the step,
  so the GPU runs dry while the CPU issues the next one.
* sync_read_deferred: the same loop reading all losses once, after the loop.
  Fixes the above ("sync removed").

The tiny-op programs: each iteration is an unfused momentum-SGD step over
`tiny_tensors` small tensors of `tiny_elements` float32 each, one tensor at a
time (gradient of a quadratic, momentum, update): four elementwise kernels per
tensor, thousands per iteration, each shorter than its launch.

* tiny_ops: eager, as written: the GPU idles while the CPU launches.
* tiny_ops_graph: the same step captured once in a `torch.cuda.CUDAGraph`
  and replayed each iteration. Fixes the above ("CUDA graph").

Every program is a function of (device, sizes) that sets up its data, weights,
streams (and graph) and returns a `Loop`: `reset()` restores the state a run
starts from and poisons its outputs (untimed), `run()` issues
`sizes.iterations` iterations (the window that is timed and traced), and
`outputs()` hands back what the run computed, on the CPU. Every program of a
family starts from the same inputs (one seed), so `differences` checks a fix
against the program it fixes: same outputs within a tolerance, never faster by
doing less. On `--device cpu` (a smoke run) pinning, streams, events and the
graph are left out; everything else runs.

Why these sizes: with a step as long as a pinned copy, hiding the copy
halves the loop (the largest gain overlap can give), so every fix has a
clear effect; `calibrate_hidden` sets `hidden` so on the GPU at hand. A
64 MiB batch keeps each iteration's GPU time several times the CPU's time
to issue it (about 20 PyTorch calls, 0.3 to 0.4 ms), so the copy programs
are bound by the GPU, not by launches, and a sync in the loop costs what it
does in real code: the GPU idles from the end of each step until the CPU
has issued the next one. On an H100 (2026-11-27) a pinned batch copied in
1.27 ms and the calibrated step (hidden 2048) took 1.50 ms. A first run on
an H200 with 16 MiB batches (0.34 ms of copy, a 0.36 ms step) was bound by
the CPU's issuing: the double-buffered loop with no reads ran as slow as
the one that syncs every iteration.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Sizes:
    """How big one run of a program is. The copy programs use `batch_rows` to
    `host_batches`, the tiny-op programs `tiny_tensors` and `tiny_elements`."""

    iterations: int = 40  # loop iterations in one run: the timed and traced window
    batch_rows: int = 32768  # rows (tokens) in one batch: 64 MiB
    width: int = 1024  # a row's length, the model's width
    hidden: int = 4096  # the MLP's hidden width (calibrate_hidden sets it on a GPU)
    blocks: int = 2  # MLP blocks in one step
    host_batches: int = 8  # distinct host batches the loop cycles through
    tiny_tensors: int = 512  # small tensors the tiny-op step updates one by one
    tiny_elements: int = 4096  # float32 elements in each
    seed: int = 10  # every input comes from this seed, the same in every program

    def batch_bytes(self) -> int:
        """Bytes of one batch (bfloat16)."""
        return self.batch_rows * self.width * 2

    def of_family(self, family: str) -> Dict[str, int]:
        """The sizes a program of `family` uses, by name (for the record)."""
        names = {"copy": ("iterations", "batch_rows", "width", "hidden", "blocks", "host_batches", "seed"),
                 "tiny": ("iterations", "tiny_tensors", "tiny_elements", "seed")}[family]
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}
        if family == "copy":
            out["batch_bytes"] = self.batch_bytes()
        return out


# A smoke run's sizes: every code path in a second on a CPU.
SMOKE_SIZES = Sizes(iterations=3, batch_rows=64, width=32, hidden=64, host_batches=4, tiny_tensors=16, tiny_elements=64)


@dataclass
class Loop:
    """One program, set up. Call `reset()` before each `run()`."""

    run: Callable[[], None]  # the timed and traced window: `sizes.iterations` iterations
    reset: Callable[[], None]  # back to the starting state, outputs poisoned (not timed)
    outputs: Callable[[], Dict[str, torch.Tensor]]  # what the last run computed, on the CPU


# --- the copy programs ---------------------------------------------------------


def _host_batches(sizes: Sizes, pinned: bool) -> List[torch.Tensor]:
    """`sizes.host_batches` batches in host memory, the same in every program.
    Batch k is scaled by 1 + k/2, so a loop that computes on the wrong batch
    (a missing wait) gives a loss far outside the tolerance."""
    gen = torch.Generator().manual_seed(sizes.seed)
    batches = []
    for k in range(sizes.host_batches):
        batch = (torch.randn(sizes.batch_rows, sizes.width, generator=gen) * (1 + k / 2)).to(torch.bfloat16)
        batches.append(batch.pin_memory() if pinned else batch)
    return batches


class _Mlp:
    """The compute step: `blocks` residual MLP blocks in bfloat16, the same
    weights in every program (one seed)."""

    def __init__(self, device: torch.device, sizes: Sizes):
        gen = torch.Generator().manual_seed(sizes.seed + 1)
        self.weights = []
        for _ in range(sizes.blocks):
            up = torch.randn(sizes.hidden, sizes.width, generator=gen) / math.sqrt(sizes.width)
            down = torch.randn(sizes.width, sizes.hidden, generator=gen) / math.sqrt(sizes.hidden)
            self.weights.append((up.to(device, torch.bfloat16), down.to(device, torch.bfloat16)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in self.weights:
            x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, x.shape[-1:]), up)), down)
        return x


def _loss(y: torch.Tensor) -> torch.Tensor:
    """The step's loss: the output's mean square, in float32."""
    return y.float().square().mean()


class _TrainingStep:
    """What the copy programs share: their host batches, the model, each
    iteration's loss on the GPU, the last iteration's output and, for the
    programs that read them, the losses read back to the host."""

    def __init__(self, device: torch.device, sizes: Sizes, pinned: bool, reads_losses: bool):
        self.device, self.sizes = device, sizes
        self.host = _host_batches(sizes, pinned=pinned and device.type == "cuda")
        self.mlp = _Mlp(device, sizes)
        self.losses = torch.empty(sizes.iterations, device=device)
        self.last: Optional[torch.Tensor] = None
        self.reads_losses = reads_losses
        self.reads: List[float] = []

    def batch(self, i: int) -> torch.Tensor:
        return self.host[i % len(self.host)]

    def step(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Iteration i's compute on batch x; returns its loss (on the GPU)."""
        y = self.mlp(x)
        loss = self.losses[i]
        loss.copy_(_loss(y))
        self.last = y
        return loss

    def reset(self) -> None:
        # NaN marks an iteration that never ran: it fails every comparison.
        self.losses.fill_(float("nan"))
        self.last = None
        self.reads = []

    def outputs(self) -> Dict[str, torch.Tensor]:
        # No step ran: its last output is one NaN (never written).
        last = self.last.float().cpu() if self.last is not None else torch.full((1,), float("nan"))
        out = {"losses": self.losses.cpu(), "last_output": last}
        if self.reads_losses:
            out["loss_reads"] = torch.tensor(self.reads, dtype=torch.float64)
        return out


def _one_stream(device: torch.device, sizes: Sizes, pinned: bool) -> Loop:
    """Copy then compute on the current stream, batch after batch."""
    work = _TrainingStep(device, sizes, pinned, reads_losses=False)

    def run() -> None:
        for i in range(sizes.iterations):
            # non_blocking=False from pageable memory: PyTorch waits for the copy.
            x = work.batch(i).to(device, non_blocking=pinned)
            work.step(i, x)

    return Loop(run, work.reset, work.outputs)


# Where a double-buffered loop reads its losses back to the host.
READS = ("never", "each iteration", "once at the end")


def _double_buffered(device: torch.device, sizes: Sizes, reads: str) -> Loop:
    """Pinned batches copied one iteration ahead on a copy stream into two GPU
    buffers; the steps run on the current stream. `reads` is one of READS."""
    assert reads in READS, reads
    cuda = device.type == "cuda"
    work = _TrainingStep(device, sizes, pinned=True, reads_losses=reads != "never")
    buffers = [torch.empty(sizes.batch_rows, sizes.width, dtype=torch.bfloat16, device=device) for _ in range(2)]
    copy_stream = torch.cuda.Stream(device) if cuda else None
    copied = [torch.cuda.Event() if cuda else None for _ in range(2)]  # buffer b holds its batch
    consumed = [torch.cuda.Event() if cuda else None for _ in range(2)]  # the step has read buffer b

    def prefetch(i: int) -> None:
        b = i % 2
        with torch.cuda.stream(copy_stream) if cuda else nullcontext():
            if cuda and i >= 2:
                copy_stream.wait_event(consumed[b])  # iteration i-2's step read this buffer
            buffers[b].copy_(work.batch(i), non_blocking=True)
            if cuda:
                copied[b].record(copy_stream)

    def run() -> None:
        compute = torch.cuda.current_stream(device) if cuda else None
        if cuda:
            copy_stream.wait_stream(compute)  # the buffers are free: all before this run is done
        n = sizes.iterations
        prefetch(0)
        for i in range(n):
            if i + 1 < n:
                prefetch(i + 1)
            b = i % 2
            if cuda:
                compute.wait_event(copied[b])
            loss = work.step(i, buffers[b])
            if cuda:
                consumed[b].record(compute)
            if reads == "each iteration":
                work.reads.append(loss.item())  # waits for this step: the GPU runs dry
        if reads == "once at the end":
            work.reads = work.losses.tolist()  # one wait, after the last step

    return Loop(run, work.reset, work.outputs)


def pageable_then_compute(device: torch.device, sizes: Sizes) -> Loop:
    """Pageable batches, .to(device) (a blocking copy), then the step."""
    return _one_stream(device, sizes, pinned=False)


def pinned_one_stream(device: torch.device, sizes: Sizes) -> Loop:
    """Pinned batches, .to(device, non_blocking=True), copy and step on one stream."""
    return _one_stream(device, sizes, pinned=True)


def pinned_double_buffered(device: torch.device, sizes: Sizes) -> Loop:
    """Pinned batches copied one ahead on a copy stream into two GPU buffers, events both ways."""
    return _double_buffered(device, sizes, reads="never")


def sync_read_in_loop(device: torch.device, sizes: Sizes) -> Loop:
    """The double-buffered loop plus loss.item() each iteration (drains the pipeline)."""
    return _double_buffered(device, sizes, reads="each iteration")


def sync_read_deferred(device: torch.device, sizes: Sizes) -> Loop:
    """The double-buffered loop, its losses read once after the loop."""
    return _double_buffered(device, sizes, reads="once at the end")


# --- the tiny-op programs ------------------------------------------------------

MOMENTUM, LEARNING_RATE = 0.9, 0.05


class _TinyOptimizerStep:
    """An unfused momentum-SGD step on `tiny_tensors` small parameter tensors
    pulled towards fixed targets (loss 0.5 |p - t|^2, gradient p - t): four
    elementwise kernels per tensor. The tensors are views of one flat buffer
    each, so reset and outputs are one copy each."""

    def __init__(self, device: torch.device, sizes: Sizes):
        gen = torch.Generator().manual_seed(sizes.seed + 2)
        shape = (sizes.tiny_tensors, sizes.tiny_elements)
        self.start = torch.randn(shape, generator=gen).to(device)
        self.targets_all = torch.randn(shape, generator=gen).to(device)
        self.params_all = self.start.clone()
        self.momenta_all = torch.zeros_like(self.start)
        self.params = list(self.params_all.unbind(0))
        self.momenta = list(self.momenta_all.unbind(0))
        self.targets = list(self.targets_all.unbind(0))

    def step(self) -> None:
        for p, m, t in zip(self.params, self.momenta, self.targets):
            g = p - t
            m.mul_(MOMENTUM).add_(g)
            p.add_(m, alpha=-LEARNING_RATE)

    def reset(self) -> None:
        self.params_all.copy_(self.start)
        self.momenta_all.zero_()

    def outputs(self) -> Dict[str, torch.Tensor]:
        return {"params": self.params_all.cpu(), "momenta": self.momenta_all.cpu()}


def tiny_ops(device: torch.device, sizes: Sizes) -> Loop:
    """Thousands of tiny elementwise kernels per iteration, launched one by one (issue-bound)."""
    opt = _TinyOptimizerStep(device, sizes)

    def run() -> None:
        for _ in range(sizes.iterations):
            opt.step()

    return Loop(run, opt.reset, opt.outputs)


def tiny_ops_graph(device: torch.device, sizes: Sizes) -> Loop:
    """The same step captured once in a CUDA graph and replayed each iteration."""
    opt = _TinyOptimizerStep(device, sizes)
    if device.type == "cuda":
        # PyTorch's recipe: warm up on a side stream, then capture. The warm-up
        # moves the parameters; reset() puts them back before every run.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.step()
        replay = graph.replay
    else:
        replay = opt.step  # a smoke run: no graphs on a CPU

    def run() -> None:
        for _ in range(sizes.iterations):
            replay()

    return Loop(run, opt.reset, opt.outputs)


# --- the table -----------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """A program, and what its trace must show (`lab10_trace` checks it)."""

    build: Callable[[torch.device, Sizes], Loop]
    family: str  # "copy" or "tiny": a family shares sizes and iterations
    fix_of: Tuple[Tuple[str, str], ...] = ()  # (the program it fixes, the fix's name)
    h2d_from: Optional[str] = None  # its host-to-device copies' source memory: "Pageable" or "Pinned"
    copy_stream: Optional[bool] = None  # whether those copies run on a stream no kernel runs on
    reads: str = "never"  # where it reads losses to the host (one of READS)
    graph: bool = False  # whether each iteration is one CUDA graph launch

    @property
    def name(self) -> str:
        return self.build.__name__

    @property
    def what(self) -> str:
        return (self.build.__doc__ or "").strip()

    def device_to_host_reads(self, sizes: Sizes) -> int:
        """Device-to-host copies in one run."""
        return {"never": 0, "each iteration": sizes.iterations, "once at the end": 1}[self.reads]


PROGRAMS: Dict[str, Program] = {p.name: p for p in (
    Program(pageable_then_compute, "copy", h2d_from="Pageable", copy_stream=False),
    Program(pinned_one_stream, "copy", fix_of=(("pageable_then_compute", "pinned"),),
            h2d_from="Pinned", copy_stream=False),
    Program(pinned_double_buffered, "copy",
            fix_of=(("pageable_then_compute", "pinned + copy stream"), ("pinned_one_stream", "copy stream")),
            h2d_from="Pinned", copy_stream=True),
    Program(sync_read_in_loop, "copy", h2d_from="Pinned", copy_stream=True, reads="each iteration"),
    Program(sync_read_deferred, "copy", fix_of=(("sync_read_in_loop", "sync removed"),),
            h2d_from="Pinned", copy_stream=True, reads="once at the end"),
    Program(tiny_ops, "tiny"),
    Program(tiny_ops_graph, "tiny", fix_of=(("tiny_ops", "CUDA graph"),), graph=True),
)}

# Iterations of one run by family: 40 of copies and steps (15 to 100 ms), and 8
# tiny-op steps (16k kernels: a trace of a few MiB gzipped).
ITERATIONS = {"copy": 40, "tiny": 8}

for _p in PROGRAMS.values():
    for _before, _ in _p.fix_of:
        # A fix is compared with the time of what it fixes: the same family, so the same sizes.
        assert PROGRAMS[_before].family == _p.family, (_p.name, _before)


def related(names: List[str]) -> List[Tuple[str, str, str]]:
    """Every (program, the program it fixes, the fix) that involves one of `names`."""
    return [(fix.name, before, how) for fix in PROGRAMS.values() for before, how in fix.fix_of
            if fix.name in names or before in names]


# --- checking a fix against what it fixes --------------------------------------

# (relative, absolute) tolerance of each output. The fixes run the same kernels
# on the same data, so their outputs agree to rounding; a wrong or skipped batch
# moves a loss by tens of percent.
TOLERANCES = {"losses": (1e-3, 1e-6), "loss_reads": (1e-3, 1e-6), "last_output": (2e-2, 2e-2),
              "params": (1e-5, 1e-6), "momenta": (1e-5, 1e-6)}


def never_written(outputs: Dict[str, torch.Tensor]) -> List[str]:
    """The outputs a run left as reset() poisoned them (NaN): iterations that never ran."""
    out = []
    for k, v in outputs.items():
        nans = int((v != v).sum())  # NaN is the one value not equal to itself
        if nans:
            out.append(f"{k}: {nans} of {v.numel()} never written")
    return out


def differences(expected: Dict[str, torch.Tensor], got: Dict[str, torch.Tensor]) -> List[str]:
    """How `got` differs from `expected`, output by output (outputs both
    have); empty when they agree. A NaN (an iteration never run) never agrees."""
    shared = [k for k in expected if k in got]
    if not shared:
        return ["no output to compare"]
    out = []
    for k in shared:
        a, b = expected[k].double().flatten(), got[k].double().flatten()
        if a.shape != b.shape:
            out.append(f"{k}: {b.numel()} values, not {a.numel()}")
            continue
        rtol, atol = TOLERANCES[k]
        wrong = ~torch.isclose(b, a, rtol=rtol, atol=atol)
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0])
            out.append(f"{k}: {int(wrong.sum())} of {a.numel()} differ (first at index {i}: {float(b[i]):.6g}, not {float(a[i]):.6g})")
    return out


# --- sizing the step on the GPU at hand ----------------------------------------


def _median_ms(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median GPU time of `fn` by CUDA events on the current stream."""
    times = []
    for k in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if k >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


HIDDEN_GRAIN, HIDDEN_RANGE = 256, (256, 32768)


def calibrate_hidden(device: torch.device, sizes: Sizes) -> Tuple[Sizes, dict]:
    """`sizes` with `hidden` set so one step (the MLP and the loss) takes about
    as long on this GPU as one pinned batch copy, and what was measured. The
    step's time grows with `hidden` nearly in proportion (its GEMMs and GELU);
    up to three rounds of measure-and-scale settle it within a grain."""
    host = _host_batches(replace(sizes, host_batches=1), pinned=True)[0]
    x = torch.empty(host.shape, dtype=host.dtype, device=device)
    copy_ms = _median_ms(lambda: x.copy_(host, non_blocking=True))
    hidden, tried = sizes.hidden, []
    for round_ in range(3):
        mlp = _Mlp(device, replace(sizes, hidden=hidden))
        step_ms = _median_ms(lambda: _loss(mlp(x)))
        tried.append({"hidden": hidden, "step_ms": step_ms})
        scaled = round(hidden * copy_ms / step_ms / HIDDEN_GRAIN) * HIDDEN_GRAIN
        scaled = min(max(scaled, HIDDEN_RANGE[0]), HIDDEN_RANGE[1])
        if abs(scaled - hidden) <= HIDDEN_GRAIN or round_ == 2:
            break  # the hidden width kept is always one that was measured
        hidden = scaled
    return replace(sizes, hidden=hidden), {
        "pinned_copy_ms": copy_ms, "batch_bytes": sizes.batch_bytes(), "tried": tried,
        "hidden": hidden, "step_over_copy": tried[-1]["step_ms"] / copy_ms}


# --- the GPU's gap between a graph's kernels -----------------------------------

GRAPH_GAP_KERNELS, GRAPH_GAP_REPLAYS, GRAPH_GAP_TENSORS = 1024, 5, 8


def _graph_gap_step(xs: list) -> None:
    """GRAPH_GAP_KERNELS small elementwise kernels of four kinds (add, mul,
    addcmul, clamp) over GRAPH_GAP_TENSORS tensors in turn: a graph's nodes
    as a graph of real work has them, each kernel not the one before it
    (the clamp keeps every value finite, so replays compare exactly). It is
    not lab 10's tiny_ops step (whose fix this prices)."""
    for k in range(GRAPH_GAP_KERNELS):
        x, y = xs[k % len(xs)], xs[(k + 1) % len(xs)]
        kind = (k // len(xs)) % 4
        if kind == 0:
            x.add_(y, alpha=0.5)
        elif kind == 1:
            x.mul_(0.5)
        elif kind == 2:
            x.addcmul_(y, y, value=0.125)
        else:
            x.clamp_(-4.0, 4.0)


def calibrate_graph_gap(device: torch.device) -> dict:
    """The GPU's gap between two kernels of one CUDA graph, in µs: what
    `overlap-lab diagnose` adds after each kernel when it prices a CUDA
    graph (the trace of an eager program cannot show it). A graph of
    GRAPH_GAP_KERNELS small kernels of four kinds (`_graph_gap_step`),
    replayed GRAPH_GAP_REPLAYS times under torch.profiler; per replay, its
    window less its kernels' busy time over the gaps between them (a mean:
    the rare long gap costs a graph its time as the common short one does),
    the median over the replays. Checked: the graph's results are the eager
    step's, bit for bit."""
    from torch.profiler import ProfilerActivity, profile  # only where a GPU calibrates

    gen = torch.Generator(device="cpu").manual_seed(7)
    start = [torch.rand(4096, generator=gen) for _ in range(GRAPH_GAP_TENSORS)]
    xs = [t.to(device) for t in start]
    eager = [t.to(device) for t in start]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        _graph_gap_step([t.clone() for t in xs])  # warm-up, on copies
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _graph_gap_step(xs)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(GRAPH_GAP_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    for _ in range(1 + GRAPH_GAP_REPLAYS):
        _graph_gap_step(eager)
    torch.cuda.synchronize()
    if not all(torch.equal(a, b) for a, b in zip(xs, eager)):
        raise RuntimeError("the graph's results are not the eager step's")
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    kernels = sorted((float(e["ts"]), float(e["dur"])) for e in events if isinstance(e, dict) and e.get("cat") == "kernel")
    if len(kernels) != GRAPH_GAP_KERNELS * GRAPH_GAP_REPLAYS:
        raise RuntimeError(f"{len(kernels)} kernels traced, not {GRAPH_GAP_KERNELS * GRAPH_GAP_REPLAYS}")
    per_replay = []
    for r in range(GRAPH_GAP_REPLAYS):
        ks = kernels[r * GRAPH_GAP_KERNELS:(r + 1) * GRAPH_GAP_KERNELS]
        window = ks[-1][0] + ks[-1][1] - ks[0][0]
        per_replay.append((window - sum(d for _, d in ks)) / (len(ks) - 1))
    return {"graph_gap_us": statistics.median(per_replay), "graph_gap_kernels": len(kernels),
            "graph_gap_kernel_us": statistics.median(d for _, d in kernels),
            "graph_gap_per_replay_us": per_replay}
