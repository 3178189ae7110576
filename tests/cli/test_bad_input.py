"""Bad input gets a clear, one-line error."""

import subprocess
import sys

import pytest

from nanoengine import LLM, LLMEngine, SamplingParams
from tracer.cli.main import main


@pytest.fixture(scope="module")
def engine():
    return LLMEngine("tiny", max_model_len=64, num_kv_blocks=8, block_size=4)


@pytest.mark.parametrize("prompt", ["", "   ", []])
def test_empty_prompt(engine, prompt):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(prompt)


def test_prompt_longer_than_max_model_len(engine):
    with pytest.raises(ValueError, match="max_model_len is 64"):
        engine.add_request("x" * 80)


def test_pool_too_small_for_one_request(engine):
    with pytest.raises(ValueError, match="needs 10 KV blocks but the pool has 8"):
        engine.add_request("x" * 30, SamplingParams(max_tokens=10))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k must be >= 0"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(num_kv_blocks=0), "num_kv_blocks must be >= 1"),
        (dict(bogus=1), "unknown engine option"),
        (dict(attention_backend="magic"), "attention_backend must be"),
    ],
)
def test_bad_engine_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM("tiny", **kwargs)


@pytest.mark.parametrize("model", ["/no/such/folder", "./missing-model", "not a model"])
def test_unknown_model_path(model):
    with pytest.raises(ValueError, match="check the path"):
        LLM(model)


def test_mismatched_params_list():
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        LLM("tiny").generate(["a", "b"], [SamplingParams()])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "", "--model", "tiny"], "empty prompt"),
        (["generate", "hi", "--model", "/no/such/folder"], "check the path"),
        (["generate", "hi", "--model", "tiny", "--max-tokens", "0"], "max_tokens"),
        (["generate", "hi", "--model", "tiny", "--top-p", "2"], "top_p"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_cli_errors_are_one_line(capsys, argv, message):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_generate_streams_text():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracer.cli.main",
            "generate",
            "hello",
            "--model",
            "tiny",
            "--max-tokens",
            "5",
            "--ignore-eos",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "5 tokens in" in result.stderr
