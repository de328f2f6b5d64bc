"""`k3 inspect DIR` with a config.json: the per-layer summary is read through k3_model_open.
A malformed config.json (or one the tensors disagree with) is malformed input: exit status 1,
an error naming the file and field, and nothing on stdout with --json. A config for a model
k3 does not run (another model_type) is not the checkpoint's fault: the tensor report is
printed, exit status 0, and stderr says why there is no per-layer summary."""
import json
import os
import subprocess

import pytest

BUILD = os.environ.get("K3_BUILD", "build")
K3 = os.path.join(BUILD, "k3")


def k3(*args):
    assert os.access(K3, os.X_OK), f"{K3} is not built (run make first)"
    return subprocess.run([K3, *args], capture_output=True, text=True)


def make_tiny(tmp_path_factory, fmt):
    d = tmp_path_factory.mktemp(fmt) / "ck"
    p = k3("make-tiny", str(d), "--format", fmt, "--seed", "3")
    assert p.returncode == 0, p.stderr
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory, "nvfp4")


def edit_config(src, dst, fn, name="config.json"):
    os.makedirs(dst)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(dst, f))
    os.unlink(os.path.join(dst, name))
    cfg = json.loads((src / name).read_text())
    fn(cfg)
    (dst / name).write_text(json.dumps(cfg))


def quant_config(cfg):
    return cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]


def test_good_config_has_layers(tiny):
    p = k3("inspect", "--json", str(tiny))
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["layers"]) > 0


def test_malformed_config_fails(tiny, tmp_path):
    bad = tmp_path / "bad"
    edit_config(tiny, bad, lambda c: c["text_config"].update(num_experts_per_token=999))
    p = k3("inspect", str(bad))
    assert p.returncode == 1
    assert "config.json" in p.stderr and "num_experts_per_token" in p.stderr
    p = k3("inspect", "--json", str(bad))
    assert p.returncode == 1 and p.stdout == ""


def test_other_model_is_only_a_note(tiny, tmp_path):
    other = tmp_path / "other"
    edit_config(tiny, other, lambda c: c.update(model_type="llama"))
    p = k3("inspect", "--json", str(other))
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert "layers" not in rep and rep["totals"]["tensors"] > 0
    assert "no per-layer summary" in p.stderr and "llama" in p.stderr
    p = k3("inspect", "--ep-size", "2", str(other))  # asked for explicitly: an error
    assert p.returncode == 1


@pytest.fixture(scope="module")
def tiny_ct(tmp_path_factory):
    return make_tiny(tmp_path_factory, "nvfp4-ct")


def test_malformed_quant_declaration_fails(tiny, tiny_ct, tmp_path):
    """A quant_algo no QuantAlgo has, or a compressed-tensors object naming another
    quant_method, is a malformed declaration (checkpoint-formats.md §2.4, §2.5): exit 1 with the
    file and field named, like a malformed config.json."""
    foo = tmp_path / "foo"
    edit_config(tiny, foo, lambda c: c["quantization"].update(quant_algo="FOO"),
                "hf_quant_config.json")
    p = k3("inspect", "-s", str(foo))
    assert p.returncode == 1
    assert "hf_quant_config.json" in p.stderr and 'unknown quantization algorithm "FOO"' in p.stderr
    gptq = tmp_path / "gptq"
    edit_config(tiny_ct, gptq, lambda c: quant_config(c).update(quant_method="gptq"))
    p = k3("inspect", "-s", str(gptq))
    assert p.returncode == 1
    assert 'quant_method: "gptq"' in p.stderr and "config_groups" in p.stderr


def test_quant_k3_does_not_run_is_only_a_note(tiny_ct, tmp_path):
    """A well-formed declaration k3 cannot run (a class target other than Linear) is like
    another model_type: the tensor report, exit 0, and a note on stderr."""
    emb = tmp_path / "emb"
    edit_config(tiny_ct, emb,
                lambda c: quant_config(c)["config_groups"]["group_0"].update(targets=["Embedding"]))
    p = k3("inspect", "-s", str(emb))
    assert p.returncode == 0, p.stderr
    assert "no per-layer summary" in p.stderr and 'class target "Embedding"' in p.stderr
