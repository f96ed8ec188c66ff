"""The GGUF reader and writer against the `gguf` Python package (the independent reference).

- Every metadata key, value type and value, and every tensor's name, type, shape, offset and size
  that `kvtier inspect --json` reports equal what gguf.GGUFReader reads from the same file: for
  both real models, synthetic models of every writable type, a fixture using every value type
  (written by our writer) and a file written by gguf.GGUFWriter.
- The synthetic models' quantised weights equal gguf.quants.quantize of the same f32 weights.
- inspect's figures (parameters, bytes, per-type totals, KV bytes per token) recomputed here.
"""
import os

import gguf
import numpy as np
import pytest

from kvtier_testlib import model, run, run_json

VT = gguf.GGUFValueType
TYPE_NAMES = {
    VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32", VT.INT32: "i32",
    VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string", VT.ARRAY: "array", VT.UINT64: "u64",
    VT.INT64: "i64", VT.FLOAT64: "f64",
}


def reference_fields(path):
    r = gguf.GGUFReader(path)
    out = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = f
    return r, out


def normalise(value):
    """Python-side value in the shape kvtier's JSON uses (floats as Python floats, nested lists)."""
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if isinstance(value, np.ndarray):
        return [normalise(v) for v in value.tolist()]
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def compare_file(path):
    info = run_json("inspect", "--json", path)
    reader, fields = reference_fields(str(path))
    meta = info["metadata"]
    assert list(meta.keys()) == list(fields.keys()), "metadata keys (and their order) differ"
    for key, f in fields.items():
        ours = meta[key]
        assert ours["type"] == TYPE_NAMES[f.types[0]], key
        if f.types[0] == VT.ARRAY and len(f.types) > 1:
            if f.types[1] == VT.ARRAY:
                continue  # checked separately: gguf-py flattens nested arrays
            assert ours["elem_type"] == TYPE_NAMES[f.types[1]], key
        expected = normalise(f.contents())
        assert ours["value"] == expected, f"{key}: {str(ours['value'])[:200]} != {str(expected)[:200]}"
    assert info["alignment"] == reader.alignment
    assert info["data_offset"] == reader.data_offset
    assert info["tensor_count"] == len(reader.tensors)
    for ours, ref in zip(info["tensors"], reader.tensors, strict=True):
        assert ours["name"] == ref.name
        assert ours["type"].lower() == ref.tensor_type.name.lower(), ref.name
        assert ours["ne"] == [int(x) for x in ref.shape], ref.name
        assert ours["offset"] + reader.data_offset == ref.data_offset, ref.name
        assert ours["n_bytes"] == int(ref.n_bytes), ref.name
    return info, reader


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_match_reference(name):
    info, reader = compare_file(model(name))
    # Figures printed by inspect, recomputed from the reference's view of the file.
    assert info["n_params"] == sum(int(t.n_elements) for t in reader.tensors)
    assert info["weight_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    by_type = {}
    for t in reader.tensors:
        e = by_type.setdefault(t.tensor_type.name.lower(), [0, 0])
        e[0] += 1
        e[1] += int(t.n_bytes)
    assert {k.lower(): [v["count"], v["bytes"]] for k, v in info["tensor_types"].items()} == by_type
    arch = reader.fields["general.architecture"].contents()
    f = lambda k: reader.fields[f"{arch}.{k}"].contents()
    n_layer, n_head, n_kv = f("block_count"), f("attention.head_count"), f("attention.head_count_kv")
    hd_k = f("attention.key_length") if f"{arch}.attention.key_length" in reader.fields else f("embedding_length") // n_head
    hd_v = f("attention.value_length") if f"{arch}.attention.value_length" in reader.fields else hd_k
    assert info["kv_bytes_per_token_f16"] == n_layer * n_kv * (hd_k + hd_v) * 2
    assert info["hparams"]["n_layer"] == n_layer
    assert info["hparams"]["n_vocab"] == len(reader.fields["tokenizer.ggml.tokens"].contents())
    # The text form runs too and names the architecture.
    assert f"architecture:  {arch}" in run("inspect", model(name)).stdout


def test_known_figures():
    """Figures of the two default models that are published independently of any GGUF reader."""
    s = run_json("inspect", "--json", model("smollm2"))
    assert (s["hparams"]["n_layer"], s["hparams"]["n_embd"], s["hparams"]["n_head"], s["hparams"]["n_head_kv"]) == (30, 576, 9, 3)
    assert s["n_params"] == 134515008
    g = run_json("inspect", "--json", model("gemma3"))
    assert (g["hparams"]["n_layer"], g["hparams"]["n_embd"], g["hparams"]["head_dim_k"]) == (18, 640, 256)
    assert g["hparams"]["sliding_window"] == 512


def test_type_sizes_match_reference():
    """Every GGML type id, block size and byte size the reader knows equals gguf-py's table."""
    fixture_dir = os.environ["KVTIER_BINARY_DIR"]
    # Tensor of each type the reference knows, written by the reference, read by us.
    path = os.path.join(fixture_dir, "test_tmp", "all_ggml_types.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = gguf.GGUFWriter(path, "test")
    # gguf-py's table still lists Q8_1 with two f32 scales (40 bytes); GGML's block_q8_1 holds two
    # f16 (36 bytes) since 2024. Q8_1 is an activation-only type that no model file stores.
    known_stale = {gguf.GGMLQuantizationType.Q8_1}
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qt in known_stale:
            continue
        raw = np.zeros((2 * size,), dtype=np.uint8)
        w.add_tensor(f"t.{qt.name}", raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info, _ = compare_file(path)
    assert info["tensor_count"] == len(gguf.GGML_QUANT_SIZES) - len(known_stale)


def test_python_written_file_with_every_value_type(tmp_path):
    path = str(tmp_path / "py.gguf")
    w = gguf.GGUFWriter(path, "pytest")
    w.add_uint8("p.u8", 200)
    w.add_int8("p.i8", -100)
    w.add_uint16("p.u16", 60000)
    w.add_int16("p.i16", -30000)
    w.add_uint32("p.u32", 4000000000)
    w.add_int32("p.i32", -2000000000)
    w.add_float32("p.f32", 1.5e-7)
    w.add_uint64("p.u64", 2**64 - 1)
    w.add_int64("p.i64", -(2**63))
    w.add_float64("p.f64", -1e-300)
    w.add_bool("p.bool", True)
    w.add_string("p.str", "ünïcødé ✓ 漢字 🙂")
    w.add_array("p.arr_str", ["a", "bb", ""])
    w.add_array("p.arr_int", [1, -2, 3])
    w.add_array("p.arr_float", [0.5, 2.25])
    w.add_array("p.arr_empty", [])
    w.add_tensor("w", np.arange(48, dtype=np.float32).reshape(3, 16))
    w.add_tensor("h", np.ones((4, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    compare_file(path)


def test_our_fixture_read_by_reference(tmp_path):
    """Our writer's every-value-type file, read back by gguf-py, at several alignments."""
    writer = os.environ["KVTIER_FIXTURE_WRITER"]
    import subprocess
    for align in (32, 64, 4096):
        path = str(tmp_path / f"fixture_{align}.gguf")
        subprocess.run([writer, path, str(align)], check=True)
        info, reader = compare_file(path)
        assert reader.alignment == align
        # Nested arrays: gguf-py flattens their contents; compare the flattened leaves.
        nested = info["metadata"]["t.arr_nested"]["value"]
        assert nested == [[1, 2, 3], ["x", "y"]]
        f = reader.fields["t.arr_nested"]
        assert f.types[:2] == [VT.ARRAY, VT.ARRAY]
        # Tensor bytes read by the reference equal what the fixture wrote.
        t = {t.name: t for t in reader.tensors}
        assert np.array_equal(np.frombuffer(t["weights.f32"].data.tobytes(), np.float32),
                              np.arange(64, dtype=np.float32) * 0.25 - 3.0)
        assert t["weights.q4_0"].data.tobytes() == bytes((i * 7) & 0xFF for i in range(36))


WRITABLE = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"]


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    files = {}
    for t in WRITABLE:
        p = d / f"tiny-{t}.gguf"
        run("synth", "--preset", "tiny-llama", "--type", t, "--seed", "5", "-o", p)
        files[t] = p
    return files


@pytest.mark.parametrize("t", WRITABLE)
def test_synthetic_files_match_reference(synth_files, t):
    info, reader = compare_file(synth_files[t])
    assert info["hparams"]["n_layer"] == 2
    assert reader.fields["general.architecture"].contents() == "llama"


@pytest.mark.parametrize("t", ["f16", "bf16", "q8_0", "q4_0", "q4_1"])
def test_synthetic_quantisation_matches_reference(synth_files, t):
    """Our reference quantisers equal gguf-py's on the same f32 weights, byte for byte."""
    f32 = {x.name: x for x in gguf.GGUFReader(str(synth_files["f32"])).tensors}
    quant = {x.name: x for x in gguf.GGUFReader(str(synth_files[t])).tensors}
    qtype = gguf.GGMLQuantizationType[t.upper()]
    n_checked = 0
    for name, q in quant.items():
        src = np.array(f32[name].data, dtype=np.float32).reshape(-1, int(f32[name].shape[0]))
        if q.tensor_type == gguf.GGMLQuantizationType.F32:
            assert q.data.tobytes() == f32[name].data.tobytes(), name
            continue
        assert q.tensor_type == qtype, name
        expected = gguf.quants.quantize(src, qtype)
        assert expected.tobytes() == q.data.tobytes(), f"{name}: quantised bytes differ from gguf-py"
        n_checked += 1
    assert n_checked >= 9


def test_synthetic_seed_changes_weights(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    run("synth", "--preset", "tiny-mha", "--seed", "1", "-o", a)
    run("synth", "--preset", "tiny-mha", "--seed", "1", "-o", b)
    run("synth", "--preset", "tiny-mha", "--seed", "2", "-o", c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    ra = gguf.GGUFReader(str(a))
    assert ra.fields["llama.attention.head_count_kv"].contents() == 4
