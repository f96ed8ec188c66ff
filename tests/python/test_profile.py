"""kvtier profile (KVPR's profiler) end to end: the cache file is written, reused, keyed (a throttled
link is another key), a corrupt file is a clear error that --force repairs, --no-cache touches no file,
and the link throttle holds the measured bandwidth under its cap."""
import json
import os
import subprocess

from kvtier_testlib import kvtier_bin, model, run, run_json


def profile(tmp_path, *extra):
    return run_json("profile", "-m", model("smollm2"), "-t", "1", "--json",
                    "--profile-cache", tmp_path / "cache" / "profile.json", *extra)


def test_cache_is_written_then_reused(tmp_path):
    first = profile(tmp_path)
    assert first["from_cache"] is False
    cache = json.loads((tmp_path / "cache" / "profile.json").read_text())
    assert cache["format"] == "kvtier-profile-cache" and len(cache["entries"]) == 1
    second = profile(tmp_path)
    assert second["from_cache"] is True
    assert second["profile"] == first["profile"]
    p = first["profile"]
    assert p["host"]["bytes_per_s"] > 0 and p["projection"]["flops_per_s"] > 0
    assert p["decode_weights_s"] > 0  # the decode weight pass (the first decode steps' other compute)
    # SmolLM2: 3 KV heads x 64 x (K+V) x f16, and Q4_1 wk/wv take Q8_32 rows of 576 (18 x 40 bytes).
    assert p["per_token"]["kv_bytes"] == 768 and p["per_token"]["x_bytes"] == 720
    split = first["split"]["host"]
    assert 0 <= split["l"] <= split["s_prime"] == 4096
    assert split["t_s"] <= split["t_no_recompute_s"]


def test_throttled_link_is_another_key_and_respects_the_cap(tmp_path):
    profile(tmp_path)
    throttled = profile(tmp_path, "--link-gbps", "0.2")
    assert throttled["from_cache"] is False
    assert throttled["profile"]["key"]["link_bytes_per_s"] == 0.2e9
    # Only the cap is held (a busy machine can make copies slower, never faster).
    assert throttled["profile"]["host"]["bytes_per_s"] <= 0.2e9 * 1.1
    cache = json.loads((tmp_path / "cache" / "profile.json").read_text())
    assert len(cache["entries"]) == 2


def test_corrupt_cache_is_a_clear_error_and_force_repairs_it(tmp_path):
    path = tmp_path / "cache" / "profile.json"
    path.parent.mkdir()
    path.write_text("{not json")
    proc = run("profile", "-m", model("smollm2"), "-t", "1", "--profile-cache", path, check=False)
    assert proc.returncode == 1
    assert str(path) in proc.stderr and "not valid JSON" in proc.stderr and "--force" in proc.stderr
    assert path.read_text() == "{not json"
    assert profile(tmp_path, "--force")["from_cache"] is False
    assert profile(tmp_path)["from_cache"] is True


def test_no_cache_and_the_environment(tmp_path):
    proc = run("profile", "-m", model("smollm2"), "-t", "1", "--no-cache", "--json",
               env={**os.environ, "KVTIER_PROFILE_CACHE": str(tmp_path / "env.json")})
    assert json.loads(proc.stdout)["from_cache"] is False
    assert not (tmp_path / "env.json").exists()
    run("profile", "-m", model("smollm2"), "-t", "1",
        env={**os.environ, "KVTIER_PROFILE_CACHE": str(tmp_path / "env.json")})
    assert (tmp_path / "env.json").exists()


def test_help_says_the_throttle_is_a_measurement_aid():
    out = subprocess.run([kvtier_bin(), "profile", "--help"], capture_output=True, text=True).stdout
    assert "--link-gbps" in out and "measurement aid" in out
