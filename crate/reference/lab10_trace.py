#!/usr/bin/env python3
"""Lab 10's one command: runs, times and traces the real programs of
`lab10_programs.py` (beside this file; its docstring says what each is) on
one GPU, for `overlap-lab diagnose` to read.

    python3 crate/reference/lab10_trace.py --out DIR
        [--programs a,b] [--iterations N] [--repeats N] [--command TEXT] [--device cuda|cpu]

(`overlap-lab pytorch-trace` runs it, carried inside the binary, on the
GPU it is given, into data/<gpu folder>/pytorch-trace/.)

For each program, in a process of its own where no profiler has run
(forked from a server started first, with PyTorch and the programs imported
in it once and nothing of CUDA: a fresh Python pays PyTorch's import, about
4 s on the GPU machines, each time): set up (its data, weights, streams, graph, DataLoader workers), two
warm-up runs, then its untraced time over --repeats runs (CUDA events from
before the first call to after the last of its work, and the host clock
around the run and the synchronize after it; median, 25-75% range, min, max
and every sample), its outputs saved. The loader and training programs' timed and traced runs
are made in the host's fast state: the host of an H200 machine, idle, switched
between building a batch in about 5 ms and in about 7.5 ms in stretches
of 0.1 s to 10 s, and a host-bound program ran 20-30% longer in the slow state
(data/nvidia-h200/README.md; the state can change within a run, so the
probes around a run say it ran in the fast state as far as they can). So each run waits, at most 2 s, for
`host_probe` (lab10_programs.py: a batch built, tiny launches; 40 ms) to
find the fast state (`HostState`: within 1.3x of the fastest batch the
run has built), and counts where the probes before and
after it both found it: runs until --repeats counted (at most twice as
many; all count where fewer than FAST_STATE_FEWEST did), a traced run made
again until it counted (at most FAST_STATE_TRACES times), and the loader's
calibration runs so too; every run, its probes and whether it counted
are recorded (`HOST_BOUND_FAMILIES`: the others run whatever the state). Then, in the same process, the profiler's CUDA side
(CUPTI) is started and the program set up again (so its graphs are
captured under it, and every trace pays the same start-up): one run
traced by torch.profiler (CPU and CUDA activities, no shapes, no stacks; the
window is the user annotation `lab10.<program>`, from the run's first call
to the end of its GPU work), exported with `export_chrome_trace` and gzipped
to DIR/<program>.json.gz, and one more traced with the profiler's CUDA sync
events (`_ExperimentalConfig(enable_cuda_sync_events=True)`: which stream
and which event record each `cudaStreamWaitEvent` waits for) to
DIR/<program>.sync-events.json.gz. With --untraced-fixes, a program that
only applies a fix (no fix starts from it, so no prediction reads its
trace) is timed untraced only: `overlap-lab all` runs its headline preset
so. A process of its own is what a learner's
program gets: once the profiler has run in a process, the process launches
more slowly (a CUDA graph of four branches took 18% longer untraced after one
profiler session than before it), and a program timed after others inherits
their leftovers.

First each family's step is sized on this GPU: the copy programs' MLP so
one step takes as long as one pinned batch copy (`calibrate_hidden`); the
loader and training programs' so one step takes half the time this CPU
takes to build a batch (`calibrate_loader`, which also measures what a
DataLoader with workers costs the loop per batch it hands over:
`calibrate_handover`); the download programs' so one
step takes 1.5x its result's pinned download and twice the host's slower
reads of a result, and at least DOWNLOAD_STEP_LEAST_MS (`calibrate_download`, which times
the host's read of a result from a fresh pageable tensor and from a reused
pinned one: `calibrate_download_read`), so the fixed download loop is bound
by its GPU, not by how fast the host reads or launches that day. Then how far apart a
branch of a CUDA graph starts its kernels with 1, 2, 4 and 8 branches side
by side (`calibrate_graph_branches`, timed by events before the profiler
first runs in this process), and the GPU's gap between two kernels of one
graph (`calibrate_graph_gap`, traced): what `overlap-lab diagnose` prices
a CUDA graph by.

Then it checks: every fix against the program it fixes (same inputs, same
outputs within a tolerance: a fix never gains by doing less; a partner not
asked for in --programs is run once, untimed, in a process of its own, for this), each traced run's
outputs against its untraced ones, and each trace against what its program
must show (its host-to-device copies pageable or pinned, all its batches'
bytes, the copies on a stream of their own or not, its device-to-host
copies, their memory and bytes, its kernels' streams, its graph launches,
its kernels, sync events in the one recorded with them and in no other,
no CUDA event written without its time: pytorch/pytorch#188481, seen here
when a process ran the profiler seven times), each trace under 8 MiB gzipped.

DIR/programs.json holds, per program: what it is, its sizes and iterations,
its untraced times, the traced run's host time, its trace file and sizes,
what the trace holds (event counts by category, copies, streams), which
program it fixes and by what fix (`fix_of`), and which programs its outputs
were checked against; and for the run: the command, the date, torch and CUDA
versions, the GPU's name and its data folder, the calibration, and the
problems found (none when it exits 0).

Time on an H200 (2026-12-01): 314 s for the fifteen programs as now
(08:16, the committed run), 271 s with every
one timed in the host's fast state (now the loader and training programs
only), and 152 s and 246 s for those four alone (--programs) on two hosts,
the second mostly in its slow state. Before that (2026-11-30): 236-300 s for the fifteen programs, each in
a fresh Python process then (PyTorch's import in each, its host batches
drawn on the CPU twice: for its untraced runs and for its traces), with the
calibration and the checks, on four hosts; a slower host took 433 s. The
headline preset's seven, forked from the server with their batches drawn
on the GPU and three timed untraced only, took 61 s (08:35). The whole set should stay under 5 minutes (a
longer run is said on stderr, not failed: the recording is whole).

The traces and programs.json are meant to be committed as they are, under
data/<gpu folder>/pytorch-trace/ (programs.json's `gpu_folder`, e.g.
nvidia-h100-80gb-hbm3), by whoever runs this on each GPU: the
untraced times are what a prediction made from a trace is compared with.
`--device cpu` is a smoke run for a machine with no GPU: small sizes, no
CUDA activity in the traces, nothing to commit.

Exit status: 0 when everything ran and every check passed; 1 when a check
failed (programs.json is still written, with the problems); 2 on bad options,
no PyTorch or no GPU (one line on stderr). Progress lines go to stderr, a
table of the times to stdout.
"""
from __future__ import annotations

