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
import time
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
    tiny_streams: int = 4  # streams the multi-stream tiny-op step spreads its tensors over
    samples: int = 128  # samples in one batch the CPU builds (the loader and training programs)
    sample_tokens: int = 16  # rows of one sample: each CPU op works on sample_tokens x width values, one thread's work
    loader_hidden: int = 4096  # the loader programs' MLP hidden width (calibrate_loader sets it on a GPU)
    loader_blocks: int = 8  # MLP blocks in one loader step
    training_blocks: int = 2  # blocks of the training loop's model (few: its step's launches stay well within its GPU time)
    training_hidden: int = 4096  # the training loop's hidden width (calibrate_loader sets it)
    workers: int = 4  # the DataLoader's worker processes in the fixed loader programs
    result_rows: int = 2048  # rows of one step's result the download programs bring back: 4 MiB
    download_hidden: int = 4096  # the download programs' MLP hidden width (calibrate_download sets it)
    download_blocks: int = 4  # MLP blocks in one download step (few launches, so a step's GPU time, not its launches, bounds the fixed loop)
    seed: int = 10  # every input comes from this seed, the same in every program

    def batch_bytes(self) -> int:
        """Bytes of one batch (bfloat16)."""
        return self.batch_rows * self.width * 2

    def loader_batch_bytes(self) -> int:
        """Bytes of one batch a loader program uploads (bfloat16)."""
        return self.samples * self.sample_tokens * self.width * 2

    def result_bytes(self) -> int:
        """Bytes of one step's result a download program brings back (bfloat16)."""
        return self.result_rows * self.width * 2

    def of_family(self, family: str) -> Dict[str, int]:
        """The sizes a program of `family` uses, by name (for the record).
        `batch_bytes` is what one iteration uploads, `result_bytes` what it downloads."""
        names = {"copy": ("iterations", "batch_rows", "width", "hidden", "blocks", "host_batches", "seed"),
                 "tiny": ("iterations", "tiny_tensors", "tiny_elements", "tiny_streams", "seed"),
                 "loader": ("iterations", "samples", "sample_tokens", "width", "loader_hidden", "loader_blocks", "workers", "seed"),
                 "training": ("iterations", "samples", "sample_tokens", "width", "training_hidden", "training_blocks", "workers", "seed"),
                 "download": ("iterations", "result_rows", "width", "download_hidden", "download_blocks", "host_batches", "seed")}[family]
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}
        if family == "copy":
            out["batch_bytes"] = self.batch_bytes()
        if family in ("loader", "training"):
            out["batch_bytes"] = self.loader_batch_bytes()
        if family == "download":
            out["result_bytes"] = self.result_bytes()
        return out


# A smoke run's sizes: every code path in a second on a CPU.
SMOKE_SIZES = Sizes(iterations=3, batch_rows=64, width=32, hidden=64, host_batches=4, tiny_tensors=16, tiny_elements=64,
                    samples=4, sample_tokens=4, loader_hidden=64, loader_blocks=2, training_blocks=1, training_hidden=64, workers=2, result_rows=64, download_hidden=64,
                    download_blocks=1)


@dataclass
class Loop:
    """One program, set up. Call `reset()` before each `run()`."""

    run: Callable[[], None]  # the timed and traced window: `sizes.iterations` iterations
    reset: Callable[[], None]  # back to the starting state, outputs poisoned (not timed)
    outputs: Callable[[], Dict[str, torch.Tensor]]  # what the last run computed, on the CPU


# --- the copy programs ---------------------------------------------------------


def _host_batches(sizes: Sizes, pinned: bool, device: torch.device) -> List[torch.Tensor]:
    """`sizes.host_batches` batches in host memory, the same in every program.
    Batch k is scaled by 1 + k/2, so a loop that computes on the wrong batch
    (a missing wait) gives a loss far outside the tolerance. Drawn on
    `device` by its seeded generator and brought to the host (a CPU draws
    512 MiB of normals in about 2 s, twice a program: its untraced and its
    traced set-up; a GPU in milliseconds)."""
    gen = torch.Generator(device).manual_seed(sizes.seed)
    batches = []
    for k in range(sizes.host_batches):
        drawn = torch.randn(sizes.batch_rows, sizes.width, generator=gen, device=device)
        batch = (drawn * (1 + k / 2)).to(torch.bfloat16).cpu()
        batches.append(batch.pin_memory() if pinned else batch)
    return batches


class _Mlp:
    """The compute step: `blocks` residual MLP blocks in bfloat16 (by
    default the copy programs' `sizes.hidden` and `sizes.blocks`), the same
    weights in every program of a family (one seed)."""

    def __init__(self, device: torch.device, sizes: Sizes, hidden: Optional[int] = None, blocks: Optional[int] = None):
        hidden, blocks = hidden or sizes.hidden, blocks or sizes.blocks
        gen = torch.Generator().manual_seed(sizes.seed + 1)
        self.weights = []
        for _ in range(blocks):
            up = torch.randn(hidden, sizes.width, generator=gen) / math.sqrt(sizes.width)
            down = torch.randn(sizes.width, hidden, generator=gen) / math.sqrt(hidden)
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
        self.host = _host_batches(sizes, pinned=pinned and device.type == "cuda", device=device)
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

    def step(self, share: Optional[List[int]] = None) -> None:
        """One step over every tensor, or over the tensors numbered in `share`."""
        for k in share if share is not None else range(len(self.params)):
            p, m, t = self.params[k], self.momenta[k], self.targets[k]
            g = p - t
            m.mul_(MOMENTUM).add_(g)
            p.add_(m, alpha=-LEARNING_RATE)

    def reset(self) -> None:
        self.params_all.copy_(self.start)
        self.momenta_all.zero_()

    def outputs(self) -> Dict[str, torch.Tensor]:
        return {"params": self.params_all.cpu(), "momenta": self.momenta_all.cpu()}


def _tiny_loop(opt: "_TinyOptimizerStep", step: Callable[[], None], sizes: Sizes) -> Loop:
    """A tiny-op program: `step` run `sizes.iterations` times, over `opt`'s tensors."""

    def run() -> None:
        for _ in range(sizes.iterations):
            step()

    return Loop(run, opt.reset, opt.outputs)


def tiny_ops(device: torch.device, sizes: Sizes) -> Loop:
    """Thousands of tiny elementwise kernels per iteration, launched one by one (issue-bound)."""
    opt = _TinyOptimizerStep(device, sizes)
    return _tiny_loop(opt, opt.step, sizes)


