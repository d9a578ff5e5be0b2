"""A PyTorch program traced two ways, to hold `overlap-lab trace` to
torch.profiler: the same GPU work (uploads from pageable and from pinned
memory, GEMMs, a download, a side stream joined by an event, a captured CUDA
graph, a host sync each step), run once under `overlap-lab trace` and once
under torch.profiler with CUDA activities only (one CUPTI subscriber per
process: never both in one run). Every output is checked against the CPU.

    python3 torch_patterns.py [--steps N] [--tiny] [--profile OUT.json]

--tiny runs thousands of tiny ops a step instead (an unfused momentum-SGD
step over 1000 small tensors, one at a time: each kernel shorter than its
launch), where a tracer's cost per call shows most. Prints the loop's wall
time and its fastest and median step; with --profile the whole program's GPU work
is profiled from before its first CUDA call, as the injection library
records it, and the trace exported to OUT.json.
"""

import argparse
import contextlib
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile", metavar="OUT.json")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps: at least 1")
    prof = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CUDA])
    with prof if prof else contextlib.nullcontext():
        wall_ms, checked, pageable = (tiny if args.tiny else run)(args.steps)
    if prof:
        prof.export_chrome_trace(args.profile)
    print(f"torch_patterns{' --tiny' if args.tiny else ''}: {args.steps} steps in {wall_ms:.2f} ms (wall), {checked} values checked")
    if pageable:
        # Each pageable copy timed by CUDA events around it, in this run:
        # what a tracer's own record of those copies is set beside (their
        # time moves from one process to the next with the host's staging).
        print("pageable copies by CUDA events: " + ", ".join(f"{k} {sum(v):.3f} ms over {len(v)}" for k, v in pageable.items()))


def print_steps(step_ms):
    """The loop's fastest and median step, ms (`record.py` reads the
    fastest: a step is too short for the host's slow spells to take every
    one, so the fastest is nearest a tracer's own cost)."""
    step_ms = sorted(step_ms)
    print(f"torch_patterns: steps fastest {step_ms[0]:.2f} ms, median {step_ms[len(step_ms) // 2]:.2f} ms")


def timed(fn, into):
    """`fn()` (a blocking copy) between two CUDA events on the current
    stream; appends their time, ms, to `into`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    into.append(start.elapsed_time(end))
    return out


def run(steps):
    dev = torch.device("cuda")
    n = 2048
    torch.manual_seed(0)
    pageable = [torch.randn(n, n) for _ in range(2)]
    pinned = [t.clone().pin_memory() for t in pageable]
    w = torch.randn(n, n, device=dev) / n**0.5
    side = torch.cuda.Stream()
    out_host = torch.empty(n, n).pin_memory()
    # A graph of three GEMMs, captured once, replayed each step.
    static_in = torch.zeros(n, n, device=dev)
    for _ in range(2):  # warm cuBLAS before capture
        torch.relu(static_in @ w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(torch.relu(torch.relu(static_in @ w) @ w) @ w)
    torch.cuda.synchronize()
    checked = 0
    uploads, downloads = [], []
    step_ms = []
    t0 = time.perf_counter()
    for step in range(steps):
        s0 = time.perf_counter()
        a = timed(lambda: pageable[step % 2].to(dev), uploads)  # pageable upload: the CPU waits
        b = pinned[step % 2].to(dev, non_blocking=True)  # pinned upload
        y = torch.relu(a @ w) + torch.relu(b @ w)
        done = torch.cuda.Event()
        main_stream = torch.cuda.current_stream()
        with torch.cuda.stream(side):
            side.wait_stream(main_stream)  # y is made on the main stream
            z = (y @ w).sum(dim=1)
            done.record(side)
        torch.cuda.current_stream().wait_event(done)
        static_in.copy_(y)
        graph.replay()
        out_host.copy_(static_out, non_blocking=True)
        torch.cuda.synchronize()  # a host sync each step
        step_ms.append((time.perf_counter() - s0) * 1e3)
        if step == steps - 1:
            w_host = timed(w.cpu, downloads)  # pageable downloads, each timed
            z_host = timed(z.cpu, downloads)
            ref_y = torch.relu(pageable[step % 2] @ w_host) + torch.relu(pinned[step % 2] @ w_host)
            ref = torch.relu(torch.relu(torch.relu(ref_y @ w_host) @ w_host) @ w_host)
            if not torch.allclose(out_host, ref, rtol=2e-2, atol=2e-2):
                print("torch_patterns: the graph's output differs from the CPU's", file=sys.stderr)
                sys.exit(2)
            if not torch.allclose(z_host, (ref_y @ w_host).sum(dim=1), rtol=2e-2, atol=2e-1):
                print("torch_patterns: the side stream's output differs from the CPU's", file=sys.stderr)
                sys.exit(2)
            checked = out_host.numel() + z.numel()
    wall_ms = (time.perf_counter() - t0) * 1e3
    print_steps(step_ms)
    return wall_ms, checked, {"MemcpyHtoD(Pageable->Device)": uploads, "MemcpyDtoH(Device->Pageable)": downloads}


def tiny(steps):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    params = [torch.randn(256, device=dev) for _ in range(1000)]
    start = [p.clone().cpu() for p in params]
    momenta = [torch.zeros_like(p) for p in params]
    lr, beta = 0.01, 0.9
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step_ms = []
    for _ in range(steps):
        s0 = time.perf_counter()
        for p, m in zip(params, momenta):
            g = 2 * p  # the gradient of sum(p^2)
            m.mul_(beta).add_(g)
            p.sub_(lr * m)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - s0) * 1e3)
    wall_ms = (time.perf_counter() - t0) * 1e3
    print_steps(step_ms)
    # The CPU's answer for the first tensor.
    p, m = start[0].clone(), torch.zeros_like(start[0])
    for _ in range(steps):
        m = m * beta + 2 * p
        p = p - lr * m
    if not torch.allclose(params[0].cpu(), p, rtol=1e-4, atol=1e-5):
        print("torch_patterns --tiny: the update differs from the CPU's", file=sys.stderr)
        sys.exit(2)
    return wall_ms, p.numel(), {}


if __name__ == "__main__":
    main()
