"""Our CPU dequantisation of every tensor of the two real models equals the `gguf` Python package's
(gguf.quants.dequantize) bit for bit. The C++ side is tests/backend/dequant_dump."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

SOURCE = Path(os.environ.get("KVTIER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BINARY = Path(os.environ.get("KVTIER_BINARY_DIR", SOURCE / "build" / "cpu"))
DUMP = BINARY / "tests" / "backend" / "dequant_dump"
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
CHUNK_ELEMENTS = 1 << 22  # compare large tensors in row ranges of about this many elements


@pytest.mark.parametrize("model", MODELS)
def test_every_tensor_bit_exact(model):
    path = SOURCE / "models" / model
    if not path.exists():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    assert DUMP.exists(), f"{DUMP} not built"
    reader = GGUFReader(str(path))
    assert len(reader.tensors) > 0
    types_seen = set()
    for t in reader.tensors:
        ne0 = int(t.shape[0])
        n_rows = int(t.n_elements) // ne0
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        row_bytes = raw.size // n_rows
        rows_per_chunk = max(1, CHUNK_ELEMENTS // ne0)
        for r0 in range(0, n_rows, rows_per_chunk):
            r1 = min(n_rows, r0 + rows_per_chunk)
            ref = dequantize(raw[r0 * row_bytes : r1 * row_bytes].reshape(r1 - r0, row_bytes), t.tensor_type)
            ref = np.asarray(ref, dtype=np.float32).reshape(-1)
            out = subprocess.run([str(DUMP), str(path), t.name, str(r0), str(r1)], check=True,
                                 capture_output=True).stdout
            ours = np.frombuffer(out, dtype=np.float32)
            assert ours.size == ref.size, f"{t.name}: {ours.size} values, expected {ref.size}"
            diff = np.nonzero(ours.view(np.uint32) != ref.view(np.uint32))[0]
            assert diff.size == 0, (
                f"{model} {t.name} ({t.tensor_type.name}) rows {r0}..{r1}: {diff.size} values differ, first at "
                f"{diff[0]}: ours {ours[diff[0]]!r} reference {ref[diff[0]]!r}")
        types_seen.add(t.tensor_type.name)
    print(model, sorted(types_seen))


RANDOM_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("type_name", RANDOM_TYPES)
def test_random_blocks_bit_exact(type_name):
    """Every supported type, including those the two models lack, on random block bytes whose f16
    scale fields are replaced by finite values (random bits would give inf/nan scales)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(1234)
    n_blocks = 64
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if type_name in ("F16", "BF16"):
        vals = rng.standard_normal(n_blocks * type_size // 2).astype(np.float32)
        if type_name == "F16":
            raw = vals.astype(np.float16).view(np.uint8).reshape(n_blocks, type_size)
        else:
            raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, type_size)
    else:
        # Offsets of the f16 scale fields in each block layout.
        f16_fields = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                      "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[type_name]
        for off in f16_fields:
            scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
            raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    ref = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1)
    name = {"F16": "f16", "BF16": "bf16"}.get(type_name, type_name.replace("_K", "_k").lower().replace("_k", "_K"))
    out = subprocess.run([str(DUMP), "--raw", name], input=raw.tobytes(), check=True, capture_output=True).stdout
    ours = np.frombuffer(out, dtype=np.float32)
    assert ours.size == ref.size
    diff = np.nonzero(ours.view(np.uint32) != ref.view(np.uint32))[0]
    assert diff.size == 0, f"{type_name}: {diff.size} differ, first {diff[0]}: {ours[diff[0]]!r} vs {ref[diff[0]]!r}"
