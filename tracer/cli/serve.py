"""`nanoengine serve`: an OpenAI-compatible HTTP server on the engine (tracer.serve).

    nanoengine serve [--model M] [engine flags] [--host 127.0.0.1] [--port 8000] [--trace FILE] [--tui]
                     [--api-key KEY] [--max-body-mb 4]

The port is taken before the model loads, so a port in use is one line and exit 2 with no banner.
The banner's first line names the URL (with the real port when --port 0 asks for any free one).
With --trace, every step is recorded to FILE.partial, renamed to FILE when the server stops.
With --tui, the live replay runs in this terminal over the server's engine (tracer.live); quitting
it stops the server. SIGTERM (`kill`) stops it as Ctrl-C does: open streams end as aborted, the
trace is closed and kept, exit 0.
A host other than this machine's loopback serves the network: a warning says so, and --api-key (or
NANOENGINE_API_KEY) makes every route but /health want `Authorization: Bearer KEY`, as vLLM's does.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import sys
import tempfile
from pathlib import Path

from tracer.cli.defaults import with_default
from tracer.cli.help_format import ArgumentParser
from tracer.cli.main import add_engine_args, engine_options
from tracer.cli.trace import take_sigterm_as_ctrl_c
from tracer.i18n import _
from tracer.serve.app import DEFAULT_MAX_BODY_BYTES
from tracer.trace.readable import printable

DEFAULT_PORT = 8000
API_KEY_ENV = "NANOENGINE_API_KEY"
STOP_S = 60  # how long quitting the TUI waits for the server and the engine loop to stop


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(
        prog="nanoengine serve",
        description=_(
            "An OpenAI-compatible server: POST /v1/completions, /v1/chat/completions (streaming or not), "
            "GET /v1/models, /health."
        ),
    )
    add_engine_args(p, sampling=False)
    p.add_argument("--host", default="127.0.0.1", help=_("address to listen on (default: this machine only)"))
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=with_default(_("port {shown}; 0: any free port")))
    p.add_argument("--trace", type=Path, default=None, help=_("record every engine step to this trace file"))
    p.add_argument("--served-model-name", default=None, help=_("the model id clients send (default: the model's name)"))
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=_("clients must send `Authorization: Bearer KEY` on every route but /health (default: ${name})").format(
            name=API_KEY_ENV
        ),
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help=with_default(
            _("a larger request body is refused with 413 {shown}: far above any prompt the engine can run")
        ),
    )
    p.add_argument(
        "--tui",
        action="store_true",
        help=_(
            "watch the server's engine in the live replay and drive it (space pauses it: HTTP streams wait; "
            "a adds a request, x aborts one); without --trace the steps go to a temporary file"
        ),
    )
    args = p.parse_args(argv)
    if not args.max_body_mb > 0:
        raise ValueError(_("--max-body-mb must be > 0, got {value}").format(value=args.max_body_mb))
    args.raw = True  # clients send text as it is; chat requests go through the template in the server
    if args.tui and not (sys.stdin.isatty() and sys.stdout.isatty()) and "TEXTUAL_DRIVER" not in os.environ:
        raise ValueError(_("--tui needs an interactive terminal (input or output is redirected): run it in a terminal"))
    return args


def serve_main(argv: list[str]) -> int:
    args = parse_args(argv)
    from tracer.serve.server import bind

    take_sigterm_as_ctrl_c()  # uvicorn hands the signal on once it has shut down
    warning = exposure_warning(args.host, args.api_key)
    if warning:
        print(_("nanoengine serve: warning: {message}").format(message=warning), file=sys.stderr, flush=True)
    sock = bind(args.host, args.port)  # before the model loads: a port in use is one line, no banner
    try:
        return serve(args, sock)
    finally:
        sock.close()


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to say when host is more than this machine's loopback (None when it is only that)."""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to a network address
        pass
    if api_key:
        return _("listening on {host}: anyone who can reach this machine can use the server with the API key").format(
            host=host
        )
    return _(
        "listening on {host}: anyone who can reach this machine can use the server and its engine; add --api-key "
        "KEY (or ${name}) to require a key"
    ).format(host=host, name=API_KEY_ENV)


