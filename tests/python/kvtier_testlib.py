"""Shared helpers for the Python reference tests: where the binary and the models are."""
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


def run(*args, check=True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([kvtier_bin(), *map(str, args)], capture_output=True, text=True, timeout=600, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"kvtier {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def run_json(*args) -> dict:
    return json.loads(run(*args).stdout)
