"""--backend and --device-mem: clear errors wherever the CUDA path cannot run (a build without CUDA,
a machine without a GPU, a command that has no CUDA path yet), and the CPU path unchanged."""
from kvtier_testlib import model, run, run_json
from kvtier_testlib import test_isa as forced_isa  # (an alias: pytest would collect test_isa)


def has_gpu() -> bool:
    p = run("bench", "-m", "synthetic:tiny-llama", "--backend", "cuda", "--prompt-tokens", "8", "--gen", "1",
            "--repeat", "1", "--device-mem", "256MiB", check=False)
    return p.returncode == 0


def test_cuda_backend_without_a_usable_gpu_is_a_clear_error():
    if has_gpu():
        return  # a GPU machine: the GPU tests cover the CUDA path
    p = run("run", "-m", model("smollm2"), "--backend", "cuda", "-p", "hi", "-n", "2", check=False)
    assert p.returncode == 1
    msg = p.stderr
    assert "--backend cuda" in msg and ("no CUDA device" in msg or "built without the CUDA backend" in msg), msg


def test_unknown_backend_is_a_usage_error():
    p = run("run", "-m", model("smollm2"), "--backend", "tpu", "-p", "hi", check=False)
    assert p.returncode == 2
    assert "--backend" in p.stderr


def test_device_mem_needs_the_cuda_backend():
    p = run("run", "-m", model("smollm2"), "--device-mem", "1GiB", "-p", "hi", "-n", "2", check=False)
    assert p.returncode == 1
    assert "--device-mem applies to --backend cuda only" in p.stderr


def test_kv_gather_needs_the_cuda_backend_and_a_known_kernel():
    p = run("run", "-m", model("smollm2"), "--kv-gather", "flat", "-p", "hi", "-n", "2", check=False)
    assert p.returncode == 1
    assert "--kv-gather applies to --backend cuda only" in p.stderr
    p = run("run", "-m", model("smollm2"), "--backend", "cuda", "--kv-gather", "zigzag", "-p", "hi", check=False)
    assert p.returncode == 2
    assert "--kv-gather" in p.stderr


def test_cuda_infinigen_refuses_what_it_cannot_run():
    # Checked before any device is touched: the policy a CUDA run cannot serve is named.
    for spec, needle in (("headinfer+infinigen", "layer placement"), ("h2o", "needs the CPU backend")):
        p = run("bench", "-m", "synthetic:tiny-llama", "--backend", "cuda", "--kv-policy", spec, "--kv-budget", "64",
                "--prompt-tokens", "8", "--gen", "1", "--repeat", "1", check=False)
        assert p.returncode != 0
        assert needle in p.stderr or "built without the CUDA backend" in p.stderr, p.stderr


def test_commands_without_a_cuda_path_say_so(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello again")
    p = run("perplexity", "-m", model("smollm2"), "--backend", "cuda", "-f", text, check=False)
    assert p.returncode != 0
    assert "--backend cuda" in p.stderr


def test_cpu_backend_is_the_default_and_unchanged():
    a = run("run", "-m", model("smollm2"), "-p", "Hello", "-n", "4", "--temp", "0", "--json")
    b = run("run", "-m", model("smollm2"), "-p", "Hello", "-n", "4", "--temp", "0", "--json", "--backend", "cpu")
    assert a.stdout.split('"tokens":')[1].split("]")[0] == b.stdout.split('"tokens":')[1].split("]")[0]


def test_layer_lanes_bytes_where_rows_stay_and_change_no_token():
    """The vector paths' rows-in-lanes copies of the layers' matrices (README `--no-layer-lanes`): the
    same tokens and logits digest either way; where the copy stands beside GGUF rows that prefill still
    reads (the AVX2 path, AVX-512 with AMX), its bytes show as device weights in `run --json` and in
    `kvtier plan`'s prediction; where it replaces them (AVX-512 without AMX: its lanes kernels serve
    prefill too, and the rows' pages are handed back) the device weights are the same either way;
    --no-layer-lanes or --weights-mem leave the copies out."""
    args = ["-m", model("gemma3"), "-p", "The printing press", "-n", "6", "--ctx", "256", "--json"]
    with_lanes = run_json("run", *args, "--logits-digest")
    without = run_json("run", *args, "--logits-digest", "--no-layer-lanes")
    assert with_lanes["tokens"] == without["tokens"]
    assert with_lanes["logits_digest"] == without["logits_digest"]
    w_with = with_lanes["peak_memory_bytes"]["device"]["weights"]
    w_without = without["peak_memory_bytes"]["device"]["weights"]
    copies_replace_rows = with_lanes["isa"] == "avx512" and not with_lanes["amx"]
    if with_lanes["output_lanes"] and not copies_replace_rows:  # AVX2, or AVX-512 with AMX
        assert w_with > w_without, (w_with, w_without)
    else:
        assert w_with == w_without, (w_with, w_without)
    isa = ["--isa", forced_isa()] if forced_isa() else []  # plan predicts for the path run took
    plan = run_json("plan", "-m", model("gemma3"), "--ctx", "256", "--json", *isa)
    assert plan["engine"]["policies"][0]["memory"]["device"]["weights"] == w_with
    plan = run_json("plan", "-m", model("gemma3"), "--ctx", "256", "--json", "--no-layer-lanes", *isa)
    assert plan["engine"]["policies"][0]["memory"]["device"]["weights"] == w_without


def cpu_has_avx512_kernels():
    """Whether /proc/cpuinfo lists every feature kvtier's AVX-512 path needs (read apart from kvtier)."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return all(x in flags for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"))


def test_avx2_and_avx512_paths_give_the_same_logits_on_the_default_models():
    """Every weight type of both default models (q4_1, q5_0, q4_K, q6_K, q8_0) and their attention
    compute the same integers and float chains on the AVX2 and the AVX-512 path (with or without AMX
    tiles), so a conversation moved between machines gets the same logits bit for bit (docs/benchmarks.md,
    "AVX-512 q8_0 on one float chain per output"). An AVX2-only machine runs only one of the paths."""
    import json
    import pytest
    for name in ("smollm2", "gemma3"):
        args = ["run", "-m", model(name), "-p", "The printing press changed", "-n", "6", "--ctx", "256", "--json",
                "--logits-digest"]
        p = run(*args, "--isa", "avx512", check=False)
        if not cpu_has_avx512_kernels():
            assert p.returncode != 0 and "does not support the avx512 kernels" in p.stderr, p.stderr
            assert "the widest path here is avx2" in p.stderr, p.stderr
            pytest.skip("this CPU has no AVX-512 VNNI: only the AVX2 path runs here")
        assert p.returncode == 0, p.stderr
        avx512 = json.loads(p.stdout)
        avx2 = run_json(*args, "--isa", "avx2")
        assert avx2["isa"] == "avx2" and avx512["isa"] == "avx512"
        assert avx2["tokens"] == avx512["tokens"], name
        assert avx2["logits_digest"] == avx512["logits_digest"], name
