"""A live session: the engine loop with a recorder writing the trace, the controls, and the app
reading that file as it grows.

    session = LiveSession.start(engine, path, params, arrivals)   # the loop runs from here
    app = session.app()                                            # the live app; app.run() in a terminal
    session.close()                                                # stops the loop, closes the trace

    LiveSession.over_loop(loop, recorder, params, served=True)     # `serve --tui`: the server's loop

close() stops the loop (what is left is aborted in one recorded step) and closes the recorder, so
the file is a complete trace that `nanoengine replay` and `nanoengine check` read as any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanoengine.engine import LLMEngine
from nanoengine.sampling_params import SamplingParams
from tracer.live.app import live_app
from tracer.live.control import EngineControl
from tracer.live.feed import ArrivalFeed
from tracer.live.source import GrowingTrace
from tracer.loop.arrivals import Arrival
from tracer.loop.engine_loop import EngineLoop
from tracer.replay.app import ReplayApp
from tracer.trace.recorder import TraceRecorder

STOP_S = 60.0  # how long close() waits for the step in flight (the default model's is < 1 s)


@dataclass(slots=True)
class LiveSession:
    loop: EngineLoop
    recorder: TraceRecorder
    control: EngineControl
    source: GrowingTrace
    owns_loop: bool = True  # False over a server's loop: the server stops it

    @classmethod
    def start(
        cls,
        engine: LLMEngine,
        path: str | Path,
        params: SamplingParams,
        arrivals: list[Arrival] | None = None,
        title: str | None = None,
        paused: bool = False,
        shown_as: str | Path | None = None,
    ) -> LiveSession:
        """paused: the engine waits for space or → before its first step. shown_as: the file name the
        app shows (the trace's final name, while it is recorded into a .partial file)."""
        recorder = TraceRecorder(engine, path, title=title).start()
        loop = EngineLoop(engine, recorder)
        control = EngineControl(loop, params)
        ArrivalFeed(control, list(arrivals or [])).start()
        session = cls(loop, recorder, control, opened(path, shown_as))
        if paused:
            loop.pause()
        loop.start()
        return session

    @classmethod
    def over_loop(cls, loop: EngineLoop, recorder: TraceRecorder, params: SamplingParams) -> LiveSession:
        """The live app on a loop another part runs (a server's): pausing makes its clients wait."""
        recorder.start()
        control = EngineControl(loop, params, served=True)
        return cls(loop, recorder, control, opened(recorder.path), owns_loop=False)

    def app(self, **kwargs) -> ReplayApp:
        return live_app(self.source, self.control, **kwargs)

    def close(self) -> None:
        if self.owns_loop:
            self.loop.stop(STOP_S)
            self.recorder.close()
        self.source.close()


def opened(path: str | Path, shown_as: str | Path | None = None) -> GrowingTrace:
    """The trace file, its header read (the recorder wrote it at start)."""
    source = GrowingTrace(path)
    source.poll()
    if shown_as is not None:
        source.path = source.steps.path = Path(shown_as)
    return source


def run_live(
    engine: LLMEngine,
    path: str | Path,
    params: SamplingParams,
    arrivals: list[Arrival] | None = None,
    title: str | None = None,
    shown_as: str | Path | None = None,
) -> int:
    """`nanoengine trace --live` / `run --live`: the app over a session recording into path; on
    quit the loop stops and the trace is closed (the caller publishes it)."""
    import sys

    session = LiveSession.start(engine, path, params, arrivals, title, shown_as=shown_as)
    try:
        app = session.app()
        result = app.run()
    finally:
        session.close()
    if app.failure:
        print(f"nanoengine: error: {app.failure}"[:400], file=sys.stderr)
    return app.return_code or result or 0
