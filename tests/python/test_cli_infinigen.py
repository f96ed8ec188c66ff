"""Selection infinigen through the CLI on the real models: `run --json` reports the speculation's figures
(layers >= 2 without a window of their own, fetched rows within the cap, fewer bytes loaded than
`layer`), and the skew file and the knobs are checked with clear errors (a missing file names the
`kvtier skew` command that makes it). The degenerate setting (alpha inf, budget 1) is a row of the
exactness matrix (tests/exactness/test_exactness.py)."""
import json
import shutil

import pytest

from kvtier_testlib import model, run

PROMPT = open("/usr/share/common-licenses/GPL-2", encoding="utf-8").read()[:2500]


@pytest.fixture(scope="module")
def skews(tmp_path_factory):
    out = tmp_path_factory.mktemp("igskew")
    files = {}
    for name in ("smollm2", "gemma3"):
        files[name] = out / f"{name}.skew.gguf"
        run("skew", "-m", model(name), "-o", files[name], "--tokens", 128, "-t", 2)
    yield files
    shutil.rmtree(out, ignore_errors=True)


def run_json(name, *extra):
    p = run("run", "-m", model(name), "-p", PROMPT, "-n", 8, "-t", 2, "--ctx", 1024, "--ignore-eos", "--json",
            *extra)
    return json.loads(p.stdout)


