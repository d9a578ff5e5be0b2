#!/usr/bin/env python3
"""Lab 9's references in PyTorch: the same network (layers of two FP16 GEMMs,
d x 4d and 4d x d, with a ReLU between) whose weights live in host memory,
run two ways, at each batch size, timed per forward pass with CUDA events:

* to_hooks: how offloading is usually written. Each layer is an
  nn.Module whose weights stay in ordinary CPU tensors; a forward pre-hook
  moves them to the GPU with .to("cuda") and a forward hook drops the GPU
  copy again (no copy back), so each layer is copied, then computed.
* ring: the best hand-written version: pinned weights, a ring of K GPU
  buffers, a copy stream at high priority running K-1 layers ahead,
  ordered by events both ways.

Usage: torch_offload.py --layers L --d-model D --batches B1,B2 --ring K
                        --warmup W --repeats R [--device N]
Prints one JSON line: {"torch": version, "batches": [{"batch", "to_hooks_ms",
"ring_ms"}, ...]}."""
import argparse, json, sys
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--ring", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    torch.cuda.set_device(a.device)
    dev = torch.device("cuda", a.device)
    L, d, K = a.layers, a.d_model, a.ring
    batches = [int(b) for b in a.batches.split(",")]
    gen = torch.Generator().manual_seed(9)
    # He-style scales, as the lab's own weights: the activations keep their size.
    s1, s2 = (3.0 / d) ** 0.5, (1.5 / d) ** 0.5
    w1 = [(torch.rand(d, 4 * d, generator=gen) * 2 - 1).mul_(s1).half() for _ in range(L)]
    w2 = [(torch.rand(4 * d, d, generator=gen) * 2 - 1).mul_(s2).half() for _ in range(L)]

    # ---- 1. .to("cuda") in forward hooks -------------------------------
    class Layer(torch.nn.Module):
        def __init__(self, a1, a2):
            super().__init__()
            self.w1 = torch.nn.Parameter(a1, requires_grad=False)
            self.w2 = torch.nn.Parameter(a2, requires_grad=False)
            self.cpu = (a1, a2)

        def forward(self, x):
            return torch.relu(x @ self.w1) @ self.w2

    def to_gpu(m, args):
        m.w1.data = m.cpu[0].to(dev)
        m.w2.data = m.cpu[1].to(dev)

    def back_to_cpu(m, args, out):
        m.w1.data, m.w2.data = m.cpu

    network = torch.nn.Sequential(*[Layer(w1[i], w2[i]) for i in range(L)])
    for m in network:
        m.register_forward_pre_hook(to_gpu)
        m.register_forward_hook(back_to_cpu)

    # ---- 2. the hand-written pinned ring -------------------------------
    p1 = [w.pin_memory() for w in w1]
    p2 = [w.pin_memory() for w in w2]
    ring = [(torch.empty(d, 4 * d, dtype=torch.half, device=dev), torch.empty(4 * d, d, dtype=torch.half, device=dev)) for _ in range(K)]
    copy_s = torch.cuda.Stream(device=dev, priority=-1)
    compute_s = torch.cuda.current_stream(dev)

    def ring_forward(x):
        copied = [torch.cuda.Event() for _ in range(K)]
        freed = [torch.cuda.Event() for _ in range(K)]

        def upload(layer, slot):
            with torch.cuda.stream(copy_s):
                ring[slot][0].copy_(p1[layer], non_blocking=True)
                ring[slot][1].copy_(p2[layer], non_blocking=True)
                copied[slot].record(copy_s)

        for j in range(min(K, L)):
            upload(j, j)
        for i in range(L):
            s = i % K
            compute_s.wait_event(copied[s])
            x = torch.relu(x @ ring[s][0]) @ ring[s][1]
            freed[s].record(compute_s)
            if i + K < L:
                copy_s.wait_event(freed[s])
                upload(i + K, s)
        return x

    def timed(f, x):
        out = []
        for rep in range(a.warmup + a.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            start.record()
            y = f(x)
            end.record()
            torch.cuda.synchronize(dev)
            if rep >= a.warmup:
                out.append(start.elapsed_time(end))
        return out, y

    results = []
    with torch.no_grad():
        for b in batches:
            x = (torch.rand(b, d, generator=gen) * 2 - 1).half().to(dev)
            hooks_ms, y1 = timed(network, x)
            ring_ms, y2 = timed(ring_forward, x)
            # Both ways compute the same network: a wrong ring would differ.
            err = ((y1.float() - y2.float()).norm() / y1.float().norm()).item()
            if not err < 1e-2:
                print(f"the two PyTorch passes disagree at batch {b}: {err:.2e}", file=sys.stderr)
                sys.exit(1)
            results.append({"batch": b, "to_hooks_ms": hooks_ms, "ring_ms": ring_ms})
            print(f"batch {b}: to_hooks {sorted(hooks_ms)[len(hooks_ms) // 2]:.2f} ms, ring {sorted(ring_ms)[len(ring_ms) // 2]:.2f} ms", file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "batches": results}))


if __name__ == "__main__":
    main()
