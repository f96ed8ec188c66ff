"""kvtier train-locret and locret-fixture end to end: the head file (read back with the `gguf` package),
progress lines, an interrupted run resumed to the same bytes, and the checks on resume."""
import signal
import subprocess

import gguf
import numpy as np
import pytest

from kvtier_testlib import SOURCE_DIR, kvtier_bin, model, run


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("locret") / "match.gguf"
    run("locret-fixture", "-o", path)
    return path


def train_args(model_path, out, *extra):
    return ["train-locret", "-m", model_path, "-o", out, "--fixture-samples", 24, "--held-out", 4, "--steps", 12,
            "--d-m", 16, "--checkpoint-every", 4, "--eval-every", 6, "--log-every", 1, "-t", 2, *extra]


def test_heads_file_is_a_gguf_tied_to_the_model(fixture_model, tmp_path):
    out = tmp_path / "heads.gguf"
    p = run(*train_args(fixture_model, out))
    assert "step 12/12" in p.stderr and "overlap" in p.stderr
    assert "eval (before training)" in p.stderr and "held-out loss" in p.stderr
    r = gguf.GGUFReader(str(out))
    meta = {f.name: f for f in r.fields.values()}

    def string(key):
        f = meta[key]
        return bytes(f.parts[f.data[0]]).decode()

    assert string("general.architecture") == "locret-heads"
    import xxhash
    assert string("locret.model_hash") == f"xxh3-64:{xxhash.xxh3_64_intdigest(fixture_model.read_bytes()):016x}"
    assert string("locret.activation") == "silu"
    assert "steps=12" in string("locret.provenance.config")
    tensors = {t.name: t for t in r.tensors}
    # 4 layers; d_in = (4 + 2 + 2) * 32 = 256, d_m 16, 2 KV heads; no optimizer state in the output.
    assert sorted(tensors) == sorted(f"locret.blk.{l}.fc{i}.weight" for l in range(4) for i in (1, 2))
    assert list(tensors["locret.blk.0.fc1.weight"].shape) == [256, 16]
    assert list(tensors["locret.blk.3.fc2.weight"].shape) == [16, 2]
    assert np.all(np.isfinite(tensors["locret.blk.2.fc1.weight"].data))
    # The checkpoint holds the AdamW moments and the step count.
    ck = gguf.GGUFReader(str(out) + ".ckpt")
    assert "locret.blk.1.fc2.adam_v" in {t.name for t in ck.tensors}


def test_interrupted_run_resumes_to_the_same_heads(fixture_model, tmp_path):
    straight = tmp_path / "straight.gguf"
    run(*train_args(fixture_model, straight))
    resumed = tmp_path / "resumed.gguf"
    args = [kvtier_bin(), *map(str, train_args(fixture_model, resumed))]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("step 5/12"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    assert "rerun with --resume" in rest
    assert not resumed.exists()
    p = run(*train_args(fixture_model, resumed, "--resume"))
    assert "resuming" in p.stderr
    assert resumed.read_bytes() == straight.read_bytes()


def test_resume_checks_configuration_and_model(fixture_model, tmp_path):
    out = tmp_path / "h.gguf"
    run(*train_args(fixture_model, out))
    p = run(*train_args(fixture_model, out, "--resume", "--lr", "1e-3"), check=False)
    assert p.returncode == 1 and "another training configuration" in p.stderr
    p = run("train-locret", "-m", model("smollm2"), "-o", out, "--fixture-samples", 24, "--held-out", 4,
            "--steps", 12, "--d-m", 16, "--resume", check=False)
    assert p.returncode == 1
    assert "trained for the model with hash" in p.stderr and "locret match-head fixture" in p.stderr


def test_bad_input(fixture_model, tmp_path):
    p = run("train-locret", "-m", fixture_model, "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 1 and "--data" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": 3}\n')
    p = run("train-locret", "-m", model("smollm2"), "-o", tmp_path / "x.gguf", "--data", bad, check=False)
    assert p.returncode == 1 and "line 2" in p.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_locret_data_builds_prompts_whose_answers_they_contain(tmp_path):
    import json

    out = tmp_path / "d.jsonl"
    p = run("locret-data", "-m", model("smollm2"), "-o", out, "--samples", 10, "--lengths", "1k", "--tasks",
            "passkey,niah,vt")
    assert "5 from prose" in p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 10
    sources = [r["source"] for r in rows]
    assert {s.split(":")[0] for s in sources[:5]} <= {"recall", "needle"}
    assert sources[5:] == ["passkey", "niah", "vt", "passkey", "niah"]
    for r in rows:
        assert r["prompt"] and r["answer"]
        if r["source"].startswith(("recall", "needle")):
            assert r["answer"] in r["prompt"]  # the answer is a span of the prompt
        assert len(r["prompt"]) > 2000  # about 1k tokens
    # Deterministic, and train-locret reads it.
    again = tmp_path / "e.jsonl"
    run("locret-data", "-m", model("smollm2"), "-o", again, "--samples", 10, "--lengths", "1k", "--tasks",
        "passkey,niah,vt")
    assert again.read_bytes() == out.read_bytes()
    p = run("locret-data", "-m", model("smollm2"), "-o", tmp_path / "f.jsonl", "--lengths", "256", "--tasks", "cwe",
            "--prose-share", 0, check=False)
    assert p.returncode == 1 and "cwe" in p.stderr
    assert not (tmp_path / "f.jsonl").exists() and not (tmp_path / "f.jsonl.tmp").exists()


def test_heads_script_refuses_an_unknown_option_before_any_work(tmp_path):
    script = SOURCE_DIR / "scripts" / "train_locret_heads.sh"
    p = subprocess.run(["bash", str(script), "--data-size", "9", model("smollm2"), tmp_path / "out"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "unknown option --data-size" in p.stderr, p.stderr
    p = subprocess.run(["bash", str(script), "--data-samples"], capture_output=True, text=True)
    assert p.returncode != 0 and "--data-samples needs a number" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
