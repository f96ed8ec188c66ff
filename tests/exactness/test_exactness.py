"""Exactness matrix: every exact KV policy, generated from the policy axes that `kvtier policies --json`
reports (every exact placement x every exact retention; headinfer with each group size, static heads
and a deeper prefetch) under each KV budget (unlimited; the smallest that fits, found from the
engine's own budget error; the smallest with the KV master copy on disk) and each chunk size
produces bit-identical logits at every position (checked through the output-normed hidden state at
each prompt position and the logits of each decode step) and identical tokens to `resident` with the
same chunk size. Prompts span several chunks; on Gemma-3 the prompt is longer than its 512-token sliding
window, so `+sliding` really frees blocks (and the test checks that it holds less KV).
Models: SmolLM2 (GQA 9/3), Gemma-3 (1 KV head, sliding-window layers, soft-capping off), a
synthetic MHA model (4/4 heads) and a synthetic OPT (MHA 4/4, LayerNorm, learned positions, ReLU FFN). Approximate values join the matrix in their degenerate settings
(degenerate_configs), where they must be exact too.
Not every row runs every (chunk, budget) setting (SWEEP, sweep_plan): the exact rows run all of them on
SmolLM2 and the synthetic models and both chunks and every budget on Gemma-3; the degenerate rows
share the settings out, each running one or two, so that every setting is run by some of them."""
import functools
import json
import re
import subprocess
import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

PROMPT = (
    "The tiered cache keeps the keys and values of every layer where they fit. Chapter one: the river "
    "bends twice before the old mill, and the miller counts the sacks each morning. " * 6
)
N_GEN = 6
CHUNKS = [37, 96]
BUDGETS = ["unlimited", "smallest", "smallest+disk"]  # of an offloaded row; resident rows: unlimited only
# Every (chunk, budget) setting, in an order where any 2 consecutive ones differ in chunk and in budget
# and any 3 consecutive ones hold both chunks and all three budgets (i -> (i mod 2, i mod 3)).
SETTINGS = [(CHUNKS[i % 2], BUDGETS[i % 3]) for i in range(len(CHUNKS) * len(BUDGETS))]
# How many settings each kind of row runs (None: every setting it can run); see sweep_plan. CI time:
# a Gemma-3 run costs ~4 SmolLM2 runs (871 positions of 262k logits), and the degenerate rows were
# more than half of the matrix's runs while each proves one hook bit-identical on one placement.
#   exact: placement x retention, headinfer's groups, static heads, prefetch depth
#   kvpr: kvpr's splits and hybridserve's ratios (one chunk size, unlimited and smallest on disk)
#   degenerate: approximate values in their degenerate settings
FULL_SWEEP = {"exact": None, "kvpr": None, "degenerate": None}
SWEEP = {
    # the exact rows' full sweep; each degenerate row on 2 settings (different rows, different settings)
    "smollm2": {"exact": None, "kvpr": None, "degenerate": 2},
    # 3 consecutive settings per exact row (both chunks, every budget), 1 per kvpr and degenerate row
    "gemma3": {"exact": 3, "kvpr": 1, "degenerate": 1},
}


def generate(tmp, mdl, chunk, extra, tag, prompt):
    """The generated tokens and a 64-bit hash (XXH3) per evaluated position: of the output-normed
    hidden state at every prompt position (the output projection's input, a row-wise product: equal
    states give equal logits, SyntheticForward.StatesGiveTheLogitsBitForBit) and of the logits at each
    decode step (`run --state-digest`). Equal hashes are equal bits. (The logits themselves are ~1 GB
    per run on Gemma-3; hashing them at every prompt position cost 2.5x the run's prefill.)"""
    p = run("run", "-m", mdl, "-p", prompt, "-n", N_GEN, "--chunk", chunk, "--ctx", 1024, "-t", 2,
            "--ignore-eos", "--json", "--state-digest", *extra)
    j = json.loads(p.stdout)
    assert len(j["state_digest"]) == j["n_prompt"] and len(j["logits_digest"]) == N_GEN - 1
    return j["tokens"], j["state_digest"] + j["logits_digest"]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def smallest_kv_mem(mdl, chunk, extra):
    """The engine's own answer to 'how much compute memory does this placement need': run with a
    budget of 1 byte and read the needed bytes from the error."""
    p = run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", chunk, "--ctx", 1024, "--kv-mem", 1, *extra,
            check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


