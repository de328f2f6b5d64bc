"""Loader rules for checkpoints as exporters write them (checkpoint-formats.md §2-§6), through
`k3 moe` (a full load of one layer) and `k3 inspect` (headers only):
- a single-format ModelOpt config loads although it never lists the embedding (no exporter
  quantizes an nn.Embedding or names it among the exclusions);
- one expert that an exclusion or a missing MIXED_PRECISION entry leaves outside its layer's
  format is an error naming the expert, not a tensor decoded like its neighbours;
- a scale sibling the decoded format does not have is an error, not claimed and dropped;
- w1 and w3 carry an input_scale together or not at all;
- ModelOpt's MXFP4 experts are named `weight`, compressed-tensors' `weight_packed`: both load
  to the same numbers;
- negative block scales (E4M3 sign bit, FP8-block F32) are refused by name;
- FP8 block declarations with a group other than 128 are refused; unknown KV-cache algorithms
  warn and are ignored (TensorRT-LLM disables KV quantization);
- inspect checks the tensors against config.json (shapes) and the scale sets without reading
  weights.
The checkpoints are the built-in tiny ones rewritten here as one unindexed shard."""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

from k3cli import BUILD, K3, k3

P = "language_model.model.layers."
X = P + "1.block_sparse_moe.experts."


def read_ck(d):
    """{name: [dtype, shape, bytes]} over every shard of d."""
    out = {}
    for f in sorted(pathlib.Path(d).glob("*.safetensors")):
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        for k, h in json.loads(raw[8:8 + n]).items():
            if k == "__metadata__":
                continue
            a, b = h["data_offsets"]
            out[k] = [h["dtype"], list(h["shape"]), raw[8 + n + a:8 + n + b]]
    return out


