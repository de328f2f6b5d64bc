"""safetensors interop: the Python `safetensors` package (PyPI) is the independent oracle.

Files the package writes are read by k3 byte for byte (tests/tools/k3_stdump dumps every tensor
through k3's pread and view paths); files k3 writes are read back by the package byte for byte
and, for the same tensors, are identical to the package's own file; a sharded checkpoint the
package writes (shards + model.safetensors.index.json) is read by `k3 inspect`.
Dtypes numpy lacks (BF16, the FP8 family, F4) go through the package's raw TensorSpec API.
"""
import json
import os
import subprocess

import numpy as np
import pytest
from safetensors import TensorSpec, deserialize, serialize, safe_open
from safetensors.numpy import save_file

BUILD = os.environ.get("K3_BUILD", "build")
STDUMP = os.path.join(BUILD, "tests", "tools", "k3_stdump")
K3 = os.path.join(BUILD, "k3")
RNG = np.random.default_rng(20261202)

# numpy dtypes the package's numpy API supports, with k3's dtype string
NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "I64": np.int64, "U64": np.uint64, "F64": np.float64, "C64": np.complex64,
}
# raw dtypes through TensorSpec: package name, k3 name, bytes per stored unit, elements per unit
RAW_DTYPES = [
    ("bfloat16", "BF16", 2, 1), ("float8_e4m3fn", "F8_E4M3", 1, 1), ("float8_e5m2", "F8_E5M2", 1, 1),
    ("float8_e8m0fnu", "F8_E8M0", 1, 1), ("float8_e4m3fnuz", "F8_E4M3FNUZ", 1, 1),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ", 1, 1), ("float4_e2m1fn_x2", "F4", 1, 2),
]


def run(*args, check=True):
    for tool in (STDUMP, K3):
        assert os.access(tool, os.X_OK), f"{tool} is not built (run make first)"
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}: {p.stderr}")
    return p


def dump(path):
    out = json.loads(run(STDUMP, "dump", str(path)).stdout)
    return {t["name"]: t for t in out["tensors"]}


def random_numpy(dt, shape):
    if dt == np.bool_:
        return RNG.integers(0, 2, size=shape).astype(np.bool_)
    if dt == np.complex64:
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    raw = RNG.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
    a = raw.view(dt).reshape(shape)
    return a


