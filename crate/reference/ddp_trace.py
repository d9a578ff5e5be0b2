#!/usr/bin/env python3
"""Several ranks, one data-parallel step: PyTorch's DistributedDataParallel
programs for `overlap-lab diagnose` on several ranks (issue 63), each run on
--gpus GPUs (one process per rank, NCCL; gloo with --device cpu), timed
untraced, then traced by torch.profiler, one trace per rank.

    python3 crate/reference/ddp_trace.py --out DIR [--gpus 2] [--steps 20]
        [--programs a,b] [--device cuda|cpu]

The model: LAYERS residual blocks x + GELU(x W) of WIDTH (float32
weights, bfloat16 autocast on a GPU), a batch of BATCH rows a rank and a
fixed target for each, the mean squared error, SGD. Its
gradients (LAYERS x WIDTH^2 x 4 bytes) take NCCL longer to sum than one
layer's backward, so how DDP buckets them and when it starts each sum shows
in the step. The programs, each a "before" and the program that applies its
fix beside it:

- ddp_bucket_25: DDP as it comes (bucket_cap_mb=25); ddp_bucket_5,
  ddp_bucket_100 and ddp_bucket_400 the same with smaller and larger
  buckets (whichever size the what-if prefers is among them or between);
- ddp_accumulate_4: four micro-batches a step, each backward's gradients
  summed (every backward all-reduces); ddp_accumulate_4_no_sync: the first
  three backwards under `no_sync()`, one sum a step;
- ddp_straggler: rank 1 runs STRAGGLE_MS of extra GPU work before each
  forward (the others wait for it in the first sum); ddp_bucket_25 is the
  balanced program.

Each program runs in processes of its own (one per rank, made by
torch.multiprocessing): set up, WARMUP steps, then --steps steps timed by
CUDA events on each rank's current stream (the host clock with --device
cpu), then steps under torch.profiler (CPU and CUDA, no shapes, no
stacks) with its step schedule, as a training script marks its steps: one
warm-up step, then TRACED_STEPS recorded, each marked `ProfilerStep#<k>`
(HTA's straggler analysis reads its iterations from them), exported by each
rank to DIR/<program>.rank<k>.json.gz.
After its steps each program checks that its weights moved, that every
rank holds the same weights (DDP's promise) and, where two programs do the
same arithmetic (the bucket sizes, the straggler, accumulation with and
without no_sync), that their updates agree within 1% of the largest. DIR/programs.json holds each
program's untraced step times per rank and the step's (the slowest rank's
each step), its traces, the sizes, and the run's command, date, torch,
NCCL and GPUs.

Exit status: 0 when every program ran and every check passed; 1 when one
failed (programs.json written with the problems); 2 on bad options, no
PyTorch or too few GPUs (one line on stderr). Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

# Before PyTorch or NCCL read their environment (the ranks inherit it):
# NVLink multicast stays off.
for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

LAYERS, WIDTH, BATCH = 24, 4096, 4096
SMOKE = {"layers": 4, "width": 64, "batch": 32}  # --device cpu
WARMUP, TRACED_STEPS = 3, 3
STRAGGLE_MS = 4.0
LEARNING_RATE = 1e-3
STARTED = time.time()

# name: (what, bucket MiB, micro-batches a step, no_sync on all but the last, extra work on rank 1)
PROGRAMS = {
    "ddp_bucket_25": ("DDP as it comes: buckets of 25 MiB, every backward summed", 25, 1, False, False),
    "ddp_bucket_5": ("buckets of 5 MiB", 5, 1, False, False),
    "ddp_bucket_100": ("buckets of 100 MiB", 100, 1, False, False),
    "ddp_bucket_400": ("buckets of 400 MiB", 400, 1, False, False),
    "ddp_accumulate_4": ("four micro-batches a step, every backward summed", 25, 4, False, False),
    "ddp_accumulate_4_no_sync": ("four micro-batches a step, the first three under no_sync(): one sum a step", 25, 4, True, False),
    "ddp_straggler": (f"rank 1 runs {STRAGGLE_MS:g} ms of extra GPU work before each forward", 25, 1, False, True),
}
# (before, after, the fix): what each pair shows.
PAIRS = [
    ("ddp_bucket_25", "ddp_bucket_5", "buckets of 5 MiB"),
    ("ddp_bucket_25", "ddp_bucket_100", "buckets of 100 MiB"),
    ("ddp_bucket_25", "ddp_bucket_400", "buckets of 400 MiB"),
    ("ddp_accumulate_4", "ddp_accumulate_4_no_sync", "no_sync() on all but the last micro-batch"),
    ("ddp_straggler", "ddp_bucket_25", "the straggler's extra work removed"),
]
# Programs whose updates must agree after the same steps (same arithmetic).
SAME_UPDATES = [("ddp_bucket_25", n) for n in ("ddp_bucket_5", "ddp_bucket_100", "ddp_bucket_400", "ddp_straggler")] + [
    ("ddp_accumulate_4", "ddp_accumulate_4_no_sync")]


def say(line: str) -> None:
    print(f"ddp [{time.time() - STARTED:5.0f} s]: {line}", file=sys.stderr, flush=True)


def fail(line: str) -> None:
    print(f"ddp_trace: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        fail(f"{message} (see --help)")


def parse(argv):
    ap = _Parser(prog="ddp_trace.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the traces and programs.json (made if missing)")
    ap.add_argument("--gpus", type=int, default=2, metavar="N", help="ranks: GPUs 0..N-1, one process each (default 2)")
    ap.add_argument("--steps", type=int, default=20, metavar="N", help="untraced timed steps per program (default 20)")
    ap.add_argument("--programs", metavar="A,B", help=f"programs to run (default: all): {', '.join(PROGRAMS)}")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default), or cpu: a smoke run over gloo, small sizes")
    a = ap.parse_args(argv)
    if a.gpus < 2 or a.steps < 1:
        fail("--gpus: at least 2; --steps: at least 1")
    a.names = list(PROGRAMS) if a.programs is None else [n.strip() for n in a.programs.split(",") if n.strip()]
    unknown = [n for n in a.names if n not in PROGRAMS]
    if unknown or not a.names:
        fail(f"--programs: unknown {', '.join(unknown) or '(none named)'}; known: {', '.join(PROGRAMS)}")
    return a


def summary(samples):
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, max(0, round(f * (len(s) - 1))))]  # noqa: E731
    return {"median": statistics.median(s), "p25": q(0.25), "p75": q(0.75), "min": s[0], "max": s[-1], "samples": samples}


def residual_block(torch, width):
    """x + GELU(x W): the signal and its gradient keep their size through
    every layer, so every layer's weights move each step."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(width, width, bias=False)

        def forward(self, x):
            return x + torch.nn.functional.gelu(self.linear(x))

    return Block()


