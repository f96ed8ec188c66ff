"""InfiniGen's bounded KV pool (retention `pool`, spec infinigen.md §8, A8) through the CLI on SmolLM2:
- a limit that holds the whole run evicts nothing and gives the very logits of `infinigen` without one
  (XXH3 digest of every logits row), with a smaller home tier;
- a small limit keeps every pool at its slots, the speculation sees only live slots, and each eviction
  policy picks its victims from the older half (FIFO: exactly the oldest positions);
- a disk home (--kv-disk) gives the very tokens, logits and pool figures of a host home, in a disk file
  whose size follows the pool, not --ctx;
- a prompt 2-3x the pool is prefilled in chunks that evict between them (FIFO: exactly the oldest
  positions go), on a host and a disk home alike;
- bad values of the flags and a limit below one slot are clear errors."""
import json
import re
import shutil

import pytest

from kvtier_testlib import model, run

PROMPT = open("/usr/share/common-licenses/GPL-2", encoding="utf-8").read()[:700]
N_GEN = 48
# SmolLM2-135M: 30 layers (28 speculate: 2..29), 3 KV heads, head size 64, f16 rows of 128 bytes.
POOL_HEADS = 28 * 3
SLOT_BYTES = POOL_HEADS * 2 * 128  # one slot of every pooled (layer, KV head), one sequence


@pytest.fixture(scope="module")
def skew(tmp_path_factory):
    out = tmp_path_factory.mktemp("igpool")
    f = out / "smollm2.skew.gguf"
    run("skew", "-m", model("smollm2"), "-o", f, "--tokens", 128, "-t", 2)
    yield f
    shutil.rmtree(out, ignore_errors=True)


def run_proc(skew, *extra):
    return run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", N_GEN, "-t", 2, "--ctx", 1024, "--ignore-eos",
               "--json", "--logits-digest", "--skew", skew, *extra)


def run_json(skew, *extra):
    return json.loads(run_proc(skew, *extra).stdout)


@pytest.fixture(scope="module")
def plain(skew):
    return run_json(skew, "--kv-policy", "infinigen")


def host_kv(j):
    return j["peak_memory_bytes"]["host"]["kv"]


