"""Shared helpers for the Python reference tests: where the binary and the models are.

KVTIER_TEST_ISA (scalar, avx2 or avx512; read here, never by the library) forces that CPU kernel path on
every kvtier command that computes (run, chat, perplexity, bench, eval) and does not name --isa itself:
scripts/test.sh runs the tests of label `isa` (the real models against the references, the randomised
exactness run) a second time with KVTIER_TEST_ISA=avx2 on AVX-512 machines, so CI proves both SIMD paths
against the references wherever it runs.
"""
import json
import os
import pathlib
import subprocess

SOURCE_DIR = pathlib.Path(os.environ.get("KVTIER_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
MODELS = {
    "smollm2": SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": SOURCE_DIR / "models" / "gemma-3-270m-q4_k_m.gguf",
}


def kvtier_bin() -> str:
    path = os.environ.get("KVTIER_BIN")
    assert path and os.path.exists(path), "KVTIER_BIN must name the built kvtier binary (run through ctest)"
    return path


def model(name: str) -> pathlib.Path:
    p = MODELS[name]
    assert p.exists(), f"{p} is missing: run scripts/setup.sh"
    return p


COMPUTING_COMMANDS = {"run", "chat", "perplexity", "bench", "eval", "compare"}


def test_isa():
    """The kernel path forced by KVTIER_TEST_ISA, or None (the best the CPU has)."""
    isa = os.environ.get("KVTIER_TEST_ISA") or None
    assert isa in (None, "scalar", "avx2", "avx512"), f"KVTIER_TEST_ISA={isa!r}: expected scalar, avx2 or avx512"
    return isa


def with_isa(args):
    """args (a kvtier command line without the binary) with --isa KVTIER_TEST_ISA added where it applies."""
    args = [str(a) for a in args]
    isa = test_isa()
    if isa and args and args[0] in COMPUTING_COMMANDS and "--isa" not in args:
        args += ["--isa", isa]
    return args


def run(*args, check=True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([kvtier_bin(), *with_isa(args)], capture_output=True, text=True, timeout=600, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"kvtier {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def run_json(*args) -> dict:
    return json.loads(run(*args).stdout)
