"""kvtier run / chat / perplexity / bench from the command line: JSON fields, streaming equals the
JSON text, seeds, stop strings, chat multi-turn, errors. Tiny synthetic model (fast) plus SmolLM2
for the chat REPL."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.gguf"
    kt.run("synth", "--preset", "tiny-llama", "-o", path, "--type", "q8_0", "--seed", "1")
    return path


def test_run_json_has_the_promised_fields(tiny):
    j = kt.run_json("run", "-m", tiny, "-p", "hello world", "-n", 12, "--ignore-eos", "--json", "--threads", 2)
    for k in ("text", "tokens", "n_prompt", "n_gen", "prefill_tokens_per_s", "decode_tokens_per_s",
              "peak_memory_bytes", "seed", "stop_reason"):
        assert k in j, k
    assert j["n_gen"] == len(j["tokens"]) == 12 and j["n_prompt"] == len(j["prompt_tokens"]) == 12  # BOS + 11 bytes
    mem = j["peak_memory_bytes"]["device"]
    assert mem["weights"] > 0 and mem["kv"] > 0 and mem["activations"] > 0 and mem["total"] >= mem["kv"]
    assert set(j["peak_memory_bytes"]) == {"device", "host", "disk"}


def test_streamed_text_equals_json_text_and_greedy_is_default(tiny):
    args = ["run", "-m", tiny, "-p", "abc", "-n", 20, "--ignore-eos"]
    streamed = kt.run(*args).stdout
    j = kt.run_json(*args, "--json")
    assert streamed == j["text"] + "\n"
    assert kt.run_json(*args, "--json")["tokens"] == j["tokens"]


def test_seed_reproducible_sampling(tiny):
    args = ["run", "-m", tiny, "-p", "abc", "-n", 24, "--ignore-eos", "--json", "--temp", "1.5", "--top-k", "50",
            "--top-p", "0.95", "--min-p", "0.01", "--repeat-penalty", "1.1"]
    a = kt.run_json(*args, "--seed", 5)
    assert kt.run_json(*args, "--seed", 5)["tokens"] == a["tokens"]
    assert kt.run_json(*args, "--seed", 6)["tokens"] != a["tokens"]


def test_stop_string_cuts_the_text(tiny):
    j = kt.run_json("run", "-m", tiny, "-p", "abc", "-n", 40, "--ignore-eos", "--json")
    text = j["text"]
    assert len(text) > 6
    stop = text[3:5]
    k = kt.run_json("run", "-m", tiny, "-p", "abc", "-n", 40, "--ignore-eos", "--json", "--stop", stop)
    assert k["stop_reason"] == "stop_string" and k["text"] == text[:text.find(stop)]


def test_context_and_flag_errors(tiny):
    p = kt.run("run", "-m", tiny, "-n", 4, check=False)
    assert p.returncode != 0 and "exactly one of -p TEXT, -f FILE and --ids 1,2,3" in p.stderr
    p = kt.run("run", "-m", tiny, "-p", "x", "--ids", "1,2", check=False)
    assert p.returncode != 0 and "exactly one of" in p.stderr
    for bad in ("1,,2", "1,2,", "x", "-1", "1 ,2"):
        p = kt.run("run", "-m", tiny, "--ids", bad, check=False)
        assert p.returncode != 0 and "is not a token id" in p.stderr, bad
    p = kt.run("run", "-m", tiny, "--ids", "99999999", check=False)
    assert p.returncode != 0 and "outside the vocabulary" in p.stderr
    p = kt.run("run", "-m", tiny, "-p", "x" * 300, "--ctx", 64, check=False)
    assert p.returncode != 0 and "raise --ctx" in p.stderr


def test_perplexity_and_bench_json(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 30)
    j = kt.run_json("perplexity", "-m", tiny, "-f", text, "--ctx", 64, "--json")
    assert j["n_windows"] >= 2 and j["perplexity"] > 1 and j["n_scored"] == j["n_windows"] * 31
    b = kt.run_json("bench", "-m", tiny, "--prompt-tokens", "16,64", "--gen", 4, "--repeat", 2, "--json")
    assert [r["prompt_tokens"] for r in b["results"]] == [16, 64]
    assert all(r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0 for r in b["results"])


def test_chat_two_turns_then_end_of_input():
    args = kt.with_isa(["chat", "-m", kt.model("smollm2"), "--temp", "0", "-n", "24", "--threads", "2"])

    def chat(text):
        proc = subprocess.run([kt.kvtier_bin(), *args], input=text, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    both = chat("What is the capital of France?\nAnd of Italy?\n")
    replies = [r for r in both.split("\n") if r.strip()]
    assert len(replies) >= 2 and "Paris" in replies[0], both
    # The second turn is answered after the first one: asked alone, the same question gets another
    # greedy reply. (Which city this 135M model names there turns on the last bits of its sums.)
    alone = chat("And of Italy?\n").strip()
    assert alone and alone not in both, (alone, both)


def test_ids_prompt_scores_a_given_sequence(tiny, tmp_path):
    """--ids gives the prompt as token ids: the same logits as the text that tokenises to them."""
    text = kt.run_json("run", "-m", tiny, "-p", "abc abc", "-n", 0, "--json", "--dump-logits", tmp_path / "a.npy")
    ids = ",".join(map(str, text["prompt_tokens"]))
    by_ids = kt.run_json("run", "-m", tiny, "--ids", ids, "-n", 0, "--json", "--dump-logits", tmp_path / "b.npy")
    assert by_ids["prompt_tokens"] == text["prompt_tokens"]
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == b.shape and a.shape[0] == len(text["prompt_tokens"]) and (a == b).all()


def test_logits_digest_is_xxh3_of_each_dumped_row(tiny, tmp_path):
    """--logits-digest (what the exactness matrix compares): per evaluated position, XXH3-64 of the
    logits' bytes, checked against the xxhash package on the rows --dump-logits writes."""
    import xxhash
    j = kt.run_json("run", "-m", tiny, "-p", "abc abd", "-n", 3, "--ignore-eos", "--json", "--logits-digest",
                    "--dump-logits", tmp_path / "a.npy")
    rows = np.load(tmp_path / "a.npy")
    assert rows.dtype == np.float32 and len(j["logits_digest"]) == rows.shape[0] == len(j["prompt_tokens"]) + 2
    assert j["logits_digest"] == [f"{xxhash.xxh3_64_intdigest(r.tobytes()):016x}" for r in rows]
    assert len(set(j["logits_digest"])) == rows.shape[0]  # distinct positions, distinct hashes
    p = kt.run("run", "-m", tiny, "-p", "abc", "-n", 1, "--logits-digest", check=False)
    assert p.returncode != 0 and "--json" in p.stderr


