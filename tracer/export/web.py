"""`nanoengine replay FILE --web`: the real replay TUI in a browser, served on localhost by
textual-serve (pip install -e '.[web]').

    serve_replay(path, start_step=0, predict=False, port=8000) -> exit code

textual-serve starts one `nanoengine replay` process per browser tab and streams its screen over a
websocket to xterm.js. It listens on localhost only: for the teacher's own browser or projector.
For students' machines, send the file from `nanoengine export --html` instead.

Listening on localhost does not keep other web pages out: any page the user opens may open a
WebSocket to localhost, and a DNS name rebound to 127.0.0.1 may send it HTTP requests. So every
request must name this server as its Host, and carry, if any, an Origin that is this server (a
WebSocket always carries one): anything else gets 403 before a replay process is started.
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from tracer.i18n import _, language
from tracer.trace.trace_file import TraceError, load_trace

WEB_HOST = "localhost"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def allowed_hosts(port: int) -> frozenset[str]:
    """Host header values that name this server (a browser leaves out the default port 80)."""
    names = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    return frozenset(names | set(LOOPBACK_NAMES) if port == 80 else names)


def allowed_origins(port: int) -> frozenset[str]:
    return frozenset(f"http://{host}" for host in allowed_hosts(port))


def refusal(headers, port: int) -> str | None:
    """Why a request with these headers is refused, or None: it comes from this server's own page."""
    host, origin = headers.get("Host", "").lower(), headers.get("Origin")
    if host not in allowed_hosts(port):
        return f"Host {host or '(none)'!r} is not this server (localhost:{port})"
    websocket = headers.get("Upgrade", "").lower() == "websocket"
    if (origin is not None or websocket) and (origin or "").lower() not in allowed_origins(port):
        return f"Origin {origin or '(none)'!r} is not this server's page (http://localhost:{port})"
    return None


def replay_command(path: Path, start_step: int, predict: bool) -> str:
    """The shell command textual-serve runs for each browser tab."""
    argv = [sys.executable, "-m", "tracer.cli.main", "replay", str(path.resolve()), "--step", str(start_step)]
    argv += ["--lang", language()]  # each tab's replay speaks the language this command was given
    return shlex.join(argv + (["--predict"] if predict else []))


def say_error(message: str) -> None:
    from tracer.i18n import error_line

    print(error_line(message), file=sys.stderr)


def serve_replay(
    path: Path,
    start_step: int = 0,
    predict: bool = False,
    port: int = 8000,
    listen: Callable[[str, int], list[socket.socket]] | None = None,
) -> int:
    """listen(host, port) binds the port (tracer.cli.ports.listen_sockets) once the trace is found
    good, before anything is announced; None: the server binds it itself."""
    try:
        import textual_serve.server  # noqa: F401
    except ModuleNotFoundError:
        say_error(
            _(
                "--web needs textual-serve: pip install -e '.[web]' (or open the trace "
                "in a terminal: nanoengine replay {path})"
            ).format(path=path)
        )
        return 2
    try:
        trace = load_trace(path)  # refuse a bad file here, not in every browser tab
    except TraceError as e:
        say_error(str(e))
        return 2
    if not 0 <= start_step < max(1, trace.num_steps):
        say_error(
            _("step {step} is outside the trace: choose 0 .. {last}").format(step=start_step, last=trace.num_steps - 1)
        )
        return 2
    sockets = listen(WEB_HOST, port) if listen is not None else None
    title = f"nanoengine replay · {trace.title or path.name}"
    server = local_server_class()(replay_command(path, start_step, predict), host=WEB_HOST, port=port, title=title)
    server.serve_on(sockets)
    return 0


def local_server_class():
    """The server class, built on first use: aiohttp and textual-serve load only for --web."""
    from aiohttp import web
    from textual_serve.server import Server

    class LocalServer(Server):
        """textual-serve's Server, answering only its own page (Host and Origin checked), on
        sockets bound beforehand."""

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            port = self.port

            @web.middleware
            async def own_page_only(request: web.Request, handler):
                why = refusal(request.headers, port)
                if why is not None:
                    raise web.HTTPForbidden(text=f"nanoengine replay --web refuses this request: {why}\n")
                return await handler(request)

            app.middlewares.append(own_page_only)
            return app

        def serve_on(self, sockets: list[socket.socket] | None) -> None:
            """Server.serve, on the given sockets (None: bind host and port)."""
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.request_exit)
            where = {"sock": sockets} if sockets else {"host": self.host, "port": self.port}
            web.run_app(self._make_app(), handle_signals=False, loop=loop, print=lambda *args: None, **where)

    return LocalServer
