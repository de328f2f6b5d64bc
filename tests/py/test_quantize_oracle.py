"""`k3 quantize` end to end against an independent NumPy reading of the published rules.

A BF16 checkpoint written by make-tiny is converted with `k3 quantize --to FORMAT`; every
byte of every quantized tensor (codes, block scales, global scales) must equal what the
oracle of test_formats_oracle.py (written from checkpoint-formats.md §3-§6, not from k3's C)
computes from the source BF16 values: ModelOpt NVFP4 (weight, weight_scale E4M3,
weight_scale_2 = amax/2688), its compressed-tensors conversion (weight_packed, and
weight_global_scale = 1/weight_scale_2 as the official modelopt_nvfp4 converter inverts it),
ModelOpt MXFP4 (E8M0 = 127 + ceil(log2(amax/6))) and FP8 128x128 blocks (amax/448, ModelOpt's
4-D scale). Every tensor that is not quantized is copied byte for byte, and the quantization
config declares exactly the modules that were quantized.
"""
import json

import numpy as np
import pytest

from test_formats_oracle import fp8_block, mxfp4, nvfp4_weight
from test_make_tiny_layout import K3, k3, read_ckpt

FORMATS = ("nvfp4", "nvfp4-ct", "mxfp4", "fp8-block")
PACKED = {"nvfp4": ".weight", "nvfp4-ct": ".weight_packed", "mxfp4": ".weight_packed",
          "fp8-block": ".weight"}


def bf16(raw, shape):
    u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    if not K3.exists():
        pytest.skip(f"{K3} not built")
    src = tmp_path_factory.mktemp("bf16")
    p = k3("make-tiny", src, "-f", "bf16", "-s", "11", "-t", "2")
    assert p.returncode == 0, p.stderr
    out = {}
    for fmt in FORMATS:
        d = tmp_path_factory.mktemp(fmt)
        p = k3("quantize", src, d, "--to", fmt, "-t", "2")
        assert p.returncode == 0, p.stderr
        out[fmt] = d
    return src, out


def module_kind(name):
    """'expert', 'keep' (router, embedding, lm_head: never quantized) or 'linear'."""
    if ".experts." in name:
        return "expert"
    if name.endswith((".block_sparse_moe.gate", "embed_tokens", "lm_head")):
        return "keep"
    return "linear"


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_exact(converted, fmt):
    src_dir, out = converted
    src, dst = read_ckpt(src_dir), read_ckpt(out[fmt])
    modules = sorted(n[:-len(".weight_scale")] for n in dst if n.endswith(".weight_scale"))
    linear = sorted(n[:-len(".weight")] for n, (dt, shape, _) in src.items()
                    if n.endswith(".weight") and len(shape) == 2 and shape[0] > 1)
    # the default selection: routed experts, or every linear but router/embedding/lm_head
    want = [m for m in linear if module_kind(m) == "expert" or
            (fmt == "fp8-block" and module_kind(m) == "linear")]
    assert modules == want
    assert len(modules) >= 144
    used = set()
    for m in modules:
        dt, shape, raw = src[m + ".weight"]
        assert dt == "BF16"
        w = bf16(raw, shape)
        rows, cols = shape
        names = [m + PACKED[fmt], m + ".weight_scale"]
        if fmt in ("nvfp4", "nvfp4-ct"):
            packed, s, ws2, _ = nvfp4_weight(w)
            assert dst[names[0]][:2] == ("U8", (rows, cols // 2))
            assert dst[names[1]][:2] == ("F8_E4M3", (rows, cols // 16))
            if fmt == "nvfp4":
                names.append(m + ".weight_scale_2")
                g = (np.float32(ws2), ("F32", ()))
            else:
                names.append(m + ".weight_global_scale")
                g = (np.float32(1.0) / np.float32(ws2), ("F32", (1,)))
            assert dst[names[2]][:2] == g[1], names[2]
            assert dst[names[2]][2] == g[0].tobytes(), names[2]
            # no calibration data: no activation scale is invented
            assert m + ".input_scale" not in dst and m + ".input_global_scale" not in dst
        elif fmt == "mxfp4":
            packed, s, _ = mxfp4(w)
            assert dst[names[0]][:2] == ("U8", (rows, cols // 2))
            assert dst[names[1]][:2] == ("U8", (rows, cols // 32))
        else:
            packed, s, _ = fp8_block(w)
            assert dst[names[0]][:2] == ("F8_E4M3", (rows, cols))
            br, bc = -(-rows // 128), -(-cols // 128)
            assert dst[names[1]][:2] == ("F32", (br, 1, bc, 1))
            s = s.astype("<f4")
        assert dst[names[0]][2] == np.ascontiguousarray(packed).tobytes(), names[0]
        assert dst[names[1]][2] == np.ascontiguousarray(s).tobytes(), names[1]
        used.update(names)
    # everything else: the source tensor, byte for byte
    for n, t in dst.items():
        if n not in used:
            assert src.get(n) == t, n
    assert set(src) - {m + ".weight" for m in modules} == set(dst) - used


@pytest.mark.parametrize("fmt", FORMATS)
def test_declared(converted, fmt):
    src_dir, out = converted
    dst = read_ckpt(out[fmt])
    quantized = {n[:-len(".weight_scale")] for n in dst if n.endswith(".weight_scale")}
    cfg = json.loads((out[fmt] / "config.json").read_text())
    qc = cfg["quantization_config"]
    if fmt in ("nvfp4", "fp8-block"):
        hf = json.loads((out[fmt] / "hf_quant_config.json").read_text())["quantization"]
        assert hf["quant_algo"] == "MIXED_PRECISION"
        root = json.loads((out[fmt] / "hf_quant_config.json").read_text())
        assert root["producer"]["name"] == "modelopt" and root["producer"]["version"].startswith("k3 ")
        ql = hf["quantized_layers"]
        algo = "NVFP4" if fmt == "nvfp4" else "FP8_PB_WO"

        def owner(m):
            while m and m not in ql:
                m = m.rpartition(".")[0]
            return m
        for m in quantized:
            assert owner(m) and ql[owner(m)]["quant_algo"].upper() == algo, m
        plain = {n[:-len(".weight")] for n, (dt, shape, _) in dst.items()
                 if n.endswith(".weight") and dt == "BF16" and len(shape) == 2 and shape[0] > 1}
        for m in plain:
            assert not owner(m) or m in qc["ignore"], m
    else:
        assert qc["quant_method"] == "compressed-tensors"
        assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
        ignore = set(qc["ignore"])
        assert not quantized & ignore
        plain = {n[:-len(".weight")] for n, (dt, shape, _) in dst.items()
                 if n.endswith(".weight") and dt == "BF16" and len(shape) == 2 and shape[0] > 1}
        # a plain linear module under `targets: Linear` must be ignored by name, except the
        # router, which is no nn.Linear in the reference model (checkpoint-formats.md §4.2)
        assert {m for m in plain - ignore if not m.endswith("block_sparse_moe.gate")} == set()
    # and k3 itself loads what it wrote
    p = k3("inspect", out[fmt], "--json")
    assert p.returncode == 0, p.stderr