def write_ck(src, dst, t, edit_cfg=None):
    """t as dst/model.safetensors beside src's configs; edit_cfg(name, obj) may change them."""
    os.makedirs(dst)
    for name in ("config.json", "hf_quant_config.json"):
        if (pathlib.Path(src) / name).exists():
            obj = json.loads((pathlib.Path(src) / name).read_text())
            if edit_cfg:
                edit_cfg(name, obj)
            (pathlib.Path(dst) / name).write_text(json.dumps(obj))
    hdr, off = {}, 0
    for k in sorted(t):
        dt, shape, data = t[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(pathlib.Path(dst) / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k in sorted(t):
            f.write(t[k][2])
    return dst


def y_path(d):
    d = pathlib.Path(d)
    return d.parent / (d.name + ".y.safetensors")  # outside the checkpoint


def run_moe(d, *extra):
    return k3("moe", "-m", d, "--layer", 1, "--random", 3, "--backend", "ref",
              "--out", y_path(d), *extra)


def out_y(d):
    raw = y_path(d).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    h = json.loads(raw[8:8 + n])["y"]
    a, b = h["data_offsets"]
    return np.frombuffer(raw[8 + n + a:8 + n + b], np.float32)


@pytest.fixture(scope="module")
def tinies(tmp_path_factory):
    if not K3.exists():
        pytest.skip(f"{K3} not built")
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for fmt in ("nvfp4", "nvfp4-ct", "mxfp4"):
        d = root / fmt
        p = k3("make-tiny", d, "-f", fmt, "--seed", "5")
        assert p.returncode == 0, p.stderr
        out[fmt] = d
    return out


def expect_fail(p, *words):
    assert p.returncode != 0, p.stdout + p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def single_format(name, obj):
    """The ModelOpt single-format shape of the same checkpoint: quant_algo NVFP4 with
    exclude_modules for what is not NVFP4, listed the way MO-QU lists unquantized Linears
    (the embedding is not among them)."""
    ex = ["lm_head", "*self_attn*", "*block_sparse_moe.gate", "*shared_experts*",
          "*routed_expert_down_proj", "*routed_expert_up_proj", "*layers.0.mlp*",
          "*res_proj"]
    if name == "hf_quant_config.json":
        obj["quantization"] = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                               "group_size": 16, "exclude_modules": ex}
    else:
        obj.pop("quantization_config", None)
        obj.get("text_config", {}).pop("quantization_config", None)


def strip_fp8(t):
    """FP8-block attention of the tiny NVFP4 checkpoint back to BF16 (the single-format
    config above declares none), from its codes x block scales."""
    lut = np.zeros(256)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        lut[b] = -v if b & 0x80 else v
    for k in [k for k in t if t[k][0] == "F8_E4M3" and k.endswith(".weight")]:
        s = k[:-len("weight")] + "weight_scale"
        sdt, sshape, sb = t.pop(s)
        sc = np.frombuffer(sb, np.float32).reshape(sshape[0], -1)
        r, c = t[k][1]
        w = lut[np.frombuffer(t[k][2], np.uint8).reshape(r, c)]
        w *= np.repeat(np.repeat(sc, 128, 0), 128, 1)[:r, :c]
        # truncated to BF16: this test needs a loadable plain weight, not these exact values
        bf = (np.float32(w).view(np.uint32) >> 16).astype(np.uint16)
        t[k] = ["BF16", [r, c], bf.tobytes()]


def test_single_format_modelopt_loads(tinies, tmp_path):
    t = read_ck(tinies["nvfp4"])
    strip_fp8(t)
    d = write_ck(tinies["nvfp4"], tmp_path / "single", t, single_format)
    p = run_moe(d)
    assert p.returncode == 0, p.stderr
    p = k3("inspect", "-s", d)
    assert p.returncode == 0, p.stderr


def test_one_expert_excluded_is_an_error(tinies, tmp_path):
    t = read_ck(tinies["nvfp4"])
    strip_fp8(t)

    def cfg(name, obj):
        single_format(name, obj)
        if name == "hf_quant_config.json":
            obj["quantization"]["exclude_modules"].append("*layers.1.block_sparse_moe.experts.3.*")
    d = write_ck(tinies["nvfp4"], tmp_path / "ex3", t, cfg)
    expect_fail(run_moe(d), X + "3.w1", "experts.3.*", "one format")
    expect_fail(k3("inspect", "-s", d), X + "3.w1")


def test_missing_per_expert_entry_is_an_error(tinies, tmp_path):
    def cfg(name, obj):
        q = obj.get("quantization") or obj.get("text_config", obj).get("quantization_config")
        if not q or "quantized_layers" not in q:
            return
        ql = q["quantized_layers"]
        decl = None
        for k in [k for k in ql if k.endswith("layers.1.block_sparse_moe.experts")
                  or k.endswith("layers.1.mlp.experts")]:
            decl = ql.pop(k)
        for e in range(16):
            for w in ("w1", "w2", "w3"):
                if (e, w) != (5, "w2"):
                    ql[f"{X}{e}.{w}"] = decl
    d = write_ck(tinies["nvfp4"], tmp_path / "no5", read_ck(tinies["nvfp4"]), cfg)
    expect_fail(run_moe(d), X + "5.w2", "no quantized_layers entry")


@pytest.mark.parametrize("fmt,module,sfx,dt,data", [
    ("nvfp4", X + "3.w1", "weight_global_scale", "F32", struct.pack("<f", 2.0)),
    ("nvfp4", X + "3.w1", "weight_scale_inv", "F32", struct.pack("<f", 2.0)),
    ("nvfp4-ct", X + "3.w1", "weight_scale_2", "F32", struct.pack("<f", 2.0)),
    ("mxfp4", X + "3.w1", "weight_scale_2", "F32", struct.pack("<f", 2.0)),
    ("nvfp4", P + "1.block_sparse_moe.gate", "input_scale", "F32", struct.pack("<f", 1.0)),
])
def test_stray_sibling_is_an_error(tinies, tmp_path, fmt, module, sfx, dt, data):
    t = read_ck(tinies[fmt])
    t[f"{module}.{sfx}"] = [dt, [], data]
    d = write_ck(tinies[fmt], tmp_path / "stray", t)
    expect_fail(run_moe(d), f"{module}.{sfx}", "unexpected beside")


def test_input_scale_on_w1_and_w3_together(tinies, tmp_path):
    t = read_ck(tinies["nvfp4"])
    del t[X + "3.w1.input_scale"]
    d = write_ck(tinies["nvfp4"], tmp_path / "in", t)
    expect_fail(run_moe(d), X + "3.w1.input_scale: missing", X + "3.w3.input_scale")


def test_modelopt_mxfp4_weight_name(tinies, tmp_path):
    src = tinies["mxfp4"]
    p = run_moe(src)
    assert p.returncode == 0, p.stderr
    want = out_y(src).copy()
    t = read_ck(src)
    for k in [k for k in t if k.endswith(".weight_packed")]:
        t[k[:-len("_packed")]] = t.pop(k)
    d = write_ck(src, tmp_path / "mxw", t)
    p = run_moe(d)
    assert p.returncode == 0, p.stderr
    assert np.array_equal(out_y(d), want)
    assert k3("inspect", "-s", d).returncode == 0


def test_negative_block_scales(tinies, tmp_path):
    t = read_ck(tinies["nvfp4"])
    k = X + "3.w2.weight_scale"
    b = bytearray(t[k][2])
    b[5] = 0xB8  # -1.0 in E4M3
    t[k][2] = bytes(b)
    expect_fail(run_moe(write_ck(tinies["nvfp4"], tmp_path / "neg", t)), k, "negative block scale")
    t = read_ck(tinies["nvfp4"])
    k = next(k for k in t if k.endswith("self_attn.q_proj.weight_scale") and t[k][0] == "F32")
    t[k][2] = struct.pack("<f", -0.5) + t[k][2][4:]
    d = write_ck(tinies["nvfp4"], tmp_path / "negfp8", t)
    layer = int(k[len(P):].split(".")[0])
    p = run_moe(d)
    if layer != 1:  # k3 moe reads only layer 1: the other layers' scales are not read
        p = subprocess.run([str(BUILD / "tests/tools/k3_load"), str(d)], capture_output=True,
                           text=True)
    expect_fail(p, k, "negative block scale")


def test_fp8_group_and_kv_algo(tinies, tmp_path):
    def g64(name, obj):
        q = obj.get("quantization")
        if q:
            for v in q.get("quantized_layers", {}).values():
                if v.get("quant_algo", "").upper() in ("FP8_PB_WO", "FP8_BLOCK_SCALES"):
                    v["group_size"] = 64
    t = read_ck(tinies["nvfp4"])
    expect_fail(run_moe(write_ck(tinies["nvfp4"], tmp_path / "g64", t, g64)), "group_size 64",
                "128x128")

    def kv(name, obj):
        q = obj.get("quantization")
        if q:
            q["kv_cache_quant_algo"] = "NVFP4_AFFINE"
    d = write_ck(tinies["nvfp4"], tmp_path / "kv", t, kv)
    p = run_moe(d)
    assert p.returncode == 0, p.stderr
    assert "NVFP4_AFFINE" in p.stderr and "disabled" in p.stderr


def test_inspect_checks_headers(tinies, tmp_path):
    def wide(name, obj):
        if name == "config.json":
            (obj.get("text_config") or obj)["moe_intermediate_size"] += 16
    d = write_ck(tinies["nvfp4"], tmp_path / "cfg", read_ck(tinies["nvfp4"]), wide)
    expect_fail(k3("inspect", "-s", d), "wrong shape", "expected BF16 [80,256], found BF16 [64,256]")
    t = read_ck(tinies["nvfp4"])
    t[X + "2.w1.weight"][0] = "I8"
    expect_fail(k3("inspect", "-s", write_ck(tinies["nvfp4"], tmp_path / "i8", t)),
                X + "2.w1.weight", "I8")
