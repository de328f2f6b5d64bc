"""make-tiny, quantize and inspect --ep-size against an independent reading of the files.

The expected tensor names, dtypes and shapes are derived here from config.json and
k3-architecture.md §8 / checkpoint-formats.md §3-§6, not from k3's plan.c, and the shards are
read by parsing safetensors headers directly. Checks: every expected tensor present with its
exact dtype and shape and nothing else; the quantization config declares what the files
hold; NVFP4 block scales are finite E4M3 and global scales positive; quantize leaves every
unselected tensor byte-identical; inspect --ep-size splits experts and bytes as
TensorRT-LLM's partition does.
"""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

BUILD = pathlib.Path(os.environ.get("K3_BUILD", "build"))
K3 = BUILD / "k3"


def k3(*args):
    return subprocess.run([str(K3), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))


def read_ckpt(d):
    """name -> (dtype, shape, bytes) from every shard, checked against the index."""
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in sorted(set(index.values())):
        raw = (d / shard).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        hdr.pop("__metadata__", None)
        for name, t in hdr.items():
            assert index[name] == shard
            b, e = t["data_offsets"]
            assert name not in out
            out[name] = (t["dtype"], tuple(t["shape"]), raw[8 + n + b:8 + n + e])
    assert set(out) == set(index)
    return out