@functools.lru_cache(maxsize=None)
def exact_values(axis):
    """The exact values of one policy axis, as the engine itself lists them."""
    j = json.loads(run("policies", "--json").stdout)
    vals = [v["value"] for v in j["axes"] if v["axis"] == axis and v["exact"]]
    assert vals, axis
    return vals


# Approximate axis values with knobs under which they drop nothing, so that they must be bit-identical
# to the same placement without them (the degenerate cases). Every approximate value the engine lists
# needs an entry (test_every_approximate_value_has_a_degenerate_row).
# value -> (knobs, the placements it runs on; None: every exact placement)
SKEW = "@SKEW@"  # replaced by the model's skew file (skew_for)
DEGENERATE = {
    "streaming": (["--sinks", "4", "--window", "1024"], None),  # the window covers --ctx
    "h2o": (["--kv-budget", "1024"], ["resident"]),  # the budget covers --ctx
    "quest": (["--kv-budget", "1024"], None),  # every page selected (offloaded: every row loaded as without it)
    "kivi4": (["--kivi-residual", "1024"], None),  # the residual window covers --ctx: nothing quantised
    "kivi2": (["--kivi-residual", "1024"], None),
    # every row above the threshold and no cap: each decode step still speculates and loads the chosen
    # rows one by one (selective loads), then attends them as the placement does; SKEW: the model's skew
    # file, made per model by check_model
    "infinigen": (["--infinigen-alpha", "inf", "--infinigen-budget", "1", "--skew", SKEW], ["layer", "headinfer"]),
    # the budget covers --ctx: nothing is evicted, whatever the (untrained) heads score
    "locret": (["--kv-budget", "1024", "--locret-heads", "{locret_heads}"], None),
    # infinigen's pool (with infinigen's degenerate knobs), its limit covering --ctx: nothing is bounded.
    # A bounded pool that holds the whole run is checked against infinigen in cli.infinigen_pool.
    "pool": (["--infinigen-alpha", "inf", "--infinigen-budget", "1", "--skew", SKEW, "--kv-pool-limit", "1GiB"],
             ["layer", "headinfer"]),
}
# Values that run only with another axis' value: the spec names both (placement+that+value).
NEEDS = {"pool": "infinigen"}


def with_model_files(cfg, mdl, tmp):
    """Fills in the per-model files a row names: {locret_heads} is untrained heads for this model,
    SKEW its infinigen skew file."""
    if SKEW in cfg:
        cfg = [skew_for(tmp, mdl) if c == SKEW else c for c in cfg]
    if "{locret_heads}" not in cfg:
        return cfg
    heads = tmp / f"{mdl.stem}.locret.gguf"
    if not heads.exists():
        run("train-locret", "-m", mdl, "-o", heads, "--steps", 0, "--d-m", 16)
    return [str(heads) if c == "{locret_heads}" else c for c in cfg]


@functools.lru_cache(maxsize=None)
def approximate_values():
    j = json.loads(run("policies", "--json").stdout)
    return tuple(v["value"] for v in j["axes"] if not v["exact"])


