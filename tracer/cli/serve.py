"""`nanoengine serve`: an OpenAI-compatible HTTP server on the engine (tracer.serve).

    nanoengine serve [--model M] [engine flags] [--host 127.0.0.1] [--port 8000] [--trace FILE]

The port is taken before the model loads, so a port in use is one line and exit 2 with no banner.
The banner's first line names the URL (with the real port when --port 0 asks for any free one).
With --trace, every step is recorded to FILE.partial, renamed to FILE when the server stops.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracer.cli.main import add_engine_args, engine_options
from tracer.trace.readable import printable

DEFAULT_PORT = 8000


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nanoengine serve",
        description="An OpenAI-compatible server: POST /v1/completions, /v1/chat/completions (streaming or not), "
        "GET /v1/models, /health.",
    )
    add_engine_args(p, sampling=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000; 0: any free port)")
    p.add_argument("--trace", type=Path, default=None, help="record every engine step to this trace file")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the model's name)")
    args = p.parse_args(argv)
    args.raw = True  # clients send text as it is; chat requests go through the template in the server
    return args


def serve_main(argv: list[str]) -> int:
    args = parse_args(argv)
    from tracer.serve.server import bind

    sock = bind(args.host, args.port)  # before the model loads: a port in use is one line, no banner
    try:
        return serve(args, sock)
    finally:
        sock.close()


def serve(args: argparse.Namespace, sock) -> int:
    from nanoengine.engine import LLMEngine
    from tracer.serve.server import Server

    print(f"Loading model {printable(args.model)} ...", file=sys.stderr, flush=True)
    engine = LLMEngine(args.model, **engine_options(args))
    recorder, partial = None, None
    if args.trace is not None:
        from tracer.trace.recorder import TraceRecorder

        partial = args.trace.with_name(args.trace.name + ".partial")
        recorder = TraceRecorder(engine, partial, title=f"nanoengine serve {engine.model_name}")
    aliases = tuple({args.model, engine.model_name} - {args.served_model_name or engine.model_name})
    server = Server(engine, sock, recorder, aliases, name=args.served_model_name)
    print(f"nanoengine serve: {printable(server.model_name)} on {server.url}", flush=True)
    print(
        f"  OpenAI API at {server.url}/v1 (completions, chat/completions, models); {server.url}/health; Ctrl-C stops",
        flush=True,
    )
    if partial is not None:
        print(
            f"  recording every step to {printable(str(partial))} ({printable(str(args.trace))} at the end)", flush=True
        )
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C is how a server stops: not an error
        print("Stopped.", file=sys.stderr, flush=True)
    finally:
        if recorder is not None and partial is not None:
            recorder.close()
            partial.replace(args.trace)
            print(f"Trace written to {printable(str(args.trace))}", flush=True)
    return 0
