"""Bad input on the command line gets one clear line and a non-zero exit; the engine's own
validation is tested in tests/engine/test_robustness.py."""

import os
import subprocess
import sys

import pytest
from conftest import HANG_S

from tracer.cli.main import main


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
    argv = ["generate", "hello", "--model", "tiny", "--max-tokens", "5", "--ignore-eos"]
    result = subprocess.run(
        [sys.executable, "-m", "tracer.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "5 tokens in" in result.stderr
