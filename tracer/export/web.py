"""`nanoengine replay FILE --web`: the real replay TUI in a browser, served on localhost by
textual-serve (pip install -e '.[web]').

    serve_replay(path, start_step=0, predict=False, port=8000) -> exit code

textual-serve starts one `nanoengine replay` process per browser tab and streams its screen over a
websocket to xterm.js. It listens on localhost only: for the teacher's own browser or projector.
For students' machines, send the file from `nanoengine export --html` instead.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tracer.trace.trace_file import TraceError, load_trace

WEB_HOST = "localhost"


def replay_command(path: Path, start_step: int, predict: bool) -> str:
    """The shell command textual-serve runs for each browser tab."""
    argv = [sys.executable, "-m", "tracer.cli.main", "replay", str(path.resolve()), "--step", str(start_step)]
    return shlex.join(argv + (["--predict"] if predict else []))


def serve_replay(path: Path, start_step: int = 0, predict: bool = False, port: int = 8000) -> int:
    try:
        from textual_serve.server import Server
    except ModuleNotFoundError:
        print(
            "nanoengine: error: --web needs textual-serve: pip install -e '.[web]' (or open the trace "
            f"in a terminal: nanoengine replay {path})",
            file=sys.stderr,
        )
        return 2
    try:
        trace = load_trace(path)  # refuse a bad file here, not in every browser tab
    except TraceError as e:
        print(f"nanoengine: error: {e}", file=sys.stderr)
        return 2
    if not 0 <= start_step < max(1, trace.num_steps):
        print(
            f"nanoengine: error: step {start_step} is outside the trace: choose 0 .. {trace.num_steps - 1}",
            file=sys.stderr,
        )
        return 2
    title = f"nanoengine replay · {trace.title or path.name}"
    Server(replay_command(path, start_step, predict), host=WEB_HOST, port=port, title=title).serve()
    return 0
