"""`kvtier plan` through the CLI: the HeadInfer paper's Table 10 (Llama-3-8B, 1M tokens) from the
llama3-8b preset, budget handling, and bad input."""
from kvtier_testlib import model, run, run_json

GIB = 1024**3
TABLE10_TOTALS = {"standard": 207, "chunked": 143, "kvquant4": 111, "layer": 87, "headinfer": 16.7}


def test_table10_totals_within_2_percent():
    j = run_json("plan", "--preset", "llama3-8b", "--ctx", "1M", "--group", "1", "--json")
    got = {m["method"]: m["device"]["total"] / GIB for m in j["methods"]}
    for method, paper in TABLE10_TOTALS.items():
        assert abs(got[method] - paper) <= 0.02 * paper, (method, got[method], paper)
    head = next(m for m in j["methods"] if m["method"] == "headinfer")
    assert head["host"]["kv"] == 128 * GIB


def test_budgets_and_max_context():
    j = run_json("plan", "--preset", "llama3-8b", "--ctx", "1M", "--device-mem", "24GiB", "--host-mem", "512GiB", "--json")
    by = {m["method"]: m for m in j["methods"]}
    assert not by["standard"]["fits"] and by["headinfer"]["fits"]
    assert by["headinfer"]["group"] == 8
    assert by["headinfer"]["max_context"] == 4 * 1024 * 1024  # bounded by the 512 GiB host pool
    assert by["standard"]["max_context"] < by["layer"]["max_context"] < by["headinfer"]["max_context"]


def test_plan_from_a_gguf_file():
    j = run_json("plan", "-m", model("smollm2"), "--ctx", "8K", "--json")
    std = next(m for m in j["methods"] if m["method"] == "standard")
    # SmolLM2: 30 layers x 3 KV heads x 64 dims x (K+V) x 2 bytes x 8192 tokens.
    assert std["device"]["kv"] == 30 * 3 * 64 * 2 * 2 * 8192


def test_plan_bad_input():
    p = run("plan", "--preset", "llama3-8b", "--ctx", "lots", check=False)
    assert p.returncode == 1 and "--ctx" in p.stderr
    p = run("plan", "--ctx", "1K", check=False)
    assert p.returncode == 1 and "exactly one of -m or --preset" in p.stderr
    p = run("plan", "--preset", "llama3-8b", "--ctx", "1K", "--group", "3", check=False)
    assert p.returncode == 1 and "does not divide" in p.stderr
    p = run("plan", "--preset", "llama3-8b", "--ctx", "1K", "--device-mem", "12XB", check=False)
    assert p.returncode == 1 and "--device-mem" in p.stderr


def test_engine_rows_from_a_gguf_file():
    j = run_json("plan", "-m", model("smollm2"), "--ctx", "2K", "--chunk", "64", "-t", "2", "--json")
    eng = j["engine"]
    assert (eng["ctx"], eng["chunk"], eng["threads"]) == (2048, 64, 2)
    rows = {r["policy"]: r for r in eng["policies"]}
    assert list(rows) == ["resident", "layer", "headinfer"] and all(r["fits"] for r in rows.values())
    res, head = rows["resident"]["memory"], rows["headinfer"]["memory"]
    # Same weights and activations (same chunk); the offloaded placement keeps the KV in host memory.
    assert res["device"]["weights"] == head["device"]["weights"] > 0
    assert res["device"]["activations"] == head["device"]["activations"] > 0
    assert res["device"]["kv"] > 10 * head["device"]["kv"] and head["host"]["kv"] >= res["device"]["kv"] * 0.99
    for tier in ("device", "host", "disk"):
        m = res[tier]
        assert m["total"] == sum(v for k, v in m.items() if k != "total")
    # The paper's model stays as it was (Table 10/11 rows use --chunk as given).
    assert {m["method"] for m in j["methods"]} == {"standard", "chunked", "kvquant4", "layer", "headinfer"}


def test_engine_rows_report_budgets_that_do_not_fit():
    j = run_json("plan", "-m", model("smollm2"), "--ctx", "2K", "--kv-policy", "resident,headinfer", "--kv-mem",
                 "4MiB", "--host-mem", "1MiB", "--group", "1", "--json")
    rows = {r["policy"]: r for r in j["engine"]["policies"]}
    assert not rows["resident"]["fits"] and "--kv-mem" in rows["resident"]["error"]
    assert not rows["headinfer"]["fits"] and "host budget" in rows["headinfer"]["error"]
    assert "engine" not in run_json("plan", "--preset", "llama3-8b", "--ctx", "1K", "--json")
    p = run("plan", "-m", model("smollm2"), "--ctx", "1K", "--kv-policy", "resident,bogus", check=False)
    assert p.returncode == 1 and "bogus" in p.stderr