def degenerate_configs(n_kv_heads):
    """Each approximate value in its degenerate setting on every exact placement."""
    out = []
    for value in approximate_values():
        knobs, placements = DEGENERATE[value]
        for placement in placements or exact_values("placement"):
            spec = f"{placement}+{NEEDS[value]}+{value}" if value in NEEDS else f"{placement}+{value}"
            flags = ["--kv-policy", spec, *knobs]
            if placement == "headinfer":
                flags += ["--group", "1"]
            out.append((flags, placement != "resident"))
    # KIVI composed with kvpr's recomputed prefix (issue 18): with the residual window covering --ctx
    # nothing is quantised, so the split (which counts quantised rows only) recomputes nothing and the
    # rest streams as f16 K/V: the same bits as resident, on both offloaded placements.
    for bits in ("kivi4", "kivi2"):
        if bits in approximate_values():
            out.append((["--kv-policy", f"layer+{bits}+kvpr", "--kivi-residual", "1024", "--recompute", "random"],
                        True))
            out.append((["--kv-policy", f"headinfer+{bits}+kvpr", "--group", "1", "--kivi-residual", "1024",
                         "--recompute", "300"], True))
    # locret without pre-RoPE copies (--locret-keys rerotate): with nothing evicted no key moves, so
    # the keys are the forward's own (test_locret_offloaded.py checks the mode through evictions).
    if "locret" in approximate_values():
        out.append((["--kv-policy", "locret", *DEGENERATE["locret"][0], "--locret-keys", "rerotate"], False))
        # kept rows at their true positions (--locret-positions original): nothing is evicted or
        # re-rotated, and the pass's positions are the true ones, as under resident.
        out.append((["--kv-policy", "locret", *DEGENERATE["locret"][0], "--locret-positions", "original"],
                    False))
        # whole words kept or evicted (--locret-span word): the rows carry their links, nothing is evicted
        out.append((["--kv-policy", "locret", *DEGENERATE["locret"][0], "--locret-span", "word"], False))
    return out


def configs(n_kv_heads):
    """(flags, offloaded) of every exact combination of placement and retention (the representation is
    the reference's own: f16), with headinfer's group sizes, static heads and prefetch depth."""
    out = []
    for retention in exact_values("retention"):
        suffix = "" if retention == "none" else "+" + retention
        for placement in exact_values("placement"):
            spec = placement + suffix
            if placement == "resident":
                if suffix:  # resident itself is the reference
                    out.append((["--kv-policy", spec], False))
            elif placement == "headinfer":
                groups = [g for g in sorted({n_kv_heads, 4, 2, 1}, reverse=True)
                          if g <= n_kv_heads and n_kv_heads % g == 0]
                if suffix:
                    groups = groups[-1:]
                for g in groups:
                    out.append((["--kv-policy", spec, "--group", str(g)], True))
                out.append((["--kv-policy", spec, "--group", "1", "--static-heads", "2", "--prefetch-depth", "2"],
                            True))
            else:
                out.append((["--kv-policy", spec], True))
    return out + kvpr_configs(n_kv_heads) + hybrid_configs() + degenerate_configs(n_kv_heads)


def kvpr_configs(n_kv_heads):
    """kvpr (exact): forced splits of none, a prefix inside the first block, a prefix that crosses
    a block boundary on the longer prompts (300 > 256-token blocks) and all positions; on layer and on
    headinfer (one head per unit, and with a static head), and with sliding retention (Gemma-3's
    sliding layers free their first blocks: the split counts from the first visible row); and a
    pseudo-random split on every visit (`--recompute random`)."""
    assert "kvpr" in exact_values("representation")
    out = [(["--kv-policy", "layer+kvpr", "--recompute", str(n)], True) for n in (0, 100, 300, 1000000)]
    out.append((["--kv-policy", "headinfer+kvpr", "--group", "1", "--recompute", "300"], True))
    out.append((["--kv-policy", "layer+kvpr", "--recompute", "random"], True))
    out.append((["--kv-policy", "headinfer+kvpr", "--group", "1", "--recompute", "random"], True))
    if n_kv_heads > 1:
        out.append((["--kv-policy", "headinfer+kvpr", "--group", "1", "--static-heads", "1", "--recompute", "77"],
                    True))
    out.append((["--kv-policy", "layer+kvpr+sliding", "--recompute", "1000000"], True))
    return out


