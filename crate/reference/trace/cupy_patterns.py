#!/usr/bin/env python3
"""A learner's CUDA program in CuPy: what `overlap-lab trace -- python3
cupy_patterns.py MODE` traces and diagnoses, beside `patterns.cu` (the same
kernel, batch sizes and checks; the CPU's work on each batch writes the
same values, with NumPy, in well under a millisecond, so that these loops
are bound by the GPU as the other two languages' are).

  pageable     one stream; each batch uploaded from a NumPy array
               (`ndarray.set`), computed, downloaded into one (`ndarray.get`)
  pinned       the same through page-locked NumPy arrays
               (`cupyx.empty_pinned`): pageable's fix
  copy-stream  pinned, the uploads on a stream of their own into two device
               buffers used in turn, joined to the compute stream by events
               (`Stream.record`, `Stream.wait_event`): pinned's fix

Usage: cupy_patterns.py MODE [--batches 20] [--mib 32]; prints its loop's
wall time and how many outputs it checked.
"""

import argparse
import os
import sys
import time

import cupy as cp
import cupyx
import numpy as np

# patterns.cu's kernel (`work.cuh`, shared by the three programs), compiled
# before the loop (`RawKernel.compile`), so the program's first GPU op is
# its first upload.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "work.cuh")) as f:
    WORK = cp.RawKernel(f.read(), "work")
ITERS = 2400
# The period of the inputs' values (`inputs`): i*7 % 1000 repeats every 1000 i.
PERIOD = 1000


def inputs(n, k):
    """Batch k's input values, as patterns.cu writes them."""
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + k * 13) % 1000).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["pageable", "pinned", "copy-stream"])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--mib", type=int, default=32)
    a = ap.parse_args()
    if a.batches < 1 or a.mib < 1:
        sys.exit("cupy_patterns.py: --batches and --mib: at least 1")
    if a.mib > 64:
        # The values are built in float32, exact while 7 * i < 2**24.
        sys.exit("cupy_patterns.py: --mib: at most 64")
    n = a.mib * (1 << 20) // 4
    empty = (lambda shape: np.empty(shape, np.float32)) if a.mode == "pageable" else (lambda shape: cupyx.empty_pinned(shape, np.float32))
    host_in, host_out = empty((a.batches, n)), empty((a.batches, n))
    for k in range(a.batches):
        host_in[k] = inputs(n, k)
    host_out.fill(-1.0)  # poisoned: a value the kernel never writes
    compute = cp.cuda.Stream(non_blocking=True)
    copy = cp.cuda.Stream(non_blocking=True) if a.mode == "copy-stream" else compute
    slots = 2 if a.mode == "copy-stream" else 1
    dev_in = [cp.empty(n, cp.float32) for _ in range(slots)]
    dev_out = cp.empty(n, cp.float32)
    uploaded, consumed = [None] * slots, [None] * slots
    WORK.compile()
    # The CPU's own work on each batch: a fresh eighth of its input, the
    # same values, written in float32 in place with NumPy. (i*7 + k*13) %
    # 1000 repeats every PERIOD values of i: batch k's first PERIOD (an
    # add and a masked subtract), copied along the eighth in rows of
    # PERIOD, then the rest. Computing every value (the add and masked
    # subtract over the whole eighth; NumPy's float `mod`, ten times
    # slower still) took the CPU about as long as the GPU took over the
    # batch, and the loop waited on its CPU.
    eighth = n // 8
    rows, rest = divmod(eighth, PERIOD)
    base = (np.arange(PERIOD, dtype=np.float32) * 7) % PERIOD
    period = np.empty(PERIOD, np.float32)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for k in range(a.batches):
        fresh = host_in[k, :eighth]
        np.add(base, (k * 13) % PERIOD, out=period)
        np.subtract(period, PERIOD, out=period, where=period >= PERIOD)
        fresh[:rows * PERIOD].reshape(rows, PERIOD)[:] = period
        fresh[rows * PERIOD:] = period[:rest]
        slot = k % slots
        if consumed[slot] is not None:
            copy.wait_event(consumed[slot])
        dev_in[slot].set(host_in[k], stream=copy)
        if copy is not compute:
            uploaded[slot] = copy.record()
            compute.wait_event(uploaded[slot])
        WORK((264,), (256,), (dev_in[slot], dev_out, np.uint64(n), np.int32(ITERS), np.float32(1.0), np.float32(0.0)), stream=compute)
        if copy is not compute:
            consumed[slot] = compute.record()
        dev_out.get(stream=compute, out=host_out[k], blocking=False)
    cp.cuda.Device().synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    for k in range(a.batches):
        want = inputs(n, k) + 1.0
        wrong = np.flatnonzero(host_out[k] != want)
        if wrong.size:
            i = wrong[0]
            sys.exit(f"cupy_patterns.py {a.mode}: batch {k}: element {i} is {host_out[k][i]}, want {want[i]}")
    print(f"cupy_patterns {a.mode}: {a.batches} batches of {a.mib} MiB in {ms:.2f} ms (wall), {a.batches * n} values checked")


if __name__ == "__main__":
    main()