def serve(args: argparse.Namespace, sock) -> int:
    from tracer.kernels.choose import build_engine
    from tracer.kernels.huge_pages import move_to_huge_pages, weight_pages
    from tracer.serve.server import Server

    print(_("Loading model {model} ...").format(model=printable(args.model)), file=sys.stderr, flush=True)
    engine = build_engine(args.model, engine_options(args))
    recorder, partial = None, None
    if args.trace is not None or args.tui:
        from tracer.trace.recorder import TraceRecorder

        partial = args.trace.with_name(args.trace.name + ".partial") if args.trace is not None else scratch_file()
        recorder = TraceRecorder(engine, partial, title=f"nanoengine serve {engine.model_name}")
    aliases = tuple({args.model, engine.model_name} - {args.served_model_name or engine.model_name})
    max_body_bytes = int(args.max_body_mb * 2**20)
    # The CPU weights moved into 2 MiB pages a page at a time whenever the server has no request to
    # run, not at khugepaged's pace (minutes): its steps are then 4-12 % shorter (huge_pages.py).
    idle_pages = weight_pages(engine.model.modules()) if engine.device.type == "cpu" else []
    server = Server(engine, sock, recorder, aliases, args.served_model_name, args.api_key, max_body_bytes)
    freeze_startup_heap()
    server.loop.when_idle(move_to_huge_pages(idle_pages))
    if args.tui:
        assert recorder is not None and partial is not None
        return serve_with_tui(server, recorder, partial, args.trace)
    print(
        _("nanoengine serve: {model} on {url}").format(model=printable(server.model_name), url=server.url), flush=True
    )
    api = _("  OpenAI API at {url}/v1 (completions, chat/completions, models); {url}/health; Ctrl-C stops")
    print(api.format(url=server.url), flush=True)
    if partial is not None:
        recording = _("  recording every step to {partial} ({trace} at the end)")
        print(recording.format(partial=printable(str(partial)), trace=printable(str(args.trace))), flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C is how a server stops: not an error
        print(_("Stopped."), file=sys.stderr, flush=True)
    finally:
        if recorder is not None and partial is not None:
            recorder.close()
            publish_trace(recorder, partial, args.trace)
    return 0


def freeze_startup_heap() -> None:
    """What start-up built (the model, the tokenizer, the app: ~180,000 objects the garbage collector
    tracks) set aside for good, as vLLM's freeze_gc_heap does once its server has started: otherwise
    each full collection walks all of them, a pause of ~100 ms in the middle of serving (every ~40 s
    of the serving bench; docs/benchmarks.md, twenty-fifth round). Collected first, so that nothing
    already garbage is kept. Only in the server's own process: tests build many engines in one."""
    gc.collect()
    gc.freeze()


def publish_trace(recorder, partial: Path, trace: Path | None) -> None:
    """FILE.partial becomes FILE; a recording that stopped says why (the server went on without it)."""
    if recorder.failed is not None:
        stopped = _("nanoengine serve: recording stopped: {why}").format(why=printable(recorder.failed))
        print(stopped, file=sys.stderr, flush=True)
    if trace is None or not partial.exists():
        partial.unlink(missing_ok=True)
        return
    partial.replace(trace)
    print(_("Trace written to {path}").format(path=printable(str(trace))), flush=True)


def scratch_file() -> Path:
    """Where `serve --tui` without --trace records (the live app reads the steps back from a file)."""
    fd, name = tempfile.mkstemp(prefix="nanoengine-serve-", suffix=".jsonl")
    os.close(fd)
    return Path(name)


def serve_with_tui(server, recorder, partial: Path, trace: Path | None) -> int:
    """The live app in this terminal over the server's engine; quitting it stops the server."""
    from nanoengine.sampling_params import SamplingParams
    from tracer.live.session import LiveSession

    url = server.url  # its socket is closed once the server stops
    recorder.title = f"nanoengine serve {server.model_name} on {url}"
    session = LiveSession.over_loop(server.loop, recorder, SamplingParams(max_tokens=64))
    server.start_in_thread()
    try:
        app = session.app()
        result = app.run()
    finally:
        server.stop(timeout=STOP_S)
        session.close()
        recorder.close()
        print(_("nanoengine serve: stopped ({url})").format(url=url), flush=True)
        publish_trace(recorder, partial, trace)
    return app.return_code or result or 0
