"""The command line with odd input: markup and escape sequences in prompts, failed and cut-short
runs that must not lose an existing trace or the text, stdin prompts, bad argv bytes, Ctrl-C
during start-up, --version and a fast --help."""

from __future__ import annotations

import io
import os
import resource
import signal
import subprocess
import sys

import pytest
from conftest import HANG_S, one_line_error
from interrupt_at import interrupted_at

from nanoengine import SamplingParams
from nanoengine.engine import LLMEngine
from tracer.cli.main import main
from tracer.trace.trace_file import load_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = ["--model", "tiny", "--max-tokens", "4", "--ignore-eos", "--num-kv-blocks", "32"]
CLI = [sys.executable, "-m", "tracer.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_prompts_and_titles_are_printed_literally_never_as_markup_or_escapes(tmp_path, capsys):
    prompt = "What does [/INST] mean? [bold]x[/bold] \x1b]0;pwned\x07\x1b[31mred"
    out = tmp_path / "t.jsonl"
    assert main(["trace", prompt, *TINY, "--out", str(out), "--title", "[/x] [red]t", "--no-tui"]) == 0
    printed = capsys.readouterr().out
    assert "What does [/INST] mean?" in printed and "[bold]x[/bold]" in printed  # the table may wrap
    assert "[/x] [red]t" in printed
    assert "\x1b" not in printed and "\x07" not in printed  # escapes are shown as text, never sent raw
    assert [r["prompt"] for r in load_trace(out).requests.values()] == [prompt]  # kept as given


def test_an_interrupted_trace_keeps_an_existing_out_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "mine.jsonl"
    out.write_text("my earlier trace\n")
    real_step, calls = LLMEngine.step, []

    def step_then_interrupt(self):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step_then_interrupt)
    assert main(["trace", "hello", *TINY, "--max-tokens", "20", "--out", str(out), "--no-tui"]) == 130
    assert out.read_text() == "my earlier trace\n"
    [partial] = tmp_path.glob("mine.jsonl.*.partial")
    assert load_trace(partial).num_steps == 2
    assert f"nanoengine replay {partial}" in " ".join(capsys.readouterr().err.split())


def limit_file_size() -> None:
    """In the child: a write past 64 KiB fails (EFBIG), like a full disk, instead of killing it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_a_write_error_names_the_path_keeps_the_old_file_and_still_prints_the_text(tmp_path):
    out = tmp_path / "mine.jsonl"
    out.write_text("my earlier trace\n")
    result = subprocess.run(
        [*CLI, "trace", "hello", *TINY, "--max-tokens", "200", "--out", str(out), "--no-tui"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=ENV,
        preexec_fn=limit_file_size,
    )
    assert result.returncode == 2
    assert f"could not write the trace to {out}: File too large" in one_line_error(result.stderr)
    assert out.read_text() == "my earlier trace\n" and not list(tmp_path.glob("*.partial"))
    expected = LLMEngine("tiny", num_kv_blocks=32)
    seq_id = expected.add_request("hello", SamplingParams(max_tokens=200, ignore_eos=True))
    while expected.has_unfinished():
        expected.step()
    assert result.stdout.strip() == expected.collect(seq_id).text.strip()


def test_dash_reads_the_prompt_from_stdin(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("a prompt from a pipe\n"))
    out = tmp_path / "t.jsonl"
    assert main(["trace", "-", *TINY, "--out", str(out), "--no-tui"]) == 0
    assert [r["prompt"] for r in load_trace(out).requests.values()] == ["a prompt from a pipe\n"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    assert main(["generate", "-", *TINY]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["generate", "-", *TINY]) == 2
    assert "empty prompt" in one_line_error(capsys.readouterr().err)
    assert main(["generate", "-", "-", *TINY]) == 2
    assert "can be given once" in one_line_error(capsys.readouterr().err)


def test_non_utf8_arguments_get_one_line():
    result = subprocess.run(
        [*CLI, "generate", b"caf\xe9", "--model", "tiny"], capture_output=True, timeout=HANG_S, env=ENV
    )
    assert result.returncode == 2
    assert "argument 2" in one_line_error(result.stderr.decode()) and "not valid UTF-8" in result.stderr.decode()


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "nanoengine 0.1.0"


def torch_loaded_by(argv: list[str]) -> bool:
    """Does `nanoengine ARGV` import torch (2 s of start-up)? Run in a fresh process."""
    code = (
        "import sys\nfrom tracer.cli.main import main\n"
        f"try:\n    rc = main({argv!r})\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('exit', rc or 0, 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    *_, exit_code, loaded = result.stdout.split()
    assert result.returncode == 0 and exit_code == "0", result.stdout + result.stderr
    return loaded == "True"


@pytest.mark.parametrize("command", ["", "generate", "trace", "check", "replay", "run", "demo", "diff", "lesson"])
def test_help_does_not_import_torch(command):
    assert not torch_loaded_by([command, "--help"] if command else ["--help"])


def test_reading_a_trace_does_not_import_torch(tiny_trace_path):
    assert not torch_loaded_by(["replay", str(tiny_trace_path), "--text", "--step", "1"])
    assert not torch_loaded_by(["check", str(tiny_trace_path)])
    assert not torch_loaded_by(["lesson", "list"])  # the lessons' TARGETS read without running check.py
    assert torch_loaded_by(["generate", "hi", *TINY])  # the probe can tell


def test_a_kv_pool_bigger_than_memory_is_one_line(capsys):
    assert main(["generate", "hi", "--model", "tiny", "--num-kv-blocks", str(10**12)]) == 2
    assert "num_kv_blocks=1000000000000 needs" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize(
    "point",
    ["import:torch", "call:nanoengine.model_runner:ModelRunner.__init__:1"],  # torch loads; the model is built
)
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(point):
    result = interrupted_at(point, ["generate", "hello", *TINY], ENV)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip() == "interrupted"
    assert result.stdout == ""


def test_generate_reports_a_request_that_failed_inside_the_engine(monkeypatch, capsys):
    from nanoengine.model_runner import ModelRunner

    real_run = ModelRunner.run

    def fail_on_b(self, seqs, inputs):
        if any(s.token_ids[0] == ord("b") + 3 for s in seqs):  # the tiny byte tokenizer: "b"
            raise RuntimeError("boom")
        return real_run(self, seqs, inputs)

    monkeypatch.setattr(ModelRunner, "run", fail_on_b)
    assert main(["generate", "a", "b", *TINY]) == 1
    captured = capsys.readouterr()
    assert "prompt 1 failed inside the engine: RuntimeError: boom" in captured.err
    assert "--- [0] a" in captured.out and "--- [1] b" in captured.out


@pytest.mark.parametrize("argv", [["generate", "hi", "--dtype", "float8"], ["bench", "--rate"], ["lesson", "frob"]])
def test_a_bad_option_is_one_line_without_the_usage_block(capsys, argv):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "\n" not in err and err.startswith(f"nanoengine {argv[0]}: error: "), err
