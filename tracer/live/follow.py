"""The replay over a trace that is still being written: the timeline grows and the view follows the
newest step, like `tail -f` (`nanoengine replay --follow FILE`; the live app is the same with an
engine's controls).

    follow_app(source: GrowingTrace) -> ReplayApp      source.poll() already read its header
    run_follow(path) -> exit code

The growing file is the app's step source: ←, g, n/p browse history while it keeps growing; End
(or reaching the newest step) follows again. The app reads the file on a timer (ReplayModel.poll)
and never waits for the writer.
"""

from __future__ import annotations

from pathlib import Path

from tracer.live.source import GrowingTrace
from tracer.replay.app import POLL_S, ReplayApp
from tracer.trace.trace_file import TraceError


def follow_app(source: GrowingTrace, **kwargs) -> ReplayApp:
    """The replay following source (source.poll() already read its header), at its newest step."""
    return ReplayApp(source, max(0, len(source.steps) - 1), **kwargs)


def followed_path(path: Path) -> Path:
    """The file to follow: path, or the server's path.partial while it is still recording into it."""
    partial = path.with_name(path.name + ".partial")
    return partial if not path.exists() and partial.exists() else path


def wait_for_header(source: GrowingTrace, say) -> None:
    """Poll until the header line is complete (a recorder writes it at its first step)."""
    import time

    if source.poll() or source.has_header:
        return
    say(f"waiting for {source.path} to get its first line (Ctrl-C to stop) ...")
    while not source.has_header:
        time.sleep(POLL_S)
        source.poll()


def run_follow(path: str | Path) -> int:
    """`nanoengine replay --follow FILE`: open the replay on a trace another process is writing."""
    import os
    import sys

    def say(message: str) -> None:
        print(f"nanoengine: {message}", file=sys.stderr, flush=True)

    try:
        source = GrowingTrace(followed_path(Path(path)))
    except TraceError as e:
        say(f"error: {e}")
        return 2
    if not (sys.stdin.isatty() and sys.stdout.isatty()) and "TEXTUAL_DRIVER" not in os.environ:
        source.close()
        say(f"error: --follow needs an interactive terminal; `nanoengine check {path}` reads the file as it is")
        return 2
    try:
        wait_for_header(source, say)
    except (TraceError, KeyboardInterrupt) as e:
        source.close()
        if isinstance(e, KeyboardInterrupt):
            return 130
        say(f"error: {e}")
        return 2
    try:
        app = follow_app(source)
        result = app.run()
    finally:
        source.close()
    if app.failure:
        say(f"error: {app.failure}"[:400])
    return app.return_code or result or 0
