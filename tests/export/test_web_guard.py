"""`nanoengine replay FILE --web` answers only its own page: a request whose Host is not this
server (DNS rebinding) or whose Origin is another site (any page the user opens could otherwise
start replay processes and send them keys) gets 403; the port is checked before any banner."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import HANG_S, one_line_error

pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install -e '.[test]')")
CLI = [sys.executable, "-m", "tracer.cli.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, path: str, headers: dict[str, str]) -> int:
    """The status of one GET, sent with exactly these Host, Origin and Upgrade headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest("GET", path, skip_host=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def websocket_headers(host: str, origin: str | None) -> dict[str, str]:
    headers = {
        "Host": host,
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
    }
    return headers | ({"Origin": origin} if origin is not None else {})


@pytest.fixture
def served(tiny_trace_path, tmp_path) -> Iterator[int]:
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [*CLI, "replay", str(tiny_trace_path), "--web", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if request(port, "/", {"Host": f"localhost:{port}"}) == 200:
                    break
            except OSError:
                time.sleep(0.2)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_only_this_servers_own_page_gets_an_answer(served):
    port = served
    here = f"localhost:{port}"
    assert request(port, "/", {"Host": here}) == 200
    assert request(port, "/", {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}) == 200
    assert request(port, "/", {"Host": here, "Origin": "http://evil.example"}) == 403
    assert request(port, "/", {"Host": f"evil.example:{port}"}) == 403  # a rebound DNS name
    assert request(port, "/static/js/textual.js", {"Host": f"evil.example:{port}"}) == 403
    assert request(port, "/ws", websocket_headers(here, "http://evil.example")) == 403
    assert request(port, "/ws", websocket_headers(here, f"http://localhost:{port + 1}")) == 403
    assert request(port, "/ws", websocket_headers(here, "null")) == 403
    assert request(port, "/ws", websocket_headers(here, None)) == 403
    assert request(port, "/ws", websocket_headers(f"evil.example:{port}", f"http://evil.example:{port}")) == 403
    assert request(port, "/ws", websocket_headers(here, f"http://localhost:{port}")) == 101


def test_a_port_outside_1_to_65535_is_refused(tiny_trace_path):
    for port in ("70000", "0", "-1"):
        result = subprocess.run(
            [*CLI, "replay", str(tiny_trace_path), "--web", "--port", port],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert result.returncode == 2 and "Serving" not in result.stdout, result.stdout
        assert "1 to 65535" in one_line_error(result.stderr)


def test_a_port_in_use_is_said_before_any_banner(tiny_trace_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*CLI, "replay", str(tiny_trace_path), "--web", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
    assert result.returncode == 2 and "Serving" not in result.stdout, result.stdout
    assert f"port {port} on localhost is in use" in one_line_error(result.stderr)
