"""The float64 MoE reference (src/moe/reference.c) against an independent numpy computation.

numpy decodes the weight formats from their definitions (E2M1, E4M3, E8M0, BF16 tables built
here), emulates the run-time activation quantization (NVFP4 per 16 with g = 1/max
input_scale, the hidden activation rounded to float32 first; MXFP8 per 32; bf16 round to
nearest even of x and of the float32 hidden, done here with integer bit operations since
numpy has no bfloat16) and runs the per-token expert loop in float64. Fresh random inputs on every run (seed printed on failure).
Bounds: relative L2 <= 1e-12 (float64 summation order only).
"""
import os
import pathlib
from fractions import Fraction
import subprocess
import tempfile

import numpy as np
import pytest

BUILD = os.environ.get("K3_BUILD", "build")
TOOL = pathlib.Path(BUILD) / "tests" / "tools" / "moe_ref_tool"

ACT = {"identity": 1, "gelu": 2, "relu": 3, "silu": 4, "swiglu": 5, "geglu": 6,
       "swiglu_bias": 7, "relu2": 8, "situ": 9}
GATED = {"swiglu", "geglu", "swiglu_bias", "situ"}
FMT = {"f32": 0, "bf16": 1, "nvfp4": 3, "mxfp4": 4}
MODE = {"w4a16": 0, "w4a4": 1, "w4a8": 2, "w4a16-bf16": 3}

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 15
    m = b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, s * v)


E4M3_POS = np.array([e4m3_decode(c) for c in range(0x7F)])  # 0 .. 448, increasing


def round_to_table(x, table):
    """Round |x| to the nearest entry of an increasing table, ties to the even index (the
    even code: these tables are indexed by code), keeping the sign; saturates at the top."""
    a = np.abs(x)
    hi = np.clip(np.searchsorted(table, a), 1, len(table) - 1)
    lo = hi - 1
    dl, dh = a - table[lo], table[hi] - a
    idx = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    idx = np.where(a >= table[-1], len(table) - 1, idx)
    return np.sign(x) * table[idx]


def e4m3_round(x):
    return round_to_table(np.asarray(x, np.float64), E4M3_POS)


def e2m1_round(x):
    return round_to_table(np.asarray(x, np.float64), E2M1[:8])


def nvfp4_act(x32, g):
    """NVFP4 run-time activation quantization of float32 rows, dequantized (block.h rule)."""
    x32 = x32.astype(np.float32).reshape(x32.shape[0], -1, 16)
    g = np.float32(g)
    amax = np.abs(x32).max(axis=2, keepdims=True)
    s = e4m3_round(((g * amax).astype(np.float32) / np.float32(6)).astype(np.float32))
    s32 = s.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = ((x32 * g).astype(np.float32) / s32).astype(np.float32)
    q = np.where(s32 == 0, 0, q)
    c = e2m1_round(np.clip(q, -6, 6))
    return (c * s.astype(np.float64) / np.float64(g)).reshape(x32.shape[0], -1)


def mxfp8_act(x32):
    x = x32.astype(np.float32).reshape(x32.shape[0], -1, 32).astype(np.float64)
    amax = np.abs(x).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(amax / 448.0))
    e = np.clip(np.where(np.isfinite(e), e, -127), -127, 127)
    return (e4m3_round(x / 2.0 ** e) * 2.0 ** e).reshape(x32.shape[0], -1)


def bf16_round(x32):
    """float32 -> nearest bfloat16 (ties to even), as float32: add 0x7FFF plus the lowest kept
    bit to the bit pattern, then clear the 16 dropped bits (finite inputs only)."""
    u = np.asarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def test_bf16_round_by_hand():
    """bf16 keeps 8 significant bits (ulp 2^-7 on [1, 2)): below, above and at half an ulp
    (ties to the even neighbour, either way), a carry into the exponent, a negative tie and
    a subnormal that is already bf16."""
    x = np.float32([1 + 2 ** -9, 1 + 3 * 2 ** -9, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 - 2 ** -9,
                    -(2 + 3 * 2 ** -7), 2 ** -130])
    want = [1, 1 + 2 ** -7, 1, 1 + 2 ** -6, 2, -(2 + 2 ** -5), 2 ** -130]
    assert bf16_round(x).astype(np.float64).tolist() == want


