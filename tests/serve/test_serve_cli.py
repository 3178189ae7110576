"""`nanoengine serve` as a user runs it: a real process, curl as the client, Ctrl-C to stop, the
trace it leaves; a port in use or out of range is one line and exit 2 with no banner."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import pytest
from serving import CLI, WAIT, ServeProcess

from tracer.cli.main import main
from tracer.trace.trace_file import load_trace


def curl(*args: str) -> str:
    return subprocess.run(
        ["curl", "-sS", "--max-time", str(WAIT), *args], capture_output=True, text=True, check=True
    ).stdout


def test_serve_answers_curl_and_ctrl_c_leaves_a_trace_that_checks(tmp_path, capsys):
    trace = tmp_path / "served.jsonl"
    server = ServeProcess("--model", "tiny", "--port", "0", "--trace", str(trace))
    try:
        banner = server.wait_for(" on http://")
        url = banner.split(" on ")[1].strip()
        assert url.startswith("http://127.0.0.1:")  # localhost only by default
        assert json.loads(curl(f"{url}/health")) == {"status": "ok"}
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 5, "temperature": 0})
        out = json.loads(curl(f"{url}/v1/completions", "-H", "Content-Type: application/json", "-d", body))
        assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 5
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
        events = [
            line for line in curl("-N", f"{url}/v1/chat/completions", "-d", json.dumps(chat)).splitlines() if line
        ]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
        server.proc.send_signal(signal.SIGINT)  # after the banner and two answered requests
        assert server.proc.wait(timeout=WAIT) == 0
        server.wait_for("Trace written to")
        assert "Traceback" not in server.proc.stderr.read()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert not trace.with_name(trace.name + ".partial").exists()
    assert main(["check", str(trace), "--full"]) == 0
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
