"""Driving a running engine from the live app, debugger-style, through its EngineLoop.

    control = EngineControl(loop, params)     # params: what `a` adds requests with
    control.toggle_pause(); control.step_once()
    control.add(prompt, max_tokens=None)      # joins at the next step; a refusal becomes a notice
    control.abort(seq_id)                     # FINISHED (abort) at the next step, its blocks freed
    control.take_notices() -> [(severity, message)]   # what the app should say, from any thread

Nothing here waits for the engine: each call puts a command on the loop's queue and returns. The
loop thread answers through notices, which the app reads on its timer. A step that breaks an
invariant pauses the engine at that step (the recorder's live checker found it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from nanoengine.loading.validation import is_int, short_repr
from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import Sequence
from tracer.loop.engine_loop import REJECTED, EngineLoop, LoopRequest, RequestUpdate
from tracer.replay.colors import seq_tag

REFUSED = (REJECTED, "ignored", "error")  # finish reasons that mean the request never ran to its end


class EngineControl:
    def __init__(self, loop: EngineLoop, params: SamplingParams, served: bool = False) -> None:
        """served: the engine serves HTTP clients (pausing it makes their streams wait)."""
        self.loop = loop
        self.params = params
        self.served = served
        self.notices: deque[tuple[str, str]] = deque()  # appended by the loop thread, taken by the app
        self.num_violations = 0  # the recorder's violations seen so far
        self.paused_by = ""  # why the engine paused itself (a violation), until space resumes it
        loop.add_step_callback(self.after_step)

    # ---- state, read by the app -----------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self.loop.paused

    @property
    def stopped(self) -> bool:
        return not self.loop.thread.is_alive()

    def state(self) -> str:
        """One phrase for the status line."""
        if self.stopped:
            return f"engine stopped{': ' + self.loop.error if self.loop.error else ''}"
        if self.paused:
            return f"engine PAUSED{self.paused_by}" + (": HTTP streams wait" if self.served else "")
        return "engine running" if self.loop.engine.has_unfinished() else "engine idle (no requests)"

    def take_notices(self) -> list[tuple[str, str]]:
        taken = []
        while self.notices:
            taken.append(self.notices.popleft())
        return taken

    # ---- commands, from the app -----------------------------------------------------------
    def toggle_pause(self) -> None:
        if self.loop.paused:
            self.paused_by = ""
            self.loop.resume()
        else:
            self.loop.pause()

    def step_once(self) -> None:
        self.loop.step_once()

    def add(self, prompt: str, max_tokens: int | None = None) -> None:
        """Add a request at the next step with the run's sampling params (max_tokens if given);
        ValueError (one line) for params that are wrong before it reaches the engine."""
        params = self.params if max_tokens is None else replace(self.params, max_tokens=max_tokens)
        params.validate()
        request = LoopRequest(prompt, params, self.on_update)
        self.loop.submit(lambda: self.admit(request))

    def admit(self, request: LoopRequest) -> None:
        """In the loop thread: the request's `arrive` is the step it joins at."""
        request.notes["arrive"] = self.loop.engine.num_steps
        request.notes["added_by"] = "live"
        self.loop.admit(request)

    def abort(self, seq_id: int) -> None:
        if not is_int(seq_id):  # refused here: the loop thread only ever sees an integer id
            self.notices.append(("warning", f"{short_repr(seq_id)} is not a request id: nothing to abort"))
            return
        self.loop.submit(lambda: self.abort_now(seq_id))

    def abort_now(self, seq_id: int) -> None:
        """In the loop thread. A request the loop tracks (an HTTP client's too) gets its last update."""
        request = self.loop.live.get(seq_id)
        seq = self.loop.engine.sequences.get(seq_id)
        if request is not None:
            self.loop.abort_now(request)
        elif seq is not None and not seq.is_finished:
            self.loop.engine.abort(seq_id)
        else:
            why = "has already finished" if seq is not None else "has finished or never existed"
            self.notices.append(("warning", f"{seq_tag(seq_id)} {why}: nothing to abort"))
            return
        self.notices.append(("information", f"abort {seq_tag(seq_id)}: it finishes at the next step"))

    # ---- the loop thread --------------------------------------------------------------------
    def on_update(self, update: RequestUpdate) -> None:
        if update.finish_reason in REFUSED:
            what = update.error or update.finish_reason
            self.notices.append(("error", f"request not run: {what}"))

    def after_step(self, appended: list[Sequence]) -> None:
        """A step that broke an invariant pauses the engine there."""
        recorder = self.loop.recorder
        found = len(recorder.violations) if recorder is not None else 0
        if found > self.num_violations:
            new = recorder.violations[self.num_violations :]
            self.num_violations = found
            first = new[0]
            self.paused_by = f" by an invariant violation at step {first.step}"
            self.loop.pause()
            self.notices.append(
                (
                    "error",
                    f"invariant violation at step {first.step} ({first.invariant}): the engine is paused "
                    "there; space resumes",
                )
            )
