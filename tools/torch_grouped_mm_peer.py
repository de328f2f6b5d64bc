#!/usr/bin/env python3
"""PyTorch peer for the GPU MoE benchmark (tools/gpu-check): one Kimi K3 routed layer with
bf16 weights through torch._grouped_mm, on the same routing k3's benchmark uses (uniform
top-k drawn with splitmix64 from the seed, token by token, exactly as src/cuda/moe_bench.cu
draws it). Times the whole routed layer (sort, gather, FC1, SiTU, FC2, weighted scatter-add)
with CUDA events around 5 batches of back-to-back calls, median per-call mean. Also measures, in the same process, the
device-to-device copy bandwidth (read + write counted) and the bf16 dense matmul rate.
Prints TSV on stdout. An oracle/peer only: nothing in k3 depends on it."""
import argparse
import sys

import torch

M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def routing(T, E, k, seed):
    st = seed
    ids = [[0] * k for _ in range(T)]
    w = [[0.0] * k for _ in range(T)]
    for t in range(T):
        for j in range(k):
            while True:
                st, z = splitmix64(st)
                e = z % E
                if e not in ids[t][:j]:
                    break
            ids[t][j] = e
            st, z = splitmix64(st)
            w[t][j] = (z >> 11) * 2.0**-53
    return ids, w


def median_ms(fn, reps, warm=3):
    """Per-call mean of back-to-back calls in 5 batches (as k3's bench times itself), median."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    per = max(1, reps // 5)
    ts = []
    for _ in range(5):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / per)
    ts.sort()
    return ts[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="1,8,64,256,2048")
    ap.add_argument("--experts", type=int, default=896)
    ap.add_argument("--hidden", type=int, default=3584)
    ap.add_argument("--inter", type=int, default=3072)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dev = torch.device("cuda")
    E, H, I, k = a.experts, a.hidden, a.inter, a.topk

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10)
    print(f"#torch_copy_bw_GBs\t{2 * n / ms / 1e6:.1f}")
    del src, dst
    A = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    B = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    ms = median_ms(lambda: A @ B, 10)
    print(f"#torch_bf16_TFLOPs\t{2 * 8192**3 / ms / 1e9:.1f}")
    del A, B
    sys.stdout.flush()

    g = torch.Generator(device=dev).manual_seed(1)
    W13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16, device=dev, generator=g).mul_(0.02)
    W2 = torch.randn(E, H, I, dtype=torch.bfloat16, device=dev, generator=g).mul_(0.02)
    W13t, W2t = W13.transpose(1, 2), W2.transpose(1, 2)  # [E, H, 2I], [E, I, H] column-major

    def situ(gate, up, a_=4.0, b_=25.0):
        gf, uf = gate.float(), up.float()
        return (a_ * torch.tanh(gf / a_) * torch.sigmoid(gf) * (b_ * torch.tanh(uf / b_))).to(torch.bfloat16)

    print("#torch\tT\tus_median")
    for T in [int(s) for s in a.T.split(",")]:
        ids_l, w_l = routing(T, E, k, a.seed)
        ids = torch.tensor(ids_l, dtype=torch.int64, device=dev)
        wts = torch.tensor(w_l, dtype=torch.float32, device=dev)
        x = torch.randn(T, H, dtype=torch.bfloat16, device=dev)

        def layer():
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)
            tok = order // k
            offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
            xs = x.index_select(0, tok)
            h13 = torch._grouped_mm(xs, W13t, offs=offs)
            h = situ(h13[:, I:], h13[:, :I])
            o = torch._grouped_mm(h, W2t, offs=offs)
            wv = wts.flatten().index_select(0, order).unsqueeze(1)
            y = torch.zeros(T, H, dtype=torch.float32, device=dev)
            y.index_add_(0, tok, o.float() * wv)
            return y

        try:
            ms = median_ms(layer, a.reps)
            print(f"torch\t{T}\t{ms * 1e3:.1f}")
        except Exception as ex:  # report, keep going with the other sizes
            print(f"#torch_fail\t{T}\t{type(ex).__name__}: {str(ex)[:200]}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