def tiny_ops_graph(device: torch.device, sizes: Sizes) -> Loop:
    """The same step captured once in a CUDA graph and replayed each iteration."""
    opt = _TinyOptimizerStep(device, sizes)
    return _tiny_loop(opt, _captured(device, opt.step), sizes)


def tiny_ops_streams(device: torch.device, sizes: Sizes) -> Loop:
    """The tiny-op step spread over streams, forked and joined by events (issue-bound still)."""
    opt = _TinyOptimizerStep(device, sizes)
    return _tiny_loop(opt, _on_streams(device, sizes, opt), sizes)


def tiny_ops_streams_graph(device: torch.device, sizes: Sizes) -> Loop:
    """The multi-stream step captured once in a CUDA graph (its fork and join kept) and replayed."""
    opt = _TinyOptimizerStep(device, sizes)
    return _tiny_loop(opt, _captured(device, _on_streams(device, sizes, opt)), sizes)


def _on_streams(device: torch.device, sizes: Sizes, opt: "_TinyOptimizerStep") -> Callable[[], None]:
    """`opt`'s step with its tensors dealt out over `sizes.tiny_streams`
    side streams: each side stream waits for the current stream's event
    (the fork), updates its share, and records an event the current stream
    waits for (the join). On a CPU, the plain step."""
    if device.type != "cuda":
        return opt.step
    n = sizes.tiny_streams
    sides = [torch.cuda.Stream(device) for _ in range(n)]
    forked, joined = torch.cuda.Event(), [torch.cuda.Event() for _ in range(n)]
    shares = [list(range(k, len(opt.params), n)) for k in range(n)]

    def step() -> None:
        main = torch.cuda.current_stream(device)
        forked.record(main)
        for side, share, done in zip(sides, shares, joined):
            side.wait_event(forked)
            with torch.cuda.stream(side):
                opt.step(share)
                done.record(side)
        for done in joined:
            main.wait_event(done)

    return step


def _captured(device: torch.device, step: Callable[[], None]) -> Callable[[], None]:
    """`step` captured once in a CUDA graph, as PyTorch's recipe does it
    (warm up on a side stream, then capture); returns the graph's replay.
    The warm-up moves the parameters: a program's reset() puts them back
    before every run. On a CPU (a smoke run: no graphs), `step` itself."""
    if device.type != "cuda":
        return step

    def warm_up() -> None:
        for _ in range(3):
            step()

    return _graph_of(device, step, warm_up)


