"""`nanoengine serve` as a user runs it: a real process, curl as the client, Ctrl-C to stop, the
trace it leaves; a port in use or out of range is one line and exit 2 with no banner."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager

import httpx
import pytest
from serving import CLI, WAIT, ServeProcess

from tracer.cli.main import main
from tracer.trace.trace_file import load_trace


def curl(*args: str) -> str:
    return subprocess.run(
        ["curl", "-sS", "--max-time", str(WAIT), *args], capture_output=True, text=True, check=True
    ).stdout


@contextmanager
def served_with_trace(trace):
    """A `serve --trace` child and its URL; once the body has stopped it: exit 0, no traceback, the
    trace renamed from .partial and clean."""
    server = ServeProcess("--model", "tiny", "--port", "0", "--trace", str(trace))
    try:
        yield server, server.wait_for(" on http://").split(" on ")[1].strip()
        assert server.proc.wait(timeout=WAIT) == 0
        server.wait_for("Trace written to")
        assert "Traceback" not in server.proc.stderr.read()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert not trace.with_name(trace.name + ".partial").exists()
    assert main(["check", str(trace), "--full"]) == 0


def test_serve_answers_curl_and_ctrl_c_leaves_a_trace_that_checks(tmp_path, capsys):
    trace = tmp_path / "served.jsonl"
    with served_with_trace(trace) as (server, url):
        assert url.startswith("http://127.0.0.1:")  # localhost only by default
        assert json.loads(curl(f"{url}/health")) == {"status": "ok"}
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 5, "temperature": 0})
        out = json.loads(curl(f"{url}/v1/completions", "-H", "Content-Type: application/json", "-d", body))
        assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 5
        # greedy: at the server's default temperature (1.0) the tiny model drew its EOS within 4 tokens
        # in 14 of 1,500 tries, and this stream must end by its length
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        }
        events = [
            line for line in curl("-N", f"{url}/v1/chat/completions", "-d", json.dumps(chat)).splitlines() if line
        ]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
        server.proc.send_signal(signal.SIGINT)  # after the banner and two answered requests
    requests = load_trace(trace).requests.values()
    assert sorted(r["http_request_id"].split("-")[0] for r in requests) == ["chatcmpl", "cmpl"]
    assert all(r["arrival_time"] > 0 for r in requests)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=WAIT)


def test_a_port_in_use_is_one_line_and_no_banner():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        result = run_cli("--model", "tiny", "--port", str(taken.getsockname()[1]))
    assert result.returncode == 2 and result.stdout == ""
    err = result.stderr.strip()
    assert err.startswith("nanoengine: error: port ") and "in use" in err and "\n" not in err


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_one_line(port):
    result = run_cli("--model", "tiny", "--port", port)
    assert result.returncode == 2 and result.stdout == ""
    err = result.stderr.strip()
    assert "out of range" in err and "\n" not in err and "Traceback" not in err


def test_sigterm_stops_the_server_as_ctrl_c_does_and_the_trace_is_kept(tmp_path):
    trace = tmp_path / "served.jsonl"
    with served_with_trace(trace) as (server, url):
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        # 2,000 tokens outlast the signal (then 'abort'); if not, 'length' and the check still holds
        with httpx.Client(base_url=url, timeout=WAIT) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line).startswith("data: {")  # in flight
                server.proc.send_signal(signal.SIGTERM)
                events = [line for line in lines if line]
    ended = json.loads(events[-2][6:])["choices"][0]["finish_reason"] if events[-1:] == ["data: [DONE]"] else None
    rows = [row for step in load_trace(trace).steps for row in step["seqs"] if row["finish_reason"]]
    assert ended in ("abort", "length") and [row["finish_reason"] for row in rows] == [ended]  # aborted, recorded


def test_serving_the_network_warns_and_an_api_key_guards_it():
    server = ServeProcess("--model", "tiny", "--port", "0", "--host", "0.0.0.0", "--api-key", "sk-1")
    try:
        url = server.wait_for(" on http://").split(" on ")[1].strip()
        assert httpx.get(f"{url}/v1/models", timeout=WAIT).status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-1"}, timeout=WAIT).status_code == 200
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=WAIT) == 0
        err = server.proc.stderr.read()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert "warning: listening on 0.0.0.0" in err and "Traceback" not in err


def test_serving_the_network_without_a_key_says_so(monkeypatch):
    from tracer.cli.serve import exposure_warning

    monkeypatch.delenv("NANOENGINE_API_KEY", raising=False)
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("::1", None) is None
    assert exposure_warning("localhost", None) is None
    assert "anyone who can reach" in exposure_warning("0.0.0.0", None) and "--api-key" in exposure_warning("::", None)
    assert "--api-key" not in exposure_warning("0.0.0.0", "sk-1")


FREEZE_CHILD = """
import gc, weakref
from tracer.cli.serve import freeze_startup_heap

class Node:
    pass

garbage = Node()
garbage.me = garbage  # a cycle: only a collection frees it
gone = weakref.ref(garbage)
kept = [Node()]
del garbage
freeze_startup_heap()
after = [Node()]
tracked = gc.get_objects()  # every generation but the frozen objects
print(gone() is None, not any(o is kept for o in tracked), any(o is after for o in tracked))
"""


def test_the_servers_startup_heap_is_collected_then_frozen():
    """serve's start-up heap is set aside from the collector (no full-collection pauses while
    serving), after a collection: garbage of that moment is freed, not kept for good; what is made
    later is collected as usual."""
    out = subprocess.run([sys.executable, "-c", FREEZE_CHILD], capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]