def test_a_limit_that_holds_the_run_is_bit_identical_to_no_limit(skew, plain):
    positions = plain["n_prompt"] + N_GEN  # more than the run writes; far less than --ctx 1024
    assert positions < 1024
    pooled = run_json(skew, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", positions * SLOT_BYTES)
    assert pooled["kv"]["policy"] == "layer+infinigen+pool"
    assert pooled["tokens"] == plain["tokens"]
    assert pooled["logits_digest"] == plain["logits_digest"]
    p = pooled["kv"]["infinigen"]["pool"]
    assert p["slots"] == positions and p["evictions"] == 0 and p["eviction"] == "counter"
    assert p["live_max"] <= positions
    # the speculation saw the same rows
    for k in ("rows_total", "rows_fetched", "n_sel_min", "n_sel_max", "layer_steps"):
        assert pooled["kv"]["infinigen"][k] == plain["kv"]["infinigen"][k], k
    # the home tier holds the pooled layers' slots only
    assert host_kv(pooled) < host_kv(plain)
    # pool without a limit: nothing bounded, the same run
    unbounded = run_json(skew, "--kv-policy", "layer+infinigen+pool")
    assert unbounded["logits_digest"] == plain["logits_digest"]
    assert "pool" not in unbounded["kv"]["infinigen"]


@pytest.mark.parametrize("eviction", ["counter", "fifo", "lru"])
def test_a_small_limit_keeps_the_pools_at_their_slots(skew, plain, eviction):
    P = plain["n_prompt"]
    C = P + 8  # slots per (layer, KV head): the prompt and 8 decoded tokens, then evictions
    j = run_json(skew, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", C * SLOT_BYTES + SLOT_BYTES - 1,
                 "--kv-pool-eviction", eviction)
    g = j["kv"]["infinigen"]
    p = g["pool"]
    assert p["slots"] == C and p["eviction"] == eviction
    steps = g["layer_steps"] // 28  # decode passes that speculated (positions P .. P + steps - 1)
    assert steps >= N_GEN - 2
    written = P + steps  # positions each pooled layer received (the last decode pass's token included)
    E = written - C  # evictions per (layer, KV head)
    assert 0 < E < C
    assert p["live_max"] == C and p["live_rows"] == C * POOL_HEADS
    assert p["evictions"] == E * POOL_HEADS
    assert [x["layer"] for x in p["layers"]] == list(range(2, 30))
    assert all(x["evictions"] == 3 * E for x in p["layers"])
    # victims only from the older half of the positions
    assert p["young_victims"] == 0
    assert 0 <= p["max_evicted_pos"] < written / 2
    # each speculation ran over the live slots only: min(position, C) rows per KV head
    assert g["rows_total"] == 28 * 3 * sum(min(P + i, C) for i in range(steps))
    assert 0 < g["rows_fetched"] <= 0.2 * g["rows_total"] + 28 * 3 * steps
    mins = [x["min_live_pos"] for x in p["layers"]]
    if eviction == "fifo":  # the oldest positions go first: exactly 0 .. E-1 are gone
        assert mins == [E] * 28 and p["max_evicted_pos"] == E - 1
    else:  # fetched rows stay: the attention sink at position 0 survives somewhere
        assert min(mins) < E
    assert len(j["tokens"]) == len(plain["tokens"])


def fails(*args):
    p = run(*args, check=False)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_bad_pool_flags_are_refused_with_clear_messages(skew, tmp_path):
    base = ["run", "-m", model("smollm2"), "-p", PROMPT, "-n", 2, "-t", 2, "--skew", skew, "--ctx", 1024]
    err = fails(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", "64MiB", "--kv-pool-eviction", "mru")
    assert "unknown pool eviction 'mru'" in err and "counter, fifo, lru" in err
    err = fails(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", "64MiB", "--kv-pool-prefill", "mass")
    assert "unknown pool prefill rule 'mass'" in err and "weight, order" in err
    err = fails(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", "lots")
    assert "--kv-pool-limit" in err
    # below one slot of every (layer, KV head): the message names the minimum
    err = fails(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", "1KiB")
    assert "cannot hold one slot" in err and f"at least {SLOT_BYTES} bytes" in err
    assert "needs selection infinigen" in fails(*base, "--kv-policy", "layer+pool")
    # a limit that bounds nothing runs on a disk home too
    run(*base, "--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", 1024 * SLOT_BYTES, "--kv-disk", tmp_path)


PAGE = 256 * 128  # one home page: 256 rows of 128 bytes (one KV head's K or V)


def disk_bytes(j):
    m = re.match(r"disk file in .*, (\d+) bytes, ", j["kv"]["home"])
    assert m, j["kv"]["home"]
    return int(m.group(1))


@pytest.mark.parametrize("eviction", ["counter", "fifo", "lru"])
def test_a_disk_home_gives_the_host_homes_run(skew, plain, tmp_path, eviction):
    C = plain["n_prompt"] + 8  # evicts from the 9th decoded token on
    flags = ["--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", C * SLOT_BYTES, "--kv-pool-eviction", eviction]
    host = run_json(skew, *flags)
    disk = run_json(skew, *flags, "--kv-disk", tmp_path)
    assert host["kv"]["home"].startswith("host") and disk["kv"]["home"].startswith("disk file")
    assert disk["tokens"] == host["tokens"]
    assert disk["logits_digest"] == host["logits_digest"]
    assert disk["kv"]["infinigen"]["pool"] == host["kv"]["infinigen"]["pool"]
    assert disk["kv"]["infinigen"]["pool"]["evictions"] > 0
    for k in ("rows_total", "rows_fetched", "layer_steps"):
        assert disk["kv"]["infinigen"][k] == host["kv"]["infinigen"][k], k
    # the disk file: layers 0-1 hold --ctx 1024 positions (4 pages), the 28 pooled layers one page
    # (C < 256 slots), per KV head and K|V
    assert disk_bytes(disk) == (2 * 4 + 28 * 1) * 3 * 2 * PAGE
    # `kvtier plan` predicts every byte the run held
    plan = json.loads(run("plan", "-m", model("smollm2"), "--ctx", 1024, "-t", 2, "--json", "--kv-disk", tmp_path,
                          *flags).stdout)
    assert plan["engine"]["policies"][0]["memory"] == disk["peak_memory_bytes"]
    assert disk["peak_memory_bytes"]["disk"]["kv"] == disk_bytes(disk)
    unbounded = json.loads(run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", 1, "-t", 2, "--ctx", 1024, "--json",
                               "--skew", skew, "--kv-policy", "infinigen", "--kv-disk", tmp_path).stdout)
    assert disk_bytes(unbounded) == 30 * 4 * 3 * 2 * PAGE


@pytest.mark.parametrize("eviction", ["fifo", "counter", "lru"])
def test_a_prompt_longer_than_the_pool_evicts_while_it_is_prefilled(skew, plain, tmp_path, eviction):
    P = plain["n_prompt"]
    C = 64  # slots per (layer, KV head): the prompt is 2-3x that
    assert 2 * C <= P <= 3 * C
    flags = ["--kv-policy", "layer+infinigen+pool", "--kv-pool-limit", C * SLOT_BYTES, "--kv-pool-eviction", eviction,
             "--chunk", 32]
    proc = run_proc(skew, *flags)
    j = json.loads(proc.stdout)
    g = j["kv"]["infinigen"]
    p = g["pool"]
    assert p["slots"] == C
    steps = g["layer_steps"] // 28
    assert steps >= N_GEN - 2
    written = P + steps
    assert p["live_max"] == C and p["live_rows"] == C * POOL_HEADS  # never more rows than slots
    assert p["evictions"] == (written - C) * POOL_HEADS
    assert p["prefill_evictions"] == (P - C) * POOL_HEADS
    assert f"longer than the KV pool's {C} slots" in proc.stderr  # evicting at prefill: a warning (§15.13)
    # every decode step speculated over the C live slots
    assert g["rows_total"] == 28 * 3 * C * steps
    if eviction == "fifo":  # exactly the oldest positions went, at prefill and at decode
        assert [x["min_live_pos"] for x in p["layers"]] == [written - C] * 28
        assert p["max_evicted_pos"] == written - C - 1
        # from position 2C on the oldest live one (p - C) is no longer in the older half (< p / 2): the
        # victim comes from all slots
        assert p["young_victims"] == POOL_HEADS * sum(1 for q in range(C, written) if q - C >= q // 2)
    assert len(j["tokens"]) == N_GEN
    # a disk home: the same run
    d = run_json(skew, *flags, "--kv-disk", tmp_path)
    assert d["tokens"] == j["tokens"] and d["logits_digest"] == j["logits_digest"]
    assert d["kv"]["infinigen"]["pool"] == p
    assert p["prefill"] == "order"
    if eviction != "fifo":
        # --kv-pool-prefill weight (§15.13 [D]): the prompt's victims by prefill attention weight. The
        # same counts, other rows kept (other logits), and a disk home gives the host home's run.
        w = run_json(skew, *flags, "--kv-pool-prefill", "weight")
        pw = w["kv"]["infinigen"]["pool"]
        assert pw["prefill"] == "weight"
        assert pw["evictions"] == p["evictions"] and pw["prefill_evictions"] == p["prefill_evictions"]
        assert w["logits_digest"] != j["logits_digest"]
        wd = run_json(skew, *flags, "--kv-pool-prefill", "weight", "--kv-disk", tmp_path)
        assert wd["logits_digest"] == w["logits_digest"] and wd["kv"]["infinigen"]["pool"] == pw
        # `kvtier plan` counts the weights' scratch and per-slot bytes: every byte the run held
        plan = json.loads(run("plan", "-m", model("smollm2"), "--ctx", 1024, "-t", 2, "--json",
                              *flags, "--kv-pool-prefill", "weight").stdout)
        assert plan["engine"]["policies"][0]["memory"] == w["peak_memory_bytes"]
        assert w["peak_memory_bytes"]["device"]["scratch"] > j["peak_memory_bytes"]["device"]["scratch"]