def _graph_of(device: torch.device, step: Callable[[], None], warm_up: Callable[[], None]) -> Callable[[], None]:
    """PyTorch's recipe for a CUDA graph: `warm_up` run on a side stream,
    then `step` captured; returns the graph's replay (which keeps the graph)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        warm_up()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


# --- the loader programs: batches the CPU builds ---------------------------------
#
# Each sample is built on the CPU from raw bytes, as a data pipeline decodes
# and augments its records: a (sample_tokens x width) uint8 record turned to
# float, normalized per feature, scaled by the sample's augmentation gain,
# clipped and cast to bfloat16. Each op works on sample_tokens x width
# values (16k by default), below PyTorch's grain for splitting an op over
# threads, so a sample is one thread's work in the loop's own process and
# in a DataLoader worker alike. A batch is `samples` samples stacked (what a
# DataLoader's default collate does).


class _Records(torch.utils.data.Dataset):
    """`iterations x samples` samples, each built on the CPU when asked for
    (`__getitem__`), the same in every program (one seed)."""

    POOL = 256  # distinct raw records, cycled

    def __init__(self, sizes: Sizes):
        gen = torch.Generator().manual_seed(sizes.seed + 3)
        self.sizes = sizes
        self.raw = torch.randint(0, 256, (self.POOL, sizes.sample_tokens, sizes.width), generator=gen, dtype=torch.uint8)
        self.mean = self.raw.float().mean(dim=(0, 1))
        self.std = self.raw.float().std(dim=(0, 1))
        # Each sample's gain: a loop that uploads the wrong batch moves the loss far.
        self.gains = 0.5 + torch.rand(sizes.iterations * sizes.samples, generator=gen)

    def __len__(self) -> int:
        return self.sizes.iterations * self.sizes.samples

    def __getitem__(self, j: int) -> torch.Tensor:
        x = self.raw[j % self.POOL].float()
        x = (x - self.mean) / self.std
        x = x * self.gains[j]
        return x.clamp_(-3.0, 3.0).to(torch.bfloat16)

    def batch(self, i: int) -> torch.Tensor:
        """Batch i, built here (the loop's own process), as the default collate stacks it."""
        n = self.sizes.samples
        return torch.stack([self[i * n + k] for k in range(n)])


def _fed_by_loader(work, device: torch.device, sizes: Sizes, workers: int) -> Loop:
    """`work` (its `records`, `step(i, x)`, `reset`, `outputs`) fed by a
    DataLoader with `workers` workers: with workers, its batches pinned and
    uploaded with non_blocking=True (on a GPU); with none, pageable and
    uploaded by a blocking copy, PyTorch's defaults."""
    pinned = workers > 0 and device.type == "cuda"
    loader = _loader(work.records, sizes, workers, pinned=pinned)

    def run() -> None:
        for i, x in enumerate(loader):
            work.step(i, x.to(device, non_blocking=pinned))

    return Loop(run, work.reset, work.outputs)


def _loader(records: _Records, sizes: Sizes, workers: int, pinned: bool) -> torch.utils.data.DataLoader:
    """A DataLoader over `records` in order: `workers` processes (0: built in
    the loop's own process), batches in pinned memory where `pinned`. Its
    workers persist from run to run (started in the first, a warm-up run)."""
    return torch.utils.data.DataLoader(records, batch_size=sizes.samples, shuffle=False, num_workers=workers,
                                       pin_memory=pinned, persistent_workers=workers > 0)


class _LoaderInference:
    """What the inference loader programs share: the model (the MLP, the
    loader's width and blocks), each iteration's loss on the GPU and the
    last iteration's output."""

    def __init__(self, device: torch.device, sizes: Sizes):
        self.device, self.sizes = device, sizes
        self.records = _Records(sizes)
        self.mlp = _Mlp(device, sizes, sizes.loader_hidden, sizes.loader_blocks)
        self.losses = torch.empty(sizes.iterations, device=device)
        self.last: Optional[torch.Tensor] = None

    def step(self, i: int, x: torch.Tensor) -> None:
        y = self.mlp(x.view(-1, self.sizes.width))
        self.losses[i].copy_(_loss(y))
        self.last = y

    def reset(self) -> None:
        self.losses.fill_(float("nan"))
        self.last = None

    def outputs(self) -> Dict[str, torch.Tensor]:
        last = self.last.float().cpu() if self.last is not None else torch.full((1,), float("nan"))
        return {"losses": self.losses.cpu(), "last_output": last}


def cpu_prepared_batches(device: torch.device, sizes: Sizes) -> Loop:
    """Each batch built on the CPU in the loop, then .to(device) (pageable) and the step: the GPU waits for the CPU."""
    work = _LoaderInference(device, sizes)

    def run() -> None:
        for i in range(sizes.iterations):
            x = work.records.batch(i).to(device)
            work.step(i, x)

    return Loop(run, work.reset, work.outputs)


def dataloader_workers_pinned(device: torch.device, sizes: Sizes) -> Loop:
    """The same batches from a DataLoader with worker processes and pin_memory, uploaded with non_blocking=True."""
    return _fed_by_loader(_LoaderInference(device, sizes), device, sizes, sizes.workers)


# --- the training loop ---------------------------------------------------------
#
# A small real training loop: a model (the loader programs' MLP shape, as
# torch.nn modules in float32 under bfloat16 autocast), AdamW, and a
# DataLoader over the loader programs' records; the target of each sample
# is a fixed "teacher" map of it, computed on the GPU. The backward pass's
# kernels are launched from autograd's own thread.


class _Training:
    """The model, its optimizer and the teacher, with the starting state a
    run resets to, each step's loss and the last step's output."""

    def __init__(self, device: torch.device, sizes: Sizes):
        torch.manual_seed(sizes.seed + 4)
        w, h = sizes.width, sizes.training_hidden
        blocks = []
        for _ in range(sizes.training_blocks):
            blocks += [torch.nn.LayerNorm(w), torch.nn.Linear(w, h), torch.nn.GELU(), torch.nn.Linear(h, w)]
        self.model = torch.nn.Sequential(*blocks).to(device)
        self.teacher = (torch.randn(w, w) / math.sqrt(w)).to(device, torch.bfloat16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.start = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.device, self.sizes = device, sizes
        self.records = _Records(sizes)
        self.losses = torch.empty(sizes.iterations, device=device)

    def step(self, i: int, x: torch.Tensor) -> None:
        x = x.view(-1, self.sizes.width)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            target = x @ self.teacher
            y = self.model(x)
            loss = F.mse_loss(y.float(), target.float())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.losses[i].copy_(loss.detach())

    def reset(self) -> None:
        self.model.train()
        self.model.load_state_dict(self.start)
        self.optimizer.state.clear()  # AdamW starts again from no moments
        self.losses.fill_(float("nan"))

    def outputs(self) -> Dict[str, torch.Tensor]:
        params = torch.cat([p.detach().float().flatten().cpu() for p in self.model.parameters()])
        return {"losses": self.losses.cpu(), "trained_params": params}


def training_loop(device: torch.device, sizes: Sizes) -> Loop:
    """A training loop (forward, backward, AdamW) fed by a DataLoader with no workers: each batch built on the CPU in turn."""
    return _fed_by_loader(_Training(device, sizes), device, sizes, 0)


def training_loop_workers_pinned(device: torch.device, sizes: Sizes) -> Loop:
    """The same training loop fed by a DataLoader with worker processes and pin_memory, uploads non_blocking."""
    return _fed_by_loader(_Training(device, sizes), device, sizes, sizes.workers)


# --- the download programs: results brought back each step -----------------------
#
# Each iteration computes a step (the MLP, `download_blocks` blocks
# `download_hidden` wide, longer than the host's read: `calibrate_download`) on a batch
# already on the GPU and brings its whole result (result_rows x width
# bfloat16) back to the host, where the loop reads it: the sum of its
# values, as a metric or a writer would touch every value.


class _Results:
    """What the download programs share: their GPU batches, the model, and
    the sums the host read of each step's result."""

    def __init__(self, device: torch.device, sizes: Sizes):
        gen = torch.Generator().manual_seed(sizes.seed + 5)
        self.batches = [(torch.randn(sizes.result_rows, sizes.width, generator=gen) * (1 + k / 2)).to(device, torch.bfloat16)
                        for k in range(sizes.host_batches)]
        self.mlp = _Mlp(device, sizes, sizes.download_hidden, sizes.download_blocks)
        self.sums: List[float] = []
        self.last: Optional[torch.Tensor] = None

    def step(self, i: int) -> torch.Tensor:
        return self.mlp(self.batches[i % len(self.batches)])

    def read(self, host: torch.Tensor) -> None:
        """The host reads one step's result: the sum of its values."""
        self.sums.append(float(host.sum(dtype=torch.float32)))
        self.last = host

    def reset(self) -> None:
        self.sums, self.last = [], None

    def outputs(self) -> Dict[str, torch.Tensor]:
        last = self.last.float().clone() if self.last is not None else torch.full((1,), float("nan"))
        return {"result_sums": torch.tensor(self.sums, dtype=torch.float64), "last_result": last}


def results_cpu_each_step(device: torch.device, sizes: Sizes) -> Loop:
    """Each step's result brought back with y.cpu() (a pageable download the CPU waits for), then read."""
    work = _Results(device, sizes)

    def run() -> None:
        for i in range(sizes.iterations):
            work.read(work.step(i).cpu())

    return Loop(run, work.reset, work.outputs)


def results_pinned_read_late(device: torch.device, sizes: Sizes) -> Loop:
    """Results copied into two pinned buffers on a download stream, each read a step late."""
    work = _Results(device, sizes)
    cuda = device.type == "cuda"
    if not cuda:  # a smoke run: no streams, events or pinned memory
        return results_cpu_each_step(device, sizes)
    shape = (sizes.result_rows, sizes.width)
    pinned = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=True) for _ in range(2)]
    results = [None, None]  # each step's result on the GPU, kept until its download is done
    download = torch.cuda.Stream(device)
    computed = [torch.cuda.Event() for _ in range(2)]  # step i's result is ready
    copied = [torch.cuda.Event() for _ in range(2)]  # step i's result is in pinned[i % 2]

    def run() -> None:
        compute = torch.cuda.current_stream(device)
        download.wait_stream(compute)
        n = sizes.iterations
        for i in range(n + 1):
            if i < n:
                b = i % 2
                results[b] = work.step(i)
                computed[b].record(compute)
                with torch.cuda.stream(download):
                    download.wait_event(computed[b])
                    pinned[b].copy_(results[b], non_blocking=True)
                    results[b].record_stream(download)  # the allocator keeps it until the copy is done
                    copied[b].record(download)
            if i >= 1:
                b = (i - 1) % 2
                copied[b].synchronize()  # step i-1's result is home: read it while step i runs
                work.read(pinned[b])
        compute.wait_stream(download)  # the run's end (the timing's event) follows the last download

    return Loop(run, work.reset, work.outputs)


