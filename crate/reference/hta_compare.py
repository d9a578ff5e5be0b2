#!/usr/bin/env python3
"""The figures of one torch.profiler trace as Meta's HolisticTraceAnalysis
(HTA, PyPI `HolisticTraceAnalysis`) computes them, printed as JSON, for
`overlap-lab diagnose` to be held to (crate/tests/hta.rs):

- the traced window, GPU idle and busy time: HTA's temporal breakdown
  (`TraceAnalysis.get_temporal_breakdown`): the window from the first GPU
  op's start to the last one's end, idle the window less the union of
  every GPU op (kernels, copies and memsets alike);
- each copy kind's count, time and bytes: the GPU events HTA's parser keeps,
  classed by HTA's own `get_kernel_type` (memory ops), summed per name
  ("Memcpy HtoD (Pageable -> Device)").
- each stream's idle time split by cause: HTA's idle-time breakdown
  (`TraceAnalysis.get_idle_time_breakdown`, its default 30 µs
  `consecutive_kernel_delay`): between each op of a stream and the next,
  host wait where the next op's launching call began after the op before
  ended, else kernel wait under the threshold, else other (HTA rounds each
  figure to 0.01 µs).

Given several traces, one per rank of a data-parallel step in rank
order, it prints each rank's window, idle time (the temporal breakdown)
and communication/computation overlap (`get_comm_comp_overlap`: NCCL's
kernel time under computation kernels over NCCL's kernel time, %) instead,
and, where the traces mark their steps (`ProfilerStep#<k>`), HTA's one
potential straggler (`get_potential_stragglers`; null where unmarked or
where HTA's analysis fails), for `overlap-lab diagnose` on several ranks.

Usage: hta_compare.py TRACE.json[.gz] [TRACE.json[.gz] ...]

Two settings, so that HTA reads the trace as written and whole:
- HTA_DISABLE_NS_ROUNDING=1: by default HTA rounds a trace's ns timestamps to
  whole µs (starts up, ends down; a workaround for overlapping events in old
  PyTorch traces, pytorch/pytorch#122425), which moves every short op by up
  to 2 µs;
- include_last_profiler_step=True: by default HTA drops the GPU work of the
  last ProfilerStep, while the diagnosis covers the whole traced window.
"""

import json
import logging
import os
import sys

os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: hta_compare.py TRACE.json[.gz] [TRACE.json[.gz] ...]", file=sys.stderr)
        return 2
    paths = [os.path.abspath(p) for p in sys.argv[1:]]
    missing = [p for p in sys.argv[1:] if not os.path.isfile(p)]
    if missing:
        print(f"hta_compare.py: no such trace: {missing[0]}", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    from importlib.metadata import version

    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import KernelType, get_kernel_type

    if len(paths) > 1:
        return ranks(paths, TraceAnalysis, version("HolisticTraceAnalysis"))
    path = paths[0]

    analysis = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(path), include_last_profiler_step=True)
    breakdown = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    window = float(breakdown["kernel_time(us)"])
    idle = float(breakdown["idle_time(us)"])

    kinds, _ = analysis.get_idle_time_breakdown(visualize=False)
    idle_kinds = {}
    for stream, category, time in zip(kinds["stream"], kinds["idle_category"], kinds["idle_time"]):
        idle_kinds.setdefault(str(int(stream)), {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0})[f"{category}_us"] = float(time)

    trace = analysis.t.get_trace(0)
    names = analysis.t.symbol_table.get_sym_table()
    gpu = trace[trace["stream"].ne(-1)]
    copies = {}
    for name_id, dur, nbytes in zip(gpu["name"], gpu["dur"], gpu["bytes"]):
        name = names[name_id]
        if get_kernel_type(name) != KernelType.MEMORY.name or not name.startswith("Memcpy"):
            continue
        c = copies.setdefault(name, {"count": 0, "time_us": 0.0, "bytes": 0})
        c["count"] += 1
        c["time_us"] += float(dur)
        c["bytes"] += int(nbytes)
    print(
        json.dumps(
            {
                "library": "HolisticTraceAnalysis",
                "version": version("HolisticTraceAnalysis"),
                "window_us": window,
                "idle_us": idle,
                "busy_us": window - idle,
                "copies": copies,
                "idle_kinds": idle_kinds,
            },
            indent=2,
        )
    )
    return 0


def ranks(paths, TraceAnalysis, hta_version) -> int:
    """Several ranks' traces (rank k the k-th): each one's window, idle
    time and communication/computation overlap, as HTA computes them."""
    analysis = TraceAnalysis(trace_files=dict(enumerate(paths)), trace_dir=os.path.dirname(paths[0]), include_last_profiler_step=True)
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    out = {}
    for _, row in breakdown.iterrows():
        rank = int(row["rank"])
        share = overlap[overlap["rank"].eq(rank)]["comp_comm_overlap_pctg"].iloc[0]
        out[str(rank)] = {"window_us": float(row["kernel_time(us)"]), "idle_us": float(row["idle_time(us)"]), "overlap_pctg": float(share)}
    # Its potential stragglers need the steps marked (`ProfilerStep#<k>`):
    # none where the traces have no marks. One candidate: HTA names the
    # ranks whose last collectives start latest, as many as asked for.
    from hta.analyzers.straggler_analysis import StragglerAnalysis

    stragglers = None
    if StragglerAnalysis.get_profiler_steps(analysis.t):  # the steps HTA read from the marks
        # HTA 0.5 finds NCCL's kernels by their names before NCCL 2.19
        # (`ncclKernel_...`); newer NCCL names them `ncclDevKernel_...`. Each
        # gets an alias of the old form in HTA's symbol table, pointing at
        # the same kernel, so that its analysis sees the collectives.
        symbols = analysis.t.symbol_table
        for name in list(symbols.sym_table):
            if name.startswith("ncclDevKernel"):
                alias = "ncclKernel" + name[len("ncclDevKernel"):]
                if alias not in symbols.sym_index:
                    symbols.sym_table.append(alias)
                    symbols.sym_index[alias] = symbols.sym_index[name]
        try:
            stragglers = [int(r) for r in analysis.get_potential_stragglers(num_candidates=1)]
        except ValueError as e:  # HTA finds no collective long enough to judge by (NaN spreads)
            print(f"hta_compare.py: HTA's straggler analysis failed: {e}", file=sys.stderr)
    print(json.dumps({"library": "HolisticTraceAnalysis", "version": hta_version, "ranks": out, "potential_stragglers": stragglers}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
