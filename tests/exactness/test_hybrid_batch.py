"""HybridServe's mini-batched executor (issue 15, docs/hybridserve.md "Mini-batches"): `hybridserve`
with streamed weights (--weights-mem below all weights) runs B sequences per pass, each layer's weights
loaded once per pass for all of them, the sequences' cache visits ordered by Algorithm 2's mini-batches.

- Exactness: each sequence's greedy tokens and the XXH3 digests of every logits row it got (its prompt's
  last position, then each decode step; `bench --logits-digest`) equal `kvtier run --ids <its prompt>
  --kv-policy resident --logits-digest` run alone, at forced ratios 0.5 and inf, weights streamed from
  host memory and from the GGUF file, the KV home in host memory and on disk at the smallest --kv-mem.
- One weight pass per step: the weight bytes a round streams are those of its passes (prefill passes +
  decode steps) times the streamed layers' bytes, not B times that.
- Memory: the compute tier holds the same weights, KV, staging and scratch bytes for B sequences as for
  one, within --weights-mem and --kv-mem; and a single run's peak equals `kvtier plan -m` exactly.
"""
import json
import math
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

N_GEN = 4
BATCH = 3
CHUNK = 64


@pytest.fixture(scope="module")
def opt6(tmp_path_factory):
    """tiny-opt with 12 layers (their weights larger than the fixed ones and the two staging slots)."""
    path = tmp_path_factory.mktemp("syn") / "opt12.gguf"
    run("synth", "--preset", "tiny-opt", "--type", "q8_0", "--layers", 12, "-o", path)
    return path


