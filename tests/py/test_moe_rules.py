"""`k3 moe` rules from moe.md and k3-architecture.md that an operator audit found missing:
- use_grouped_topk false is plain top-k whatever num_expert_group / topk_group say
  (architecture table: grouping is a no-op for K3); true with groups 4 / 2 really limits;
- non-finite x or topk_weights given to --experts-only are errors on every backend, as on the
  reference (the CPU path used to return a file of NaN);
- an output that leaves the float32 range (finite but huge inputs) is an error, not inf;
- unknown, repeated and value-less options and out-of-range layers are named as such."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from k3cli import K3, k3



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not K3.exists():
        pytest.skip(f"{K3} not built")
    d = tmp_path_factory.mktemp("tiny") / "ck"
    p = k3("make-tiny", d, "-f", "nvfp4", "--seed", "9")
    assert p.returncode == 0, p.stderr
    return d


def with_config(src, dst, **text_cfg):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (cfg.get("text_config") or cfg).update(text_cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def route(d, x, tmp_path, tag):
    save_file({"x": x}, str(tmp_path / f"{tag}.in.safetensors"))
    p = k3("moe", "-m", d, "--layer", 1, "--in", tmp_path / f"{tag}.in.safetensors",
           "--out", tmp_path / f"{tag}.safetensors")
    assert p.returncode == 0, p.stderr
    return load_file(str(tmp_path / f"{tag}.safetensors"))


def test_use_grouped_topk_false_is_plain_topk(tiny, tmp_path):
    x = np.random.default_rng().standard_normal((32, 256)).astype(np.float32)
    plain = route(tiny, x, tmp_path, "plain")
    off = route(with_config(tiny, tmp_path / "off", use_grouped_topk=False, num_expert_group=4,
                            topk_group=2), x, tmp_path, "off")
    assert np.array_equal(off["topk_ids"], plain["topk_ids"])
    assert np.array_equal(off["topk_weights"], plain["topk_weights"])
    on = route(with_config(tiny, tmp_path / "on", use_grouped_topk=True, num_expert_group=4,
                           topk_group=2), x, tmp_path, "on")
    # 4 of 16 experts in 2 of 4 groups: at most 2 distinct groups per token
    assert all(len(set(int(i) // 4 for i in row)) <= 2 for row in on["topk_ids"])
    assert not np.array_equal(on["topk_ids"], plain["topk_ids"])


def experts_only_input(path, x, w):
    T = x.shape[0]
    ids = np.tile(np.arange(4, dtype=np.int32), (T, 1))
    save_file({"x": x, "topk_ids": ids, "topk_weights": w}, str(path))


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("what", ["x", "w"])
def test_experts_only_non_finite_inputs(tiny, tmp_path, backend, what):
    x = np.full((3, 128), 0.5, np.float32)
    w = np.full((3, 4), 0.25, np.float32)
    (x if what == "x" else w)[1, 2] = np.nan if what == "x" else np.inf
    experts_only_input(tmp_path / "in.safetensors", x, w)
    p = k3("moe", "-m", tiny, "--layer", 1, "--in", tmp_path / "in.safetensors",
           "--out", tmp_path / "y.safetensors", "--experts-only", "--backend", backend)
    assert p.returncode != 0
    assert ("x[1][2] is nan" if what == "x" else "topk_weights[1][2] is inf") in p.stderr, p.stderr
    assert not (tmp_path / "y.safetensors").exists()


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_output_overflow_is_an_error(tiny, tmp_path, backend):
    x = (4 * np.random.default_rng().standard_normal((2, 128))).astype(np.float32)
    w = np.full((2, 4), 3.4e38, np.float32)  # 4 slots of |y_e| ~ 1 each overflow the sum
    experts_only_input(tmp_path / "in.safetensors", x, w)
    p = k3("moe", "-m", tiny, "--layer", 1, "--in", tmp_path / "in.safetensors",
           "--out", tmp_path / "y.safetensors", "--experts-only", "--backend", backend)
    assert p.returncode != 0
    assert "exceeds the float32 range" in p.stderr, p.stderr
    assert not (tmp_path / "y.safetensors").exists()


def test_option_and_layer_messages(tiny, tmp_path):
    p = k3("moe", "-m", tiny, "--layer", 1, "--random", 2, "--out", tmp_path / "y.safetensors",
           "--bogus")
    assert p.returncode != 0 and "unknown option '--bogus'" in p.stderr, p.stderr
    p = k3("moe", "-m", tiny, "--layer", 1, "--random", 2, "--out")
    assert p.returncode != 0 and "--out: missing value" in p.stderr, p.stderr
    p = k3("moe", "-m", tiny, "--layer", 1, "--random", 2, "--out", tmp_path / "y.safetensors",
           "--ep-size", 2, "--model", tiny)
    assert p.returncode != 0 and "--model: given twice" in p.stderr, p.stderr
    p = k3("moe", "-m", tiny, "--layer", 9, "--random", 2, "--out", tmp_path / "y.safetensors")
    assert p.returncode != 0 and "layer 9: " in p.stderr and "decoder layers (0..3)" in p.stderr, p.stderr