import argparse
import collections
import gc
import gzip
import json
import math
import multiprocessing
import multiprocessing.forkserver
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

WARMUP_RUNS = 2
DEFAULT_REPEATS = 15
MAX_TRACE_BYTES = 8 << 20  # gzipped; a trace larger than this asks for fewer --iterations
WINDOW_PREFIX = "lab10."  # the user annotation around each traced run
SYNC_EVENTS_SUFFIX = ".sync-events"  # <program>.sync-events.json.gz: its run traced with CUDA sync events
SCRIPT = "crate/reference/lab10_trace.py"
BUDGET_SECONDS = 300  # the whole set, with the default sizes, on one GPU: a longer run is said, not failed
PART_TIMEOUT_SECONDS = 600  # one program's process (its runs take seconds): one that hangs is stopped
FAST_STATE_MOST = 2  # a program's untraced runs: at most this many times --repeats, until --repeats were in the host's fast state
FAST_STATE_FEWEST = 5  # fewer runs than this in the fast state: all its runs count
FAST_STATE_TRACES = 3  # a traced run made again until it was in the host's fast state, at most this many times


# The run's start: a part's process is told it by its parent (LAB10_STARTED).
STARTED = float(os.environ.get("LAB10_STARTED", time.time()))


def say(line: str) -> None:
    """A progress line, on stderr, with the seconds since the run started."""
    print(f"lab10 [{time.time() - STARTED:5.0f} s]: {line}", file=sys.stderr, flush=True)


