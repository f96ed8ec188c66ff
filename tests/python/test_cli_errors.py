"""Bad input to the CLI gets a clear message and a non-zero exit, never a crash or a stray file."""
import os
import signal
import subprocess
import time

from kvtier_testlib import kvtier_bin, model, run, with_isa


def test_no_subcommand_is_a_usage_error():
    p = run(check=False)
    assert p.returncode == 2
    assert "subcommand" in (p.stderr + p.stdout).lower()


def test_help_tells_every_subcommand():
    p = run("--help")
    for cmd in ("inspect", "synth"):
        assert cmd in p.stdout


def test_unknown_flag():
    p = run("inspect", "--bogus", model("smollm2"), check=False)
    assert p.returncode == 2
    assert "--bogus" in p.stderr


def test_inspect_missing_file(tmp_path):
    p = run("inspect", tmp_path / "nope.gguf", check=False)
    assert p.returncode == 1
    assert "nope.gguf" in p.stderr and "cannot open" in p.stderr


def test_inspect_directory(tmp_path):
    p = run("inspect", tmp_path, check=False)
    assert p.returncode == 1 and "not a regular file" in p.stderr


def test_inspect_truncated_and_garbage_files(tmp_path):
    src = model("smollm2").read_bytes()[:100000]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src)
    p = run("inspect", cut, check=False)
    assert p.returncode == 1
    assert "cut.gguf: at byte" in p.stderr and ("file ends" in p.stderr or "does not fit" in p.stderr)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    p = run("inspect", junk, check=False)
    assert p.returncode == 1 and "not a GGUF file" in p.stderr
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    p = run("inspect", empty, check=False)
    assert p.returncode == 1 and "file ends while reading magic" in p.stderr


def test_synth_bad_arguments(tmp_path):
    p = run("synth", "--preset", "gpt-17", "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 1 and "unknown preset 'gpt-17'" in p.stderr and "llama3-8b" in p.stderr
    p = run("synth", "--preset", "tiny-llama", "--type", "q4_K", "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 1 and "q4_K" in p.stderr
    p = run("synth", "--preset", "tiny-llama", "--type", "q9_9", "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 1 and "unknown type" in p.stderr
    p = run("synth", "--preset", "tiny-llama", "--layers", "0", "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 2
    p = run("synth", "--preset", "tiny-llama", "-o", tmp_path / "no" / "dir" / "x.gguf", check=False)
    assert p.returncode == 1 and "cannot create" in p.stderr
    assert os.listdir(tmp_path) == []


def test_synth_list_and_layers(tmp_path):
    p = run("synth", "--list")
    for name in ("tiny-llama", "tiny-mha", "smollm2-135m", "llama3-8b", "llama2-7b", "qwen2-7b", "mistral-7b"):
        assert name in p.stdout
    out = tmp_path / "s.gguf"
    run("synth", "--preset", "smollm2-135m", "--layers", "3", "--ctx", "100000", "--type", "q4_1", "-o", out)
    info = run("inspect", "--json", out).stdout
    import json
    j = json.loads(info)
    assert j["hparams"]["n_layer"] == 3 and j["hparams"]["n_ctx_train"] == 100000
    assert set(j["tensor_types"]) == {"f32", "q4_1"}


def test_counts_out_of_range_say_what_they_want():
    cases = [(["bench", "--gen", "0"], "--gen: must be greater than 0, not 0"),
             (["bench", "--repeat", "0"], "--repeat: must be greater than 0, not 0"),
             (["run", "-p", "hi", "-n", "-1"], "--n-predict: must be 0 or more, not -1"),
             (["run", "-p", "hi", "--ctx", "-5"], "--ctx: must be 0 or more, not -5"),
             (["run", "-p", "hi", "-t", "two"], "--threads: 'two' is not a number")]
    for args, want in cases:
        p = run(args[0], "-m", model("smollm2"), *args[1:], check=False)
        assert p.returncode == 2
        assert want in p.stderr, p.stderr
        assert "179769" not in p.stderr  # not CLI11's "not in range 0.000000 to 1.797...e308"


def _stops_on_ctrl_c(args):
    """Starts kvtier with args, sends SIGINT after 3 s and returns (exit code, seconds from the signal to the
    exit, stderr). Long work stops between its
    passes, so the exit comes within seconds, not at the end of the work."""
    proc = subprocess.Popen([kvtier_bin(), *with_isa(args)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    time.sleep(3)
    assert proc.poll() is None, "the command ended before the signal: give it longer work"
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"kvtier {args[0]} still running 30 s after Ctrl-C")
    return proc.returncode, time.monotonic() - t0, err


def test_bench_stops_on_ctrl_c_within_a_long_prompt():
    # 8000 prompt tokens in passes of 64 on one thread: about a minute of prefill, a pass well under a second.
    code, waited, err = _stops_on_ctrl_c(["bench", "-m", model("smollm2"), "--prompt-tokens", "8000", "--gen", "4",
                                          "--repeat", "1", "--warmup", "0", "--chunk", "64", "-t", "1"])
    assert code == 130 and "interrupted" in err, err
    assert waited < 20


def test_perplexity_stops_on_ctrl_c_between_windows(tmp_path):
    text = tmp_path / "long.txt"
    text.write_text(" ".join(f"word{i % 977} and the next sentence follows." for i in range(10000)))
    code, waited, err = _stops_on_ctrl_c(["perplexity", "-m", model("smollm2"), "-f", text, "--ctx", "256",
                                          "-t", "1"])
    assert code == 130 and "interrupted" in err, err
    assert waited < 20


def test_a_directory_as_a_text_file_is_named(tmp_path):
    for args in (["run", "-m", model("smollm2"), "-f", tmp_path, "-n", "2"],
                 ["perplexity", "-m", model("smollm2"), "-f", tmp_path],
                 ["tokenize", "-m", model("smollm2"), "-f", tmp_path]):
        p = run(*args, check=False)
        assert p.returncode == 1
        assert f"'{tmp_path}' is a directory, not a text file" in p.stderr, p.stderr


def test_an_output_in_a_missing_directory_is_refused_before_the_work(tmp_path):
    missing = tmp_path / "no" / "such"
    for args in (["skew", "-m", model("smollm2"), "-o", missing / "s.gguf"],
                 ["train-locret", "-m", model("smollm2"), "-o", missing / "h.gguf"],
                 ["locret-data", "-m", model("smollm2"), "-o", missing / "d.jsonl"]):
        p = run(*args, check=False)
        assert p.returncode == 2, p.stderr
        assert f"the directory '{missing}' does not exist" in p.stderr, p.stderr