# --- the table -----------------------------------------------------------------


# The fix a DataLoader with workers and pin_memory makes, as the what-if
# names it for its default of 4 workers (`Sizes.workers`).
PREPARED_AHEAD_PINNED = "pinned + prepare the next batch ahead (4 workers)"


# The families whose programs the CPU's own work bounds (each batch built
# on the CPU, by the loop or by a DataLoader's workers): `lab10_trace`
# times and traces them in the host's fast state (`HostState`); the others
# it probes around each run, and runs whatever the state.
HOST_BOUND_FAMILIES = ("loader", "training")


@dataclass(frozen=True)
class Program:
    """A program, and what its trace must show (`lab10_trace` checks it)."""

    build: Callable[[torch.device, Sizes], Loop]
    family: str  # "copy", "tiny", "loader", "training" or "download": a family shares sizes, iterations and a calibration
    fix_of: Tuple[Tuple[str, str], ...] = ()  # (the program it fixes, the fix's name)
    h2d_from: Optional[str] = None  # its host-to-device copies' source memory: "Pageable" or "Pinned"
    copy_stream: Optional[bool] = None  # whether those copies run on a stream no kernel runs on
    reads: str = "never"  # where it reads losses (or results) to the host (one of READS)
    d2h_from: Optional[str] = None  # its device-to-host copies' destination memory: "Pageable" or "Pinned"
    graph: bool = False  # whether each iteration is one CUDA graph launch
    streams: int = 1  # the fewest streams its kernels run on

    @property
    def name(self) -> str:
        return self.build.__name__

    @property
    def what(self) -> str:
        return (self.build.__doc__ or "").strip()

    @property
    def host_bound(self) -> bool:
        return self.family in HOST_BOUND_FAMILIES

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
    Program(tiny_ops_streams, "tiny", streams=4),
    Program(tiny_ops_streams_graph, "tiny", fix_of=(("tiny_ops_streams", "CUDA graph"),), graph=True, streams=4),
    Program(cpu_prepared_batches, "loader", h2d_from="Pageable", copy_stream=False),
    Program(dataloader_workers_pinned, "loader", fix_of=(("cpu_prepared_batches", PREPARED_AHEAD_PINNED),),
            h2d_from="Pinned", copy_stream=False),
    Program(training_loop, "training", h2d_from="Pageable", copy_stream=False),
    Program(training_loop_workers_pinned, "training", fix_of=(("training_loop", PREPARED_AHEAD_PINNED),),
            h2d_from="Pinned", copy_stream=False),
    Program(results_cpu_each_step, "download", reads="each iteration", d2h_from="Pageable"),
    Program(results_pinned_read_late, "download", fix_of=(("results_cpu_each_step", "pinned + download stream + read a step late"),),
            reads="each iteration", d2h_from="Pinned", streams=1),
)}

# Iterations of one run by family: 40 of copies and steps (15 to 100 ms), 8
# tiny-op steps (16k kernels: a trace of a few MiB gzipped), 40 batches or
# results of the others.
ITERATIONS = {"copy": 40, "tiny": 8, "loader": 40, "training": 40, "download": 20}

assert PREPARED_AHEAD_PINNED.endswith(f"({Sizes().workers} workers)")
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
# A training loop's parameters after 40 AdamW steps in bfloat16 autocast
# agree less closely (cuBLAS may split a GEMM differently from run to run),
# a skipped or wrong batch still moves its losses far.
TOLERANCES = {"losses": (1e-3, 1e-6), "loss_reads": (1e-3, 1e-6), "last_output": (2e-2, 2e-2),
              "params": (1e-5, 1e-6), "momenta": (1e-5, 1e-6), "trained_params": (2e-2, 1e-4),
              "result_sums": (1e-3, 1e-3), "last_result": (2e-2, 2e-2)}


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


HIDDEN_GRAIN, HIDDEN_RANGE = 256, (256, 65536)


def _fit_hidden(hidden: int, step_ms_of: Callable[[int], float], target_ms: float) -> Tuple[int, list]:
    """The hidden width, from `hidden`, whose step takes about `target_ms`
    (`step_ms_of(hidden)` measures one), and every width tried. A step's
    time grows with its hidden width nearly in proportion (its GEMMs and
    GELU); up to three rounds of measure-and-scale settle it within a
    grain, and the width kept is always one that was measured."""
    tried = []
    for round_ in range(3):
        step_ms = step_ms_of(hidden)
        tried.append({"hidden": hidden, "step_ms": step_ms})
        scaled = round(hidden * target_ms / step_ms / HIDDEN_GRAIN) * HIDDEN_GRAIN
        scaled = min(max(scaled, HIDDEN_RANGE[0]), HIDDEN_RANGE[1])
        if abs(scaled - hidden) <= HIDDEN_GRAIN or round_ == 2:
            break
        hidden = scaled
    return hidden, tried


def calibrate_hidden(device: torch.device, sizes: Sizes) -> Tuple[Sizes, dict]:
    """`sizes` with `hidden` set so one step of the copy programs (the MLP
    and the loss) takes about as long on this GPU as one pinned batch copy,
    and what was measured."""
    host = _host_batches(replace(sizes, host_batches=1), pinned=True, device=device)[0]
    x = torch.empty(host.shape, dtype=host.dtype, device=device)
    copy_ms = _median_ms(lambda: x.copy_(host, non_blocking=True))

    def step_ms(hidden: int) -> float:
        mlp = _Mlp(device, sizes, hidden)
        return _median_ms(lambda: _loss(mlp(x)))

    hidden, tried = _fit_hidden(sizes.hidden, step_ms, copy_ms)
    return replace(sizes, hidden=hidden), {
        "pinned_copy_ms": copy_ms, "batch_bytes": sizes.batch_bytes(), "tried": tried,
        "hidden": hidden, "step_over_copy": tried[-1]["step_ms"] / copy_ms}


