#!/usr/bin/env python3
"""Lab 8's reference: PyTorch's copy between two GPUs (Tensor.copy_ from
cuda:FROM to cuda:TO), one way and both ways at once, timed as overlap-lab
times its own: by difference (COPIES copies minus one, over COPIES-1), each
run bracketed by CUDA events on the first GPU's stream, RUNS runs after one
untimed run of each, every result checked against the source. With
FROM == TO (a machine with one GPU) the copies are within that GPU.

Usage: torch_peer_copy.py --from 0 --to 1 --bytes 67108864 [--copies 11] [--runs 5]
Prints one JSON object: {"torch": version, "bytes": n, "one_way_ms": [...],
"both_ways_ms": [...]} (per-copy times, ms, one per run). overlap-lab runs
it in the same process tree as its own measurement (`overlap-lab multi-gpu`)."""
import argparse, json, sys

import torch

# About 10 ms of a GPU's clock: far longer than issuing a run's copies.
HOLD_CYCLES = 20_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", type=int, required=True)
    ap.add_argument("--to", dest="dst", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--copies", type=int, default=11)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if a.copies < 2 or a.runs < 1 or a.bytes < 8:
        sys.exit("give --copies >= 2, --runs >= 1 and --bytes >= 8")
    n = a.bytes // 4 // 2 * 2
    A, B = torch.device("cuda", a.src), torch.device("cuda", a.dst)
    src = torch.rand(n, device=A)
    dst = torch.full((n,), float("nan"), device=B)
    back_src = torch.rand(n, device=B)
    back_dst = torch.full((n,), float("nan"), device=A)
    sa, sb = torch.cuda.Stream(A), torch.cuda.Stream(B)
    half = n // 2

    def run(k, both):
        torch.cuda.synchronize(A)
        torch.cuda.synchronize(B)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # A spin kernel holds the first stream while Python issues the
        # copies (as overlap-lab's gate holds its streams), so the time
        # Python takes to issue them is not in the copies' time.
        with torch.cuda.stream(sa):
            torch.cuda._sleep(HOLD_CYCLES)
        start.record(sa)
        sb.wait_event(start)
        for _ in range(k):
            if both:
                # Half each way at once, as overlap-lab's both-ways plan.
                with torch.cuda.stream(sa):
                    dst[:half].copy_(src[:half], non_blocking=True)
                with torch.cuda.stream(sb):
                    back_dst[half:].copy_(back_src[half:], non_blocking=True)
            else:
                with torch.cuda.stream(sa):
                    dst.copy_(src, non_blocking=True)
        joined = torch.cuda.Event()
        joined.record(sb)
        sa.wait_event(joined)
        end.record(sa)
        end.synchronize()
        torch.cuda.synchronize(B)
        if both:
            ok = torch.equal(dst[:half].cpu(), src[:half].cpu()) and torch.equal(back_dst[half:].cpu(), back_src[half:].cpu())
        else:
            ok = torch.equal(dst.cpu(), src.cpu())
        if not ok:
            sys.exit("a copy did not arrive intact")
        return start.elapsed_time(end)

    out = {"torch": torch.__version__, "bytes": n * 4, "from": a.src, "to": a.dst}
    for both, key in ((False, "one_way_ms"), (True, "both_ways_ms")):
        run(1, both)
        run(a.copies, both)
        per_copy = []
        for _ in range(a.runs):
            t1 = run(1, both)
            tk = run(a.copies, both)
            per_copy.append((tk - t1) / (a.copies - 1))
        out[key] = per_copy
    print(json.dumps(out))


if __name__ == "__main__":
    main()
