"""kvtier compare end to end with SmolLM2 on a tiny grid (passkey at 512 tokens, one depth): the
results file and report, policies discovered from `kvtier policies --json` with budgets only where a
value lists --kv-budget, a grown grid runs only its new cells, an interrupted last line runs again,
settings that differ are an error, compare-report rebuilds the same report. About 30 s on 2 cores."""
import json

import pytest

from kvtier_testlib import model, run

GRID = ["--lengths", "512", "--depths", "0.5", "--samples", "1", "--seed", "3", "-t", "2"]


def compare(results, policies, *extra, check=True):
    return run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", policies, *GRID, "--results", results,
               *extra, check=check)


def lines(path):
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    res = d / "r.jsonl"
    p = compare(res, "resident,layer", "--report", d / "rep")
    return d, res, p


def test_results_file_has_a_header_and_one_line_per_cell(first):
    _, res, p = first
    rows = [json.loads(l) for l in lines(res)]
    assert rows[0]["kvtier_compare"] == 1 and rows[0]["seed"] == 3 and rows[0]["depths"] == [0.5]
    assert [(r["policy"], r["task"], r["length"], r["budget"]) for r in rows[1:]] == [
        ("resident", "passkey", 512, None), ("layer", "passkey", 512, None)]
    res_cell, layer = rows[1], rows[2]
    assert res_cell["kv_bytes"]["device"] > 0 and res_cell["kv_bytes"]["host"] == 0
    assert layer["kv_bytes"]["host"] >= res_cell["kv_bytes"]["device"] and layer["bytes_loaded"] > 0
    assert res_cell["prefill"]["tokens"] > 400 and res_cell["prefill"]["seconds"] > 0
    assert res_cell["decode"]["tokens"] > 0 and res_cell["decode"]["seconds"] > 0
    # layer is exact: the same answer as resident.
    assert layer["samples"][0]["answer"] == res_cell["samples"][0]["answer"]
    assert "2 cells run, 2 in" in p.stdout


def test_report_tables_and_plots(first):
    d, _, _ = first
    md = (d / "rep" / "README.md").read_text()
    assert "| layer | - | " in md and "100.0%" in md and "#### passkey" in md
    for f in ("accuracy-vs-compression-passkey.svg", "speed-vs-context.svg"):
        svg = (d / "rep" / f).read_text()
        assert svg.startswith("<svg ") and svg.rstrip().endswith("</svg>") and ">layer<" in svg


def test_compare_report_rebuilds_the_report(first, tmp_path):
    d, res, _ = first
    run("compare-report", res, "--report", tmp_path / "again")
    for f in ("README.md", "accuracy-vs-compression-passkey.svg", "speed-vs-context.svg"):
        assert (tmp_path / "again" / f).read_text() == (d / "rep" / f).read_text(), f


def test_list_discovers_policies_and_budgets(first):
    _, res, _ = first
    out = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", "all", "--budgets", "1/2,1/4", *GRID,
              "--results", res, "--list").stdout.splitlines()
    axes = json.loads(run("policies", "--json").stdout)["axes"]
    budgeted = [a["value"] for a in axes if "--kv-budget" in a["flags"].split() and a["axis"] != "placement"]
    unbudgeted = [a["value"] for a in axes if a["value"] not in budgeted and a["value"] not in ("f16", "all", "none")]
    assert out[0] == "done passkey 512 resident" and out[1] == "done passkey 512 layer"
    # Without a skew file or retaining heads, infinigen (and pool, which runs as layer+infinigen+pool) and locret
    # are left out (test_compare_all_e2e.py runs them); a value the resident placement refuses (kvpr, hybrid) runs
    # on layer.
    unbudgeted = [v for v in unbudgeted if v not in ("infinigen", "pool")]
    budgeted = [v for v in budgeted if v != "locret"]
    for v in unbudgeted:
        placement = any(a["value"] == v and a["axis"] == "placement" for a in axes)
        specs = [v] if placement else [f"resident+{v}", f"layer+{v}"]
        assert sum(any(l.endswith(f" {s}") for s in specs) for l in out) == 1, (v, out)
    for v in budgeted:
        assert any(l.endswith(f"resident+{v}@1/2 (256 tokens)") for l in out), (v, out)
        assert any(l.endswith(f"resident+{v}@1/4 (128 tokens)") for l in out), (v, out)
    assert all(l.startswith("todo") for l in out[2:])


def test_grown_grid_and_interrupted_line_continue(first, tmp_path):
    _, res, _ = first
    mine = tmp_path / "r.jsonl"
    mine.write_text(res.read_text())
    before = lines(mine)
    p = compare(mine, "resident,layer,headinfer")
    assert "1 cells run, 3 in" in p.stdout
    after = lines(mine)
    assert after[:3] == before and json.loads(after[3])["policy"] == "headinfer"
    # The last line cut short (a sweep killed while writing it): dropped with a warning, its cell runs again.
    text = mine.read_text()
    mine.write_text(text[: len(text) - len(after[3]) // 2])
    p = compare(mine, "resident,layer,headinfer")
    assert "incomplete line" in p.stderr and "1 cells run, 3 in" in p.stdout
    assert lines(mine)[:3] == before and json.loads(lines(mine)[3])["policy"] == "headinfer"


def test_errors(first, tmp_path):
    _, res, _ = first
    copy = tmp_path / "r.jsonl"
    copy.write_text(res.read_text())
    p = run("compare", "passkey", "-m", model("smollm2"), "--kv-policy", "resident", "--lengths", "512", "--depths",
            "0.5", "--seed", "4", "--results", copy, check=False)
    assert p.returncode == 1 and "seed 3" in p.stderr, p.stderr
    bad = [(["--budgets", "3/2"], "budgets"), (["--kv-budget", "64"], "--kv-budget"), (["--lengths", "16k"], "trained context"),
           (["--kv-type", "f32"], "representation"), (["--kv-policy", "no-such"], "no-such")]
    for args, msg in bad:
        base = [a for flag, v in (("--kv-policy", "resident"), ("--lengths", "512")) if flag not in args for a in (flag, v)]
        p = run("compare", "passkey", "-m", model("smollm2"), *base, *args, "--results", tmp_path / "x.jsonl", check=False)
        assert p.returncode in (1, 2) and msg in p.stderr, (args, p.stderr)
    # A corrupt line is an error that names it.
    lines_ = res.read_text().splitlines()
    lines_[1] = lines_[1][:20] + "#" + lines_[1][21:]
    copy.write_text("\n".join(lines_) + "\n")
    p = compare(copy, "resident,layer", check=False)
    assert p.returncode == 1 and f"{copy}:2:" in p.stderr, p.stderr