def hybrid_configs():
    """hybridserve (exact): the hybrid cache with forced ACT:KV block ratios 0 (all KV), 0.5 (KV, ACT,
    KV, KV, ...), 1 (ACT, KV, ...) and auto (Algorithm 1 from the profiled rates). Run like kvpr's rows:
    one chunk size, unlimited and smallest budget with the home on disk."""
    assert "hybrid" in exact_values("representation")
    return [(["--kv-policy", "hybridserve", "--act-ratio", r], True) for r in ("0", "0.5", "1", "auto")]


@pytest.fixture(scope="module")
def synthetic_mha(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "mha.gguf"
    run("synth", "--preset", "tiny-mha", "--type", "q8_0", "-o", path)
    return path


def skew_for(tmp_path, mdl):
    """The model's skew file for infinigen (a short sample: the degenerate rows select every row anyway)."""
    path = tmp_path / f"{mdl.stem}.skew.gguf"
    if not path.exists():
        run("skew", "-m", mdl, "-o", path, "--tokens", 96, "-t", 2)
    return str(path)


def smallest_weights_mem(mdl, chunk, extra=()):
    """The engine's own answer to 'how little weight memory can this model stream through': the
    weights outside the layers and two staging slots (no layer resident)."""
    p = run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", chunk, "--ctx", 1024, "--weights-mem", 1, *extra,
            check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed at least", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


def weight_rows(mdl, chunk):
    """Weight streaming (HybridServe's weight placement, --weights-mem): all weights in budget, about
    half the layers resident, and only the two staging slots (every layer streamed), from host memory
    and from the GGUF file (O_DIRECT). One chunk size (CI time)."""
    j = json.loads(run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", chunk, "--ctx", 1024, "--json").stdout)
    everything = j["weights"]["resident_bytes"]
    two = smallest_weights_mem(mdl, chunk)
    two_file = smallest_weights_mem(mdl, chunk, ["--weights-from", "file"])
    half = (everything + two) // 2
    return [
        ["--weights-mem", str(everything)],
        ["--weights-mem", str(half), "--weights-from", "file"],
        ["--weights-mem", str(two)],
        ["--weights-mem", str(two_file), "--weights-from", "file"],
    ]


def row_kind(flags, n_kv_heads):
    if flags in [f for f, _ in degenerate_configs(n_kv_heads)]:
        return "degenerate"
    return "kvpr" if "kvpr" in flags[1] or flags[1] == "hybridserve" else "exact"


def allowed_settings(flags, offloaded):
    """The (chunk, budget) settings a row can run, in SETTINGS order."""
    out = []
    for chunk, budget in SETTINGS:
        if not offloaded and budget != "unlimited":
            continue  # resident rows have no budget to shrink
        # kvpr's many splits run at one chunk size, unlimited and smallest-on-disk (CI time);
        # infinigen's rows (its prefill is the placement's own) also run at one chunk size (CI time)
        kvpr = "kvpr" in flags[1] or flags[1] == "hybridserve"
        if (kvpr or "infinigen" in flags[1]) and chunk != CHUNKS[-1]:
            continue
        if kvpr and budget == "smallest":
            continue
        out.append((chunk, budget))
    return out


def sweep_plan(n_kv_heads, sweep):
    """[(flags, offloaded, [(chunk, budget), ...])] for every row of configs(): the k-th row of a kind
    with n settings runs its allowed settings k*n .. k*n+n-1 (wrapping), so the rows of a kind share
    out the settings deterministically and together run every one (test_sweep_plans_cover_every_setting)."""
    index = {}
    out = []
    for flags, offloaded in configs(n_kv_heads):
        kind = row_kind(flags, n_kv_heads)
        k = index[kind] = index.get(kind, -1) + 1
        out.append((flags, offloaded, pick(allowed_settings(flags, offloaded), k, sweep[kind])))
    return out


def pick(allowed, k, n):
    """n of the allowed settings for the k-th row of its kind: allowed[k*n .. k*n+n-1], wrapping (None: all)."""
    if n is None or n >= len(allowed):
        return list(allowed)
    return [allowed[(k * n + j) % len(allowed)] for j in range(n)]


def check_model(tmp_path, mdl, n_kv_heads, prompt=PROMPT, weights=False, sweep=FULL_SWEEP):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    n_checked = 0
    refs = {}
    for chunk in CHUNKS:
        refs[chunk] = generate(tmp_path, mdl, chunk, ["--kv-policy", "resident"], f"res{chunk}", prompt)
        assert len(refs[chunk][1]) > 2 * chunk  # logits at every position of a prompt of several chunks
    for named, offloaded, settings in sweep_plan(n_kv_heads, sweep):
        cfg = with_model_files(named, mdl, tmp_path)
        for chunk, budget in settings:
            ref_tokens, ref_logits = refs[chunk]
            extra = []
            if budget != "unlimited":
                extra = ["--kv-mem", str(smallest_kv_mem(mdl, chunk, cfg))]
                if budget == "smallest+disk":
                    extra += ["--kv-disk", str(disk)]
            tag = f"{'_'.join(named)}_{budget}_{chunk}".replace("-", "").replace("@", "")
            tokens, logits = generate(tmp_path, mdl, chunk, cfg + extra, tag, prompt)
            what = f"{mdl.name} chunk={chunk} {' '.join(cfg)} budget={budget}"
            assert tokens == ref_tokens, what
            assert logits == ref_logits, f"{what}: logits differ from position {first_difference(logits, ref_logits)}"
            n_checked += 1
    if weights:
        chunk = CHUNKS[-1]
        ref_tokens, ref_logits = refs[chunk]
        for extra in weight_rows(mdl, chunk):
            tag = "w_" + "_".join(extra).replace("-", "")
            tokens, logits = generate(tmp_path, mdl, chunk, extra, tag, prompt)
            what = f"{mdl.name} chunk={chunk} {' '.join(extra)}"
            assert tokens == ref_tokens, what
            assert logits == ref_logits, f"{what}: logits differ from position {first_difference(logits, ref_logits)}"
            n_checked += 1
    assert list(disk.iterdir()) == [], "the disk tier left files behind"
    return n_checked


def test_smollm2(tmp_path):
    assert check_model(tmp_path, model("smollm2"), 3, weights=True, sweep=SWEEP["smollm2"]) >= 2 * 4 * 3 + 4


def test_gemma3(tmp_path):
    # Longer than the 512-token window of the sliding layers: +sliding frees blocks.
    assert check_model(tmp_path, model("gemma3"), 1, PROMPT * 4, weights=True, sweep=SWEEP["gemma3"]) >= 2 * 3 * 3 + 4


def test_matrix_covers_every_exact_axis_value():
    specs = {c[1] for c, _ in configs(3)}
    for p in exact_values("placement"):
        for r in exact_values("retention"):
            spec = p if r == "none" else f"{p}+{r}"
            assert spec in specs or spec == "resident", spec


def test_sweep_plans_cover_every_setting():
    """The subsets of SWEEP stay honest: every row runs; the rows of each kind together run every setting
    their rows can run; an exact row runs both chunk sizes and every budget it can run."""
    for name, n_kv_heads in (("smollm2", 3), ("gemma3", 1)):
        plan = sweep_plan(n_kv_heads, SWEEP[name])
        for kind in ("exact", "kvpr", "degenerate"):
            rows = [(f, o, s) for f, o, s in plan if row_kind(f, n_kv_heads) == kind]
            assert rows, (name, kind)
            run_ = {x for _, _, s in rows for x in s}
            can = {x for f, o, _ in rows for x in allowed_settings(f, o)}
            assert run_ == can, (name, kind, can - run_)
            for f, o, s in rows:
                assert s, (name, f)
                if kind == "exact":
                    allowed = allowed_settings(f, o)
                    assert {c for c, _ in s} == {c for c, _ in allowed}, (name, f, s)
                    assert {b for _, b in s} == {b for _, b in allowed}, (name, f, s)


def test_every_approximate_value_has_a_degenerate_row():
    missing = [v for v in approximate_values() if v not in DEGENERATE]
    assert not missing, f"approximate values without a degenerate (bit-identical) setting: {missing}"


def test_sliding_retention_holds_less_kv_on_gemma3(tmp_path):
    """Gemma-3's local layers (5 of every 6) keep window + chunk positions instead of the context."""
    prompt = PROMPT * 4
    def peak(policy, *extra):
        p = run("run", "-m", model("gemma3"), "-p", prompt, "-n", 2, "--chunk", 96, "--ctx", 8192, "-t", 2,
                "--ignore-eos", "--json", "--kv-policy", policy, *extra)
        return json.loads(p.stdout)
    # At --ctx 8192 (32 blocks of 256), the 3 global layers keep 32 blocks, the 15 local ones
    # ceil((511 + 95) / 256) + 1 = 4: (3 * 32 + 15 * 4) / (18 * 32) = 0.27 of the KV.
    full, slid = peak("resident"), peak("resident+sliding")
    assert slid["tokens"] == full["tokens"]
    assert slid["peak_memory_bytes"]["device"]["kv"] < 0.3 * full["peak_memory_bytes"]["device"]["kv"]
    assert slid["kv"]["policy"] == "resident+sliding"
    full, slid = peak("layer", "--kv-disk", str(tmp_path)), peak("layer+sliding", "--kv-disk", str(tmp_path))
    assert slid["tokens"] == full["tokens"]
    assert slid["peak_memory_bytes"]["disk"]["kv"] < 0.3 * full["peak_memory_bytes"]["disk"]["kv"]
    assert slid["kv"]["bytes_loaded"] < full["kv"]["bytes_loaded"]


def test_kivi_with_a_short_residual_window_is_approximate(tmp_path):
    """The degenerate KIVI rows above can fail: a residual window shorter than the prompt changes the
    logits (and the offloaded placement still gives the resident placement's bits)."""
    mdl = model("smollm2")
    _, ref = generate(tmp_path, mdl, 37, ["--kv-policy", "resident"], "ref", PROMPT)
    knobs = ["--kivi-residual", "32"]
    _, res = generate(tmp_path, mdl, 37, ["--kv-policy", "resident+kivi4", *knobs], "k4", PROMPT)
    _, lay = generate(tmp_path, mdl, 37, ["--kv-policy", "layer+kivi4", "--kv-disk", str(tmp_path), *knobs],
                      "k4l", PROMPT)
    assert res != ref
    assert lay == res


def test_synthetic_mha(tmp_path, synthetic_mha):
    # Byte-level vocabulary: one token per byte, so a shorter text spans the same chunks.
    assert check_model(tmp_path, synthetic_mha, 4, PROMPT[:400]) >= 2 * 5 * 3


@pytest.fixture(scope="module")
def synthetic_opt(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "opt.gguf"
    run("synth", "--preset", "tiny-opt", "--type", "q8_0", "-o", path)
    return path


def test_synthetic_opt(tmp_path, synthetic_opt):
    assert check_model(tmp_path, synthetic_opt, 4, PROMPT[:400]) >= 2 * 5 * 3


def test_budget_errors(tmp_path):
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--ctx", 1024, "--kv-mem", "1MiB", check=False)
    assert p.returncode == 1
    assert "--kv-policy layer or headinfer" in p.stderr and "bytes" in p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--kv-disk", tmp_path, check=False)
    assert p.returncode == 1 and "offloaded policies" in p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--kv-policy", "headinfer", "--kv-disk",
            tmp_path / "missing", check=False)
    assert p.returncode == 1 and "not a directory" in p.stderr