def test_state_digest_covers_the_prompt_with_states_and_the_decode_steps_with_logits(tiny):
    """--state-digest (what the exactness matrix compares): one hash per prompt position (its
    output-normed hidden state) and the decode steps' logits hashes, which are those --logits-digest
    gives; the states do not depend on the prefill chunk; the tokens are the plain run's."""
    prompt = "abc abd abe abf " * 5
    common = ["run", "-m", tiny, "-p", prompt, "-n", 4, "--ignore-eos", "--json"]
    by_logits = kt.run_json(*common, "--logits-digest", "--chunk", 7)
    n = len(by_logits["prompt_tokens"])
    states = [kt.run_json(*common, "--state-digest", "--chunk", c) for c in (7, 64)]
    for j in states:
        assert j["tokens"] == by_logits["tokens"]
        assert len(j["state_digest"]) == n and len(set(j["state_digest"])) == n
        assert j["logits_digest"] == by_logits["logits_digest"][n:] and len(j["logits_digest"]) == 3
        assert not set(j["state_digest"]) & set(by_logits["logits_digest"])  # states, not logits
    assert states[0]["state_digest"] == states[1]["state_digest"]
    for bad, msg in ((["--state-digest"], "--json"), (["--json", "--state-digest", "--logits-digest"], "not with")):
        p = kt.run("run", "-m", tiny, "-p", "abc", "-n", 1, *bad, check=False)
        assert p.returncode != 0 and msg in p.stderr, p.stderr
