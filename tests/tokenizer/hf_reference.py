"""The reference tokenizers: transformers' GGUF tokenizer conversion, fed from the `gguf` package.

transformers (5.x) builds a `tokenizers.Tokenizer` from a GGUF's `tokenizer.ggml.*` metadata
(transformers.integrations.gguf.gguf_tokenizer_mapping). Its own GGUF *reader* imports torch, which
we do not install, so the metadata is read here with the `gguf` package into the same dict that
transformers' `get_gguf_tokenizer` produces, and handed to transformers' own builders.
"""

from __future__ import annotations

import functools

import gguf
from tokenizers import Regex, pre_tokenizers
from transformers.integrations.gguf import gguf_tokenizer_mapping as M


def _field_value(field):
    """A GGUF field as a Python value (strings decoded, arrays as lists)."""
    t = field.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        et = field.types[1] if len(field.types) > 1 else None
        if et == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def read_metadata(path: str) -> dict:
    reader = gguf.GGUFReader(path)
    return {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}


def tokenizer_dict(path: str) -> tuple[str, dict, dict]:
    """(architecture, tokenizer_dict, tokenizer_config) exactly as transformers' get_gguf_tokenizer."""
    md = read_metadata(path)
    grouped = {
        group: {name: md[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in md}
        for group, renames in M.GGUF_TOKENIZER_MAPPING.items()
    }
    tok, cfg = grouped["tokenizer"], grouped["tokenizer_config"]
    if tok.get("tokenizer_type") == "llama":
        cfg.setdefault("add_bos_token", True)
    return md["general.architecture"], tok, cfg


# Where transformers' GGUF conversion is known to differ from the tokenizer the model was trained
# with, the original wins (see test_tokenizer_reference.py for the list).
_DIGITS_THEN_BYTE_LEVEL = {"smollm", "starcoder", "refact", "codeshell"}


@functools.lru_cache(maxsize=4)
def load(path: str):
    """The reference `tokenizers.Tokenizer` for a GGUF file, plus its metadata."""
    arch, tok, cfg = tokenizer_dict(path)
    backend, _ = M.convert_gguf_tokenizer(arch, tok)
    if tok.get("pre_tokenizer_type") in _DIGITS_THEN_BYTE_LEVEL:
        # SmolLM2's original tokenizer.json: Sequence[Digits(individual_digits=True), ByteLevel].
        # transformers' GGUF path does not know "smollm" and falls back to plain GPT-2 ByteLevel,
        # which groups digits; llama.cpp and the original split every digit.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return backend, tok, cfg