# What a loader program's GPU step takes against the time the CPU takes to
# build its batch: half. Built in the loop, the batches bound it (the GPU
# idles half the time); built by 4 workers, the GPU does (each worker has
# twice the time it needs).
LOADER_STEP_SHARE = 0.5
# What a download program's step takes: half as long again as its
# result's pinned download, so a download stream hides the copy, and twice
# the host's slower reads of a result (the 90th percentile of the
# calibration's), so reading a step late hides the read too: the fixed
# loop is then bound by its GPU, not by how fast the host reads that day.
# (A 16 MiB result's read took 2.9-4.3 ms a step in traces on one H200
# host and 1 ms or 4-6 ms by turns in its calibration; with a step of only
# 1.5x the copy that loop ran at the pace of its host's reads, which moved
# by half from one run to the next. Results are 4 MiB now.) And at least
# DOWNLOAD_STEP_LEAST_MS: the host's state at calibration is not its state
# a minute later (a 4 MiB read's 90th percentile was 0.087 ms in one
# calibration on an H200 host and 0.81 ms in another, the same day), and a
# step sized to a fast host's reads (0.48 ms) left both loops bound by
# their launches under the profiler. 1.6 ms is twice the slower of those
# reads, and three times a traced step's launches (20 at up to 30 µs).
DOWNLOAD_STEP_OVER_COPY = 1.5
DOWNLOAD_STEP_OVER_READ = 2.0
DOWNLOAD_STEP_LEAST_MS = 1.6


def _host_ms(fn: Callable[[], object], repeats: int = 12, warmup: int = 2) -> float:
    """Median host-clock time of `fn`, ms."""
    times = []
    for k in range(warmup + repeats):
        t0 = time.perf_counter()
        fn()
        if k >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def calibrate_loader(device: torch.device, sizes: Sizes) -> Tuple[Sizes, dict]:
    """`sizes` with `loader_hidden` and `training_hidden` set so the
    inference step and the training step (forward, backward, AdamW) each
    take LOADER_STEP_SHARE of the time this CPU takes to build one batch in
    the loop's own process, and what was measured (with a DataLoader's cost
    per batch handed over, `calibrate_handover`)."""
    records = _Records(sizes)
    batch_ms = _host_ms(lambda: records.batch(0))
    x = records.batch(0).to(device)

    def inference_ms(hidden: int) -> float:
        mlp = _Mlp(device, sizes, hidden, sizes.loader_blocks)
        return _median_ms(lambda: _loss(mlp(x.view(-1, sizes.width))))

    def training_ms(hidden: int) -> float:
        work = _Training(device, replace(sizes, training_hidden=hidden))
        return _median_ms(lambda: work.step(0, x), repeats=10)

    target = LOADER_STEP_SHARE * batch_ms
    loader_hidden, tried = _fit_hidden(sizes.loader_hidden, inference_ms, target)
    training_hidden, tried_training = _fit_hidden(sizes.training_hidden, training_ms, target)
    return replace(sizes, loader_hidden=loader_hidden, training_hidden=training_hidden), {**calibrate_handover(device, sizes),
        "host_batch_ms": batch_ms, "loader_batch_bytes": sizes.loader_batch_bytes(),
        "loader_hidden": loader_hidden, "loader_tried": tried, "loader_step_over_batch": tried[-1]["step_ms"] / batch_ms,
        "training_hidden": training_hidden, "training_tried": tried_training,
        "training_step_over_batch": tried_training[-1]["step_ms"] / batch_ms}


class _ReadyRecords(torch.utils.data.Dataset):
    """Samples of the loader programs' shape, made once: a DataLoader over
    them costs only its handing over of each batch."""

    def __init__(self, sizes: Sizes):
        self.sizes = sizes
        self.samples = [torch.zeros(sizes.sample_tokens, sizes.width, dtype=torch.bfloat16) for _ in range(sizes.samples)]

    def __len__(self) -> int:
        return self.sizes.iterations * self.sizes.samples

    def __getitem__(self, j: int) -> torch.Tensor:
        return self.samples[j % len(self.samples)]


HANDOVER_RUNS = 5
# The host probe's sizes: one batch built HOST_PROBE_REPEATS times (after
# one warm-up), and HOST_PROBE_LAUNCHES of `_loop_work`'s tiny launches as
# many times: about 40 ms on an H200's host.
HOST_PROBE_REPEATS = 3
HOST_PROBE_LAUNCHES = 500


def host_probe(device: torch.device, records: "_Records") -> dict:
    """How fast this host runs now, in the two kinds of work the loader
    and training programs' host time is made of: one batch built in the
    loop's own process (`_Records.batch`: tensor ops on the CPU, ms) and
    one of `_loop_work`'s tiny launches (Python, the dispatcher and a
    kernel launch, µs), each the median of HOST_PROBE_REPEATS. Taken
    before each timed run and around each traced one, so a recording says
    how fast its host ran at each: an H200's host, idle but for the probe,
    built a batch in about 5 ms or about 7.5 ms, switching from one
    stretch to the next, 0.1 s to 10 s long, on every core alike
    (data/nvidia-h200/README.md)."""
    batch_ms = _host_ms(lambda: records.batch(0), repeats=HOST_PROBE_REPEATS, warmup=1)
    launch_ms = _host_ms(lambda: _loop_work(HOST_PROBE_LAUNCHES, device), repeats=HOST_PROBE_REPEATS, warmup=1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"batch_ms": batch_ms, "launch_us": launch_ms * 1e3 / HOST_PROBE_LAUNCHES}


# A probe within FAST_STATE_SLACK of the fastest batch the run has built
# finds the host in its fast state; a measurement waits at most
# FAST_STATE_WAIT_S for it (then it is made anyway, and marked slow).
FAST_STATE_SLACK = 1.3
FAST_STATE_WAIT_S = 2.0