def fail(line: str) -> None:
    """Bad options, no PyTorch or no GPU: one line, exit status 2."""
    print(f"lab10_trace: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        fail(f"{message} (see --help)")


def _whole_number(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not '{text}'")
    return n


def parse(argv: list[str]) -> argparse.Namespace:
    ap = _Parser(prog="lab10_trace.py", description=__doc__.split("\n\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the traces and programs.json (made if missing)")
    ap.add_argument("--programs", metavar="A,B", help="programs to run, comma-separated (default: all)")
    ap.add_argument("--iterations", type=_whole_number, metavar="N",
                    help="iterations of every program's run (default: 40 for the copy programs, 8 for the tiny-op ones; 3 with --device cpu)")
    ap.add_argument("--repeats", type=_whole_number, default=DEFAULT_REPEATS, metavar="N",
                    help=f"untraced timed runs per program (default {DEFAULT_REPEATS})")
    ap.add_argument("--command", metavar="TEXT",
                    help="the command the record says made it (default: this script's command line; `overlap-lab pytorch-trace` passes its own)")
    ap.add_argument("--untraced-fixes", action="store_true",
                    help="time the programs that only apply a fix untraced, with no traces: no prediction starts from "
                         "their traces (quicker; `overlap-lab all` at its headline preset)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default): GPU 0; cpu: a smoke run with no CUDA activity")
    # One part of one program, in a process of its own (Session.part runs it):
    # not for typing by hand, so not in --help.
    ap.add_argument("--part", choices=("program", "outputs"), help=argparse.SUPPRESS)
    ap.add_argument("--program", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--host-fastest-ms", type=float, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted samples, interpolated between neighbours."""
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(samples: list[float]) -> dict:
    """Median, 25-75% range, min, max and the samples, in ms."""
    s = sorted(samples)
    return {"median": statistics.median(s), "p25": _quantile(s, 0.25), "p75": _quantile(s, 0.75),
            "min": s[0], "max": s[-1], "samples": samples}


def host_speed(probes: list) -> str:
    """The host's speed over `probes` (`host_probe`'s), in words: the medians."""
    batch = statistics.median(p["batch_ms"] for p in probes)
    launch = statistics.median(p["launch_us"] for p in probes)
    return f"host: a batch built in {batch:.2f} ms, a launch in {launch:.2f} µs"


def gpu_folder(name: str) -> str:
    """The GPU's data folder, as the crate names it ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def command_as_recorded(argv: list[str], out: str, destination: str | None) -> str:
    """The command as typed, its output folder named as the repository names
    it: the folder the record is committed to (data/<gpu folder>/pytorch-trace) where
    --out is a path of this machine (absolute, or outside the repository)."""
    outside = os.path.isabs(out) or os.path.normpath(out).startswith("..")
    words, i = [], 0
    while i < len(argv):
        if argv[i] == "--out" and i + 1 < len(argv):
            words += ["--out", destination if outside and destination else argv[i + 1]]
            i += 2
            continue
        if argv[i].startswith("--out=") and outside and destination:
            words.append(f"--out={destination}")
        else:
            words.append(argv[i])
        i += 1
    return " ".join(["python3", SCRIPT] + words)


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, where Linux says it (as the crate's fingerprint reads it)."""
    try:
        return Path("/sys/module/nvidia/version").read_text().strip()
    except OSError:
        return None


def trace_facts(trace: dict) -> dict:
    """What a Kineto trace holds that its program's checks ask about."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    h2d = [e for e in copies if " HtoD " in e.get("name", "")]
    d2h = [e for e in copies if " DtoH " in e.get("name", "")]
    syncs = [e for e in events if e.get("cat") == "cuda_sync"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    runtime = [e.get("name", "") for e in events if e.get("cat") == "cuda_runtime"]
    cuda = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")]

    def source(e: dict) -> str:  # "Memcpy HtoD (Pinned -> Device)" -> "Pinned"
        m = re.search(r"\((.+) -> ", e.get("name", ""))
        return m.group(1) if m else "unnamed"

    def destination(e: dict) -> str:  # "Memcpy DtoH (Device -> Pageable)" -> "Pageable"
        m = re.search(r" -> (.+)\)", e.get("name", ""))
        return m.group(1) if m else "unnamed"

    def streams(es: list) -> list:
        return sorted({e.get("args", {}).get("stream") for e in es}, key=str)

    return {
        "events": dict(collections.Counter(str(e.get("cat")) for e in events)),
        "kernels": len(kernels), "kernel_streams": streams(kernels),
        "h2d_copies": len(h2d), "h2d_bytes": sum(int(e.get("args", {}).get("bytes", 0)) for e in h2d),
        "h2d_sources": sorted({source(e) for e in h2d}), "h2d_streams": streams(h2d),
        "d2h_copies": len(d2h), "d2h_bytes": sum(int(e.get("args", {}).get("bytes", 0)) for e in d2h),
        "d2h_destinations": sorted({destination(e) for e in d2h}),
        "stream_wait_events": sum(e.get("name") == "Stream Wait Event" for e in syncs),
        "graph_launches": sum(n.startswith("cudaGraphLaunch") for n in runtime),
        "stream_synchronizes": sum(n.startswith("cudaStreamSynchronize") for n in runtime),
        # CUDA events the profiler wrote with no time ("ts": 0, "dur": 0): a
        # known fault after several profiler sessions in one process
        # (pytorch/pytorch#188481); `overlap-lab diagnose` refuses such a trace.
        "unstamped_cuda_events": sum(e.get("ts") == 0 and e.get("dur") == 0 for e in cuda),
        "window_annotations": sum(e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(WINDOW_PREFIX)
                                  for e in events),
    }


def trace_problems(program, sizes, facts: dict, cuda: bool, sync_events: bool = False) -> list[str]:
    """How a trace differs from what its program must show; `sync_events`
    where it was recorded with the profiler's CUDA sync events."""
    out = []
    if facts["window_annotations"] != 1:
        out.append(f"{facts['window_annotations']} window annotations ({WINDOW_PREFIX}{program.name}), not 1")
    if not cuda:
        return out
    if facts["unstamped_cuda_events"]:
        out.append(f"{facts['unstamped_cuda_events']} CUDA events have no time (\"ts\": 0, \"dur\": 0: the profiler lost them, "
                   "pytorch/pytorch#188481)")
    if facts["kernels"] < sizes.iterations:
        out.append(f"{facts['kernels']} kernels for {sizes.iterations} iterations")
    if program.family == "tiny" and facts["kernels"] < 4 * sizes.tiny_tensors * sizes.iterations:
        out.append(f"{facts['kernels']} kernels, not the {4 * sizes.tiny_tensors * sizes.iterations} its steps launch")
    if len(facts["kernel_streams"]) < program.streams:
        out.append(f"its kernels ran on {len(facts['kernel_streams'])} stream(s), not {program.streams} or more")
    if program.h2d_from:
        if facts["h2d_sources"] != [program.h2d_from]:
            out.append(f"its host-to-device copies come from {facts['h2d_sources']} memory, not {program.h2d_from} only")
        want = sizes.iterations * sizes.of_family(program.family)["batch_bytes"]
        if facts["h2d_bytes"] != want:
            out.append(f"its host-to-device copies move {facts['h2d_bytes']} bytes, not the {want} of its batches")
    elif facts["h2d_copies"]:
        out.append(f"{facts['h2d_copies']} host-to-device copies, where it makes none")
    shared = set(facts["h2d_streams"]) & set(facts["kernel_streams"])
    if program.copy_stream is True and shared:
        out.append(f"its copies share stream(s) {sorted(shared, key=str)} with kernels, not a copy stream of their own")
    if program.copy_stream is False and not set(facts["h2d_streams"]) <= set(facts["kernel_streams"]):
        out.append(f"its copies run on stream(s) {facts['h2d_streams']}, not its kernels' {facts['kernel_streams']}")
    reads = program.device_to_host_reads(sizes)
    if facts["d2h_copies"] != reads:
        out.append(f"{facts['d2h_copies']} device-to-host copies, not the {reads} it reads")
    if program.d2h_from:
        if facts["d2h_destinations"] != [program.d2h_from]:
            out.append(f"its device-to-host copies go to {facts['d2h_destinations']} memory, not {program.d2h_from} only")
        want = sizes.iterations * sizes.result_bytes()
        if facts["d2h_bytes"] != want:
            out.append(f"its device-to-host copies move {facts['d2h_bytes']} bytes, not the {want} of its results")
    launches = sizes.iterations if program.graph else 0
    if facts["graph_launches"] != launches:
        out.append(f"{facts['graph_launches']} graph launches, not {launches}")
    syncs = facts["events"].get("cuda_sync", 0)
    if sync_events and not syncs:
        out.append("no CUDA sync events, though it was recorded with them")
    if not sync_events and syncs:
        out.append(f"{syncs} CUDA sync events, though it was recorded without them")
    return out


class Session:
    """One run of the command: the device, the options, and what it found."""

    def __init__(self, torch, lab, args, out_dir: Path):
        from torch.profiler import ProfilerActivity

        self.torch, self.lab, self.args, self.out_dir = torch, lab, args, out_dir
        self.cuda = args.device == "cuda"
        if self.cuda:
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        else:
            self.device = torch.device("cpu")
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.base = lab.Sizes() if self.cuda else lab.SMOKE_SIZES
        self.calibration = None
        self.calibrated: set[str] = set()
        # The host's state, for measurements made in its fast state (`lab.HostState`).
        self.host = lab.HostState(self.device, self.base, args.host_fastest_ms)
        self.results: dict = {}
        self.outputs: dict = {}
        self.problems: list[str] = []

    def calibrate_graph_branches(self) -> None:
        """How far apart a CUDA graph's branches side by side start their
        kernels, for `diagnose`'s CUDA-graph what-if: timed by events before
        anything in this process starts the profiler."""
        branches = self.lab.calibrate_graph_branches(self.device)
        self.calibration = {**(self.calibration or {}), **branches}
        spacing = ", ".join(f"{b}: {us:.3f}" for b, us in branches["graph_branch_spacing_us"].items())
        say(f"calibrated: a branch's kernels µs apart by the branches side by side in a CUDA graph: {spacing}")

    def calibrate_graph(self) -> None:
        """The GPU's gap between a graph's kernels (traced), for `diagnose`'s CUDA-graph what-if."""
        gap = self.lab.calibrate_graph_gap(self.device)
        self.calibration = {**(self.calibration or {}), **gap}
        say(f"calibrated: {gap['graph_gap_us']:.3f} µs between two kernels of one CUDA graph (the median over "
            f"{len(gap['graph_gap_per_replay_us'])} replays of each one's mean gap; {gap['graph_gap_kernels']} kernels "
            f"of {gap['graph_gap_kernel_us']:.2f} µs)")

    def calibrate(self, family: str) -> None:
        """The step of `family`'s programs sized against this GPU and CPU (each calibration once)."""
        what = {"copy": "copy", "loader": "loader", "training": "loader", "download": "download"}.get(family)
        if what is None or what in self.calibrated:
            return
        self.calibrated.add(what)
        calibration = {"copy": self.lab.calibrate_hidden, "loader": self.lab.calibrate_loader, "download": self.lab.calibrate_download}[what]
        self.base, measured = calibration(self.device, self.base)
        if measured.get("host_fastest_batch_ms") is not None:
            self.host.fastest_ms = min(self.host.fastest_ms or math.inf, measured["host_fastest_batch_ms"])
        self.calibration = {**(self.calibration or {}), **measured}
        c, b = measured, self.base
        if what == "copy":
            say(f"calibrated: a pinned {b.batch_bytes() >> 20} MiB batch copies in {c['pinned_copy_ms']:.3f} ms; "
                f"hidden width {c['hidden']}: the step takes {c['step_over_copy']:.2f}x that")
        elif what == "loader":
            say(f"calibrated: the CPU builds a batch of {b.samples} samples in {c['host_batch_ms']:.3f} ms; hidden widths "
                f"{c['loader_hidden']} (inference, {c['loader_step_over_batch']:.2f}x that) and {c['training_hidden']} "
                f"(training, {c['training_step_over_batch']:.2f}x); a DataLoader hands a ready {c['handover_batch_bytes'] >> 20} MiB "
                f"batch over in {c['handover_one_worker_us']:.0f} µs with 1 worker, {c['handover_us']:.0f} µs with {c['handover_workers']} "
                f"(its first in {c['handover_first_batch_us']:.0f} µs; a loop busy {c['handover_loop_work_us']:.0f} µs between batches loses "
                f"{c['handover_taken_over_us']:.0f} µs a batch beside workers building them, {c['handover_taken_over_ready_us']:.0f} "
                f"over ready samples; beside building workers, a batch each "
                + ", ".join(f"{q['per_batch_us']:.0f} µs with {q['loop_work_us']:.0f} µs of its own work" for q in c["handover_by_loop_work"])
                + f"; {host_speed(c['handover_host_probe'])})")
        else:
            say(f"calibrated: a {b.result_bytes() >> 20} MiB result downloads (pinned) in {c['pinned_download_ms']:.3f} ms; "
                f"the host reads a result in {c['download_read_pageable_us']:.0f} µs from a fresh pageable tensor, "
                f"{c['download_read_pinned_us']:.0f} µs from a reused pinned one (one read in ten over "
                f"{c['download_slow_read_ms'] * 1e3:.0f} µs); hidden width {c['download_hidden']} over {c['download_blocks']} blocks: the step takes "
                f"{c['download_step_ms']:.2f} ms, {c['download_step_over_copy']:.1f}x the download and "
                f"{c['download_step_over_slow_read']:.1f}x the slower reads")

    def sizes_of(self, program):
        default = self.lab.ITERATIONS[program.family] if self.cuda else self.base.iterations
        return replace(self.base, iterations=self.args.iterations or default)

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed_run(self, loop) -> tuple[float | None, float]:
        """One untraced run: (GPU ms by CUDA events, None on a CPU; host ms)."""
        torch = self.torch
        loop.reset()
        self.synchronize()
        start = torch.cuda.Event(enable_timing=True) if self.cuda else None
        end = torch.cuda.Event(enable_timing=True) if self.cuda else None
        t0 = time.perf_counter()
        if self.cuda:
            start.record()
        loop.run()
        if self.cuda:
            end.record()  # on the current stream: every program's work joins it
        self.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3
        return (start.elapsed_time(end) if self.cuda else None), host_ms

    def traced_run(self, loop, name: str, sync_events: bool):
        """One run under torch.profiler, with its CUDA sync events where
        `sync_events`: (the profiler, host ms of the window)."""
        from torch.profiler import profile, record_function

        loop.reset()
        self.synchronize()
        config = {}
        if sync_events:
            config["experimental_config"] = self.torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        with profile(activities=self.activities, record_shapes=False, with_stack=False, **config) as prof:
            t0 = time.perf_counter()
            with record_function(WINDOW_PREFIX + name):  # the window: the run and the wait for its GPU work
                loop.run()
                self.synchronize()
            host_ms = (time.perf_counter() - t0) * 1e3
        return prof, host_ms

    def export(self, prof, name: str) -> tuple[Path, bytes]:
        """The trace, gzipped to <out>/<name>.json.gz; returns its path and the JSON."""
        raw_path, gz_path = self.out_dir / f"{name}.json", self.out_dir / f"{name}.json.gz"
        # Exported from inside the folder, so the trace names its file as
        # "<name>.json" (Kineto writes the path it is given into it), not by
        # where this machine keeps it.
        here = os.getcwd()
        os.chdir(self.out_dir)
        try:
            prof.export_chrome_trace(raw_path.name)
        finally:
            os.chdir(here)
        raw = raw_path.read_bytes()
        raw_path.unlink()
        with open(gz_path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename=raw_path.name) as z:
            z.write(raw)
        return gz_path, raw

    def time_part(self, name: str, sizes, work: Path) -> dict:
        """The timed part: one program set up, warmed up and timed untraced
        (in a process no profiler has run in), its outputs saved for its
        traced runs and the fix checks; returns its untraced times."""
        torch = self.torch
        loop = self.lab.PROGRAMS[name].build(self.device, sizes)
        for _ in range(WARMUP_RUNS):
            loop.reset()
            loop.run()
        self.synchronize()
        # A host-bound program is timed in the host's fast state: runs until
        # --repeats were made in it, at most twice as many (all count where
        # too few were). Any other: --repeats runs, whatever the state.
        host_bound = self.lab.PROGRAMS[name].host_bound
        if host_bound:
            runs = self.host.measured(lambda: self.timed_run(loop), self.args.repeats, FAST_STATE_MOST * self.args.repeats)
            counted = self.lab.HostState.counted(runs, FAST_STATE_FEWEST)
        else:
            runs = counted = [{"result": self.timed_run(loop)} for _ in range(self.args.repeats)]
        device_ms, host_ms = [r["result"][0] for r in counted], [r["result"][1] for r in counted]
        outputs = self.outputs[name] = loop.outputs()
        self.problems.extend(f"{name}: its run's {d}" for d in self.lab.never_written(outputs))
        torch.save(outputs, work / f"{name}.outputs.pt")
        untraced = {"device_ms": summary(device_ms) if self.cuda else None, "host_ms": summary(host_ms)}
        state = ""
        if host_bound:
            untraced["host_runs"] = [{"device_ms": r["result"][0], "host_ms": r["result"][1], "host_probe": r["host_probe"],
                                      "fast": r["fast"], "counted": r in counted} for r in runs]
            state = (f" (of {len(runs)}, {sum(r['fast'] for r in runs)} in the host's fast state; "
                     f"{host_speed([p for r in counted for p in r['host_probe']])})")
        shown = untraced["device_ms"] or untraced["host_ms"]
        say(f"  untraced, {len(counted)} runs of {sizes.iterations} iterations{state}: median {shown['median']:.3f} ms "
            f"(25-75%: {shown['p25']:.3f}-{shown['p75']:.3f}) " + ("by CUDA events" if self.cuda else "on the host clock"))
        return untraced

    def outputs_part(self, name: str, sizes, work: Path) -> None:
        """A partner's outputs, from one untimed run (a program not asked for
        in --programs that a fix is checked against)."""
        loop = self.lab.PROGRAMS[name].build(self.device, sizes)
        loop.reset()
        loop.run()
        self.synchronize()
        self.torch.save(loop.outputs(), work / f"{name}.outputs.pt")

    def trace_part(self, name: str, sizes) -> dict:
        """The traced part: the profiler's CUDA side started before the
        program is set up again (its graphs are captured after it, and every
        trace pays the same start-up), then one run traced, one more with
        CUDA sync events; each checked against the untraced runs' outputs
        (`time_part`'s). Returns what each trace is, by "false" and "true"."""
        from torch.profiler import profile

        with profile(activities=self.activities):
            self.torch.ones(1, device=self.device).add_(1)
            self.synchronize()
        program = self.lab.PROGRAMS[name]
        loop = program.build(self.device, sizes)
        for _ in range(WARMUP_RUNS):
            loop.reset()
            loop.run()
        self.synchronize()
        traces = {}
        for sync_events in (False, True) if self.cuda else (False,):
            traces[sync_events] = self.trace_one(loop, program, sizes, sync_events)
        return {str(k).lower(): v for k, v in traces.items()}

    def program_part(self, name: str, sizes, work: Path) -> None:
        """A program's process: timed untraced before anything in it starts
        the profiler (`time_part`), then set up again and traced (`trace_part`)."""
        # Its untraced times are kept, whatever becomes of its traces.
        self.results[name] = {"untraced": self.time_part(name, sizes, work)}
        if self.untraced_only(name):
            say("  not traced (--untraced-fixes: no prediction starts from its trace)")
            return
        self.free()
        self.results[name]["traces"] = self.trace_part(name, sizes)

    def measure(self, k: int, count: int, name: str, work: Path) -> None:
        """One program timed untraced and then traced, in a process of its
        own (`program_part`): as a learner runs a program, with no other
        program's state and no profiler in it while it is timed."""
        program = self.lab.PROGRAMS[name]
        sizes = self.sizes_of(program)
        say(f"[{k}/{count}] {name}: {program.what}")
        found = self.part("program", name, sizes, work)
        untraced_only = self.untraced_only(name)
        if found is None or ("traces" not in found and not untraced_only):
            return  # the problem is recorded: the process failed, or its traces did
        self.outputs[name] = self.torch.load(work / f"{name}.outputs.pt", map_location="cpu")
        traces = {s == "true": v for s, v in found.get("traces", {}).items()}
        plain = traces.get(False, {"trace": None, "traced_host_ms": None, "trace_bytes": None, "trace_json_bytes": None, "trace_facts": None})
        self.results[name] = {
            "what": program.what, "family": program.family, "iterations": sizes.iterations,
            "sizes": sizes.of_family(program.family), "untraced": found["untraced"],
            "traced_host_ms": plain["traced_host_ms"], "window": None if untraced_only else WINDOW_PREFIX + name,
            "trace": plain["trace"], "trace_bytes": plain["trace_bytes"], "trace_json_bytes": plain["trace_json_bytes"],
            "trace_facts": plain["trace_facts"], "traced_host_probe": plain.get("host_probe"),
            "fix_of": [{"program": before, "fix": how} for before, how in program.fix_of],
            "checked_against": [],
        }
        if True in traces:
            self.results[name]["sync_events"] = traces[True]

    def part(self, which: str, name: str, sizes, work: Path) -> dict | None:
        """Runs one part of a program (`program`: timed, then traced unless
        it only applies a fix and --untraced-fixes; or `outputs`: one untimed
        run) in a new process (`_part_process`, forked from the server that
        has PyTorch imported already: see `start_part_server`): its progress
        lines pass through, its problems join this run's; None where it
        failed."""
        argv = ["--out", str(self.out_dir), "--device", self.args.device, "--repeats", str(self.args.repeats),
                "--part", which, "--program", name, "--sizes", json.dumps(asdict(sizes)), "--work", str(work)]
        if self.untraced_only(name):
            argv.append("--untraced-fixes")
        if self.host.fastest_ms is not None:
            argv += ["--host-fastest-ms", repr(self.host.fastest_ms)]
        process = multiprocessing.get_context("forkserver").Process(target=_part_process, args=(argv, STARTED), name=f"lab10-{name}")
        process.start()
        process.join(PART_TIMEOUT_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
            self.problems.append(f"{name}: its {which} process ran over {PART_TIMEOUT_SECONDS} s and was stopped")
            return None
        answer = work / f"{name}.{which}.json"
        if process.exitcode != 0 or not answer.exists():
            code = process.exitcode
            how = f"exit status {code}" if code >= 0 else f"stopped by signal {-code}"
            self.problems.append(f"{name}: its {which} process failed ({how}; what it printed is above)")
            return None
        found = json.loads(answer.read_text())
        self.problems.extend(found["problems"])
        return found["results"].get(name)

    def untraced_only(self, name: str) -> bool:
        """Whether `name` is timed untraced only: --untraced-fixes, and it
        applies a fix that no other program's fix starts from (no prediction
        is made from its trace)."""
        befores = {before for p in self.lab.PROGRAMS.values() for before, _ in p.fix_of}
        return self.args.untraced_fixes and bool(self.lab.PROGRAMS[name].fix_of) and name not in befores

    def trace_one(self, loop, program, sizes, sync_events: bool) -> dict:
        """One traced run of `loop` (with the profiler's CUDA sync events
        where `sync_events`), its outputs checked against the untraced run's,
        exported and checked: what the record says of it."""
        name = program.name
        # A host-bound program is traced in the host's fast state: again, at
        # most FAST_STATE_TRACES times, until it was. Any other: once.
        host = {}
        if program.host_bound:
            runs = self.host.measured(lambda: self.traced_run(loop, name, sync_events), 1, FAST_STATE_TRACES)
            run = runs[-1]  # the one in the fast state, else the last tried
            prof, traced_host_ms = run["result"]
            host = {"host_probe": run["host_probe"], "host_fast": run["fast"], "host_attempts": len(runs)}
            del runs
        else:
            prof, traced_host_ms = self.traced_run(loop, name, sync_events)
        what = f"{name}: the traced run's" + (" (sync events)" if sync_events else "")
        self.problems.extend(f"{what} {d}" for d in self.lab.differences(self.outputs[name], loop.outputs()))
        gz_path, raw = self.export(prof, name + (SYNC_EVENTS_SUFFIX if sync_events else ""))
        del prof
        gz_bytes = gz_path.stat().st_size
        try:
            facts = trace_facts(json.loads(raw))
            self.problems.extend(f"{name}: its trace {gz_path.name}: {p}"
                                 for p in trace_problems(program, sizes, facts, self.cuda, sync_events))
        except ValueError as e:
            facts = None
            self.problems.append(f"{name}: its trace {gz_path.name} is not JSON ({e})")
        if gz_bytes > MAX_TRACE_BYTES:
            self.problems.append(f"{name}: its trace {gz_path.name} is {gz_bytes / 2**20:.1f} MiB gzipped, over "
                                 f"{MAX_TRACE_BYTES >> 20} MiB: run it with fewer --iterations")
        say(f"  traced{' with sync events' if sync_events else ''}: {traced_host_ms:.1f} ms on the host clock -> "
            f"{gz_path.name} ({gz_bytes / 2**20:.2f} MiB, {len(raw) / 2**20:.1f} MiB unpacked)"
            + (f"; {host_speed(host['host_probe'])}, attempt {host['host_attempts']}" if host else ""))
        return {"trace": gz_path.name, "traced_host_ms": traced_host_ms, "trace_bytes": gz_bytes,
                "trace_json_bytes": len(raw), "trace_facts": facts, **host}

    def outputs_of(self, name: str, work: Path):
        """A program's outputs: from its timed run, or from one untimed run
        made in a process of its own (a partner not asked for in --programs)."""
        if name not in self.outputs:
            say(f"checking against {name}: one untimed run")
            self.part("outputs", name, self.sizes_of(self.lab.PROGRAMS[name]), work)
            if not (work / f"{name}.outputs.pt").exists():
                raise RuntimeError(f"{name}'s untimed run gave no outputs (its problem is above)")
            self.outputs[name] = self.torch.load(work / f"{name}.outputs.pt", map_location="cpu")
        return self.outputs[name]

    def check_fix(self, fix: str, before: str, how: str, work: Path) -> None:
        """A fix against the program it fixes: the same outputs from the same inputs."""
        found = self.lab.differences(self.outputs_of(before, work), self.outputs_of(fix, work))
        self.problems.extend(f"{fix} ({how}, the fix of {before}): its {d}" for d in found)
        say(f"  {fix} against {before} ({how}): " + ("same outputs" if not found else f"{len(found)} difference(s)"))
        for name, other in ((fix, before), (before, fix)):
            if name in self.results:
                self.results[name]["checked_against"].append(other)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def guarded(session: Session, what: str, step) -> None:
    """Runs one step; a failure is a problem of the run (with its traceback on
    stderr), and the other programs still run and are recorded."""
    try:
        step()
    except Exception as e:  # noqa: BLE001 - any failure of one program is reported, not fatal
        traceback.print_exc()
        session.problems.append(f"{what}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    session.free()


def run_part(session: Session, args: argparse.Namespace) -> int:
    """This process is one part of one program (`Session.part` started it):
    runs it, and answers in <work>/<program>.<part>.json (its results and
    problems)."""
    if args.program not in session.lab.PROGRAMS or not args.sizes or not args.work:
        fail("--part needs --program, --sizes and --work (Session.part passes them)")
    sizes = session.lab.Sizes(**json.loads(args.sizes))
    work = Path(args.work)
    step = {"program": session.program_part, "outputs": session.outputs_part}[args.part]
    guarded(session, args.program, lambda: step(args.program, sizes, work))
    answer = {"results": session.results, "problems": session.problems}
    (work / f"{args.program}.{args.part}.json").write_text(json.dumps(answer) + "\n")
    return 0


def _part_process(argv: list[str], started: float) -> None:
    """A program's process (`Session.part`): this script's --part, its
    progress lines timed from the run's start."""
    global STARTED
    STARTED = started
    sys.exit(main(argv))


def start_part_server() -> None:
    """Starts the server each program's process is forked from, with
    PyTorch and the programs imported in it once: a fresh process pays
    PyTorch's import each time (about 4 s on the GPU machines; a program's
    own set-up and runs take 2 to 15 s). Nothing in the server touches
    CUDA, so each program still starts its own CUDA context, and nothing of
    one program's state reaches another. Started before this process imports
    PyTorch itself, so the two imports run side by side."""
    multiprocessing.set_forkserver_preload(["torch", "lab10_programs"])
    multiprocessing.forkserver.ensure_running()


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    args = parse(argv)
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out {args.out}: not a folder")
    if not args.part:
        start_part_server()
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is needed and could not be imported ({e})")
    import lab10_programs as lab

    names = list(lab.PROGRAMS)
    if args.programs is not None:
        asked = [n.strip() for n in args.programs.split(",") if n.strip()]
        unknown = [n for n in asked if n not in lab.PROGRAMS]
        if unknown or not asked:
            what = f"unknown program(s) {', '.join(unknown)}" if unknown else "no program named"
            fail(f"--programs: {what}; known: {', '.join(lab.PROGRAMS)}")
        names = list(dict.fromkeys(asked))
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: PyTorch sees no CUDA GPU (torch.cuda.is_available() is False); --device cpu runs a smoke run")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--out {args.out}: cannot make the folder ({e.strerror})")

    session = Session(torch, lab, args, out_dir)
    cuda = session.cuda
    os.environ["LAB10_STARTED"] = str(STARTED)
    if args.part:
        return run_part(session, args)
    gpu = torch.cuda.get_device_name(0) if cuda else None
    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, " + (f"GPU 0: {gpu}" if cuda else "CPU smoke run"))
    relations = lab.related(names)
    needed = list(dict.fromkeys(names + [n for r in relations for n in r[:2]]))
    if cuda:
        for family in dict.fromkeys(lab.PROGRAMS[n].family for n in needed):
            guarded(session, f"the {family} programs' calibration (they keep their default hidden width)",
                    lambda: session.calibrate(family))
        guarded(session, "the graph branches' calibration (diagnose prices a graph's kernels by its gap)", session.calibrate_graph_branches)
        guarded(session, "the graph gap's calibration (diagnose prices a CUDA graph as a lower bound)", session.calibrate_graph)

    # Each program runs in a process of its own (timed, then traced), so no
    # program's timing carries another's state, or the profiler's: this one
    # only calibrates (the graph gap's calibration is traced, after the
    # branches are timed by events) and checks the fixes.
    with tempfile.TemporaryDirectory(prefix="lab10-") as work_dir:
        work = Path(work_dir)
        for k, name in enumerate(names, 1):
            guarded(session, name, lambda: session.measure(k, len(names), name, work))
        for fix, before, how in relations:
            guarded(session, f"{fix} against {before}", lambda: session.check_fix(fix, before, how, work))

    seconds = time.perf_counter() - started
    if cuda and names == list(lab.PROGRAMS) and seconds > BUDGET_SECONDS:
        # Said, not a problem: the recording is whole (a slow host's CPU, not a failed check).
        say(f"note: the whole set took {seconds:.0f} s, over its budget of {BUDGET_SECONDS} s")
    record = {
        "what": "lab 10's real programs: untraced times and torch.profiler traces (crate/reference/lab10_programs.py)",
        "command": args.command or command_as_recorded(argv, args.out, f"data/{gpu_folder(gpu)}/pytorch-trace" if gpu else None),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "device": args.device, "gpu": gpu, "gpu_folder": gpu_folder(gpu) if gpu else None,
        "driver": driver_version() if cuda else None,
        "timing": {"warmup_runs": WARMUP_RUNS, "repeats": args.repeats,
                   "device_ms": "CUDA events on the current stream, recorded before the run's first call and after its last "
                                "(every program's work joins that stream)",
                   "host_ms": "the host clock from before the run's first call to after torch.cuda.synchronize()"},
        "calibration": session.calibration,
        "programs": session.results,
        "problems": session.problems,
        "seconds": seconds,
    }
    (out_dir / "programs.json").write_text(json.dumps(record, indent=1) + "\n")

    clock = "device_ms" if cuda else "host_ms"
    print(f"{'program':<30} {'median ms':>10} {'25-75% ms':>18} {'traced host ms':>15}  trace")
    for name, r in session.results.items():
        t = r["untraced"][clock]
        traced = "-" if r["traced_host_ms"] is None else f"{r['traced_host_ms']:.1f}"
        print(f"{name:<30} {t['median']:>10.3f} {t['p25']:>8.3f}-{t['p75']:<9.3f} {traced:>15}  {r['trace'] or 'not traced'}")
    say(f"done in {seconds:.0f} s: {out_dir / 'programs.json'}")
    for p in session.problems:
        say(f"PROBLEM: {p}")
    return 1 if session.problems else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1:]))
