"""`kvtier policies`: the presets, axes and values it lists are the ones --kv-policy accepts, with
their exactness; --check explains a spec; bad specs are clear errors everywhere a policy is taken."""
import json

from kvtier_testlib import model, run


def listing():
    return json.loads(run("policies", "--json").stdout)


def test_lists_every_axis_value_and_preset():
    j = listing()
    axes = {}
    for v in j["axes"]:
        axes.setdefault(v["axis"], []).append(v["value"])
        assert v["help"], v
    exact = {"placement": ["resident", "layer", "headinfer"], "representation": ["f16", "f32", "kvpr", "hybrid"],
             "selection": ["all"], "retention": ["none", "sliding"]}
    assert set(axes) == set(exact)
    for axis, vals in exact.items():
        assert axes[axis][:len(vals)] == vals, axes
    # The approximate baselines come after the exact values, each with the flags that tune it.
    for v in j["axes"]:
        if v["value"] not in exact[v["axis"]]:
            assert not v["exact"] and v["flags"].startswith("--"), v
    assert "streaming" in axes["retention"] and "kivi4" in axes["representation"]
    assert [p["name"] for p in j["presets"]] == ["resident", "layer", "headinfer", "kvpr", "hybridserve", "infinigen", "locret"]
    text = run("policies").stdout
    for v in j["axes"]:
        assert v["value"] in text and v["help"][:40] in text


def test_every_listed_value_is_accepted_by_check_and_exactness_agrees():
    j = listing()
    for v in j["axes"]:
        c = json.loads(run("policies", "--check", v["value"], "--json").stdout)
        assert c[v["axis"]] == v["value"]
        assert c["exact"] == v["exact"]
    c = json.loads(run("policies", "--check", "sliding+headinfer", "--json").stdout)
    assert c == {"spec": "headinfer+sliding", "placement": "headinfer", "representation": "f16",
                 "selection": "all", "retention": "sliding", "exact": True}


def test_bad_specs_are_clear_errors():
    for spec, words in (("layer+headinfer", "two placement values"), ("layer+lru", "unknown KV policy value 'lru'"),
                        ("layer++sliding", "empty part")):
        p = run("policies", "--check", spec, check=False)
        assert p.returncode == 1 and words in p.stderr, (spec, p.stderr)
        p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", spec, check=False)
        assert p.returncode == 1 and words in p.stderr, (spec, p.stderr)
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "layer+f32", "--kv-type", "f16",
            check=False)
    assert p.returncode == 1 and "different representations" in p.stderr
    p = run("bench", "-m", model("smollm2"), "--kv-policy", "layer,none+layer", "--prompt-tokens", 8,
            check=False)
    assert p.returncode == 1 and "listed twice" in p.stderr, p.stderr


def test_kvpr_combinations_that_cannot_work_are_clear_errors(tmp_path):
    m = model("smollm2")
    for spec, extra, words in (("resident+kvpr", [], "not resident+kvpr"),
                               ("layer+kvpr+streaming", ["--window", "64"], "retention none or sliding"),
                               ("kvpr", ["--recompute", "-5"], "--recompute -5"),
                               ("kvpr", ["--recompute", "some"], "--recompute")):
        p = run("run", "-m", m, "-p", "x", "-n", 1, "--kv-policy", spec, *extra, check=False)
        assert p.returncode != 0 and words in p.stderr, (spec, p.stderr)
        assert "terminate" not in p.stderr and "Assertion" not in p.stderr
    # auto and a number are accepted; the split shows in --json; auto profiles the link and the
    # projection once and caches the result where --profile-cache says
    cache = tmp_path / "profile.json"
    for r in ("auto", "7"):
        p = run("run", "-m", m, "-p", "one two three four five six seven eight nine ten", "-n", 2, "--kv-policy",
                "kvpr", "--recompute", r, "--profile-cache", cache, "--json")
        kv = json.loads(p.stdout)["kv"]
        if r == "auto":
            assert 0 <= kv["split"] <= 12 and cache.exists(), kv
        else:
            assert kv["split"] == 7, kv