def test_run_json_reports_the_speculation_on_smollm2(skews):
    layer = run_json("smollm2", "--kv-policy", "layer")
    ig = run_json("smollm2", "--kv-policy", "infinigen", "--skew", skews["smollm2"])
    assert ig["kv"]["policy"] == "layer+infinigen"
    g = ig["kv"]["infinigen"]
    # 30 layers, 0 and 1 dense: 28 speculations per decode pass
    assert g["layer_steps"] > 0 and g["layer_steps"] % 28 == 0
    assert [x["layer"] for x in g["layers"]] == list(range(2, 30))
    assert all(x["steps"] == g["layer_steps"] // 28 for x in g["layers"])
    # at most the 20 % cap of the rows per KV head, and some rows in every layer
    assert 0 < g["fetched_fraction"] <= 0.2
    assert g["rows_fetched"] <= 0.2 * g["rows_total"]
    assert all(0 < x["fetched_fraction"] <= 0.2 for x in g["layers"])
    assert 1 <= g["n_sel_min"] <= g["n_sel_mean"] <= g["n_sel_max"]
    assert g["selective_loads"] == g["layer_steps"]  # layer placement: one unit per layer
    assert g["speculation_s"] > 0 and g["stall_s"] >= 0
    assert g["partial_keys_build_bytes"] > 0  # the prompt's keys, read once from the home tier
    # the decode steps load the chosen rows only
    assert ig["kv"]["bytes_loaded"] < 0.6 * layer["kv"]["bytes_loaded"]
    assert "infinigen" not in layer["kv"]


def test_gemma3_speculates_on_its_global_layers_only(skews):
    g = run_json("gemma3", "--kv-policy", "headinfer+infinigen", "--skew", skews["gemma3"])["kv"]["infinigen"]
    # 18 layers, every sixth global (5, 11, 17); the sliding-window layers attend their window densely
    assert [x["layer"] for x in g["layers"]] == [5, 11, 17]
    assert 0 < g["fetched_fraction"] <= 0.2


def test_relative_group_rule_keeps_every_row_the_max_rule_keeps(skews):
    # A row above the max rule's threshold (the group's largest score - alpha) is above its own head's
    # maximum - alpha, so the relative rule's count is never smaller; on Gemma-3 (4 query heads per KV
    # head, one of them sink-like in layer 5) it is much larger.
    rel = run_json("gemma3", "--kv-policy", "infinigen", "--skew", skews["gemma3"])["kv"]["infinigen"]
    mx = run_json("gemma3", "--kv-policy", "infinigen", "--skew", skews["gemma3"], "--infinigen-group", "max")
    mx = mx["kv"]["infinigen"]
    assert rel["rows_total"] == mx["rows_total"]
    assert rel["rows_fetched"] > mx["rows_fetched"], (rel["rows_fetched"], mx["rows_fetched"])
    assert rel["fetched_fraction"] <= 0.2
    # a value the flag's parser refuses is a usage error (exit 2) with the choices, not an abort
    for flag, value, choices in (("--infinigen-group", "mean", "max or relative"),
                                 ("--kv-pool-eviction", "bogus", "counter, fifo, lru")):
        p = run("run", "-m", model("gemma3"), "-p", "hi", "-n", 1, "--kv-policy", "infinigen", "--skew",
                skews["gemma3"], flag, value, check=False)
        assert p.returncode == 2 and choices in p.stderr and "terminate" not in p.stderr, (p.returncode, p.stderr)


def test_alpha_inf_and_budget_1_fetch_every_row(skews):
    g = run_json("smollm2", "--kv-policy", "infinigen", "--skew", skews["smollm2"], "--infinigen-alpha", "inf",
                 "--infinigen-budget", "1")["kv"]["infinigen"]
    assert g["fetched_fraction"] == 1.0 and g["rows_fetched"] == g["rows_total"]


def fails(*args):
    p = run(*args, check=False)
    assert p.returncode == 1, p.stderr
    return p.stderr


def test_missing_or_foreign_skew_files_are_refused_with_the_command_that_makes_one(skews, tmp_path):
    m = model("smollm2")
    missing = tmp_path / "none.skew.gguf"
    err = fails("run", "-m", m, "-p", "hi", "-n", 1, "--kv-policy", "infinigen", "--skew", missing)
    assert str(missing) in err and f"kvtier skew -m {m} -o {missing}" in err
    # the default path: next to the model
    default = str(m)[: -len(".gguf")] + ".skew.gguf"
    err = fails("run", "-m", m, "-p", "hi", "-n", 1, "--kv-policy", "infinigen")
    assert default in err and "kvtier skew -m" in err
    # Gemma-3's file for SmolLM2: the model hash differs
    err = fails("run", "-m", m, "-p", "hi", "-n", 1, "--kv-policy", "infinigen", "--skew", skews["gemma3"])
    assert "hash" in err and f"kvtier skew -m {m} -o {skews['gemma3']}" in err


def test_bad_combinations_and_knobs_are_refused(skews):
    base = ["run", "-m", model("smollm2"), "-p", "hi", "-n", 1, "--skew", skews["smollm2"]]
    assert "not resident+infinigen" in fails(*base, "--kv-policy", "resident+infinigen")
    assert "not kivi4" in fails(*base, "--kv-policy", "layer+infinigen+kivi4")
    assert "--infinigen-alpha" in fails(*base, "--kv-policy", "infinigen", "--infinigen-alpha", "0")
    assert "--infinigen-budget" in fails(*base, "--kv-policy", "infinigen", "--infinigen-budget", "1.5")


def test_disk_home_gathers_give_the_host_homes_bits(skews, tmp_path):
    """A selective load on a disk home reads through short gaps between the chosen rows' I/O pages and
    issues its reads together (io_uring): the attention must still see exactly the chosen rows, so the
    logits are bit-identical to the same selection on a host home (row-exact loads), for infinigen at its
    default alpha and for quest with a budget below the context. The slack is counted in bytes_loaded."""
    def digests(*extra):
        p = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", 8, "-t", 2, "--ctx", 1024, "--ignore-eos",
                "--json", "--logits-digest", *extra)
        return json.loads(p.stdout)

    cases = [("infinigen", ["--kv-policy", "infinigen", "--skew", skews["smollm2"]]),
             ("quest", ["--kv-policy", "layer+quest", "--kv-budget", "128"]),
             ("headinfer+infinigen", ["--kv-policy", "headinfer+infinigen", "--group", "1", "--skew",
                                      skews["smollm2"]])]
    for name, flags in cases:
        host = digests(*flags)
        disk = digests(*flags, "--kv-disk", tmp_path)
        assert "O_DIRECT" in disk["kv"]["home"], disk["kv"]["home"]
        assert disk["logits_digest"] == host["logits_digest"], name
        assert disk["tokens"] == host["tokens"], name
        key = "quest" if name == "quest" else "infinigen"
        assert disk["kv"][key]["rows_fetched"] == host["kv"][key]["rows_fetched"] > 0, name
        assert disk["kv"][key]["fetched_fraction"] < 0.5, name
        # host memory copies the rows only; the disk home reads some gaps to merge its reads
        assert host["kv"]["bytes_slack"] == 0, name
        assert 0 < disk["kv"]["bytes_slack"] < disk["kv"]["bytes_loaded"], name
    assert list(tmp_path.iterdir()) == [], "the disk tier left files behind"