class HostState:
    """The host's state as `host_probe` finds it: fast, or slowed. An
    H200's host built a batch in about 5 ms or about 7.5 ms, switching
    within a second or two with nothing else running, and a host-bound program
    ran 20-30% longer in the slow state (data/nvidia-h200/README.md). A
    measurement compared with another is made in the fast state on both
    sides: it waits for it (`wait_fast`), and counts where the probes
    before and after it both find it (`fast`). `fastest_ms` is the fastest
    batch built so far (handed on from the process that started this one)."""

    def __init__(self, device: torch.device, sizes: Sizes, fastest_ms: Optional[float] = None):
        self.device, self.sizes = device, sizes
        self.fastest_ms = fastest_ms
        self.records: Optional[_Records] = None  # the probe's batch, made at its first probe

    def probe(self) -> dict:
        if self.records is None:
            self.records = _Records(replace(self.sizes, iterations=1))
        found = host_probe(self.device, self.records)
        self.fastest_ms = min(self.fastest_ms or math.inf, found["batch_ms"])
        return found

    def fast(self, found: dict) -> bool:
        return found["batch_ms"] <= FAST_STATE_SLACK * (self.fastest_ms or math.inf)

    def wait_fast(self) -> dict:
        """Probes until the host is in its fast state, at most
        FAST_STATE_WAIT_S; the last probe."""
        t0 = time.perf_counter()
        while True:
            found = self.probe()
            if self.fast(found) or time.perf_counter() - t0 > FAST_STATE_WAIT_S:
                return found

    def measured(self, measure: Callable[[], object], wanted: int, most: int) -> List[dict]:
        """`measure()` run until `wanted` of its runs were made in the fast
        state (probes before and after), at most `most` runs: each run's
        result, its probes and whether it was in the fast state."""
        runs = []
        while len(runs) < most and sum(r["fast"] for r in runs) < wanted:
            before = self.wait_fast()
            result = measure()
            after = self.probe()
            runs.append({"result": result, "host_probe": [before, after], "fast": self.fast(before) and self.fast(after)})
        return runs

    @staticmethod
    def counted(runs: List[dict], fewest: int) -> List[dict]:
        """Of `measured`'s runs, those its figures are over: the runs made in
        the fast state, or all of them where fewer than `fewest` were."""
        fast = [r for r in runs if r["fast"]]
        return fast if len(fast) >= fewest else runs


# How long the loop's own work between two batches takes where the loop's
# loss to the loader is timed: longer than a ready batch takes to come
# through (about 2 ms for 4 MiB on an H200's host), so the loop never waits
# for one and what it loses is the loader's share of its thread.
LOOP_WORK_MS = 4.0


def _loop_work(steps: int, device: torch.device) -> None:
    """The loop's own work between two batches, as a training or inference
    loop's is: launching its step, op after op (`steps` tiny in-place ops
    on `device`: Python, PyTorch's dispatcher and, on a GPU, each op's
    kernel launch). Tiny ops on the CPU instead, launching nothing, gave
    a loss to the loader that moved fourfold from one host to another
    (data/nvidia-h200/README.md)."""
    x = torch.zeros(16, device=device)
    for _ in range(steps):
        x.add_(1.0)


def _loop_work_steps(target_ms: float, device: torch.device) -> Tuple[int, float]:
    """How many of `_loop_work`'s ops take about `target_ms` on this CPU,
    and the median time they then take alone, ms."""
    probe = 2000
    steps = max(1, round(probe * target_ms / _host_ms(lambda: _loop_work(probe, device))))
    return steps, _host_ms(lambda: _loop_work(steps, device))


def _handover_us(device: torch.device, sizes: Sizes, workers: int, loop_steps: int = 0,
                 records: Optional[torch.utils.data.Dataset] = None, from_first_batch: bool = False,
                 state: Optional[HostState] = None) -> dict:
    """A DataLoader with `workers` workers and pin_memory over `records`
    (ready samples where none), over HANDOVER_RUNS runs of `sizes.iterations` batches after one
    that starts the workers: its time per batch (each run's time over its
    batches) and its first batch's (from asking for the iterator to the
    batch in hand: the workers told to start again, the first batch
    stacked, handed over and pinned), medians. With `loop_steps`, the loop
    does that much of its own work (`_loop_work`) after each batch, and
    the time per batch is the loop's from the first batch in hand to the
    last, over the batches that came between (the first batch's wait left
    out); so too with no work of its own where `from_first_batch`. With
    `state`, the medians are over the runs made in the host's fast state
    (`HostState.measured`, at most twice HANDOVER_RUNS runs; all of them
    where none was)."""
    loader = _loader(records if records is not None else _ReadyRecords(sizes), sizes, workers, pinned=device.type == "cuda")

    def run() -> Tuple[float, float]:
        t0 = time.perf_counter()
        batches = iter(loader)
        next(batches)
        t1 = time.perf_counter()
        n, last = 1, t1
        while True:
            if loop_steps:
                _loop_work(loop_steps, device)
            if next(batches, None) is None:
                break
            n, last = n + 1, time.perf_counter()
        if loop_steps or from_first_batch:
            # From the first batch in hand to the last: n - 1 batches, each its wait and the work before it.
            return (last - t1) * 1e6 / max(1, n - 1), (t1 - t0) * 1e6
        return (time.perf_counter() - t0) * 1e6 / n, (t1 - t0) * 1e6

    run()  # starts the workers
    if state is None:
        kept, fast = [run() for _ in range(HANDOVER_RUNS)], None
    else:
        runs = state.measured(run, HANDOVER_RUNS, 2 * HANDOVER_RUNS)
        fast = sum(r["fast"] for r in runs)
        kept = [r["result"] for r in HostState.counted(runs, 1)]
    del loader  # its workers go
    per_batch, first = [k[0] for k in kept], [k[1] for k in kept]
    return {"per_batch_us": statistics.median(per_batch), "per_run_us": per_batch, "first_us": statistics.median(first),
            "first_per_run_us": first, "fast_runs": fast}


# The loop's own work between batches at which its time a batch beside
# building workers is also timed, below LOOP_WORK_MS (`calibrate_handover`).
LOOP_WORK_CURVE_MS = (0.5, 1.0, 2.0)


def _curve_point(timed: dict) -> dict:
    """A point of `handover_by_loop_work` from `_handover_us`'s result."""
    return {"per_batch_us": timed["per_batch_us"], "per_run_us": timed["per_run_us"], "fast_runs": timed["fast_runs"]}


