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

and past the streaming bound, where --placements names the lab's planned
placements for a batch:

* fused_ring: the ring with the ReLU in the first GEMM's epilogue
  (torch._addmm_activation with a zero bias: PyTorch's cuBLASLt path);
* resident: R layers kept on the GPU (spread evenly, as the lab's), the
  rest through the ring of K, fused layers (the lab's FP16 placement);
* fp8: FP8 (E4M3) weights, transposed, one scale per tensor, through
  torch._scaled_mm, in the lab's FP8 placement; the activations'
  scales calibrated once from a pass (as the lab's), each GEMM's output
  quantized by PyTorch after it (scale, cast);
* int4: 4-bit weights in the lab's 4-bit placement, laid out as the lab's
  (symmetric INT4 by output, an FP16 scale per 128 inputs, two values a
  byte, a layer's four parts in one pinned buffer, one upload a layer),
  quantized by the same rule; each layer dequantized by PyTorch ops
  (unpack, scale) into FP16, then the fused FP16 layer. Eager ops, and
  the same dequantization through torch.compile (its best: one fused
  kernel where Inductor fuses it) where Triton can compile here;
* layer_eager and layer_fused: one layer alone (weights on the GPU),
  relu(x @ W1) @ W2 and the fused-epilogue form, the mean over L layers;
* layer_int4pack: one layer alone through torch._weight_int4pack_mm (the
  same 4-bit integers in its own tiled layout, the scales in BF16, BF16
  activations), the mean
  over up to 4 layers: a reference, not a yardstick (it is no fast GEMM
  on Hopper).

Usage: torch_offload.py --layers L --d-model D --batches B1,B2 --ring K
                        --warmup W --repeats R [--device N]
                        [--placements B:R:K:R8:K8:R4:K4,...]
Prints one JSON line: {"torch": version, "batches": [{"batch", "to_hooks_ms",
"ring_ms", "fused_ring_ms", "resident_ms", "fp8_ms", "int4_ms",
"int4_compiled_ms", "layer_eager_ms", "layer_fused_ms",
"layer_int4pack_ms", "fp8_note", "int4_note", ...}, ...]} (a pass not run
is null; a note says why)."""
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
    ap.add_argument("--placements", default="")
    a = ap.parse_args()
    # batch -> (R, K, R8, K8, R4, K4); R8 or R4 < 0: no FP8 or 4-bit placement.
    placements = {}
    for item in filter(None, a.placements.split(",")):
        b, r, k, r8, k8, r4, k4 = (int(v) for v in item.split(":"))
        placements[b] = (r, k, r8, k8, r4, k4)
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

    def eager_layer(x, w):
        return torch.relu(x @ w[0]) @ w[1]

    zero_bias = torch.zeros(4 * d, dtype=torch.half, device=dev)

    def fused_layer(x, w):
        # cuBLASLt's ReLU epilogue: PyTorch takes it with a 1-D bias and beta 1.
        return torch._addmm_activation(zero_bias, x, w[0]) @ w[1]

    def resident_layers(r):
        """The lab's rule: layer i is resident where i*R mod L < R (R layers
        spread evenly, layer 0 the first)."""
        return [i for i in range(L) if (i * r) % L < r]

    def streamed(x, layer_fn, host, slots, kept):
        """The ring over the layers not in `kept` (layer -> its GPU weights),
        uploading from `host` into `slots`, the kept layers run where they fall."""
        k = len(slots)
        copied = [torch.cuda.Event() for _ in range(k)]
        freed = [torch.cuda.Event() for _ in range(k)]

        def upload(layer, slot):
            with torch.cuda.stream(copy_s):
                for dst, src in zip(slots[slot], host(layer)):
                    dst.copy_(src, non_blocking=True)
                copied[slot].record(copy_s)

        order = [i for i in range(L) if i not in kept]
        for j in range(min(k, len(order))):
            upload(order[j], j)
        m = 0
        for i in range(L):
            if i in kept:
                x = layer_fn(x, kept[i], i)
                continue
            s = m % k
            compute_s.wait_event(copied[s])
            x = layer_fn(x, slots[s], i)
            freed[s].record(compute_s)
            if m + k < len(order):
                copy_s.wait_event(freed[s])
                upload(order[m + k], s)
            m += 1
        return x

    pinned16 = lambda layer: (p1[layer], p2[layer])

    def ring_forward(x):
        return streamed(x, lambda x, w, i: eager_layer(x, w), pinned16, ring, {})

    def fused_ring_forward(x):
        return streamed(x, lambda x, w, i: fused_layer(x, w), pinned16, ring, {})

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

    # ---- 3. FP8 weights (where the GPU has FP8 and PyTorch _scaled_mm) -
    e4m3 = getattr(torch, "float8_e4m3fn", None)
    fp8_note = None
    if e4m3 is None or not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability(dev) < (8, 9):
        fp8_note = "no FP8 here (PyTorch's float8_e4m3fn and _scaled_mm on compute capability 8.9 and up)"
    f8 = []  # per layer: (W1ᵀ, W2ᵀ) pinned FP8 and their scales on the GPU
    if fp8_note is None:
        for i in range(L):
            pair = []
            for w in (w1[i], w2[i]):
                s_w = w.float().abs().max() / 448.0
                pair.append(((w.float() / s_w).t().contiguous().to(e4m3).pin_memory(), s_w.to(dev)))
            f8.append(pair)

    def fp8_layer(scales):
        """The FP8 layer with per-layer activation scales `scales[i]` =
        (s_in, s_h, 1/s_h, s_y, 1/s_y), all 0-dim GPU tensors."""
        def run(x8, w, i):
            s_in, s_h, inv_h, s_y, inv_y = scales[i]
            (w1t, sw1), (w2t, sw2) = f8[i]
            h = torch._scaled_mm(x8, w[0].t(), scale_a=s_in, scale_b=sw1, out_dtype=torch.half)
            h8 = (torch.relu_(h) * inv_h).to(e4m3)
            # (PyTorch 2.11's scale_result with an FP8 out_dtype did not
            # scale as cuBLASLt's D scale does on an H200: quantized here.)
            return (torch._scaled_mm(h8, w[1].t(), scale_a=s_h, scale_b=sw2, out_dtype=torch.half) * inv_y).to(e4m3)
        return run

    def calibrate(x):
        """Each layer's activation scales, from one FP8 pass that measures
        them as it goes (8x above the amax, as the lab's)."""
        scales = []
        s_in = (x.float().abs().max() / 448.0).to(dev)
        x8 = (x.float() / s_in).to(e4m3)
        s_x = s_in
        for i in range(L):
            (w1t, sw1), (w2t, sw2) = f8[i]
            g1, g2 = w1t.to(dev), w2t.to(dev)
            h = torch.relu(torch._scaled_mm(x8, g1.t(), scale_a=s_in, scale_b=sw1, out_dtype=torch.half))
            s_h = (h.float().abs().max() * 8 / 448.0).clamp_min(1e-30)
            h8 = (h.float() / s_h).to(e4m3)
            y = torch._scaled_mm(h8, g2.t(), scale_a=s_h, scale_b=sw2, out_dtype=torch.half)
            s_y = (y.float().abs().max() * 8 / 448.0).clamp_min(1e-30)
            scales.append((s_in, s_h, 1.0 / s_h, s_y, 1.0 / s_y))
            x8, s_in = (y.float() / s_y).to(e4m3), s_y
        return x8.new_empty(0), s_x, scales

    # ---- 4. 4-bit weights, laid out as the lab's -----------------------
    G = 128
    int4_note = None
    if d % G != 0:
        int4_note = f"no 4-bit pass: d = {d} does not split into groups of {G}"
    # A layer's bytes: W1's packed integers and scales, then W2's, each
    # matrix by output (Wᵀ): W1ᵀ is 4d x d, W2ᵀ is d x 4d.
    part_shapes = [((4 * d, d // 2), torch.uint8), ((4 * d, d // G), torch.half), ((d, 2 * d), torch.uint8), ((d, 4 * d // G), torch.half)]
    parts4, at = [], 0
    for shp, dt in part_shapes:
        n = shp[0] * shp[1] * (2 if dt == torch.half else 1)
        parts4.append((at, n, shp, dt))
        at += n
    layer4_bytes = at

    def views4(buf):
        """(W1ᵀ packed, its scales, W2ᵀ packed, its scales) in a layer's bytes."""
        return [buf[o:o + n].view(dt).view(shp) for o, n, shp, dt in parts4]

    def quantize4(w):
        """w (FP16, x @ w) by output, as the lab's rule: each group's scale is
        its largest magnitude over 7 (FP16), each value its rounded integer
        plus 8 in a nibble, an even input's in the low one. On the GPU."""
        wt = w.to(dev).float().t().contiguous()
        n_out, n_in = wt.shape
        g = wt.view(n_out, n_in // G, G)
        scale = (g.abs().amax(-1) / 7.0).half()
        s = scale.float().unsqueeze(-1)
        q = torch.where(s > 0, (g / s.clamp_min(1e-30)).round().clamp(-7, 7), torch.zeros_like(g))
        q = (q.to(torch.int32) + 8).view(n_out, n_in)
        return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), scale

    h4 = []  # per layer: its bytes, pinned
    if int4_note is None:
        for i in range(L):
            buf = torch.empty(layer4_bytes, dtype=torch.uint8).pin_memory()
            v = views4(buf)
            for j, w in enumerate((w1[i], w2[i])):
                packed, scale = quantize4(w)
                v[2 * j].copy_(packed)
                v[2 * j + 1].copy_(scale)
            h4.append(buf)

    def dequant4_eager(packed, scale):
        """Wᵀ in FP16 from its packed integers and its groups' scales."""
        n_out = packed.shape[0]
        q = torch.stack((packed & 15, packed >> 4), dim=-1).view(n_out, -1, G)
        return ((q.half() - 8) * scale.unsqueeze(-1)).view(n_out, -1)

    def with_views(buf):
        """A layer's GPU buffer and its four parts' views, made once (not
        per layer of every timed pass). The ring's upload copies into the
        buffer alone: it pairs a slot's entries with the host's one."""
        return (buf, *views4(buf))

    def int4_layer(dequant):
        def run(x, w, i):
            _, p1, sc1, p2, sc2 = w
            h = torch._addmm_activation(zero_bias, x, dequant(p1, sc1).t())
            return h @ dequant(p2, sc2).t()
        return run

    dequant4_compiled, compile_note = None, None
    if int4_note is None:
        try:
            dequant4_compiled = torch.compile(dequant4_eager, dynamic=False)
            v = views4(h4[0].to(dev))
            # Compiled here, under no_grad as the passes run (a guard of
            # its own: compiled otherwise, it would compile again in the
            # first timed pass where the run asks for no warm-up).
            with torch.no_grad():
                for p, sc in ((v[0], v[1]), (v[2], v[3])):
                    if not torch.allclose(dequant4_compiled(p, sc), dequant4_eager(p, sc), rtol=1e-3, atol=0):
                        raise RuntimeError("its values differ from the eager ops'")
            torch.cuda.synchronize(dev)
        except Exception as e:  # no Triton, no compiler: the eager pass stands alone
            dequant4_compiled = None
            compile_note = "torch.compile of the dequantization failed here: " + str(e).splitlines()[0][:200]

    def int4pack_layers(x):
        """One layer alone through torch._weight_int4pack_mm, (times, None)
        or (None, why not)."""
        if int4_note is not None:
            return None, int4_note
        if not hasattr(torch, "_weight_int4pack_mm") or not hasattr(torch, "_convert_weight_to_int4pack"):
            return None, "no torch._weight_int4pack_mm in this PyTorch"
        try:
            n = min(L, 4)
            packs = []
            for i in range(n):
                v = views4(h4[i].to(dev))
                pair = []
                for p, sc in ((v[0], v[1]), (v[2], v[3])):
                    # Its packing puts an even input in the high nibble; its
                    # values are (q - 8) * scale + zero, groups x out x 2.
                    wp = torch._convert_weight_to_int4pack(((p & 15) << 4 | p >> 4).contiguous(), 8)
                    sz = torch.stack((sc.to(torch.bfloat16), torch.zeros_like(sc, dtype=torch.bfloat16)), -1).transpose(0, 1).contiguous()
                    pair.append((wp, sz))
                packs.append((pair, v))
            xb = x.to(torch.bfloat16)
            (wp, sz), v = packs[0][0][0], packs[0][1]
            want = xb.float() @ dequant4_eager(v[0], v[1]).float().t()
            got = torch._weight_int4pack_mm(xb, wp, G, sz).float()
            err = ((got - want).norm() / want.norm()).item()
            if not err < 2e-2:
                return None, f"torch._weight_int4pack_mm disagrees with the dequantized GEMM: {err:.2e}"

            def layers(y):
                for (a1, s1), (a2, s2) in (pr for pr, _ in packs):
                    y = torch._weight_int4pack_mm(torch.relu(torch._weight_int4pack_mm(y, a1, G, s1)), a2, G, s2)
                return y
            return [ms / n for ms in timed(layers, xb)[0]], None
        except Exception as e:
            return None, "torch._weight_int4pack_mm failed here: " + str(e).splitlines()[0][:200]

    def layer_alone(layer_fn, x):
        """One layer's mean time over L layers from the GPU ring (no uploads)."""
        def layers(y):
            for i in range(L):
                y = layer_fn(y, ring[i % K])
            return y
        return [ms / L for ms in timed(layers, x)[0]]

    def median(v):
        return sorted(v)[len(v) // 2]

    results = []
    with torch.no_grad():
        for b in batches:
            x = (torch.rand(b, d, generator=gen) * 2 - 1).half().to(dev)
            hooks_ms, y1 = timed(network, x)
            ring_ms, y2 = timed(ring_forward, x)
            fused_ms, y3 = timed(fused_ring_forward, x)
            # Every way computes the same network: a wrong ring would differ.
            for name, y in (("ring", y2), ("fused ring", y3)):
                err = ((y1.float() - y.float()).norm() / y1.float().norm()).item()
                if not err < 1e-2:
                    print(f"PyTorch's {name} disagrees with its .to() pass at batch {b}: {err:.2e}", file=sys.stderr)
                    sys.exit(1)
            for i in range(K):
                ring[i][0].copy_(p1[i])
                ring[i][1].copy_(p2[i])
            row = {"batch": b, "to_hooks_ms": hooks_ms, "ring_ms": ring_ms, "fused_ring_ms": fused_ms,
                   "layer_eager_ms": layer_alone(eager_layer, x), "layer_fused_ms": layer_alone(fused_layer, x),
                   "resident_ms": None, "resident": None, "fp8_ms": None, "fp8": None, "fp8_note": fp8_note,
                   "int4_ms": None, "int4_compiled_ms": None, "int4": None, "int4_note": int4_note or compile_note}
            row["layer_int4pack_ms"], row["int4pack_note"] = int4pack_layers(x)
            if b in placements:
                r, k, r8, k8, r4, k4 = placements[b]
                kept = {i: (w1[i].to(dev), w2[i].to(dev)) for i in resident_layers(r)}
                slots = [(torch.empty(d, 4 * d, dtype=torch.half, device=dev), torch.empty(4 * d, d, dtype=torch.half, device=dev)) for _ in range(k)]
                res_ms, y4 = timed(lambda x: streamed(x, lambda x, w, i: fused_layer(x, w), pinned16, slots, kept), x)
                err = ((y1.float() - y4.float()).norm() / y1.float().norm()).item()
                if not err < 1e-2:
                    print(f"PyTorch's resident pass disagrees at batch {b}: {err:.2e}", file=sys.stderr)
                    sys.exit(1)
                row["resident_ms"], row["resident"] = res_ms, [r, k]
                del kept, slots
                if fp8_note is None and r8 >= 0:
                    _, s_x, scales = calibrate(x)
                    x8 = (x.float() / s_x).to(e4m3)
                    kept8 = {i: (f8[i][0][0].to(dev), f8[i][1][0].to(dev)) for i in resident_layers(r8)}
                    slots8 = [(torch.empty(4 * d, d, dtype=e4m3, device=dev), torch.empty(d, 4 * d, dtype=e4m3, device=dev)) for _ in range(k8)]
                    host8 = lambda layer: (f8[layer][0][0], f8[layer][1][0])
                    fp8_ms, y5 = timed(lambda x8: streamed(x8, fp8_layer(scales), host8, slots8, kept8), x8)
                    y5 = y5.float() * scales[-1][3]
                    err = ((y1.float() - y5).norm() / y1.float().norm()).item()
                    row["fp8_ms"], row["fp8"], row["fp8_error"] = fp8_ms, [r8, k8], err
                    del kept8, slots8
                if int4_note is None and r4 >= 0:
                    kept4 = {i: with_views(h4[i].to(dev)) for i in resident_layers(r4)}
                    slots4 = [with_views(torch.empty(layer4_bytes, dtype=torch.uint8, device=dev)) for _ in range(k4)]
                    host4 = lambda layer: (h4[layer],)
                    # The same network without the ring: each layer's bytes
                    # uploaded, then run. A ring that read a slot early differs.
                    y_plain = x
                    for i in range(L):
                        y_plain = int4_layer(dequant4_eager)(y_plain, with_views(h4[i].to(dev)), i)
                    for key, dq in (("int4_ms", dequant4_eager), ("int4_compiled_ms", dequant4_compiled)):
                        if dq is None:
                            continue
                        ms4, y6 = timed(lambda x: streamed(x, int4_layer(dq), host4, slots4, kept4), x)
                        err = ((y_plain.float() - y6.float()).norm() / y_plain.float().norm()).item()
                        if not err < 1e-2:
                            print(f"PyTorch's 4-bit pass ({key}) disagrees with its pass without a ring at batch {b}: {err:.2e}", file=sys.stderr)
                            sys.exit(1)
                        row[key] = ms4
                    row["int4"] = [r4, k4]
                    row["int4_error"] = ((y1.float() - y_plain.float()).norm() / y1.float().norm()).item()
                    del kept4, slots4, y_plain
                torch.cuda.empty_cache()
            results.append(row)
            line = f"batch {b}: to_hooks {median(hooks_ms):.2f} ms, ring {median(ring_ms):.2f} ms, fused ring {median(fused_ms):.2f} ms"
            if row["resident_ms"]:
                line += f", resident {median(row['resident_ms']):.2f} ms"
            if row["fp8_ms"]:
                line += f", FP8 {median(row['fp8_ms']):.2f} ms (off FP16 by {row['fp8_error']:.3f})"
            if row["int4_ms"]:
                line += f", 4-bit {median(row['int4_ms']):.2f} ms (off FP16 by {row['int4_error']:.3f})"
            if row["int4_compiled_ms"]:
                line += f", 4-bit compiled {median(row['int4_compiled_ms']):.2f} ms"
            if row["layer_int4pack_ms"]:
                line += f", _weight_int4pack_mm layer {median(row['layer_int4pack_ms']):.3f} ms"
            print(line, file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "batches": results}))


if __name__ == "__main__":
    main()