def needed(args, flag):
    """The smallest budget the engine accepts for `flag` (from its budget error at 1 byte)."""
    p = run(*args, flag, 1, check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


def bench_args(mdl, prompt_tokens, batch=BATCH):
    return ["bench", "-m", mdl, "--prompt-tokens", prompt_tokens, "--gen", N_GEN, "--batch", batch, "--repeat", 1,
            "--warmup", 0, "--chunk", CHUNK, "-t", 2, "--json", "--logits-digest"]


def batched(mdl, prompt_tokens, extra, batch=BATCH):
    j = json.loads(run(*bench_args(mdl, prompt_tokens, batch), *extra).stdout)
    (row,) = j["results"]
    assert row["batch"] == batch
    return row


def alone(mdl, ids):
    """Tokens and the digests of the logits rows a batched run gets: the prompt's last position on."""
    j = json.loads(run("run", "-m", mdl, "--ids", ",".join(map(str, ids)), "-n", N_GEN + 1, "--ignore-eos",
                       "--chunk", CHUNK, "-t", 2, "--json", "--logits-digest", "--kv-policy", "resident").stdout)
    return j["tokens"][:N_GEN], j["logits_digest"][len(ids) - 1:]


def check_model(mdl, prompt_tokens, tmp_path):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    ref = None
    rows = 0
    for ratio in ("0.5", "inf"):
        for source in ("host", "file"):  # the two slots only (file: tensors page-aligned in them)
            slots = needed(bench_args(mdl, prompt_tokens) + ["--kv-policy", "hybridserve", "--weights-from", source],
                           "--weights-mem")
            cfg = ["--kv-policy", "hybridserve", "--act-ratio", ratio, "--weights-mem", str(slots),
                   "--weights-from", source]
            kv_mem = needed(bench_args(mdl, prompt_tokens) + cfg, "--kv-mem")
            for extra in ([], ["--kv-mem", str(kv_mem), "--kv-disk", str(disk)]):
                row = batched(mdl, prompt_tokens, cfg + extra)
                label = " ".join(cfg + extra)
                if ref is None:
                    ref = [alone(mdl, s["prompt_ids"]) for s in row["sequences"]]
                    assert len({tuple(t) for t, _ in ref}) > 1, "the sequences should differ"
                for b, s in enumerate(row["sequences"]):
                    assert len(s["prompt_ids"]) == prompt_tokens
                    assert s["tokens"] == ref[b][0], f"{mdl.name} {label}: sequence {b}'s tokens differ from alone"
                    assert len(s["logits_digest"]) == N_GEN + 1
                    assert s["logits_digest"] == ref[b][1], f"{mdl.name} {label}: sequence {b}'s logits differ"
                # Every layer but the resident ones streamed, once per pass for the whole batch.
                w = row["weights"]
                assert w["streamed_layers"] > 0 and w["source"] == source, w
                passes = math.ceil(BATCH * prompt_tokens / CHUNK) + N_GEN
                per_pass = w["streamed_bytes"]
                if source == "host":
                    assert (passes - 1) * per_pass <= row["weight_bytes_loaded_per_run"] <= (passes + 1) * per_pass, (
                        label, row["weight_bytes_loaded_per_run"], passes, per_pass)
                else:  # the file's extents are widened to 4 KiB pages
                    assert (passes - 1) * per_pass <= row["weight_bytes_loaded_per_run"] <= (passes + 1) * (
                        per_pass + w["streamed_layers"] * 64 * 4096), (label, row["weight_bytes_loaded_per_run"])
                # Algorithm 2 planned the batched passes (every decode step carries all B sequences).
                mb = row["kv"]["mini_batches"]
                assert mb["last_seqs"] == BATCH and 1 <= mb["last"] <= BATCH and mb["passes"] >= N_GEN, mb
                dev = row["peak_memory_bytes"]["device"]
                assert dev["weights"] <= slots, (label, dev)
                if extra:
                    assert dev["kv"] + dev["staging"] + dev["scratch"] <= kv_mem, (label, dev, kv_mem)
                rows += 1
    assert list(disk.iterdir()) == [], "the disk tier left files behind"
    return rows


def test_opt_batched_hybridserve_streamed_weights_equals_alone(opt6, tmp_path):
    assert check_model(opt6, 100, tmp_path) == 8


def test_smollm2_batched_hybridserve_streamed_weights_equals_alone(tmp_path):
    assert check_model(model("smollm2"), 90, tmp_path) == 8


def test_batch_fits_the_compute_tier_of_one_sequence(opt6, tmp_path):
    """B sequences need no more compute-local weights, KV, staging or scratch than one: their KV and
    checkpoints live in the home tier, and a weight pass serves all of them."""
    cfg = ["--kv-policy", "hybridserve", "--act-ratio", "1"]
    slots = needed(bench_args(opt6, 100) + cfg, "--weights-mem")
    cfg += ["--weights-mem", str(slots)]
    kv_mem = needed(bench_args(opt6, 100, 4) + cfg, "--kv-mem")
    cfg += ["--kv-mem", str(kv_mem), "--kv-disk", str(tmp_path)]
    one = batched(opt6, 100, cfg, batch=1)["peak_memory_bytes"]["device"]
    four = batched(opt6, 100, cfg, batch=4)["peak_memory_bytes"]["device"]
    for cat in ("weights", "kv", "staging", "scratch"):
        assert four[cat] == one[cat], (cat, one, four)
    assert four["weights"] <= slots and four["kv"] + four["staging"] + four["scratch"] <= kv_mem


@pytest.mark.parametrize("source", ["host", "file"])
def test_plan_predicts_hybridserve_with_streamed_weights_exactly(opt6, tmp_path, source):
    """Peak compute-tier bytes within --weights-mem + --kv-mem (+ activations and logits), and equal,
    per tier and category, to the `kvtier plan -m` row of the same flags."""
    prompt = "The tiers of memory move bytes back and forth. " * 4
    base = ["--ctx", 512, "--chunk", CHUNK, "-t", 2, "--kv-policy", "hybridserve", "--act-ratio", "0.5"]
    slots = needed(["run", "-m", opt6, "-p", "x", "-n", 1, *base, "--weights-from", source], "--weights-mem")
    layer_bytes = 37632  # one tiny-opt layer at q8_0 (the run's streamed_bytes / streamed_layers, checked below)
    for wmem, n_streamed in ((slots, 12), (slots + layer_bytes, 11)):  # slots only; one layer resident too
        flags = base + ["--weights-mem", wmem, "--weights-from", source]
        kv_mem = needed(["run", "-m", opt6, "-p", "x", "-n", 1, *flags], "--kv-mem")
        flags += ["--kv-mem", kv_mem, "--kv-disk", tmp_path]
        j = json.loads(run("run", "-m", opt6, "-p", prompt, "-n", 4, "--ignore-eos", "--json", *flags).stdout)
        measured = j["peak_memory_bytes"]
        (prow,) = json.loads(run("plan", "-m", opt6, "--json", *flags).stdout)["engine"]["policies"]
        assert prow["fits"], prow
        predicted = prow["memory"]
        for tier in ("device", "host", "disk"):
            for cat in ("weights", "kv", "activations", "staging", "scratch", "logits", "total"):
                assert measured[tier][cat] == predicted[tier][cat], (wmem, source, tier, cat, measured, predicted)
        dev = measured["device"]
        assert dev["weights"] <= wmem and dev["kv"] + dev["staging"] + dev["scratch"] <= kv_mem, dev
        assert dev["total"] <= wmem + kv_mem + dev["activations"] + dev["logits"], dev
        assert measured["disk"]["kv"] > 0, measured
        if source == "file":
            assert measured["disk"]["weights"] > 0 and measured["host"]["weights"] == 0, measured
        else:
            assert measured["host"]["weights"] > 0 and measured["disk"]["weights"] == 0, measured
        assert j["weights"]["streamed_layers"] == n_streamed, j["weights"]
        assert j["weights"]["streamed_bytes"] == n_streamed * layer_bytes, j["weights"]
