"""Byte-for-byte check of k3's block quantizers against an independent NumPy implementation.

The oracle below is written from the rules (checkpoint-formats.md §3.2-§3.6, §5, §6.1 and
the float32 operation order documented in src/formats/block.h), not from k3's C code: E4M3
encoding is a nearest-value search over the decoded table with ties to the even code, E2M1
follows ModelOpt's searchsorted-plus-odd-bound-fix formulation, and exponents come from a
float64 log2. k3 runs through build/tests/tools/k3_fmt on the same float32 input and every
output byte (codes, scales, weight_scale_2, dequantized floats) must match.
"""
import os
import subprocess
import zlib

import numpy as np
import pytest

BUILD = os.environ.get("K3_BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tools", "k3_fmt")
F32 = np.float32
# Fresh inputs on every run; K3_SEED=<n> replays one. Failures print the seed.
SEED = int(os.environ.get("K3_SEED", np.random.SeedSequence().entropy % 2**32))


def rng_for(*key):
    return np.random.default_rng([SEED, zlib.crc32(repr(key).encode())])


def check(got, want, what):
    assert same_bytes(got, want), f"{what} differs (K3_SEED={SEED})"

# ---- scalar oracle ------------------------------------------------------------------


def _e4m3_table():
    """Decoded value of every code 0..255 (float64), NaN for 0x7F/0xFF."""
    v = np.empty(256)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[c] = np.nan if (c & 0x7F) == 0x7F else (-mag if c & 0x80 else mag)
    return v


E4M3 = _e4m3_table()
E4M3_POS = E4M3[:0x7F]  # codes 0..0x7E, increasing
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def e4m3_encode(x):
    """Nearest E4M3 value to float32 x, ties to the even code, saturating at 448."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(E4M3_POS, a, side="left"), 0, 0x7E)
    lo = np.clip(hi - 1, 0, 0x7E)
    dlo, dhi = np.abs(a - E4M3_POS[lo]), np.abs(E4M3_POS[hi] - a)
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= 448.0, 0x7E, code)
    code = np.where(np.isnan(x), 0x7F, code | (np.signbit(x).astype(np.int64) << 7))
    return code.astype(np.uint8)


def e2m1_encode(x, sign_from_lt=False):
    """ModelOpt's formulation: searchsorted over the midpoints, +1 on the odd bounds.
    sign_from_lt: sign bit iff x < 0 (ModelOpt weights); else the float's sign bit."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x).astype(np.float64)
    ordv = np.searchsorted(E2M1_BOUNDS, a, side="left") + np.isin(a, [0.75, 1.75, 3.5])
    neg = (x < 0) if sign_from_lt else np.signbit(x)
    return (ordv + 8 * neg.astype(np.int64)).astype(np.uint8)


def pack(codes):
    codes = codes.astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed):
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2], out[..., 1::2] = packed & 15, packed >> 4
    return out


def pow2_f32(e):
    return np.ldexp(F32(1.0), np.asarray(e, dtype=np.int32)).astype(F32)


def ceil_log2(d):
    """ceil(log2(d)) for float32 d > 0, in float64 (exact for float32 inputs)."""
    return np.ceil(np.log2(d.astype(np.float64))).astype(np.int64)


# ---- block oracles ------------------------------------------------------------------


