"""`k3 inspect` on a bare .safetensors file (no config.json, so no declaration and no plan): each
weight's format is judged from the names and dtypes of its tensors, and the set is checked by the
loader's own dtype, shape and sibling rules (checkpoint-formats.md §3-§6, §8.2 item 6). A set the
loader would refuse is a problem: exit status 1, and stderr names the tensor at fault and what
was expected. The files are written here byte by byte (F8 dtypes have no numpy type)."""
import json
import struct

import numpy as np
import pytest

from k3cli import k3

N, K = 32, 64
W = ("U8", [N, K // 2], b"\x11" * (N * K // 2))
WS = ("F8_E4M3", [N, K // 16], b"\x38" * (N * K // 16))
WS_MX = ("U8", [N, K // 32], b"\x7f" * (N * K // 32))
F8W = ("F8_E4M3", [N, K], b"\x38" * (N * K))
GRID = ("F32", [1, 1], np.float32(1).tobytes())


def f32(shape, v=0.01):
    return ("F32", shape, np.full(shape, v, np.float32).tobytes())


def write(path, tensors):
    hdr, off = {}, 0
    for name, (dt, shape, data) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[2] for t in tensors.values()))
    return path


NVFP4 = {"x.weight": W, "x.weight_scale": WS, "x.weight_scale_2": f32([]), "x.input_scale": f32([])}
NVFP4_CT = {"x.weight_packed": W, "x.weight_scale": WS, "x.weight_global_scale": f32([1], 100.0),
            "x.input_global_scale": f32([1], 100.0)}
MXFP4 = {"x.weight_packed": W, "x.weight_scale": WS_MX}

GOOD = [
    ("nvfp4", NVFP4, "NVFP4"),
    ("nvfp4_ct", NVFP4_CT, "NVFP4-CT"),
    ("mxfp4", MXFP4, "MXFP4"),
    ("mxfp4_modelopt_name", {"x.weight": W, "x.weight_scale": WS_MX, "x.input_scale": f32([])},
     "MXFP4"),
    ("mxfp8", {"x.weight": F8W, "x.weight_scale": WS_MX}, "MXFP8"),
    ("fp8", {"x.weight": F8W, "x.weight_scale": GRID}, "FP8-block"),
    ("fp8_inv", {"x.weight": F8W, "x.weight_scale_inv": GRID}, "FP8-block"),
    ("u8_alone", {"x.weight": W}, "plain"),
    ("packed_alone", {"x.weight_packed": W}, "plain"),
]


def with_(base, **kw):
    t = dict(base)
    for k, v in kw.items():
        if v is None:
            del t["x." + k]
        else:
            t["x." + k] = v
    return t


# (case, tensors, what stderr must say); the first three groups are the audit's items 1, 2, 3
BAD = [
    ("ws2_u8", with_(NVFP4, weight_scale_2=("U8", [], b"\x01")),
     "x.weight_scale_2: expected a scalar F32|BF16|F16 of shape [] or [1], found U8 []"),
    ("ws2_i64", with_(NVFP4, weight_scale_2=("I64", [1], np.int64(1).tobytes())),
     "x.weight_scale_2: expected a scalar F32|BF16|F16 of shape [] or [1], found I64 [1]"),
    ("ws2_1x1", with_(NVFP4, weight_scale_2=f32([1, 1])),
     "x.weight_scale_2: expected a scalar F32|BF16|F16 of shape [] or [1], found F32 [1,1]"),
    ("input_scale_2", with_(NVFP4, input_scale=f32([2])),
     "x.input_scale: expected a scalar F32|BF16|F16 of shape [] or [1], found F32 [2]"),
    ("input_scale_u8", with_(NVFP4, input_scale=("U8", [], b"\x01")),
     "x.input_scale: expected a scalar F32|BF16|F16 of shape [] or [1], found U8 []"),
    ("ct_igs_3", with_(NVFP4_CT, input_global_scale=f32([3])),
     "x.input_global_scale: expected a scalar F32|BF16|F16 of shape [] or [1], found F32 [3]"),
    ("both_globals", with_(NVFP4, weight_global_scale=f32([1], 100.0)),
     "x.weight_global_scale: unexpected beside a ModelOpt NVFP4 weight"),
    ("fp8_both", {"x.weight": F8W, "x.weight_scale": GRID, "x.weight_scale_inv": GRID},
     "x.weight: both weight_scale and weight_scale_inv present"),
    ("fp8_bf16_scale", {"x.weight": F8W, "x.weight_scale": ("BF16", [1, 1], b"\x80\x3f")},
     "x.weight_scale: expected F32 [1,1], found BF16 [1,1]"),
    ("mxfp4_input_u8", with_(MXFP4, input_scale=("U8", [5], b"\0" * 5)),
     "x.input_scale: expected a scalar F32|BF16|F16 of shape [] or [1], found U8 [5]"),
    ("fp8_no_scale", {"x.weight": F8W},
     "x.weight: F8_E4M3 weight without its scale (x.weight_scale or .weight_scale_inv)"),
    ("fp8_vector_no_scale", {"x.weight": ("F8_E4M3", [2], b"\x38\x38")},
     "x.weight: F8_E4M3 weight without its scale"),
    ("no_ws2", with_(NVFP4, weight_scale_2=None), "x.weight_scale_2: missing"),
    ("no_ws", with_(NVFP4, weight_scale=None), "x.weight_scale: missing"),
    ("ws_e5m2", with_(NVFP4, weight_scale=("F8_E5M2",) + WS[1:]),
     "x.weight_scale: expected F8_E4M3 [32,4], found F8_E5M2 [32,4]"),
    ("ct_no_wgs", with_(NVFP4_CT, weight_global_scale=None), "x.weight_global_scale: missing"),
    ("stacked", {"x.weight": ("U8", [2, N, K // 2], W[2] * 2),
                 "x.weight_scale": ("F8_E4M3", [2, N, K // 16], WS[2] * 2),
                 "x.weight_scale_2": f32([2])},
     "x.weight: expected a rank-2 [out, in] weight, found U8 [2,32,32]"),
    ("i8_with_scale", {"x.weight": ("I8", [N, K], b"\0" * (N * K)), "x.weight_scale": GRID},
     "x.weight: I8 weight beside x.weight_scale"),
]


@pytest.mark.parametrize("case,tensors,fmt", GOOD, ids=[c[0] for c in GOOD])
def test_good_sets(tmp_path, case, tensors, fmt):
    p = k3("inspect", "--json", write(tmp_path / f"{case}.safetensors", tensors))
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    w = [t for t in rep["tensors"] if t["name"] in ("x.weight", "x.weight_packed")]
    assert [t["quant"] for t in w] == [fmt] and "problem" not in w[0]
    assert rep["totals"]["problems"] == 0


@pytest.mark.parametrize("case,tensors,msg", BAD, ids=[c[0] for c in BAD])
def test_bad_sets(tmp_path, case, tensors, msg):
    path = write(tmp_path / f"{case}.safetensors", tensors)
    p = k3("inspect", path)
    assert p.returncode == 1
    assert msg in p.stderr, p.stderr
    assert "no known format" not in p.stderr and "FP8-no-scale" not in p.stdout
    rep = json.loads(k3("inspect", "--json", path).stdout)
    assert rep["totals"]["problems"] == 1
    assert [msg in t.get("problem", "") for t in rep["tensors"]].count(True) == 1
