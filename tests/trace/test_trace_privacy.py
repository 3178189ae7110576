"""A shared trace says which model and tokenizer made it, never where their files were: the header
names the model and a digest of the tokenizer's content, not the folder it was loaded from
(which shows the user's home folder). Old traces, which hold that path, still load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tracer.cli.main import main
from tracer.trace.trace_file import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
DEFAULT_MODEL = Path.home() / ".cache" / "nanoengine" / "SmolLM2-135M-Instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def model_folder(folder: Path) -> Path:
    """A random tiny Llama with the default model's real tokenizer, saved in folder."""
    if not all((DEFAULT_MODEL / name).is_file() for name in TOKENIZER_FILES):
        pytest.skip("the default model's tokenizer is not cached (run `nanoengine generate hi` once)")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(DEFAULT_MODEL / name, folder / name)
    return folder


def test_the_header_names_the_model_and_hashes_the_tokenizer_never_a_path(tmp_path, one_torch_thread):
    home = tmp_path / "home" / "alice-secret"
    first = model_folder(home / "models" / "my-model")
    second = tmp_path / "elsewhere" / "my-model"
    shutil.copytree(first, second)
    headers = []
    for folder, out in ((first, tmp_path / "a.jsonl"), (second, tmp_path / "b.jsonl")):
        flags = ["--model", str(folder), "--raw", "--max-tokens", "3", "--num-kv-blocks", "16", "--no-tui"]
        assert main(["trace", "The capital of France is", *flags, "--out", str(out)]) == 0
        text = out.read_text(encoding="utf-8")
        assert "alice-secret" not in text and str(tmp_path) not in text
        headers.append(load_trace(out, validate="all").header)
    a, b = (h["tokenizer"] for h in headers)
    assert a["name"] == "my-model" and a["vocab_size"] == 49152 and len(a["sha256"]) == 64
    assert a == b  # the same tokenizer, wherever it was loaded from
    assert headers[0]["model"] == "my-model"


def test_old_traces_with_a_tokenizer_path_still_load():
    for path in sorted(DATA.glob("*.jsonl")):
        trace = load_trace(path, validate="all")
        assert trace.num_steps > 0, path