def expected(cfg, experts_fmt, attn_fp8, trunk="BF16"):
    """Tensor name -> (dtype, shape), from k3-architecture.md §8. trunk: the format of every
    projection other than experts, router, embedding and lm_head (a compressed-tensors
    `targets: Linear` export quantizes them all, checkpoint-formats.md §4.2)."""
    tc = cfg["text_config"]
    P = "language_model."
    H, V = tc["hidden_size"], tc["vocab_size"]
    la = tc["linear_attn_config"]
    nh, hd = la["num_heads"], la["head_dim"]
    HD = nh * hd
    E, I, L = tc["num_experts"], tc["moe_intermediate_size"], tc["routed_expert_hidden_size"]
    exp = {}

    def lin(name, rows, cols, fmt="BF16"):
        if fmt == "BF16":
            exp[name + ".weight"] = ("BF16", (rows, cols))
        elif fmt == "FP8":
            exp[name + ".weight"] = ("F8_E4M3", (rows, cols))
            exp[name + ".weight_scale"] = ("F32", (-(-rows // 128), 1, -(-cols // 128), 1))
        elif fmt == "NVFP4":
            exp[name + ".weight"] = ("U8", (rows, cols // 2))
            exp[name + ".weight_scale"] = ("F8_E4M3", (rows, cols // 16))
            exp[name + ".weight_scale_2"] = ("F32", ())
            exp[name + ".input_scale"] = ("F32", ())
        elif fmt == "NVFP4-CT":
            exp[name + ".weight_packed"] = ("U8", (rows, cols // 2))
            exp[name + ".weight_scale"] = ("F8_E4M3", (rows, cols // 16))
            exp[name + ".weight_global_scale"] = ("F32", (1,))
            exp[name + ".input_global_scale"] = ("F32", (1,))
        elif fmt == "MXFP4":
            exp[name + ".weight_packed"] = ("U8", (rows, cols // 2))
            exp[name + ".weight_scale"] = ("U8", (rows, cols // 32))

    attn = "FP8" if attn_fp8 else trunk
    lin(P + "model.embed_tokens", V, H)
    lin(P + "lm_head", V, H)
    for n in ("model.norm", "model.output_attn_res_norm"):
        exp[P + n + ".weight"] = ("BF16", (H,))
    exp[P + "model.output_attn_res_proj.weight"] = ("BF16", (1, H))
    for l in range(tc["num_hidden_layers"]):
        p = f"{P}model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            exp[p + n + ".weight"] = ("BF16", (H,))
        for n in ("self_attention_res_proj", "mlp_res_proj"):
            exp[p + n + ".weight"] = ("BF16", (1, H))
        a = p + "self_attn."
        if l + 1 in la["kda_layers"]:
            for n in ("q_proj", "k_proj", "v_proj", "g_proj"):
                lin(a + n, HD, H, attn)
            for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
                exp[a + n + ".weight"] = ("F32", (HD, 1, la["short_conv_kernel_size"]))
            exp[a + "A_log"] = ("F32", (-(-nh // 128) * 128,))
            exp[a + "dt_bias"] = ("F32", (HD,))
            lin(a + "f_a_proj", hd, H, attn)
            lin(a + "f_b_proj", HD, hd, attn)
            lin(a + "b_proj", nh, H, attn)
            exp[a + "o_norm.weight"] = ("F32", (hd,))  # k3-architecture.md §3.1, §8.2
            lin(a + "o_proj", H, HD, trunk)  # KDA o_proj is not in the FP8 list (checkpoint-formats §7.3)
        else:
            mh, q, kv = tc["num_attention_heads"], tc["q_lora_rank"], tc["kv_lora_rank"]
            nope, rope, v = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
            lin(a + "q_a_proj", q, H, attn)
            exp[a + "q_a_layernorm.weight"] = ("BF16", (q,))
            lin(a + "q_b_proj", mh * (nope + rope), q, attn)
            lin(a + "kv_a_proj_with_mqa", kv + rope, H, attn)
            exp[a + "kv_a_layernorm.weight"] = ("BF16", (kv,))
            lin(a + "kv_b_proj", mh * (nope + v), kv, attn)
            lin(a + "g_proj", mh * v, H, attn)
            lin(a + "o_proj", H, mh * v, attn)
        if l < tc["first_k_dense_replace"]:
            F = tc["intermediate_size"]
            lin(p + "mlp.gate_proj", F, H, trunk)
            lin(p + "mlp.up_proj", F, H, trunk)
            lin(p + "mlp.down_proj", H, F, trunk)
            continue
        m = p + "block_sparse_moe."
        lin(m + "gate", E, H)
        exp[m + "gate.e_score_correction_bias"] = ("F32", (E,))
        lin(m + "routed_expert_down_proj", L, H, trunk)
        lin(m + "routed_expert_up_proj", H, L, trunk)
        exp[m + "routed_expert_norm.weight"] = ("BF16", (L,))
        S = tc["num_shared_experts"] * I
        lin(m + "shared_experts.gate_proj", S, H, trunk)
        lin(m + "shared_experts.up_proj", S, H, trunk)
        lin(m + "shared_experts.down_proj", H, S, trunk)
        for e in range(E):
            lin(f"{m}experts.{e}.w1", I, L, experts_fmt)
            lin(f"{m}experts.{e}.w3", I, L, experts_fmt)
            lin(f"{m}experts.{e}.w2", L, I, experts_fmt)
    return exp


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    if not K3.exists():
        pytest.skip(f"{K3} not built")
    out = {}
    for fmt in ("nvfp4", "nvfp4-ct", "mxfp4", "bf16"):
        d = tmp_path_factory.mktemp(fmt)
        p = k3("make-tiny", d, "-f", fmt, "-s", "5", "-t", "2")
        assert p.returncode == 0, p.stderr
        out[fmt] = d
    return out


@pytest.mark.parametrize("fmt,experts,fp8,trunk", [("nvfp4", "NVFP4", True, "BF16"),
                                                   ("nvfp4-ct", "NVFP4-CT", False, "NVFP4-CT"),
                                                   ("mxfp4", "MXFP4", False, "BF16"),
                                                   ("bf16", "BF16", False, "BF16")])
def test_layout(made, fmt, experts, fp8, trunk):
    d = made[fmt]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "kimi_k3" and cfg["text_config"]["model_type"] == "kimi_linear"
    got = read_ckpt(d)
    want = expected(cfg, experts, fp8, trunk)
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5])
    for name, (dt, shape) in want.items():
        assert got[name][:2] == (dt, shape), (name, got[name][:2], (dt, shape))
    # scales: no NaN E4M3 block scale, positive finite global scales
    for name, (dt, shape, raw) in got.items():
        if dt == "F8_E4M3" and name.endswith("weight_scale"):
            b = np.frombuffer(raw, np.uint8)
            assert not np.any((b & 0x7F) == 0x7F), name
        if name.endswith(("weight_scale_2", "input_scale", "weight_global_scale", "input_global_scale")):
            v = np.frombuffer(raw, np.float32)
            assert v.size == 1 and np.isfinite(v[0]) and v[0] > 0, name
    # A_log padding tail is zero, real heads are not
    la = cfg["text_config"]["linear_attn_config"]
    a = np.frombuffer(got["language_model.model.layers.0.self_attn.A_log"][2], np.float32)
    assert np.all(a[la["num_heads"]:] == 0) and np.all(a[:la["num_heads"]] != 0)
    # the declaration matches the files
    qc = cfg.get("quantization_config")
    if fmt == "bf16":
        assert qc is None and not (d / "hf_quant_config.json").exists()
    elif fmt == "nvfp4":
        hf = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
        assert hf["quant_algo"] == "MIXED_PRECISION"
        ql = hf["quantized_layers"]
        assert ql["language_model.model.layers.1.block_sparse_moe.experts"]["quant_algo"] == "NVFP4"
        assert ql["language_model.model.layers.3.self_attn.kv_b_proj"]["quant_algo"].lower() == "fp8_pb_wo"
    else:
        assert qc["quant_method"] == "compressed-tensors"
        assert qc["format"] == ("mxfp4-pack-quantized" if fmt == "mxfp4" else "nvfp4-pack-quantized")
        assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
        if fmt == "mxfp4":  # moonshotai/Kimi-K3's config exactly (k3-architecture.md §1.2)
            w = qc["config_groups"]["group_0"]["weights"]
            assert (w["num_bits"], w["type"], w["group_size"], w["scale_dtype"]) == (4, "float", 32, "torch.uint8")
            assert qc["config_groups"]["group_0"]["input_activations"] is None
            assert qc["ignore"] == ["re:.*self_attn.*", "re:.*shared_experts.*",
                                    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
                                    "re:.*vision_tower.*", "re:.*mm_projector.*"]
        else:  # Firworks-style (checkpoint-formats.md §4.2)
            assert qc["ignore"] == ["lm_head"]
            assert qc["config_groups"]["group_0"]["input_activations"]["dynamic"] == "local"


def test_seed_determinism(made, tmp_path):
    p = k3("make-tiny", tmp_path, "-f", "nvfp4", "-s", "5", "-t", "1")
    assert p.returncode == 0, p.stderr
    a, b = read_ckpt(made["nvfp4"]), read_ckpt(tmp_path)
    assert all(a[n][2] == b[n][2] for n in a)
    p = k3("make-tiny", tmp_path / "s6", "-f", "nvfp4", "-s", "6")
    c = read_ckpt(tmp_path / "s6")
    assert c["language_model.lm_head.weight"][2] != a["language_model.lm_head.weight"][2]


def test_quantize_cli(made, tmp_path):
    out = tmp_path / "q"
    p = k3("quantize", made["bf16"], out, "--to", "nvfp4", "--exclude", r"layers\.3\.")
    assert p.returncode == 0, p.stderr
    src, dst = read_ckpt(made["bf16"]), read_ckpt(out)
    quantized = {n for n in dst if dst[n][0] in ("U8", "F8_E4M3")}
    for n, (dt, shape, raw) in dst.items():
        if n in src and n not in quantized:
            assert src[n] == dst[n], n  # copied byte for byte
    assert "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale_2" in dst
    assert "language_model.model.layers.1.block_sparse_moe.experts.0.w1.input_scale" not in dst
    assert dst["language_model.model.layers.3.block_sparse_moe.experts.0.w1.weight"][0] == "BF16"
    hf = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quantized_layers"]
    assert set(hf) == {f"language_model.model.layers.{l}.block_sparse_moe.experts" for l in (1, 2)}
    assert (out / "tiktoken.model").read_bytes() == (made["bf16"] / "tiktoken.model").read_bytes()
    bad = k3("quantize", made["bf16"], tmp_path / "x", "--to", "int3")
    assert bad.returncode == 1 and "--to" in bad.stderr


def test_inspect_ep(made):
    d = made["mxfp4"]
    p = k3("inspect", d, "--json", "--ep-size", "3")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    layers = rep["layers"]
    assert [x["attention"] for x in layers] == ["KDA", "KDA", "KDA", "MLA"]
    assert [x["ffn"] for x in layers] == ["dense", "MoE", "MoE", "MoE"]
    assert all(x.get("expert_format") == "MXFP4" and x["experts"] == 16 for x in layers[1:])
    got = read_ckpt(d)
    expert_bytes = lambda e: sum(len(r) for n, (_, _, r) in got.items() if f".experts.{e}.w" in n)
    total = sum(len(r) for _, _, r in got.values())
    other = total - sum(expert_bytes(e) for e in range(16))
    ranks = rep["expert_parallel"]["ranks"]
    # TensorRT-LLM's partition: 16 over 3 -> 6, 5, 5 contiguous
    assert [(r["first_expert"], r["experts"]) for r in ranks] == [(0, 6), (6, 5), (11, 5)]
    for r in ranks:
        eb = sum(expert_bytes(e) for e in range(r["first_expert"], r["first_expert"] + r["experts"]))
        assert r["expert_bytes"] == eb and r["total_bytes"] == other + eb
    for fmt in ([], ["--json"], ["--summary"]):  # refused before the report prints a line
        t = k3("inspect", d, "--ep-size", "17", *fmt)
        assert t.returncode == 1 and "--ep-size 17" in t.stderr and "exceeds n_experts 16" in t.stderr
        assert t.stdout == "", t.stdout[-200:]
    t = k3("inspect", d, "--ep-size")
    assert t.returncode == 1 and "--ep-size: missing value" in t.stderr and t.stdout == ""
    t = k3("inspect", d, "--ep-size", "2")
    assert t.returncode == 0 and "expert parallel over 2 ranks" in t.stdout
    assert "experts.0.w1.weight_packed" in t.stdout  # the full report lists every tensor


def test_inspect_summary(made):
    d = made["nvfp4"]
    t = k3("inspect", d, "--summary", "--ep-size", "2")
    assert t.returncode == 0, t.stderr
    assert "layers (4" in t.stdout and "expert parallel over 2 ranks" in t.stdout
    assert "by quantization" in t.stdout and ".weight" not in t.stdout  # no per-tensor rows
    rows = [l.split() for l in t.stdout.splitlines() if l.strip()[:1].isdigit() and "MoE" in l]
    assert [r[4] for r in rows] == ["NVFP4"] * 3
    j = json.loads(k3("inspect", d, "-s", "--json").stdout)
    assert j["tensors"] == [] and len(j["layers"]) == 4 and j["totals"]["problems"] == 0
