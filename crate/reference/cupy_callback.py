#!/usr/bin/env python3
"""Lab 4's variant 3 (the seed's fix) in CuPy: row_dot on a compute stream,
D2H scores into a few pinned slots, an event after the D2H, a non-blocking
callback stream that waits on it and runs a host function
(`Stream.launch_host_func`) that only hands the job to a worker thread,
which does the argmin and returns the slot. The kernel is overlap-lab's own
kernels/row_dot.cu; sizes, iterations and slots come from an overlap-lab
record. The CPU work is the same argmin as overlap-lab's (argmin.c, built
here with gcc -O3 and called through ctypes, which releases the GIL, and
timed inside the call). At every CPU cost point of the record it runs
twice: with the same passes (the same work: the comparison the verdict is
on), then with the passes adjusted until CuPy's worker spends the same CPU
time per iteration as overlap-lab's did (in CuPy's process the same passes
took 1.1-1.6x longer on the H200), which compares the pattern alone.

Usage: cupy_callback.py RECORD.json [--out cupy.json]
Every argmin is checked against a CPU reference (float32 BLAS of small
integers: exact). Prints both totals at each point; exits 1 unless
overlap-lab's variant 3 is faster at the same work at every point where the
GPU is not the slower side (where it is, both sit at the GPU's bound). The
same-CPU-time comparison is printed beside it, not judged."""
import argparse, ctypes, json, os, queue, statistics, subprocess, sys, tempfile, threading, time
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

    # The same argmin as overlap-lab's, compiled natively.
    lib_path = os.path.join(tempfile.mkdtemp(prefix="overlap-lab-argmin-"), "libargmin.so")
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", "-o", lib_path, os.path.join(os.path.dirname(__file__), "argmin.c")], check=True)
    lib = ctypes.CDLL(lib_path)
    lib.heavy_argmin.restype = ctypes.c_int64
    lib.heavy_argmin.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_double)]

    def cpu_work(scores, passes):
        """The argmin and its duration (ms, timed inside the call)."""
        ms = ctypes.c_double()
        i = lib.heavy_argmin(scores.ctypes.data, rows, passes, ctypes.byref(ms))
        if i < 0:
            raise RuntimeError("argmin passes disagree: the scores changed while being read")
        return i, ms.value

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
                try:
                    results[t], durations[t] = cpu_work(host[s], passes)
                except Exception as e:  # surfaces after the run
                    errors.append(f"iteration {t}: {e}")
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

    run(r["points"][0]["passes"])  # warm-up
    def measure(passes):
        totals, cpus = zip(*[run(passes) for _ in range(a.repeats)])
        return {"passes": passes, "cupy_total_ms": list(totals), "median_ms": statistics.median(totals), "cpu_ms": statistics.median(cpus)}

    def bound(cpu):
        return n * max(gpu_ms, cpu) + min(gpu_ms, cpu)

    print(f"CuPy variant 3 vs overlap-lab's: {rows} keys x {dim}, {n} iterations, {nslots} slots, GPU {gpu_ms:.3f} ms per iteration (the record's)")
    rows_out, verdicts, pattern_alone = [], [], []
    for p in r["points"]:
        v3 = next(v for v in p["variants"] if v["variant"] == "hand-off-to-worker")
        ours, ours_cpu = v3["total_ms"]["median"], v3["cpu_ms"]["median"]
        # The same work (passes), then the same CPU time per iteration:
        # the passes scaled until CuPy's worker spends what overlap-lab's did.
        same_work = measure(p["passes"])
        passes, cpu = p["passes"], same_work["cpu_ms"]
        for _ in range(5):
            if abs(cpu / ours_cpu - 1) < 0.05:
                break
            passes = max(1, round(passes * ours_cpu / cpu))
            _, cpu = run(passes)
        same_time = measure(passes)
        ratio = same_work["median_ms"] / ours
        gpu_bound = ours_cpu < 0.9 * gpu_ms
        print(f"  C/G {ours_cpu / gpu_ms:.2f}: overlap-lab {ours:.2f} ms ({p['passes']} passes, CPU {ours_cpu:.3f} ms, {100 * bound(ours_cpu) / ours:.1f}% of bound)")
        for name, m in [("same work", same_work), ("same CPU time", same_time)]:
            print(f"      CuPy, {name}: {m['passes']} passes, CPU {m['cpu_ms']:.3f} ms; {m['median_ms']:.2f} ms (min {min(m['cupy_total_ms']):.2f}, max {max(m['cupy_total_ms']):.2f}), "
                  f"{100 * bound(m['cpu_ms']) / m['median_ms']:.1f}% of bound -> CuPy / overlap-lab = {m['median_ms'] / ours:.3f}")
        rows_out.append({"cpu_over_gpu": ours_cpu / gpu_ms, "overlap_lab_total_ms": ours, "overlap_lab_cpu_ms": ours_cpu,
                         "same_work": same_work, "same_cpu_time": same_time, "cupy_over_overlap_lab_same_work": ratio,
                         "cupy_over_overlap_lab_same_cpu_time": same_time["median_ms"] / ours, "gpu_bound": gpu_bound})
        # Where the GPU is the slower side, both sit at the GPU's bound and
        # there is nothing for the pattern to win; it is judged elsewhere.
        if not gpu_bound:
            verdicts.append(ratio > 1.0)
            pattern_alone.append(same_time["median_ms"] / ours)
    if a.out:
        json.dump({"points": rows_out, "gpu_ms": gpu_ms, "rows": rows, "dim": dim, "iterations": n, "slots": nslots,
                   "cpu_work": "argmin.c: overlap-lab's argmin in C, via ctypes", "repeats": a.repeats,
                   "cupy": cp.__version__, "numpy": np.__version__}, open(a.out, "w"), indent=1)
    ok = bool(verdicts) and all(verdicts)
    print(f"{'PASS' if ok else 'FAIL'}: overlap-lab faster at the same work at {sum(verdicts)} of {len(verdicts)} points where the CPU is not the faster side")
    print(f"  (at the same CPU time, the pattern alone: CuPy / overlap-lab = {', '.join(f'{x:.3f}' for x in pattern_alone)})")
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()