def test_emulated_perplexity_equals_the_decode_steps_perplexity(skews, tmp_path):
    """`perplexity --infinigen-emulate` (the paper's teacher-forced emulation: each window in ordinary
    passes, every query masked to its speculated rows) gives the perplexity of `--chunk 1`, where every
    token is a real decode step of layer+infinigen: the same rows attended, the same bits (spec A6 at the
    level of the logits). Both models, 2 windows of 256 tokens; both lose against resident."""
    text = tmp_path / "gpl.txt"
    text.write_text(PROMPT * 3, encoding="utf-8")
    for name in ("smollm2", "gemma3"):
        def ppl(*extra):
            return json.loads(run("perplexity", "-m", model(name), "-f", text, "--ctx", 256, "--chunks", 2, "-t",
                                  2, "--skew", skews[name], "--json", *extra).stdout)

        emulated = ppl("--kv-policy", "infinigen", "--infinigen-emulate")
        decoded = ppl("--kv-policy", "infinigen", "--chunk", 1)
        resident = ppl()
        assert emulated["nll"] == decoded["nll"], name
        assert emulated["nll"] > resident["nll"], name
        e = emulated["infinigen_emulation"]
        assert e["queries"] > 0 and 0 < e["fetched_fraction"] <= 0.2, name
        assert "infinigen_emulation" not in decoded


def test_emulation_needs_an_infinigen_policy_without_a_pool(skews, tmp_path):
    text = tmp_path / "gpl.txt"
    text.write_text(PROMPT * 3, encoding="utf-8")
    base = ["perplexity", "-m", model("smollm2"), "-f", text, "--ctx", 256, "--chunks", 1, "--skew",
            skews["smollm2"], "--infinigen-emulate"]
    assert "--kv-policy infinigen" in fails(*base)
    assert "--kv-policy infinigen" in fails(*base, "--kv-policy", "layer")
    assert "pool" in fails(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", "1MiB")
    assert "outside the context" in fails(*base, "--kv-policy", "infinigen", "--infinigen-emulate-from", 256)
    # --infinigen-emulate-from implies the emulation, and its checks
    assert "--kv-policy infinigen" in fails(*base[:-1], "--kv-policy", "layer", "--infinigen-emulate-from", 128)


def test_emulation_from_the_scored_half_takes_each_windows_columns(skews, tmp_path):
    """`--infinigen-emulate-from N`: the first N tokens of each window attend densely as a prompt and
    choose the columns, later ones are emulated decode steps (the C++ test
    `InfinigenEmulation.SessionEmulateFrom*` holds the logits to a real prefill + decode bit for bit).
    Here: the CLI wiring. With N = ctx/2 (the scored half) exactly the scored tokens speculate, in the
    28 layers of SmolLM2 that do; 0 is plain `--infinigen-emulate`; the prompt's columns give another
    result than the offline ones."""
    text = tmp_path / "gpl.txt"
    text.write_text(PROMPT * 3, encoding="utf-8")

    def ppl(*extra):
        return json.loads(run("perplexity", "-m", model("smollm2"), "-f", text, "--ctx", 256, "--chunks", 2,
                              "-t", 2, "--skew", skews["smollm2"], "--kv-policy", "infinigen", "--json",
                              *extra).stdout)

    offline = ppl("--infinigen-emulate")
    zero = ppl("--infinigen-emulate", "--infinigen-emulate-from", 0)
    half = ppl("--infinigen-emulate-from", 128)  # implies --infinigen-emulate
    assert zero["nll"] == offline["nll"]
    assert zero["infinigen_emulation"]["emulate_from"] == 0
    e = half["infinigen_emulation"]
    assert e["emulate_from"] == 128
    assert e["queries"] == 2 * (256 - 128) * 28
    assert 0 < e["fetched_fraction"] <= 0.2
    assert half["nll"] != offline["nll"]
