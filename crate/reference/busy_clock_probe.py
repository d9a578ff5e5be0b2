"""Does a GPU kept busy run the same kernels slower than one that idles
between them, and how long must it idle to run them faster? The
calibration lab 10's what-if prices a fix that keeps the GPU busier by
(`diagnose::busy_clock`; data/<gpu>/README.md tells why).

The queue model prices every kernel at its traced time. Lab 10's fixed
download loop keeps its GPU busy where the "before" loop left it idle a
third of the time, and ran the same GEMMs about 5% slower. This probe
runs the download programs' step (`lab10_programs._Mlp`, four blocks of
the 2026-12-02 H200 recording's width) in phases: back to back (the next
step queued behind the one running), and each step followed by an idle
gap of a given length (the CPU waits for the step, then spins, then
launches the next step behind a one-thread sleep so that its kernels
queue, not follow the launches), for each gap length in turn, several
rounds. The sleep is counted in the idle gap: one thread of one SM, it
leaves the GPU as idle to its clock as no kernel would (about 50-60 µs,
so the shortest gaps measured are about that much over the spin). Each step is timed by CUDA
events, and so is each idle gap (from one step's end event to the next
one's start); the SM clock and the board's power are sampled beside it
by `nvidia-smi -lms` where it runs. It prints, per phase, the median
step and its spread, the median gap, the GPU's busy share (the steps'
time over the phase's), and the clocks and power sampled in it, and
with `--out` writes them as the recording lab 10 reads.

Usage: python3 crate/reference/busy_clock_probe.py [--hidden N] [--blocks N]
    [--steps N] [--gaps-ms MS,MS,...] [--rounds N] [--out FILE]

The recording: --out data/<gpu folder>/pytorch-trace/busy_clock.json
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


# About 50-60 µs at the H200's 1.6-2 GHz: longer than launching a step's kernels.
HOLD_CYCLES = 100_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=24832, help="the MLP's hidden width (default: the 2026-12-02 H200 recording's)")
    ap.add_argument("--blocks", type=int, default=4, help="MLP blocks in a step (default 4)")
    ap.add_argument("--steps", type=int, default=300, help="steps a phase (default 300)")
    ap.add_argument("--gaps-ms", default="0.02,0.05,0.1,0.2,0.3,0.5,1,2", help="the idle gaps after each step, one phase each, ms (default 0.02,0.05,0.1,0.2,0.3,0.5,1,2)")
    ap.add_argument("--rounds", type=int, default=4, help="the busy phase and each gap's, this many times in turn (default 4)")
    ap.add_argument("--out", help="write the figures as JSON here too")
    args = ap.parse_args()
    for name in ("hidden", "blocks", "rounds"):
        if getattr(args, name) < 1:
            print(f"busy_clock_probe: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.steps < 2:
        print("busy_clock_probe: --steps must be at least 2 (an idle gap lies between two steps)", file=sys.stderr)
        return 2
    try:
        gaps_ms = [float(g) for g in args.gaps_ms.split(",")]
    except ValueError:
        print(f"busy_clock_probe: --gaps-ms: {args.gaps_ms!r} is not a list of numbers", file=sys.stderr)
        return 2
    if not gaps_ms or any(g <= 0 for g in gaps_ms):
        print("busy_clock_probe: --gaps-ms must list gaps longer than 0", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"busy_clock_probe: PyTorch is needed ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("busy_clock_probe: PyTorch sees no CUDA GPU", file=sys.stderr)
        return 1
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import lab10_programs as lab

    device = torch.device("cuda")
    sizes = lab.Sizes(download_hidden=args.hidden, download_blocks=args.blocks)
    mlp = lab._Mlp(device, sizes, sizes.download_hidden, sizes.download_blocks)
    x = torch.randn(sizes.result_rows, sizes.width, device=device).to(torch.bfloat16)
    for _ in range(20):  # warm-up: cuBLAS's choices made, the clocks up
        mlp(x)
    torch.cuda.synchronize()

    smi = shutil.which("nvidia-smi")
    samples_file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    sampler = None
    if smi:
        sampler = subprocess.Popen([smi, "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20", "-i", "0"],
                                   stdout=samples_file, stderr=subprocess.DEVNULL)
        time.sleep(0.5)

    phases = []
    for r in range(args.rounds):
        for gap_ms in [0.0] + gaps_ms:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
            t0 = time.time()
            first = time.perf_counter()
            for start, end in events:
                if gap_ms > 0:
                    # The GPU is idle here: without this the first kernels would
                    # run as the CPU launches them and the step's time would be
                    # the launches'. A one-thread sleep holds the queue while
                    # the step is launched behind it (its SMs stay idle).
                    torch.cuda._sleep(HOLD_CYCLES)
                start.record()
                mlp(x)
                end.record()
                if gap_ms > 0:
                    end.synchronize()
                    # Spun, not slept: a sleep of 50 µs takes what the scheduler gives it.
                    until = time.perf_counter() + gap_ms / 1e3
                    while time.perf_counter() < until:
                        pass
            torch.cuda.synchronize()
            t1 = time.time()
            steps = [s.elapsed_time(e) for s, e in events]
            idle = [events[i][1].elapsed_time(events[i + 1][0]) for i in range(len(events) - 1)]
            span = events[0][0].elapsed_time(events[-1][1])
            phases.append({"round": r, "gap_ms": gap_ms, "from": t0, "to": t1, "steps_ms": steps, "idle_ms": idle,
                           "busy_share": sum(steps) / span, "wall_ms": (time.perf_counter() - first) * 1e3})
            time.sleep(0.2)
    if sampler:
        sampler.terminate()
        sampler.wait()
    samples = []
    samples_file.seek(0)
    for line in samples_file:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            when = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + parts[0].split(".")[1])
            samples.append((when, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    os.unlink(samples_file.name)

    gpu = torch.cuda.get_device_name(0)
    print(f"{gpu}, torch {torch.__version__}: a step of {args.blocks} blocks of width {args.hidden} "
          f"on {sizes.result_rows}x{sizes.width} bfloat16, {args.steps} steps a phase")
    print(f"{'phase':<18}{'median ms':>10}{'25-75% ms':>16}{'gap ms':>9}{'busy':>7}{'SM MHz (samples)':>24}{'power W':>9}")
    for p in phases:
        q = statistics.quantiles(p["steps_ms"], n=4)
        inside = [s for s in samples if p["from"] <= s[0] <= p["to"]]
        clocks = f"{statistics.median([s[1] for s in inside]):.0f} ({min(s[1] for s in inside):.0f}-{max(s[1] for s in inside):.0f}, {len(inside)})" if inside else "not sampled"
        power = f"{statistics.median([s[2] for s in inside]):.0f}" if inside else "-"
        p["sm_mhz"] = [s[1] for s in inside]
        p["power_w"] = [s[2] for s in inside]
        name = "busy" if p["gap_ms"] == 0 else f"gaps of {p['gap_ms']:g} ms"
        print(f"{name + ' ' + str(p['round'] + 1):<18}{statistics.median(p['steps_ms']):>10.3f}{f'{q[0]:.3f}-{q[2]:.3f}':>16}"
              f"{statistics.median(p['idle_ms']):>9.3f}{p['busy_share']:>7.2f}{clocks:>24}{power:>9}")
    summary = []
    for gap_ms in [0.0] + gaps_ms:
        mine = [p for p in phases if p["gap_ms"] == gap_ms]
        summary.append({"gap_ms": gap_ms,
                        "step_ms": statistics.median([t for p in mine for t in p["steps_ms"]]),
                        "idle_ms": statistics.median([t for p in mine for t in p["idle_ms"]]),
                        "busy_share": statistics.median([p["busy_share"] for p in mine])})
    busy = summary[0]["step_ms"]
    for row in summary[1:]:
        print(f"gaps of {row['gap_ms']:g} ms (the GPU idle {row['idle_ms']:.3f} ms a step, busy {row['busy_share']:.2f}): "
              f"busy over gapped {busy / row['step_ms']:.3f}")
    if args.out:
        out = Path(args.out)
        record = {
            "what": "lab 10's busy clock: one step's kernels kept busy and with idle gaps (crate/reference/busy_clock_probe.py)",
            "command": "python3 crate/reference/busy_clock_probe.py " + " ".join(sys.argv[1:]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "gpu": gpu, "driver": driver_version(),
            "step": {"hidden": args.hidden, "blocks": args.blocks, "rows": sizes.result_rows, "width": sizes.width, "dtype": "bfloat16"},
            "steps_a_phase": args.steps, "rounds": args.rounds,
            "by_gap": summary, "phases": phases,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, where Linux says it (as the crate's fingerprint reads it)."""
    try:
        return Path("/sys/module/nvidia/version").read_text().strip()
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