def nvfp4_weight(w, ws2=None):
    rows, cols = w.shape
    if ws2 is None:
        amax = F32(np.max(np.abs(w)))
        ws2 = F32(1.0) if amax == 0 else F32(amax * F32(1.0 / 2688.0))
    ws2 = F32(ws2)
    blocks = w.reshape(rows, cols // 16, 16)
    amax_b = np.max(np.abs(blocks), axis=-1)
    sf = amax_b / F32(F32(6.0) * ws2)
    sf = np.where(sf == 0, F32(1.0), sf)
    sf = np.maximum(sf, F32(2.0**-9)).astype(F32)
    assert np.all(sf < 464)
    s = e4m3_encode(sf)
    denom = (E4M3[s].astype(F32) * ws2).astype(F32)
    q = (blocks / denom[..., None]).astype(F32).reshape(rows, cols)
    codes = e2m1_encode(q, sign_from_lt=True)
    deq = (E2M1[codes].reshape(rows, cols // 16, 16) * E4M3[s][..., None] * np.float64(ws2))
    return pack(codes), s, ws2, deq.reshape(rows, cols).astype(F32)


def nvfp4_act(x, g):
    g = F32(g)
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 16, 16)
    amax_b = np.max(np.abs(blocks), axis=-1)
    sf = (g * (amax_b * F32(1.0 / 6.0))).astype(F32)
    s = e4m3_encode(np.minimum(sf, F32(448.0)))
    sv = E4M3[s].astype(F32)
    with np.errstate(divide="ignore"):
        o = np.where(sv == 0, F32(0.0), g * (F32(1.0) / sv)).astype(F32)
    q = np.clip((blocks * o[..., None]).astype(F32), F32(-6), F32(6)).reshape(rows, cols)
    codes = e2m1_encode(q)
    deq = E2M1[codes].reshape(rows, cols // 16, 16) * E4M3[s][..., None] * np.float64(F32(1) / g)
    return pack(codes), s, deq.reshape(rows, cols).astype(F32)


def mxfp4(w):
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    d = (np.max(np.abs(blocks), axis=-1) * F32(1.0 / 6.0)).astype(F32)
    with np.errstate(divide="ignore"):
        e = np.where(d > 0, ceil_log2(np.where(d > 0, d, 1)), -127)
    e = np.maximum(e, -127)
    q = (blocks * pow2_f32(-e)[..., None]).astype(F32).reshape(rows, cols)
    codes = e2m1_encode(q)
    deq = E2M1[codes].reshape(rows, cols // 32, 32) * np.ldexp(1.0, e)[..., None]
    return pack(codes), (e + 127).astype(np.uint8), deq.reshape(rows, cols).astype(F32)


def mxfp8(x):
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 32, 32)
    d = (np.max(np.abs(blocks), axis=-1) * F32(1.0 / 448.0)).astype(F32)
    e = np.where(d > 0, ceil_log2(np.where(d > 0, d, 1)), -127)
    e = np.clip(e, -127, 127)
    q = np.clip((blocks * pow2_f32(-e)[..., None]).astype(F32), F32(-448), F32(448))
    codes = e4m3_encode(q).reshape(rows, cols)
    deq = E4M3[codes].reshape(rows, cols // 32, 32) * np.ldexp(1.0, e)[..., None]
    return codes, (e + 127).astype(np.uint8), deq.reshape(rows, cols).astype(F32)


def fp8_block(w):
    rows, cols = w.shape
    nbr, nbc = -(-rows // 128), -(-cols // 128)
    scales = np.empty((nbr, nbc), dtype=F32)
    data = np.empty((rows, cols), dtype=np.uint8)
    deq = np.empty((rows, cols), dtype=F32)
    for i in range(nbr):
        for j in range(nbc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = F32(np.max(np.abs(blk)))
            s = F32(1.0) if amax == 0 else F32(amax * F32(1.0 / 448.0))
            scales[i, j] = s
            c = e4m3_encode((blk / s).astype(F32))
            data[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = c
            deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (E4M3[c] * np.float64(s)).astype(F32)
    return data, scales, deq


# ---- running k3 ---------------------------------------------------------------------


def run_k3(tmp_path, mode, w, param=None):
    w = np.ascontiguousarray(w, dtype="<f4")
    inp = tmp_path / "in.f32"
    w.tofile(inp)
    out = str(tmp_path / "out")
    cmd = [TOOL, mode, str(inp), str(w.shape[0]), str(w.shape[1]), out]
    if param is not None:
        cmd.append(repr(float(param)))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr
    res = {k: np.fromfile(out + "." + k, dtype=np.uint8) for k in ("data", "scales")}
    res["deq"] = np.fromfile(out + ".deq", dtype="<f4").reshape(w.shape)
    if os.path.exists(out + ".global"):
        res["global"] = np.fromfile(out + ".global", dtype="<f4")[0]
    return res, p.stderr


def same_bytes(a, b):
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.fixture(scope="module", autouse=True)
def _tool():
    if not os.access(TOOL, os.X_OK):
        pytest.fail(f"{TOOL} not built (run make)")


# ---- inputs -------------------------------------------------------------------------


def make_inputs(rng, rows, cols, kind):
    if kind == "normal":
        w = rng.standard_normal((rows, cols))
    elif kind == "uniform":
        w = rng.uniform(-3, 3, (rows, cols))
    elif kind == "heavy":
        w = rng.standard_t(2, (rows, cols)) * 10.0 ** rng.integers(-3, 3, (rows, 1))
    elif kind == "large":
        w = rng.standard_normal((rows, cols)) * 1e30
    elif kind == "tiny":
        w = rng.standard_normal((rows, cols)) * 1e-30
    elif kind == "mixed":
        # blocks spanning many binades, zero blocks, tiny-amax blocks next to huge ones
        w = rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-8, 8, (rows, cols // 16)).repeat(16, 1)
        w[:, :16] = 0.0
        if rows > 1:
            w[1, 16:32] = 1e-12 * rng.standard_normal(16)
        w[0, -1] = 1e7
    elif kind == "grid":
        # values on the E2M1/E4M3 grids and their midpoints times powers of two: many ties
        vals = np.concatenate([E2M1[:8], (E2M1[1:8] + E2M1[0:7]) / 2])
        w = rng.choice(vals, (rows, cols)) * rng.choice([-1, 1], (rows, cols))
        w = w * 2.0 ** rng.integers(-4, 4, (rows, 1))
    else:
        raise ValueError(kind)
    return w.astype(F32)


KINDS = ["normal", "uniform", "heavy", "large", "tiny", "mixed", "grid"]
SHAPES = [(1, 32), (3, 64), (8, 256), (17, 96)]


def ties_forced(rng, rows, cols):
    """NVFP4 weight matrix whose quotients W/(scale*ws2) hit the E2M1 midpoints exactly."""
    w = make_inputs(rng, rows, cols, "normal")
    _, s, ws2, _ = nvfp4_weight(w)
    denom = (E4M3[s].astype(F32) * ws2).astype(F32)
    blocks = w.reshape(rows, cols // 16, 16).copy()
    amax_b = np.max(np.abs(blocks), axis=-1)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
    for r in range(rows):
        for b in range(cols // 16):
            keep = int(np.argmax(np.abs(blocks[r, b])))
            for i in range(16):
                if i == keep:
                    continue
                t = F32(rng.choice(mids) * rng.choice([-1, 1]))
                v = F32(t * denom[r, b])
                if abs(v) < amax_b[r, b] and F32(v / denom[r, b]) == t:
                    blocks[r, b, i] = v
    return blocks.reshape(rows, cols)


# ---- tests --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_nvfp4_weight_bit_exact(tmp_path, kind, shape):
    rng = rng_for((kind, shape))
    w = make_inputs(rng, *shape, kind)
    packed, s, ws2, deq = nvfp4_weight(w)
    got, err = run_k3(tmp_path, "nvfp4-w", w)
    assert got is not None, err
    check(got["global"], ws2, "global")
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")
    check(got["deq"], deq, "deq")


def test_nvfp4_weight_ties(tmp_path):
    rng = rng_for("ties")
    w = ties_forced(rng, 16, 128)
    packed, s, ws2, _ = nvfp4_weight(w)
    denom = (E4M3[s].astype(F32) * ws2).astype(F32)
    q = (w.reshape(16, 8, 16) / denom[..., None]).astype(F32)
    nties = int(np.isin(np.abs(q), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).sum())
    assert nties > 1000  # the test exercises ties for real
    got, err = run_k3(tmp_path, "nvfp4-w", w)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")


def test_nvfp4_weight_gs_and_zero(tmp_path):
    rng = rng_for("gs")
    w = make_inputs(rng, 4, 64, "normal")
    gs = F32(np.max(np.abs(w)) * F32(1.0 / 2688.0) * F32(1.5))  # a shared, larger ws2
    packed, s, _, deq = nvfp4_weight(w, gs)
    got, err = run_k3(tmp_path, "nvfp4-w-gs", w, gs)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")
    check(got["deq"], deq, "deq")
    z = np.zeros((2, 32), dtype=F32)
    got, err = run_k3(tmp_path, "nvfp4-w", z)
    assert got is not None, err
    assert got["global"] == 1.0 and np.all(got["scales"] == 0x38) and np.all(got["data"] == 0)
    assert np.all(got["deq"] == 0)
    # a ws2 too small for the block amax: ModelOpt's cast would give NaN; k3 refuses
    got, err = run_k3(tmp_path, "nvfp4-w-gs", w, gs / 4)
    assert got is None and "exceeds" in err


@pytest.mark.parametrize("mode", ["nvfp4-w", "mxfp4", "fp8-block"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_weight_non_finite_rejected(tmp_path, mode, bad):
    w = np.ones((3, 64), dtype=F32)
    w[2, 37] = bad
    got, err = run_k3(tmp_path, mode, w)
    assert got is None
    assert "[2, 37]" in err and ("NaN" if np.isnan(bad) else "Inf") in err and "numeric" in err.lower()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_nvfp4_act_bit_exact(tmp_path, kind, shape):
    rng = rng_for(("act", kind, shape))
    x = make_inputs(rng, *shape, kind)
    amax = float(np.max(np.abs(x)))
    # calibrated global scale, one 10x too small (scales saturate at 448) and one 1e4 too
    # large (tiny blocks encode to scale 0 -> codes 0)
    for g in (2688.0 / amax if amax else 1.0, 268.8 / amax if amax else 1.0, 2.688e7 / amax if amax else 1.0):
        g = F32(g)
        if not np.isfinite(g):
            continue
        packed, s, deq = nvfp4_act(x, g)
        got, err = run_k3(tmp_path, "nvfp4-act", x, g)
        assert got is not None, err
        check(got["scales"], s, "scales")
        check(got["data"], packed, "data")
        check(got["deq"], deq, "deq")


def test_nvfp4_act_nan_block(tmp_path):
    x = np.ones((2, 48), dtype=F32)
    x[1, 20] = np.nan
    x[0, 40] = np.inf
    got, err = run_k3(tmp_path, "nvfp4-act", x, 1.0)
    assert got is not None, err
    s = got["scales"].reshape(2, 3)
    assert s[1, 1] == 0x7F and s[0, 2] == 0x7F and s[0, 0] != 0x7F and s[1, 0] != 0x7F
    assert np.all(np.isnan(got["deq"][1, 16:32])) and np.all(np.isnan(got["deq"][0, 32:48]))
    assert np.all(np.isfinite(got["deq"][0, :32]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_mxfp4_bit_exact(tmp_path, kind, shape):
    rng = rng_for(("mx4", kind, shape))
    w = make_inputs(rng, *shape, kind)
    packed, s, deq = mxfp4(w)
    got, err = run_k3(tmp_path, "mxfp4", w)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")
    check(got["deq"], deq, "deq")


@pytest.mark.parametrize("kind", KINDS + ["subnormal"])
@pytest.mark.parametrize("shape", SHAPES)
def test_mxfp8_bit_exact(tmp_path, kind, shape):
    rng = rng_for(("mx8", kind, shape))
    if kind == "subnormal":
        x = (rng.standard_normal(shape) * 1e-40).astype(F32)  # exponents clamp at -127
    else:
        x = make_inputs(rng, *shape, kind)
    codes, s, deq = mxfp8(x)
    got, err = run_k3(tmp_path, "mxfp8", x)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], codes, "data")
    check(got["deq"], deq, "deq")


def test_mxfp8_nan_block(tmp_path):
    x = np.ones((1, 64), dtype=F32)
    x[0, 40] = np.nan
    got, err = run_k3(tmp_path, "mxfp8", x)
    assert got is not None, err
    assert got["scales"][1] == 0xFF and got["scales"][0] == 127 - 8
    assert np.all(got["data"][32:] == 0x7F) and np.all(np.isnan(got["deq"][0, 32:]))


FP8_CASES = [(k, sh) for sh in [(1, 1), (5, 130), (128, 128), (200, 300), (129, 64)]
             for k in KINDS if sh[1] % 16 == 0 or k not in ("mixed", "grid")]  # those need cols % 16


@pytest.mark.parametrize("kind,shape", FP8_CASES)
def test_fp8_block_bit_exact(tmp_path, kind, shape):
    rng = rng_for(("fp8", kind, shape))
    w = make_inputs(rng, *shape, kind)
    data, scales, deq = fp8_block(w)
    got, err = run_k3(tmp_path, "fp8-block", w)
    assert got is not None, err
    check(got["scales"], scales, "scales")
    check(got["data"], data, "data")
    check(got["deq"], deq, "deq")


def test_nvfp4_act_scale_rounding_order(tmp_path):
    """Blocks whose amax puts g*amax/6 next to an E4M3 rounding midpoint, where the float32
    order g * (amax * float(1/6)) and other orders (g * amax / 6) give different scales."""
    rng = rng_for("act-order")
    pos = E4M3_POS[8:0x7E]
    mids = ((pos[:-1] + pos[1:]) / 2).astype(F32)  # midpoints of adjacent normal codes
    for _ in range(200):  # find a g for which the inputs separate the two orders
        g = F32(rng.uniform(0.5, 2.0) * 2688.0 / 7.0)
        a0 = (rng.choice(mids, 200) * F32(6.0) / g).astype(F32)
        amax = np.concatenate([a0 + k * np.spacing(a0) for k in range(-4, 5)]).astype(F32)
        other = e4m3_encode((g * amax / F32(6.0)).astype(F32))
        ours = e4m3_encode((g * (amax * F32(1.0 / 6.0))).astype(F32))
        if np.any(other != ours):
            break
    assert np.any(other != ours), f"no separating input found (K3_SEED={SEED})"
    x = rng.uniform(-1, 1, (amax.size, 16)).astype(F32) * amax[:, None]
    x[:, 5] = amax
    x = x.reshape(-1, 64) if amax.size % 4 == 0 else x
    packed, s, deq = nvfp4_act(x, g)
    got, err = run_k3(tmp_path, "nvfp4-act", x, g)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")


def test_code_coverage(tmp_path):
    """Every E4M3 scale code 0x01..0x7E and every E2M1 code come out of the NVFP4 weight
    quantizer; every finite E4M3 code out of MXFP8; E8M0 bytes 0..252 out of MXFP4 (253
    and up need amax > FLT_MAX). Each is checked bit-exact against the oracle as well."""
    rng = rng_for("coverage")
    pos = E4M3_POS[1:]  # the 126 nonzero positive scale values
    blocks = rng.uniform(-1, 1, (pos.size, 16)) * (6 * pos)[:, None]
    blocks[:, 3] = 6 * pos  # block amax = 6 * scale with weight_scale_2 = 1
    blocks[:, 4] = -1e-3 * pos  # rounds to code 8 (-0)
    w = blocks.astype(F32).reshape(-1, 32)
    packed, s, _, _ = nvfp4_weight(w, F32(1.0))
    got, err = run_k3(tmp_path, "nvfp4-w-gs", w, 1.0)
    assert got is not None, err
    check(got["scales"], s, "scales")
    check(got["data"], packed, "data")
    assert set(got["scales"].tolist()) == set(range(1, 0x7F))
    assert set(unpack(got["data"]).ravel().tolist()) == set(range(16))

    finite = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], dtype=np.uint8)
    # 31 codes per block plus 448, so every block's exponent is 0 and codes map to themselves
    cs = np.concatenate([finite, np.zeros(-finite.size % 31, np.uint8)]).reshape(-1, 31)
    cs = np.concatenate([cs, np.full((cs.shape[0], 1), 0x7E, np.uint8)], axis=1)
    x = E4M3[cs].astype(F32).reshape(1, -1)
    codes, sc, _ = mxfp8(x)
    got, err = run_k3(tmp_path, "mxfp8", x)
    assert got is not None, err
    check(got["data"], codes, "data")
    check(got["scales"], sc, "scales")
    assert np.array_equal(got["data"], cs.ravel())
    assert set(got["data"].tolist()) == set(finite.tolist())

    e = np.arange(-127, 126)
    w = (rng.uniform(-1, 1, (e.size, 32)) * np.ldexp(6.0, e)[:, None]).astype(F32)
    w[:, 0] = np.ldexp(6.0, e)
    _, sc, _ = mxfp4(w.reshape(-1, 32))
    got, err = run_k3(tmp_path, "mxfp4", w.reshape(-1, 32))
    assert got is not None, err
    check(got["scales"], sc, "scales")
    assert set(got["scales"].tolist()) == set(range(0, 253))