def python_tensors():
    """name -> (k3 dtype, shape, bytes) for every dtype the package can write, plus the
    TensorSpec dict that writes them."""
    expect, specs, keep = {}, {}, []
    for k3name, dt in NUMPY_DTYPES.items():
        for suffix, shape in (("m", (3, 5)), ("s", ()), ("e", (0, 4))):
            a = np.array(random_numpy(dt, shape), order="C")  # ascontiguousarray would make 0-d 1-d
            keep.append(a)
            name = f"np.{k3name}.{suffix}"
            specs[name] = TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
            expect[name] = (k3name, list(shape), a.tobytes())
    for pyname, k3name, unit, per in RAW_DTYPES:
        shape = (4, 6)
        nbytes = 4 * 6 * unit // per
        b = RNG.integers(0, 256, size=nbytes, dtype=np.uint8)
        keep.append(b)
        name = f"raw.{k3name}"
        spec_shape = (4, 6 // per)  # the package counts F4 in byte pairs and doubles the last dim
        specs[name] = TensorSpec(dtype=pyname, shape=spec_shape, data_ptr=b.ctypes.data, data_len=nbytes)
        expect[name] = (k3name, list(shape), b.tobytes())
    return expect, specs, keep


def test_python_files_read_by_k3(tmp_path):
    expect, specs, keep = python_tensors()
    path = tmp_path / "py.safetensors"
    path.write_bytes(bytes(serialize(specs, metadata={"format": "np", "who": "python"})))
    got = dump(path)
    assert set(got) == set(expect)
    for name, (dt, shape, data) in expect.items():
        t = got[name]
        assert t["dtype"] == dt, name
        assert t["shape"] == shape, name
        assert bytes.fromhex(t["hex"]) == data, name
        # the reference writer aligns every tensor to its element size: views are zero-copy
        assert t["zero_copy"] == (len(data) > 0), name
    meta = json.loads(run(K3, "inspect", "--json", str(path)).stdout)["shards"][0]["metadata"]
    assert meta == {"format": "np", "who": "python"}


def spec_for(expect, meta):
    return json.dumps({
        "metadata": meta,
        "tensors": [{"name": n, "dtype": dt, "shape": shape, "hex": data.hex()}
                    for n, (dt, shape, data) in expect.items()],
    })


def test_k3_files_read_by_python(tmp_path):
    expect, specs, keep = python_tensors()
    # F6 only in this direction: the package reads but cannot write it (no numpy/torch type)
    expect["raw.F6_E2M3"] = ("F6_E2M3", [2, 4], RNG.integers(0, 256, 6, dtype=np.uint8).tobytes())
    expect["raw.F6_E3M2"] = ("F6_E3M2", [4], RNG.integers(0, 256, 3, dtype=np.uint8).tobytes())
    out = tmp_path / "k3.safetensors"
    p = subprocess.run([STDUMP, "write", str(out)], input=spec_for(expect, {"format": "pt"}),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got = dict(deserialize(out.read_bytes()))
    assert set(got) == set(expect)
    for name, (dt, shape, data) in expect.items():
        assert got[name]["dtype"] == dt, name
        assert list(got[name]["shape"]) == shape, name
        assert bytes(got[name]["data"]) == data, name
    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        for name, (dt, shape, data) in expect.items():
            if dt in NUMPY_DTYPES:
                assert f.get_tensor(name).tobytes() == data, name


def test_k3_file_identical_to_python_file(tmp_path):
    """Same tensors, one metadata entry: the reference layout and header text, byte for byte."""
    expect, specs, keep = python_tensors()
    ref = bytes(serialize(specs, metadata={"format": "pt"}))
    out = tmp_path / "k3.safetensors"
    p = subprocess.run([STDUMP, "write", str(out)], input=spec_for(expect, {"format": "pt"}),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == ref


def write_python_checkpoint(d):
    """Three shards and an index, the Hugging Face way, with NVFP4, compressed-tensors NVFP4,
    MXFP4, FP8-block (2-D and 4-D scales) and plain BF16 tensors."""
    f32 = lambda *s: RNG.standard_normal(s).astype(np.float32)
    u8 = lambda *s: RNG.integers(0, 256, size=s, dtype=np.uint8)
    shards = [
        {   # ModelOpt NVFP4 expert, N = 32, K = 64
            "model.layers.1.mlp.experts.0.w1.weight": u8(32, 32),
            "model.layers.1.mlp.experts.0.w1.weight_scale": ("float8_e4m3fn", u8(32, 4)),
            "model.layers.1.mlp.experts.0.w1.weight_scale_2": np.array(0.5, np.float32),
            "model.layers.1.mlp.experts.0.w1.input_scale": np.array([0.25], np.float32),
            # compressed-tensors NVFP4
            "model.layers.1.mlp.experts.1.w1.weight_packed": u8(32, 32),
            "model.layers.1.mlp.experts.1.w1.weight_scale": ("float8_e4m3fn", u8(32, 4)),
            "model.layers.1.mlp.experts.1.w1.weight_global_scale": np.array([448.0], np.float32),
        },
        {   # MXFP4 (U8 E8M0 scales) and MXFP4 with F8_E8M0 scales
            "model.layers.2.mlp.experts.0.w2.weight_packed": u8(16, 32),
            "model.layers.2.mlp.experts.0.w2.weight_scale": u8(16, 2),
            "model.layers.2.mlp.experts.1.w2.weight_packed": u8(16, 32),
            "model.layers.2.mlp.experts.1.w2.weight_scale": ("float8_e8m0fnu", u8(16, 2)),
            "model.embed_tokens.weight": ("bfloat16", u8(8, 16 * 2)),
        },
        {   # FP8 128x128 blocks: N = 200, K = 300 -> grid [2, 3]
            "model.layers.0.self_attn.q_proj.weight": ("float8_e4m3fn", u8(200, 300)),
            "model.layers.0.self_attn.q_proj.weight_scale": f32(2, 1, 3, 1),
            "model.layers.0.self_attn.o_proj.weight": ("float8_e4m3fn", u8(130, 128)),
            "model.layers.0.self_attn.o_proj.weight_scale_inv": f32(2, 1),
            "lm_head.weight": ("bfloat16", u8(8, 16 * 2)),
        },
    ]
    n = len(shards)
    weight_map, total, expect, keep = {}, 0, {}, []
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        specs = {}
        for k, v in tensors.items():
            if isinstance(v, tuple):
                pyname, raw = v
                raw = np.ascontiguousarray(raw)
                shape = raw.shape if pyname != "bfloat16" else (raw.shape[0], raw.shape[1] // 2)
                specs[k] = TensorSpec(dtype=pyname, shape=shape, data_ptr=raw.ctypes.data, data_len=raw.nbytes)
                data = raw.tobytes()
            else:
                v = np.array(v, order="C")  # keeps 0-d scalars 0-d
                specs[k] = TensorSpec(dtype=v.dtype.name, shape=v.shape, data_ptr=v.ctypes.data, data_len=v.nbytes)
                raw, data = v, v.tobytes()
            keep.append(raw)
            weight_map[k] = name
            total += len(data)
            expect[k] = (name, data)
        (d / name).write_bytes(bytes(serialize(specs, metadata={"format": "pt"})))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True))
    return expect, total


def test_python_sharded_checkpoint_inspect(tmp_path):
    expect, total = write_python_checkpoint(tmp_path)
    rep = json.loads(run(K3, "inspect", "--json", str(tmp_path)).stdout)
    assert rep["index"] is True
    assert len(rep["shards"]) == 3
    assert rep["totals"]["tensors"] == len(expect)
    assert rep["totals"]["bytes"] == total
    assert rep["totals"]["problems"] == 0
    by = {t["name"]: t for t in rep["tensors"]}
    for name, (shard, data) in expect.items():
        assert by[name]["shard"] == shard
        assert by[name]["bytes"] == len(data)
    q = lambda n: by[n]["quant"]
    assert q("model.layers.1.mlp.experts.0.w1.weight") == "NVFP4"
    assert by["model.layers.1.mlp.experts.0.w1.weight_scale_2"]["part_of"] == "model.layers.1.mlp.experts.0.w1.weight"
    assert by["model.layers.1.mlp.experts.0.w1.input_scale"]["role"] == "input_scale"
    assert q("model.layers.1.mlp.experts.1.w1.weight_packed") == "NVFP4-CT"
    assert q("model.layers.2.mlp.experts.0.w2.weight_packed") == "MXFP4"
    assert q("model.layers.2.mlp.experts.1.w2.weight_packed") == "MXFP4"
    assert q("model.layers.0.self_attn.q_proj.weight") == "FP8-block"
    assert q("model.layers.0.self_attn.o_proj.weight") == "FP8-block"
    assert q("lm_head.weight") == "plain"
    assert rep["totals"]["by_quant"]["NVFP4"]["weights"] == 1
    assert rep["totals"]["by_dtype"]["BF16"]["tensors"] == 2
    # the text report too, and every byte through k3's reader
    text = run(K3, "inspect", str(tmp_path)).stdout
    assert "NVFP4" in text and "weight_scale_2 of model.layers.1.mlp.experts.0.w1.weight" in text
    got = dump(tmp_path)
    for name, (shard, data) in expect.items():
        assert got[name]["shard"] == shard
        assert bytes.fromhex(got[name]["hex"]) == data, name


def test_inspect_rejects_malformed(tmp_path):
    expect, total = write_python_checkpoint(tmp_path)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1])  # one byte short
    p = run(K3, "inspect", str(tmp_path), check=False)
    assert p.returncode == 1
    assert "model-00002-of-00003.safetensors" in p.stderr and "model.embed_tokens.weight" not in p.stdout
    write_python_checkpoint(tmp_path)
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    idx["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors"  # wrong shard
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    p = run(K3, "inspect", "--json", str(tmp_path), check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert '"lm_head.weight"' in p.stderr and "model-00003-of-00003.safetensors" in p.stderr
    # an NVFP4 weight whose block scale has the wrong shape is reported and fails
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({"x.weight": np.zeros((4, 8), np.uint8), "x.weight_scale": np.zeros((4, 2), np.uint8).view(np.uint8),
               "x.weight_scale_2": np.array(1.0, np.float32)}, str(bad / "m.safetensors"))
    p = run(K3, "inspect", str(bad / "m.safetensors"), check=False)
    assert p.returncode == 1  # U8 scale next to a U8 weight: no known format


def test_k3_sharded_read_by_python(tmp_path):
    expect, specs, keep = python_tensors()
    p = subprocess.run([STDUMP, "write-sharded", str(tmp_path), "3"], input=spec_for(expect, {"format": "pt"}),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(idx["weight_map"]) == set(expect)
    assert idx["metadata"]["total_size"] == sum(len(d) for _, _, d in expect.values())
    shards = sorted(set(idx["weight_map"].values()))
    assert shards == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    seen = {}
    for s in shards:
        for name, t in deserialize((tmp_path / s).read_bytes()):
            assert idx["weight_map"][name] == s
            seen[name] = bytes(t["data"])
    assert seen == {n: d for n, (_, _, d) in expect.items()}
