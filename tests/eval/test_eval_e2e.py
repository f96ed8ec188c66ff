"""kvtier eval end to end with SmolLM2 on a small grid: JSON and report, the same seed gives the
same prompts and answers, exact policies match resident sample by sample, bad flags are errors."""
import json
import re

import pytest

from kvtier_testlib import model, run

GRID = ["--lengths", "512", "--depths", "0,1", "--samples", "1", "--seed", "3", "-t", "2"]
EXACT = ("layer", "headinfer", "layer+sliding")  # policies that promise resident's tokens exactly


def eval_json(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    run("eval", *args, "-m", model("smollm2"), *GRID, "--json", out)
    return json.loads(out.read_text())


def known_policies():
    """The presets the unknown-policy error names (the same list `kvtier policies` prints)."""
    p = run("eval", "niah", "-m", model("smollm2"), "--kv-policy", "no-such-policy", check=False)
    assert p.returncode == 1
    m = re.search(r"known presets: ([a-z0-9_ -]+);", p.stderr)
    assert m, p.stderr
    return m.group(1).split()


def exact_specs():
    """Whether `kvtier policies --check` calls each of EXACT exact."""
    return {s: json.loads(run("policies", "--check", s, "--json").stdout)["exact"] for s in EXACT}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    out = d / "a.json"
    rep = d / "report"
    run("eval", "passkey,niah,vt", "-m", model("smollm2"), *GRID, "--json", out, "--report", rep)
    return json.loads(out.read_text()), rep


def test_json_has_every_sample_and_metadata(first):
    j, _ = first
    meta = j["meta"]
    assert meta["policies"] == ["resident"] and meta["lengths"] == [512] and meta["seed"] == 3
    assert meta["commit"] and meta["machine"] and "kvtier eval" in meta["command"]
    assert [t["name"] for t in meta["tasks"]] == ["passkey", "niah", "vt"]
    assert len(j["samples"]) == 2 + 2 + 1
    for s in j["samples"]:
        assert 0 < s["prompt_tokens"] <= 512
        assert s["expected"] and isinstance(s["answer"], str) and 0.0 <= s["score"] <= 1.0
    assert {c["task"] for c in j["overall"]} == {"passkey", "niah", "vt"}


def test_small_model_finds_short_needles(first):
    # SmolLM2 finds most needles in 512 tokens; a broken engine (or prompt) finds none.
    j, _ = first
    scores = [s["score"] for s in j["samples"] if s["task"] in ("niah", "passkey")]
    assert sum(scores) >= len(scores) / 2, [(s["task"], s["depth"], s["expected"], s["answer"]) for s in j["samples"]]


def test_report_is_written(first):
    _, rep = first
    md = (rep / "README.md").read_text()
    assert "### niah" in md and "| resident |" in md
    for f in ("niah-resident-heatmap.svg", "passkey-resident-heatmap.svg", "niah-by-length.svg", "vt-by-length.svg"):
        assert (rep / f).read_text().startswith("<svg ")


def test_same_seed_same_prompts_and_answers(first, tmp_path):
    j, _ = first
    again = eval_json(tmp_path, "b", "passkey,niah,vt")
    key = lambda s: (s["task"], s["length"], s["depth"], s["index"], s["seed"], s["prompt_tokens"], s["expected"], s["answer"], s["score"])
    assert [key(s) for s in again["samples"]] == [key(s) for s in j["samples"]]


def test_eval_report_merges_runs(first, tmp_path):
    # The run split in two JSON files (passkey; niah and vt) and merged back: the same samples and cells.
    j, _ = first
    parts = []
    for name, tasks in (("p", {"passkey"}), ("q", {"niah", "vt"})):
        part = dict(j, samples=[s for s in j["samples"] if s["task"] in tasks])
        part["meta"] = dict(j["meta"], tasks=[t for t in j["meta"]["tasks"] if t["name"] in tasks])
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
        parts.append(tmp_path / f"{name}.json")
    run("eval-report", *parts, parts[0], "--json", tmp_path / "m.json", "--report", tmp_path / "rep")
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["samples"] == j["samples"] and m["cells"] == j["cells"] and m["overall"] == j["overall"]
    assert (tmp_path / "rep" / "niah-resident-heatmap.svg").exists()


def test_exact_policies_equal_resident(tmp_path):
    assert set(EXACT) & set(known_policies()) == {"layer", "headinfer"}
    assert all(exact_specs().values()), exact_specs()
    # Offloaded policies with one KV head per unit and the master copy on disk: answers and NLLs
    # must equal resident's sample by sample (--expect-equal exits 1 otherwise).
    run("eval", "niah,ppl", "-m", model("smollm2"), "--kv-policy", ",".join(["resident", *EXACT]), *GRID,
        "--group", "1", "--kv-disk", tmp_path, "--expect-equal")


def test_selection_policies_select(tmp_path):
    # Each policy runs every axis it names: with --chunk 1 every position is a decode step, so quest's
    # page selection at a 32-token budget changes the NLL of a 256-token window, and eval must say so
    # (it once dropped the selection axis and ran layer+quest as plain layer). The recorded command
    # names the knobs that differ from their defaults.
    out = tmp_path / "q.json"
    p = run("eval", "ppl", "-m", model("smollm2"), "--kv-policy", "resident,layer+quest", "--kv-budget", "32",
            "--chunk", "1", "--lengths", "256", "--samples", "1", "-t", "2", "--json", out, "--expect-equal",
            check=False)
    assert p.returncode == 1 and "layer+quest vs resident: 1 of the samples differ" in p.stdout, p.stdout + p.stderr
    j = json.loads(out.read_text())
    nll = {s["policy"]: s["nll_sum"] for s in j["samples"]}
    assert nll["layer+quest"] > nll["resident"], nll
    assert "--kv-budget 32" in j["meta"]["command"] and "--chunk 1" in j["meta"]["command"]


def test_unknown_policy_names_the_known_ones():
    assert "resident" in known_policies()


def test_bad_grid_flags():
    for args in (["--lengths", "12x"], ["--depths", "1.5"], ["--lengths", "16"]):
        p = run("eval", "niah", "-m", model("smollm2"), *args, check=False)
        assert p.returncode in (1, 2), args
        assert "length" in p.stderr or "depth" in p.stderr, p.stderr
    p = run("eval", "needles", "-m", model("smollm2"), check=False)
    assert p.returncode == 1 and "niah-mq" in p.stderr
