"""Running the app: a socket bound before anything else (a port in use is a one-line error before
the model loads), the engine loop, and uvicorn serving on that socket.

    sock = bind("127.0.0.1", 0)                      # OSError / ValueError: say it in one line
    server = Server(engine, sock, recorder=None)     # the loop starts; nothing is served yet
                                                     # (api_key=..., max_body_bytes=...: see app.py)
    server.run()                                     # blocks (Ctrl-C stops it), or:
    server.start_in_thread(); ...; server.stop()     # tests, and a TUI in the main thread
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from nanoengine.engine import LLMEngine
from tracer.loop.engine_loop import EngineLoop
from tracer.serve.app import DEFAULT_MAX_BODY_BYTES, ServedModel, build_app
from tracer.serve.metrics import ServerMetrics

GRACEFUL_SHUTDOWN_S = 3  # open streams get this long to end on Ctrl-C; then they are cut (and aborted)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port); ValueError in one line if it cannot."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range: choose 1-65535 (or 0 for any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"cannot listen on host {host!r}: {e.strerror}; use an address such as 127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise ValueError(f"port {port} on {host} is already in use: pick another with --port (or 0)") from None
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    return sock


class StoppingServer(uvicorn.Server):
    """uvicorn's server that, when it starts to shut down (Ctrl-C, SIGTERM, stop()), first stops the
    engine loop: each open stream then ends at once with finish_reason 'abort' and [DONE], and the
    trace records the aborts, instead of the streams being cut after the grace period."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)


class Server:
    def __init__(
        self,
        engine: LLMEngine,
        sock: socket.socket,
        recorder: Any = None,
        aliases: tuple[str, ...] = (),
        name: str | None = None,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        """name: the model id clients send (default: the engine's model name); aliases: also accepted;
        api_key: wanted on every route but /health; max_body_bytes: a larger body is a 413."""
        engine.config.use_chat_template = False  # the server templates chat requests itself, completions never
        self.sock = sock
        self.model_name = name or engine.model_name
        self.metrics = ServerMetrics(self.model_name)
        self.metrics.watch(engine)  # before the loop thread owns the engine
        self.loop = EngineLoop(engine, recorder).start()
        served = ServedModel(self.model_name, engine.tokenizer, engine.scheduler.max_model_len, aliases)
        config = uvicorn.Config(
            build_app(self.loop, served, max_body_bytes, api_key, self.metrics),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        self.uvicorn = StoppingServer(config, on_shutdown=self.loop.stop)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def run(self) -> None:
        """Serve until Ctrl-C (or stop()), then stop the engine loop: what is left is aborted."""
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.loop.stop()
            self.sock.close()

    def start_in_thread(self) -> Server:
        self.thread = threading.Thread(target=self.run, name="nanoengine-http", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
