"""KV placements on a real model: measured compute-tier KV bytes against the planner and the
budget, transfer accounting, and disk faults that stop a run cleanly."""
import json
import re
import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

PROMPT = "A long document about tiered memory. " * 40
CTX = 2048


def run_json(*args):
    return json.loads(run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", 4, "--ctx", CTX, "-t", 2,
                          "--ignore-eos", "--json", *args).stdout)


def plan_kv(policy, group=None):
    args = ["plan", "-m", model("smollm2"), "--ctx", CTX, "--policy", policy, "--json"]
    if group:
        args += ["--group", group]
    j = json.loads(run(*args).stdout)
    return j["methods"][0]["device"]["kv"]


def test_measured_kv_matches_the_planner():
    cases = [("resident", [], plan_kv("standard")),
             ("layer", [], plan_kv("layer")),
             ("headinfer g=1", ["--group", "1"], plan_kv("headinfer", 1)),
             ("headinfer g=3", ["--group", "3"], plan_kv("headinfer", 3))]
    for name, extra, predicted in cases:
        policy = name.split()[0]
        j = run_json("--kv-policy", policy, *extra)
        measured = j["peak_memory_bytes"]["device"]["kv"]
        assert abs(measured - predicted) <= 0.10 * predicted, (name, measured, predicted)
        if policy != "resident":
            # Only new rows are written back; loads bring the past rows of each unit per pass.
            assert j["kv"]["bytes_stored"] > 0 and j["kv"]["bytes_loaded"] > 0
            assert j["kv"]["stall_s"] >= 0


def test_measured_never_exceeds_the_budget():
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--ctx", CTX, "--kv-policy", "headinfer",
            "--kv-mem", 1, check=False)
    need = int(re.search(r"(\d+) bytes are needed", p.stderr).group(1))
    for budget in (need, need * 3 // 2, need * 4):
        j = run_json("--kv-policy", "headinfer", "--kv-mem", budget)
        dev = j["peak_memory_bytes"]["device"]
        assert dev["kv"] + dev["staging"] <= budget, (budget, dev)
    # A budget one byte short fails before the run starts, naming both sizes.
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--ctx", CTX, "--kv-policy", "headinfer",
            "--kv-mem", need - 1, check=False)
    assert p.returncode == 1 and f"{need} bytes are needed" in p.stderr and str(need - 1) in p.stderr


def test_disk_failure_stops_the_run_without_complete_output(tmp_path):
    p = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", 8, "--ctx", CTX, "--kv-policy", "headinfer",
            "--kv-disk", tmp_path, "--json", "--debug-kv-disk-fail-after", 200000, check=False)
    assert p.returncode == 1
    assert "KV disk tier" in p.stderr and "Input/output error" in p.stderr
    assert '"text"' not in p.stdout  # no result object is printed for a failed run
    assert list(tmp_path.iterdir()) == []


def test_random_copy_delays_keep_outputs_identical(tmp_path):
    ref = run_json("--kv-policy", "resident")
    for extra in (["--kv-policy", "layer"], ["--kv-policy", "headinfer", "--group", "1", "--prefetch-depth", "3"]):
        j = run_json(*extra, "--kv-disk", tmp_path, "--debug-copy-delay-us", 300)
        assert j["tokens"] == ref["tokens"], extra


def test_bench_compares_policies(tmp_path):
    j = json.loads(run("bench", "-m", model("smollm2"), "--prompt-tokens", "64,128", "--gen", 4, "--repeat", 1,
                       "-t", 2, "--kv-policy", "resident,layer,headinfer", "--group", 1, "--kv-disk", tmp_path,
                       "--json").stdout)
    rows = j["results"]
    assert [(r["policy"], r["prompt_tokens"]) for r in rows] == [
        (p, n) for n in (64, 128) for p in ("resident", "layer", "headinfer")]
    for r in rows:
        assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
        assert (r["bytes_loaded_per_run"] > 0) == (r["policy"] != "resident")
    assert rows[0]["prefill_ratio_to_first"] == 1.0
    p = run("bench", "-m", model("smollm2"), "--kv-policy", "resident,bogus", check=False)
    assert p.returncode == 1 and "bogus" in p.stderr and "headinfer" in p.stderr
