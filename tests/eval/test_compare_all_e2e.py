"""kvtier compare --kv-policy all run end to end (not only listed) on SmolLM2 at 512 tokens, budget 1/2:
discovery yields runnable policies only (a value the resident placement refuses runs on layer; infinigen
and locret when their files are given, named on stderr and left out otherwise), every cell of the
grid runs and writes its line, and the exact policies give resident's answer. About a minute on 2 cores."""
import json

import pytest

from kvtier_testlib import model, run

GRID = ["--budgets", "1/2", "--lengths", "512", "--depths", "0.5", "--samples", "1", "--seed", "3", "-t", "2"]
# Extra items next to 'all': quest on an offloaded placement (resident+quest is what 'all' discovers).
EXTRA = ["layer+quest"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare_all")
    m = model("smollm2")
    run("skew", "-m", m, "-o", d / "skew.gguf", "--tokens", 128, "-t", 2)
    run("train-locret", "-m", m, "-o", d / "heads.gguf", "--steps", 0, "-t", 2)  # untrained: runs, fast
    return d


def axes():
    return json.loads(run("policies", "--json").stdout)["axes"]


@pytest.fixture(scope="module")
def swept(files):
    res = files / "r.jsonl"
    p = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", ",".join(["all", *EXTRA]), *GRID,
            "--skew", files / "skew.gguf", "--locret-heads", files / "heads.gguf", "--results", res)
    rows = [json.loads(l) for l in res.read_text().splitlines()]
    return p, rows[0], rows[1:]


def test_every_discovered_policy_runs(swept):
    p, header, cells = swept
    assert "leaves out" not in p.stderr, p.stderr
    specs = [c["policy"] for c in cells]
    assert specs[0] == "resident" and len(specs) == len(set(specs)), specs
    # Every value of every axis (the defaults aside) runs in some cell, each on a placement that takes it.
    for a in axes():
        if a["value"] in ("f16", "all", "none"):
            continue
        assert any(a["value"] in s.split("+") or s == a["value"] for s in specs), (a["value"], specs)
    for bad in ("resident+infinigen", "resident+kvpr", "resident+hybrid"):
        assert bad not in specs
    for s in ("layer+infinigen", "resident+locret", "layer+kvpr", "layer+hybrid", *EXTRA):
        assert s in specs, (s, specs)
    for c in cells:
        assert c["decode"]["tokens"] > 0 and c["prefill"]["tokens"] > 400, c["policy"]
        assert c["samples"] and c["samples"][0]["answer"] is not None, c["policy"]
        takes_budget = any(a["value"] in c["policy"].split("+") and "--kv-budget" in a["flags"].split()
                           and a["axis"] != "placement" for a in axes())
        assert (c["budget"] is not None) == takes_budget, c["policy"]
    # Exact policies give resident's answer; offloaded ones move bytes. f32 rows are exact but not
    # resident's f16 bits, so its greedy text may part from resident's once the key is out: same score.
    by = {c["policy"]: c for c in cells}
    for s in ("layer", "headinfer", "layer+kvpr", "layer+hybrid", "resident+sliding"):
        assert by[s]["samples"][0]["answer"] == by["resident"]["samples"][0]["answer"], s
    assert by["resident+f32"]["samples"][0]["score"] == by["resident"]["samples"][0]["score"]
    for s in ("layer", "layer+infinigen", "layer+quest"):
        assert by[s]["bytes_loaded"] > 0, s
    assert f"{len(cells)} cells run, {len(cells)} in" in p.stdout


def test_without_the_files_all_leaves_them_out_and_says_why(tmp_path):
    p = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", "all", *GRID, "--skew",
            tmp_path / "missing.skew.gguf", "--results", tmp_path / "r.jsonl", "--list")
    specs = [l.split(" ")[3] for l in p.stdout.splitlines()]
    assert "layer+infinigen" not in specs and "resident+locret" not in specs, specs
    assert "leaves out layer+infinigen" in p.stderr and "missing.skew.gguf" in p.stderr, p.stderr
    assert "leaves out resident+locret" in p.stderr and "--locret-heads" in p.stderr, p.stderr
    # Named explicitly, a policy that cannot run is an error before the model loads.
    p = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", "resident,locret", *GRID, "--results",
            tmp_path / "r.jsonl", check=False)
    assert p.returncode == 1 and "--locret-heads" in p.stderr, p.stderr
    p = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", "all,all", *GRID, "--results",
            tmp_path / "r.jsonl", "--list")
    assert p.stdout.count(" resident\n") == 1
