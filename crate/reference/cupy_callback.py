#!/usr/bin/env python3
"""Lab 4's variant 3 (the seed's fix) in CuPy: row_dot on a compute stream,
D2H scores into a few pinned slots, an event after the D2H, a non-blocking
callback stream that waits on it and runs a host function
(`Stream.launch_host_func`) that only hands the job to a worker thread,
which does the argmin and returns the slot. The kernel is overlap-lab's own
kernels/row_dot.cu; sizes, iterations and slots come from an overlap-lab
record, and the CPU work per iteration is calibrated to the record's
balanced point (NumPy's argmin, repeated), so both sides do the same work.

Usage: cupy_callback.py RECORD.json [--out cupy.json]
Every argmin is checked against a CPU reference (float32 BLAS of small
integers: exact). Prints both totals; exits 1 if overlap-lab's variant 3 is
slower than CuPy's."""
import argparse, json, os, queue, statistics, sys, threading, time
import numpy as np
import cupy as cp
import cupyx

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rec = json.load(open(a.record))
    r = rec["results"]
    cfg = r["config"]
    rows, dim, n, nslots = cfg["rows"], cfg["dim"], cfg["iterations"], cfg["slots"]
    gpu_ms = r["gpu_ms"]["median"]
    def point_cpu(p):
        return statistics.median(v["cpu_ms"]["median"] for v in p["variants"])
    bal = min(r["points"], key=lambda p: abs(np.log(point_cpu(p) / gpu_ms)))
    target_cpu_ms = point_cpu(bal)  # the CPU work per iteration both sides do
    ours_v3 = next(v for v in bal["variants"] if v["variant"] == "hand-off-to-worker")
    ours, ours_cpu = ours_v3["total_ms"]["median"], ours_v3["cpu_ms"]["median"]

    src = open(os.path.join(os.path.dirname(__file__), "../../kernels/row_dot.cu")).read()
    kernel = cp.RawKernel(src, "row_dot", options=("--fmad=false",))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = min(sms * 16, (rows + 7) // 8)

    rng = np.random.default_rng()
    keys_h = rng.integers(-8, 8, size=(rows, dim), dtype=np.int8).astype(np.float32)
    queries_h = rng.integers(-8, 8, size=(n, dim), dtype=np.int8).astype(np.float32)
    reference = np.argmin(keys_h @ queries_h.T, axis=0)  # exact: integer sums < 2^24
    keys, queries = cp.asarray(keys_h), cp.asarray(queries_h)
    del keys_h

    compute = cp.cuda.Stream(non_blocking=True)
    callback = cp.cuda.Stream(non_blocking=True)
    dev = [cp.empty(rows + 1, dtype=cp.float32) for _ in range(nslots)]
    host = [cupyx.empty_pinned((rows + 1,), dtype=np.float32) for _ in range(nslots)]
    ready = [cp.cuda.Event(disable_timing=True) for _ in range(nslots)]
    nbytes = (rows + 1) * 4

    def gpu_work(t, s):
        with compute:
            kernel((grid,), (256,), (keys, queries, np.int32(t), np.uint32(rows), np.int32(dim), dev[s], np.uint32(t)))
        cp.cuda.runtime.memcpyAsync(host[s].ctypes.data, dev[s].data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToHost, compute.ptr)

    def cpu_work(scores, passes):
        first = int(np.argmin(scores))
        for _ in range(passes - 1):
            if int(np.argmin(scores)) != first:
                raise RuntimeError("argmin passes disagree")
        return first

    # Calibrate NumPy's passes to the record's CPU time per iteration.
    def cpu_ms(passes, reps=9):
        v = []
        for i in range(reps):
            gpu_work(i % n, 0)
            compute.synchronize()
            t0 = time.perf_counter()
            cpu_work(host[0][:rows], passes)
            v.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(v)
    one, nine = cpu_ms(1), cpu_ms(9)
    per_pass = max((nine - one) / 8, 1e-6)
    passes = max(1, round((target_cpu_ms - (one - per_pass)) / per_pass))

    def run(passes):
        free = queue.Queue()
        for s in range(nslots):
            free.put(s)
        jobs = queue.Queue()
        results = [-1] * n
        durations = [0.0] * n
        errors = []
        last_end = [0.0]
        def worker():
            while True:
                job = jobs.get()
                if job is None:
                    return
                t, s = job
                stamp = int(host[s].view(np.uint32)[rows])
                t0 = time.perf_counter()
                try:
                    results[t] = cpu_work(host[s][:rows], passes)
                except Exception as e:  # surfaces after the run
                    errors.append(f"iteration {t}: {e}")
                durations[t] = (time.perf_counter() - t0) * 1e3
                if stamp != t or int(host[s].view(np.uint32)[rows]) != t:
                    errors.append(f"iteration {t}: slot {s} stamped {stamp}")
                last_end[0] = time.perf_counter()
                free.put(s)
        def hand_off(arg):  # the host function: only enqueue
            jobs.put(arg)
        th = threading.Thread(target=worker, name="argmin-worker")
        th.start()
        start = time.perf_counter()
        for t in range(n):
            s = free.get()
            gpu_work(t, s)
            ready[s].record(compute)
            callback.wait_event(ready[s])
            callback.launch_host_func(hand_off, (t, s))
        compute.synchronize()
        callback.synchronize()
        jobs.put(None)
        th.join()
        total = (last_end[0] - start) * 1e3
        bad = [t for t in range(n) if results[t] != reference[t]]
        if errors or bad:
            sys.exit(f"CuPy run failed verification: {errors[:1]} {bad[:3]}")
        return total, statistics.median(durations)

    # Correct the passes on real runs, as overlap-lab does: the worker's
    # argmin inside the pipeline does not cost what it costs alone.
    for _ in range(4):
        _, c = run(passes)
        if abs(c / target_cpu_ms - 1) < 0.1:
            break
        passes = max(1, passes + round((target_cpu_ms - c) / per_pass))
    totals, cpus = zip(*[run(passes) for _ in range(a.repeats)])
    cupy_ms, cupy_cpu = statistics.median(totals), statistics.median(cpus)
    bound = n * max(gpu_ms, cupy_cpu) + min(gpu_ms, cupy_cpu)
    print(f"CuPy variant 3: {rows} keys x {dim}, {n} iterations, {nslots} slots, {passes} NumPy argmin passes")
    print(f"  CPU per iteration {cupy_cpu:.3f} ms (overlap-lab's balanced point: {target_cpu_ms:.3f} ms), GPU {gpu_ms:.3f} ms")
    print(f"  CuPy total {cupy_ms:.2f} ms (min {min(totals):.2f}, max {max(totals):.2f}), {n / cupy_ms * 1e3:.0f} it/s, {100 * bound / cupy_ms:.1f}% of its bound {bound:.2f} ms")
    print(f"  overlap-lab variant 3 at the same point: {ours:.2f} ms (CPU per iteration {ours_cpu:.3f} ms) -> CuPy / overlap-lab = {cupy_ms / ours:.3f}")
    if a.out:
        json.dump({"cupy_total_ms": totals, "cupy_cpu_ms": cupy_cpu, "passes": passes, "target_cpu_ms": target_cpu_ms,
                   "gpu_ms": gpu_ms, "overlap_lab_total_ms": ours, "rows": rows, "dim": dim, "iterations": n, "slots": nslots,
                   "cupy": cp.__version__, "numpy": np.__version__}, open(a.out, "w"), indent=1)
    print("PASS" if ours < cupy_ms else "FAIL: overlap-lab's variant 3 is not faster")
    sys.exit(0 if ours < cupy_ms else 1)

if __name__ == "__main__":
    main()