def nccl_version(torch):
    v = torch.cuda.nccl.version()
    return ".".join(str(x) for x in v[:3]) if isinstance(v, tuple) else f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def rank_main(rank, a, name, store, work):
    """One rank of one program: set up, warm up, timed steps, traced steps,
    its weights saved; answers in <work>/<name>.rank<k>.json."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = a.device == "cuda"
    what, bucket_mb, micro, no_sync, straggles = PROGRAMS[name]
    sizes = {"layers": LAYERS, "width": WIDTH, "batch": BATCH} if cuda else SMOKE
    if cuda:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=a.gpus, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=a.gpus)
    try:
        torch.manual_seed(0)  # the same weights on every rank and in every program
        layers = [residual_block(torch, sizes["width"]) for _ in range(sizes["layers"])]
        model = DDP(torch.nn.Sequential(*layers).to(dev), bucket_cap_mb=bucket_mb)
        first = torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu()
        opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        gen = torch.Generator(device="cpu").manual_seed(100 + rank)  # each rank its own batches and targets
        batches = [(torch.randn(sizes["batch"], sizes["width"], generator=gen).to(dev),
                     torch.randn(sizes["batch"], sizes["width"], generator=gen).to(dev)) for _ in range(4)]
        extra = torch.randn(2048, 2048, device=dev) if straggles and rank == 1 and cuda else None
        # The straggler's extra work: matmuls calibrated to STRAGGLE_MS once.
        extra_reps = 0
        if extra is not None and cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            (extra @ extra).sum()
            s.record()
            for _ in range(20):
                extra @ extra
            e.record()
            e.synchronize()
            extra_reps = max(1, round(STRAGGLE_MS / (s.elapsed_time(e) / 20)))
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
        k = 0

        def step():
            nonlocal k
            for _ in range(extra_reps):
                extra @ extra
            for m in range(micro):
                x, target = batches[k % len(batches)]
                k += 1
                quiet = no_sync and m < micro - 1
                with model.no_sync() if quiet else nullcontext(), autocast:
                    loss = (model(x).float() - target).pow(2).mean() / micro
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

        for _ in range(WARMUP):
            step()
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        dist.barrier()
        step_ms = []
        for _ in range(a.steps):
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                step()
                e.record()
                e.synchronize()
                step_ms.append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                step()
                step_ms.append((time.perf_counter() - t0) * 1e3)
        dist.barrier()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities):  # the profiler's start-up, outside the traced steps
            sync()
        raw = Path(work) / f"{name}.rank{rank}.json"

        def export(prof) -> None:
            # Exported from inside the folder, so that the trace names its file
            # (Kineto writes the path it is given into it), not this machine's folders.
            here = os.getcwd()
            os.chdir(work)
            try:
                prof.export_chrome_trace(raw.name)
            finally:
                os.chdir(here)

        marks = schedule(wait=0, warmup=1, active=TRACED_STEPS, repeat=1)
        with profile(activities=activities, record_shapes=False, with_stack=False, schedule=marks, on_trace_ready=export) as prof:
            for _ in range(1 + TRACED_STEPS):
                step()
                sync()  # each marked step holds its own GPU work
                prof.step()
        if not raw.exists():
            raise RuntimeError(f"{name}: rank {rank}'s profiler exported no trace")
        gz = Path(a.out) / f"{name}.rank{rank}.json.gz"
        with open(gz, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename=raw.name) as z:
            z.write(raw.read_bytes())
        raw.unlink()
        # DDP's promise: every rank holds the same weights.
        flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        spread = flat.clone()
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        lowest = flat.clone()
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        differ = float((spread - lowest).abs().max())
        update = flat.cpu() - first
        if rank == 0:
            torch.save(update, Path(work) / f"{name}.update.pt")
        answer = {"step_ms": step_ms, "trace": gz.name, "trace_bytes": gz.stat().st_size, "weights_differ_across_ranks": differ,
                  "largest_update": float(update.abs().max()),
                  "extra_reps": extra_reps, "sizes": sizes}
        if rank == 0:
            answer.update(torch=torch.__version__, nccl=nccl_version(torch) if cuda else None,
                          gpus=[torch.cuda.get_device_name(g) for g in range(a.gpus)] if cuda else None)
        (Path(work) / f"{name}.rank{rank}.json").write_text(json.dumps(answer))
    finally:
        dist.destroy_process_group()


def run_program(a, name, work) -> tuple[dict | None, str | None]:
    """All ranks of one program, in processes of their own."""
    import torch.multiprocessing as mp

    store = Path(tempfile.mkdtemp(prefix="store-", dir=work)) / "store"
    try:
        mp.spawn(rank_main, args=(a, name, str(store), str(work)), nprocs=a.gpus, join=True)
    except Exception as e:  # noqa: BLE001 - a failed program is a problem of the run
        return None, f"{name}: failed: {(str(e).strip().splitlines() or [type(e).__name__])[-1]}"
    ranks = [json.loads((Path(work) / f"{name}.rank{r}.json").read_text()) for r in range(a.gpus)]
    per_step = [max(r["step_ms"][i] for r in ranks) for i in range(a.steps)]
    what, bucket_mb, micro, no_sync, straggles = PROGRAMS[name]
    return {"what": what, "bucket_mb": bucket_mb, "largest_update": min(r["largest_update"] for r in ranks), "micro_batches": micro, "no_sync": no_sync, "straggler_rank": 1 if straggles else None,
            "straggler_extra_matmuls": ranks[1]["extra_reps"] if straggles else 0,
            "untraced": {"step_ms": summary(per_step), "per_rank_ms": [summary(r["step_ms"]) for r in ranks]},
            "traces": [r["trace"] for r in ranks], "trace_bytes": [r["trace_bytes"] for r in ranks],
            "weights_differ_across_ranks": max(r["weights_differ_across_ranks"] for r in ranks),
            "sizes": ranks[0]["sizes"], "run": {k: ranks[0].get(k) for k in ("torch", "nccl", "gpus")}}, None


def main(argv) -> int:
    a = parse(argv)
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is needed and could not be imported ({e})")
    if a.device == "cuda" and torch.cuda.device_count() < a.gpus:
        fail(f"--gpus {a.gpus}: PyTorch sees {torch.cuda.device_count()} GPU(s)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    a.out = str(out.resolve())
    results, problems = {}, []
    work = Path(tempfile.mkdtemp(prefix="ddp-"))
    try:
        for k, name in enumerate(a.names, 1):
            say(f"[{k}/{len(a.names)}] {name}: {PROGRAMS[name][0]}")
            found, problem = run_program(a, name, work)
            if problem:
                problems.append(problem)
                say(f"  {problem}")
                continue
            results[name] = found
            if found["weights_differ_across_ranks"] != 0.0:
                problems.append(f"{name}: the ranks' weights differ by up to {found['weights_differ_across_ranks']:g} after its steps")
            if not found["largest_update"] > 0.0:
                problems.append(f"{name}: its steps left the weights where they started")
            per_rank = ", ".join(f"rank {r} {s['median']:.2f}" for r, s in enumerate(found["untraced"]["per_rank_ms"]))
            say(f"  untraced, {a.steps} steps: the step {found['untraced']['step_ms']['median']:.2f} ms "
                f"(25-75%: {found['untraced']['step_ms']['p25']:.2f}-{found['untraced']['step_ms']['p75']:.2f}); {per_rank}; "
                f"traced -> {', '.join(found['traces'])}")
        for x, y in SAME_UPDATES:
            fx, fy = work / f"{x}.update.pt", work / f"{y}.update.pt"
            if fx.exists() and fy.exists():
                ux, uy = torch.load(fx), torch.load(fy)
                worst = float((ux - uy).abs().max() / ux.abs().max().clamp_min(1e-30))
                ok = worst <= 1e-2
                say(f"  {y} against {x}: updates within {worst:.2e} of the largest ({float(ux.abs().max()):.2e})" + ("" if ok else ": OFF"))
                if not ok:
                    problems.append(f"{y}: its weights' update is {worst:.2e} (of the largest) off {x}'s after the same steps")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run = next((r["run"] for r in results.values()), {})
    record = {
        "what": "issue 63's data-parallel programs: each rank's untraced step times and torch.profiler traces (crate/reference/ddp_trace.py)",
        "command": "python3 crate/reference/ddp_trace.py " + " ".join(argv),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": a.device, "ranks": a.gpus, "steps": a.steps, "warmup_steps": WARMUP, "traced_steps": TRACED_STEPS,
        "torch": run.get("torch"), "nccl": run.get("nccl"), "gpus": run.get("gpus"),
        "timing": "each rank's step by CUDA events on its current stream (the host clock on a CPU); the step's time is the slowest rank's",
        "pairs": [{"before": b, "after": f, "fix": how} for b, f, how in PAIRS if b in results and f in results],
        "programs": results, "problems": problems, "seconds": time.time() - STARTED,
    }
    (out / "programs.json").write_text(json.dumps(record, indent=1) + "\n")
    say(f"done in {time.time() - STARTED:.0f} s: {out / 'programs.json'}")
    for p in problems:
        say(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