def act_fn(name, g, u, a, b):
    sig = lambda v: 1 / (1 + np.exp(-v))
    from math import erf
    verf = np.vectorize(erf)
    gelu = lambda v: 0.5 * v * (1 + verf(v / np.sqrt(2)))
    if name == "identity": return g
    if name == "relu": return np.maximum(g, 0)
    if name == "relu2": return np.maximum(g, 0) ** 2
    if name == "gelu": return gelu(g)
    if name == "silu": return g * sig(g)
    if name == "swiglu": return g * sig(g) * u
    if name == "geglu": return gelu(g) * u
    if name == "swiglu_bias": return g * sig(a * g) * (u + b)
    if name == "situ": return a * np.tanh(g / a) * sig(g) * (b * np.tanh(u / b))
    raise ValueError(name)


def make_matrix(rng, fmt, rows, cols):
    """Random stored bytes and their exact float64 value, decoded here."""
    if fmt == "f32":
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return w.tobytes(), None, 1.0, w.astype(np.float64)
    if fmt == "bf16":
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
        return bits.tobytes(), None, 1.0, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    codes = rng.integers(0, 16, (rows, cols))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    if fmt == "nvfp4":
        sc = rng.integers(0x20, 0x48, (rows, cols // 16)).astype(np.uint8)  # E4M3 2^-3 .. 2^1.x
        gs = np.float32(rng.uniform(0.001, 0.01))
        val = E2M1[codes] * np.repeat(e4m3_decode(sc), 16, axis=1) * np.float64(gs)
        return packed.tobytes(), sc.tobytes(), float(gs), val
    sc = rng.integers(118, 124, (rows, cols // 32)).astype(np.uint8)
    val = E2M1[codes] * np.repeat(2.0 ** (sc.astype(np.float64) - 127), 32, axis=1)
    return packed.tobytes(), sc.tobytes(), 1.0, val


class Ambiguous(Exception):
    """The inputs put a hidden activation within 2 ulp of a quantization boundary, or quantize
    every hidden value to zero: a draw to replace."""


def settled_f32(wmat, xin):
    """Per row of wmat: True where the exact dot product with xin is a float32 value v and every
    float64 summation order lands within half a float32 ulp of it (n 2^-52 sum |w x| below
    half the ulp), so the reference and this oracle both hold exactly v. A quantization tie at
    v is then no ambiguity: both round it the same way. (MXFP4 weights and bf16 inputs make
    such exact ties common: most identity draws sat on one before.)"""
    xs = [Fraction(float(b)) for b in xin]
    out = np.zeros(len(wmat), bool)
    for i, row in enumerate(wmat):
        exact = sum(Fraction(float(a)) * b for a, b in zip(row, xs))
        v = np.float32(float(exact))
        if Fraction(float(v)) == exact:
            err = len(row) * 2.0 ** -52 * float(np.abs(row * xin).sum())
            out[i] = err < float(np.spacing(np.abs(v))) / 2
    return out


def near_boundary(h32, quant, settled=None):
    """True when moving every element of h32 by 2 ulp changes its quantized value: the
    reference and this oracle may then legitimately disagree on one code, because their
    float64 sums and libm calls can differ in the last bit before the float32 rounding.
    Elements marked settled (settled_f32) are exact on both sides and not checked; quant must
    then be elementwise."""
    if settled is not None:
        h32 = h32[~settled]
    base = quant(h32)
    for d in (np.inf, -np.inf):
        moved = np.nextafter(np.nextafter(h32, np.float32(d)), np.float32(d))
        if not np.array_equal(quant(moved), base):
            return True
    return False


def run_case(tmp, act, fmt, mode, **kw):
    """Fresh random inputs; inputs that land a quantized hidden value on a rounding boundary
    are redrawn (at most 20 times), so the comparison stays exact at 1e-12."""
    for _ in range(20):
        try:
            return run_once(tmp, act, fmt, mode, **kw)
        except Ambiguous:
            continue
    raise AssertionError(f"{act} {fmt} {mode}: 20 draws in a row sat on a rounding boundary")


def run_once(tmp, act, fmt, mode, E=5, H=64, I=32, T=6, K=3, seed=None):
    seed = int(np.random.SeedSequence().entropy % 2**32) if seed is None else seed
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, H)) * 0.5).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    w = rng.uniform(0.1, 1, (T, K)).astype(np.float32)
    alpha = rng.uniform(2, 5, E).astype(np.float32)
    beta = rng.uniform(5, 30, E).astype(np.float32) if act == "situ" else rng.uniform(-1, 1, E).astype(np.float32)
    in_scale = {m: rng.uniform(0.5, 2, E).astype(np.float32) for m in ("w1", "w2")}
    in_scale["w3"] = in_scale["w1"]
    vals = {}
    for m, (r, c) in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
        parts = [make_matrix(rng, fmt, r, c) for _ in range(E)]
        (tmp / f"{m}.data").write_bytes(b"".join(p[0] for p in parts))
        if parts[0][1] is not None:
            (tmp / f"{m}.scale").write_bytes(b"".join(p[1] for p in parts))
        np.array([p[2] for p in parts], np.float32).tofile(tmp / f"{m}.gs.f32")
        in_scale[m].tofile(tmp / f"{m}.is.f32")
        vals[m] = [p[3] for p in parts]
    x.tofile(tmp / "x.f32"); ids.tofile(tmp / "ids.i32"); w.tofile(tmp / "w.f32")
    alpha.tofile(tmp / "alpha.f32"); beta.tofile(tmp / "beta.f32")
    (tmp / "meta.txt").write_text(f"{E} {H} {I} {T} {K} {ACT[act]} {FMT[fmt]} {MODE[mode]}\n")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    p = subprocess.run([str(TOOL), str(tmp)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    y = np.fromfile(tmp / "y.f64", np.float64).reshape(T, H)

    g1 = np.float32(1) / np.float32(in_scale["w1"].max())
    g2 = np.float32(1) / np.float32(in_scale["w2"].max())
    want = np.zeros((T, H))
    for t in range(T):
        xin = x[t:t + 1].astype(np.float64)
        if mode == "w4a4": xin = nvfp4_act(x[t:t + 1], g1)
        if mode == "w4a8": xin = mxfp8_act(x[t:t + 1])
        if mode == "w4a16-bf16": xin = bf16_round(x[t:t + 1]).astype(np.float64)
        for j in range(K):
            e = ids[t, j]
            g = vals["w1"][e] @ xin[0]
            u = vals["w3"][e] @ xin[0]
            h = act_fn(act, g, u, np.float64(alpha[e]), np.float64(beta[e]))
            if mode == "w4a4":
                quant = lambda v: nvfp4_act(v[None], g2)[0]
            elif mode == "w4a8":
                quant = lambda v: mxfp8_act(v[None])[0]
            elif mode == "w4a16-bf16":
                quant = lambda v: bf16_round(v).astype(np.float64)
            if mode in ("w4a4", "w4a8", "w4a16-bf16"):
                # elementwise rounding only (the block formats' scales hang on the whole block)
                exact_h = mode == "w4a16-bf16" and act in ("identity", "relu")
                settled = settled_f32(vals["w1"][e], xin[0]) if exact_h else None
                if near_boundary(h.astype(np.float32), quant, settled):
                    raise Ambiguous()
                h = quant(h.astype(np.float32))
            want[t] += np.float64(w[t, j]) * (vals["w2"][e] @ h)
    if not np.any(want):
        # every hidden value quantized to zero (w4a4: the E4M3 block scales underflow for a
        # small h): both sides must agree exactly, and the draw tests nothing else, so redraw
        assert not np.any(y), f"seed {seed}: {act} {fmt} {mode}: the expected output is all zero, k3's is not"
        raise Ambiguous()
    rel = np.linalg.norm(y - want) / np.linalg.norm(want)
    assert rel <= 1e-12, f"seed {seed}: {act} {fmt} {mode}: rel L2 {rel:.3g} > 1e-12"


needs_tool = pytest.mark.skipif(not TOOL.exists(), reason=f"{TOOL} not built (make)")


@needs_tool
@pytest.mark.parametrize("act", sorted(ACT))
@pytest.mark.parametrize("fmt", ["f32", "bf16", "nvfp4", "mxfp4"])
def test_w4a16_every_activation_and_format(tmp_path, act, fmt):
    run_case(tmp_path, act, fmt, "w4a16")


@needs_tool
@pytest.mark.parametrize("act", ["situ", "swiglu", "relu2"])
def test_w4a4_nvfp4_activation_quantization(tmp_path, act):
    run_case(tmp_path, act, "nvfp4", "w4a4")


@needs_tool
@pytest.mark.parametrize("act", ["situ", "silu"])
def test_w4a8_mxfp8_activation_quantization(tmp_path, act):
    run_case(tmp_path, act, "mxfp4", "w4a8")


@needs_tool
@pytest.mark.parametrize("act", ["situ", "swiglu", "relu2", "identity"])
@pytest.mark.parametrize("fmt", ["f32", "bf16", "nvfp4", "mxfp4"])
def test_w4a16_bf16_rounding(tmp_path, act, fmt):
    run_case(tmp_path, act, fmt, "w4a16-bf16")
