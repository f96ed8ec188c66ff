"""Chat formatting against the model's own Jinja template rendered with jinja2 (SmolLM2's GGUF
carries one; Gemma-3's file has none, so kvtier uses its Gemma formatter, unit-tested in C++), and
the chat prompt's ids against the reference tokenizer with special tokens parsed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hf_reference  # noqa: E402

SOURCE = Path(os.environ.get("KVTIER_SOURCE_DIR", HERE.parent.parent))
KVTIER = os.environ.get("KVTIER_BIN", str(SOURCE / "build/cpu/bin/kvtier"))
SMOLLM = SOURCE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = SOURCE / "models/gemma-3-270m-q4_k_m.gguf"

CASES = [
    ("", "What is the capital of France?"),
    ("You are terse.", "Write a haiku about caches.\nTwo lines, please."),
    ("", "  spaces around  "),
]


def kvtier_chat(model: Path, user: str, system: str, *extra: str) -> dict:
    cmd = [KVTIER, "tokenize", "-m", str(model), "--chat", "-p", user, "--json", *extra]
    if system:
        cmd += ["--system", system]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("system,user", CASES)
def test_smollm2_matches_its_jinja_template(system, user):
    if not SMOLLM.exists():
        pytest.skip("models missing: run scripts/setup.sh")
    md = hf_reference.read_metadata(str(SMOLLM))
    template = jinja2.Environment().from_string(md["tokenizer.chat_template"])
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    expected = template.render(messages=messages, add_generation_prompt=True, bos_token="<|im_start|>")
    got = kvtier_chat(SMOLLM, user, system)
    assert got["text"] == expected
    backend, _, _ = hf_reference.load(str(SMOLLM))
    assert got["ids"] == backend.encode(expected, add_special_tokens=False).ids


def test_gemma_without_template_uses_gemma_format():
    if not GEMMA.exists():
        pytest.skip("models missing: run scripts/setup.sh")
    got = kvtier_chat(GEMMA, "Hi there", "")
    assert got["text"] == "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    backend, _, _ = hf_reference.load(str(GEMMA))
    assert got["ids"] == backend.encode(got["text"], add_special_tokens=False).ids
    assert got["ids"][0] == 2 and got["ids"].count(2) == 1  # one BOS: the template's


def test_override_and_unknown_template():
    if not SMOLLM.exists():
        pytest.skip("models missing: run scripts/setup.sh")
    got = kvtier_chat(SMOLLM, "Hi", "", "--chat-template", "chatml")
    assert got["text"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    r = subprocess.run([KVTIER, "tokenize", "-m", str(SMOLLM), "--chat", "-p", "Hi", "--chat-template", "vicuna"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "vicuna" in r.stderr and "chatml" in r.stderr and "gemma" in r.stderr