def calibrate_handover(device: torch.device, sizes: Sizes) -> dict:
    """What a DataLoader with workers and pin_memory costs per batch when
    its samples cost nothing to build (each a ready tensor): a worker's
    stacking and handing over through shared memory, the pinning thread's
    copy, the loop's unpickling. Timed with one worker and with
    `sizes.workers`: where the time per batch falls with the workers, the
    workers' share bounds it (one worker's time is each worker's cost per
    batch), else the loop's own (`overlap-lab diagnose` puts each on its
    side when it prices preparing the next batch ahead). With
    `sizes.workers`, also the first batch's wait (the workers' start) and
    what the loop loses a batch while busy with work of its own between
    batches (LOOP_WORK_MS of `_loop_work`, longer than a batch takes to
    come through): its time a batch then, less that work's time alone
    (asking for the batch, the interpreter its pinning thread holds, and
    the host its workers share as they build the loader programs' own
    batches, `_Records`: a fixed loop's threads ran 1-30% slower beside
    building workers from host to host, data/nvidia-h200/README.md). The
    same over ready samples is recorded beside it
    (`handover_taken_over_ready_us`). Last, the loop's time a batch beside
    building workers against its own work (`handover_by_loop_work`: none,
    then LOOP_WORK_CURVE_MS and LOOP_WORK_MS of `_loop_work`): a loop
    busy for less than a batch takes to come through still loses the
    interpreter to the pinning thread (data/nvidia-h200/README.md)."""
    state = HostState(device, sizes)
    probes = []  # the host's speed before each timing, and after the last

    def handover_us(*args, **kwargs) -> dict:
        probes.append(state.probe())
        return _handover_us(device, sizes, *args, state=state, **kwargs)

    one = handover_us(1)
    many = handover_us(sizes.workers)
    steps, alone_ms = _loop_work_steps(LOOP_WORK_MS, device)
    busy = handover_us(sizes.workers, loop_steps=steps, records=_Records(sizes))
    busy_ready = handover_us(sizes.workers, loop_steps=steps)
    curve = [{"loop_work_us": 0.0, **_curve_point(handover_us(sizes.workers, records=_Records(sizes), from_first_batch=True))}]
    for target_ms in LOOP_WORK_CURVE_MS:
        k, work_ms = _loop_work_steps(target_ms, device)
        point = handover_us(sizes.workers, loop_steps=k, records=_Records(sizes))
        curve.append({"loop_work_us": work_ms * 1e3, "loop_steps": k, **_curve_point(point)})
    curve.append({"loop_work_us": alone_ms * 1e3, "loop_steps": steps, **_curve_point(busy)})
    probes.append(state.probe())
    return {"handover_us": many["per_batch_us"], "handover_per_run_us": many["per_run_us"], "handover_one_worker_us": one["per_batch_us"],
            "handover_one_worker_per_run_us": one["per_run_us"], "handover_first_batch_us": many["first_us"],
            "handover_first_batch_per_run_us": many["first_per_run_us"],
            "handover_taken_over_us": max(0.0, busy["per_batch_us"] - alone_ms * 1e3), "handover_loop_work_us": alone_ms * 1e3,
            "handover_busy_loop_per_batch_us": busy["per_batch_us"], "handover_busy_loop_per_run_us": busy["per_run_us"],
            "handover_taken_over_ready_us": max(0.0, busy_ready["per_batch_us"] - alone_ms * 1e3),
            "handover_busy_loop_steps": steps, "handover_by_loop_work": curve,
            "handover_batch_bytes": sizes.loader_batch_bytes(), "handover_workers": sizes.workers, "handover_host_probe": probes,
            "handover_fast_runs": {"one_worker": one["fast_runs"], "workers": many["fast_runs"], "busy_loop": busy["fast_runs"]},
            "host_fastest_batch_ms": state.fastest_ms}


def calibrate_download(device: torch.device, sizes: Sizes) -> Tuple[Sizes, dict]:
    """`sizes` with `download_hidden` set so a download program's step takes
    the longer of DOWNLOAD_STEP_OVER_COPY times its result's pinned download
    and DOWNLOAD_STEP_OVER_READ times the host's slower reads of a result
    (their 90th percentile, from a reused pinned buffer as the fix reads
    it), and at least DOWNLOAD_STEP_LEAST_MS; and what was measured."""
    y = torch.randn(sizes.result_rows, sizes.width, device=device).to(torch.bfloat16)
    host = torch.empty(y.shape, dtype=y.dtype, pin_memory=True)
    copy_ms = _median_ms(lambda: host.copy_(y, non_blocking=True))
    reads = calibrate_download_read(device, sizes)
    slow_read_ms = statistics.quantiles(reads["download_read_pinned_per_run_us"], n=10)[-1] / 1e3
    target_ms = max(DOWNLOAD_STEP_OVER_COPY * copy_ms, DOWNLOAD_STEP_OVER_READ * slow_read_ms, DOWNLOAD_STEP_LEAST_MS)

    def step_ms(hidden: int) -> float:
        mlp = _Mlp(device, sizes, hidden, sizes.download_blocks)
        return _median_ms(lambda: mlp(y))

    hidden, tried = _fit_hidden(sizes.download_hidden, step_ms, target_ms)
    step = tried[-1]["step_ms"]
    return replace(sizes, download_hidden=hidden), {
        "pinned_download_ms": copy_ms, "result_bytes": sizes.result_bytes(), "download_hidden": hidden,
        "download_blocks": sizes.download_blocks, "download_slow_read_ms": slow_read_ms, "download_step_target_ms": target_ms,
        "download_tried": tried, "download_step_ms": step, "download_step_over_copy": step / copy_ms,
        "download_step_over_slow_read": step / slow_read_ms, **reads}


READ_REPEATS, READ_WARMUP = 30, 3


def calibrate_download_read(device: torch.device, sizes: Sizes) -> dict:
    """What the host's read of one step's result (`_Results.read`: the sum
    of its values) takes on this CPU, µs, by the host clock: from a fresh
    pageable tensor, as `y.cpu()` makes one each step, and from a pinned
    buffer reused step after step, as the download programs' fix reads
    it. Each repeat computes a step, downloads its result both ways and
    reads each (the two interleaved, so a drift of the machine's falls on
    both); medians. Checked: both reads give the same sum."""
    work = _Results(device, sizes)
    pinned = torch.empty((sizes.result_rows, sizes.width), dtype=torch.bfloat16, pin_memory=True)

    def read_us(host: torch.Tensor) -> Tuple[float, float]:
        t0 = time.perf_counter()
        total = float(host.sum(dtype=torch.float32))
        return (time.perf_counter() - t0) * 1e6, total

    fresh, reused = [], []
    for k in range(READ_WARMUP + READ_REPEATS):
        y = work.step(k)
        host = y.cpu()
        pinned.copy_(y, non_blocking=True)
        torch.cuda.synchronize()
        (a, sum_a), (b, sum_b) = read_us(host), read_us(pinned)
        if sum_a != sum_b:
            raise RuntimeError(f"the pinned result's sum {sum_b} is not the pageable one's {sum_a}")
        if k >= READ_WARMUP:
            fresh.append(a)
            reused.append(b)
    return {"download_read_pageable_us": statistics.median(fresh), "download_read_pinned_us": statistics.median(reused),
            "download_read_pageable_per_run_us": fresh, "download_read_pinned_per_run_us": reused}


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


