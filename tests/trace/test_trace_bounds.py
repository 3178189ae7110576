"""Crafted or endless input gets one line from `nanoengine check`, in bounded memory: a header that
claims a huge pool or a million requests, a line longer than any trace writes, a device that never
ends, a pipe with no writer. Each runs in a child held to 2 GiB of address space, so a reader that
allocates what the file claims fails here instead of taking the machine's memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

MAX_LINE_BYTES = 64 * 2**20  # tracer.trace.trace_file.MAX_LINE_BYTES (spelled here so the test runs on older code too)

TRACE = Path(__file__).resolve().parents[1] / "data" / "replay_small.jsonl"  # 14 steps, block_size 4
CLI = [sys.executable, "-m", "tracer.cli.main"]
ADDRESS_SPACE = 2 * 2**30


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def check(path: Path, timeout: float = HANG_S) -> str:
    """`nanoengine check path` in a memory-limited child: its one-line error (exit 2 expected)."""
    result = subprocess.run(
        [*CLI, "check", str(path)], capture_output=True, text=True, timeout=timeout, preexec_fn=limit_memory
    )
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], err[-2000:])
    assert err.startswith("nanoengine: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def with_header(tmp_path: Path, change) -> Path:
    lines = TRACE.read_text().splitlines()
    header = json.loads(lines[0])
    change(header)
    path = tmp_path / "crafted.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return path


def test_a_huge_block_size_is_refused_before_the_kv_shadow_is_sized(tmp_path):
    path = with_header(tmp_path, lambda h: h["config"].update(block_size=10**7))
    assert "claims block_size 10000000" in check(path)


def test_a_huge_pool_is_refused(tmp_path):
    path = with_header(tmp_path, lambda h: h["config"].update(block_size=4096, num_kv_blocks=10**5))
    assert "KV pool of 100,000 blocks of 4096 slots" in check(path)


def more_requests(count: int):
    def add(header: dict) -> None:
        header["requests"] += [
            {"seq_id": 10 + i, "prompt": "", "num_prompt_tokens": 0, "params": {}} for i in range(count)
        ]

    return add


def test_a_header_listing_a_million_requests_is_refused_at_once(tmp_path):
    error = check(with_header(tmp_path, more_requests(10**6)))
    assert "line 1 is 69 MB long" in error or "requests in its header" in error
    error = check(with_header(tmp_path, more_requests(10**5)))
    assert "100,002 requests in its header (its first step has 2)" in error


def test_a_line_longer_than_any_trace_writes_is_refused(tmp_path):
    path = with_header(tmp_path, lambda h: h.update(title="x" * (MAX_LINE_BYTES + 1)))
    assert "line 1 is 64 MB long" in check(path)


def test_an_endless_device_is_refused_not_read():
    assert "/dev/zero is a device, not a trace file" in check(Path("/dev/zero"))


def test_a_pipe_with_no_writer_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert "is a named pipe (FIFO), not a trace file" in check(fifo)


@pytest.mark.parametrize("name", ["trace_v1.jsonl", "replay_small.jsonl"])
def test_real_traces_stay_within_the_bounds(name):
    result = subprocess.run(
        [*CLI, "check", str(TRACE.with_name(name))],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        preexec_fn=limit_memory,
    )
    assert result.returncode == 0, result.stderr