def _profiled_kernels(replay: Callable[[], None], replays: int, per_replay: int) -> List[Tuple[float, float]]:
    """The kernels (start, duration), µs, of `replays` calls of `replay`
    under torch.profiler, in start order; `per_replay` each, checked."""
    from torch.profiler import ProfilerActivity, profile  # only where a GPU calibrates

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    kernels = sorted((float(e["ts"]), float(e["dur"])) for e in events if isinstance(e, dict) and e.get("cat") == "kernel")
    if len(kernels) != per_replay * replays:
        raise RuntimeError(f"{len(kernels)} kernels traced, not {per_replay * replays}")
    return kernels


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
    gen = torch.Generator(device="cpu").manual_seed(7)
    start = [torch.rand(4096, generator=gen) for _ in range(GRAPH_GAP_TENSORS)]
    xs = [t.to(device) for t in start]
    eager = [t.to(device) for t in start]
    replay = _graph_of(device, lambda: _graph_gap_step(xs), lambda: _graph_gap_step([t.clone() for t in xs]))  # warm-up, on copies
    replay()
    torch.cuda.synchronize()
    kernels = _profiled_kernels(replay, GRAPH_GAP_REPLAYS, GRAPH_GAP_KERNELS)
    for _ in range(1 + GRAPH_GAP_REPLAYS):
        _graph_gap_step(eager)
    torch.cuda.synchronize()
    if not all(torch.equal(a, b) for a, b in zip(xs, eager)):
        raise RuntimeError("the graph's results are not the eager step's")
    per_replay = []
    for r in range(GRAPH_GAP_REPLAYS):
        ks = kernels[r * GRAPH_GAP_KERNELS:(r + 1) * GRAPH_GAP_KERNELS]
        window = ks[-1][0] + ks[-1][1] - ks[0][0]
        per_replay.append((window - sum(d for _, d in ks)) / (len(ks) - 1))
    return {"graph_gap_us": statistics.median(per_replay), "graph_gap_kernels": len(kernels),
            "graph_gap_kernel_us": statistics.median(d for _, d in kernels),
            "graph_gap_per_replay_us": per_replay}


# Branches side by side in the branched graphs the calibration times, and
# two lengths of each branch (kernels): the difference of their times is
# what one more kernel costs a branch, with the graph's launch and its
# fork and join taken out.
GRAPH_BRANCH_COUNTS = (1, 2, 4, 8)
GRAPH_BRANCH_LENGTHS = (128, 384)
GRAPH_BRANCH_REPEATS = 15


def _branched_graph(device: torch.device, branches: int, kernels: int, gen: torch.Generator) -> Callable[[], None]:
    """A CUDA graph forked into `branches` streams, each running `kernels`
    small kernels (`_graph_gap_step`'s four kinds, on two tensors of its
    own), joined back; checked against the same step run eagerly, bit for
    bit. Returns its replay."""
    start = [[torch.rand(4096, generator=gen) for _ in range(2)] for _ in range(branches)]
    xs = [[t.to(device) for t in branch] for branch in start]
    eager = [[t.to(device) for t in branch] for branch in start]
    sides = [torch.cuda.Stream(device) for _ in range(branches)]
    forked, joined = torch.cuda.Event(), [torch.cuda.Event() for _ in range(branches)]

    def step(tensors: list) -> None:
        main = torch.cuda.current_stream(device)
        forked.record(main)
        for side, branch, done in zip(sides, tensors, joined):
            side.wait_event(forked)
            with torch.cuda.stream(side):
                for k in range(kernels):
                    x, y = branch[k % 2], branch[(k + 1) % 2]
                    (x.add_(y, alpha=0.5) if k % 4 == 0 else x.mul_(0.5) if k % 4 == 1 else
                     x.addcmul_(y, y, value=0.125) if k % 4 == 2 else x.clamp_(-4.0, 4.0))
                done.record(side)
        for done in joined:
            main.wait_event(done)

    # Warmed up on copies, so the graph's one replay and one eager step compare exactly.
    replay = _graph_of(device, lambda: step(xs), lambda: step([[t.clone() for t in branch] for branch in xs]))
    replay()
    step(eager)
    torch.cuda.synchronize()
    if not all(torch.equal(a, b) for got, want in zip(xs, eager) for a, b in zip(got, want)):
        raise RuntimeError(f"the {branches}-branch graph's results are not the eager step's")
    return replay


def calibrate_graph_branches(device: torch.device) -> dict:
    """How far apart a CUDA graph's branches start their kernels when they
    run side by side, µs per kernel of one branch, for `overlap-lab
    diagnose`'s CUDA-graph what-if: the branches share the GPU's rate of
    starting kernels, so past a few branches each runs its small kernels
    further apart than one branch alone (a kernel and the gap). For each
    count of GRAPH_BRANCH_COUNTS, graphs of that many branches of each
    length of GRAPH_BRANCH_LENGTHS (`_branched_graph`), each replay timed by
    CUDA events (the median of GRAPH_BRANCH_REPEATS after a warm-up); a
    branch's kernel spacing is the longer graph's time less the shorter's,
    over the kernels between. Timed by events in a process where the
    profiler has not run: traced, the profiler runs a graph's branches one
    after another, and once it has run in a process the graphs launched
    after it run more slowly (lab10_trace calls this first)."""
    gen = torch.Generator(device="cpu").manual_seed(11)
    short, long = GRAPH_BRANCH_LENGTHS
    spacing, samples = {}, {}
    for branches in GRAPH_BRANCH_COUNTS:
        times = {n: [] for n in GRAPH_BRANCH_LENGTHS}
        replays = {n: _branched_graph(device, branches, n, gen) for n in GRAPH_BRANCH_LENGTHS}
        for _ in range(GRAPH_BRANCH_REPEATS):  # the two lengths in turn: a drift of the clock touches both alike
            for n, replay in replays.items():
                times[n].append(_median_ms(replay, repeats=1, warmup=1) * 1e3)
        medians = {n: statistics.median(ts) for n, ts in times.items()}
        spacing[str(branches)] = (medians[long] - medians[short]) / (long - short)
        samples[str(branches)] = {str(n): ts for n, ts in times.items()}
    return {"graph_branch_spacing_us": spacing, "graph_branch_lengths": list(GRAPH_BRANCH_LENGTHS),
            "graph_branch_replay_us": samples}
