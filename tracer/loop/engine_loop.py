"""The engine loop: one thread owns an LLMEngine, steps it while it has work and sleeps when idle.

Other threads never touch the engine. They put commands on a queue that the loop drains at the
top of each step (as vLLM's engine core drains its input queue), and hear back through each
request's callback, which the loop calls after every step in which the request gained tokens or
finished.

    loop = EngineLoop(engine).start()
    request = loop.add(prompt, params, on_update)  # any thread; on_update(RequestUpdate) runs in the loop
    loop.abort(request)                            # any thread: finished (reason 'abort') in the next step
    loop.pause(); loop.step_once(); loop.resume()  # debugger-style control (the live TUI)
    loop.call(fn) -> Future                        # fn(engine) in the loop thread, between two steps
    loop.add_step_callback(fn)                     # fn(appended sequences) after every step, in the loop
    loop.when_idle(work)                           # next(work) while there is nothing else to do
    loop.stop()                                    # aborts what is left (recorded), joins the thread

A callback must be quick and must not raise (a server hands the update to its event loop).

The loop never dies from one request: a request it cannot add is rejected (its callback hears why),
a command that raises is logged in one line on stderr, and a step that fails as a whole ends the
requests it was running, with an error that says so; then the loop goes on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from nanoengine.beam_search import BeamSearchParams
from nanoengine.engine import LLMEngine
from nanoengine.loading.validation import first_line
from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import FinishReason, Sequence, TopLogprobs

REJECTED = "rejected"  # an update's finish_reason when add_request refused the request


@dataclass(slots=True)
class RequestUpdate:
    """What a request gained in one step. finish_reason is None while it runs; on the last update
    `text` is the engine's final text (the same as LLM.generate's, cut at a stop string)."""

    request: LoopRequest
    new_token_ids: list[int]
    finish_reason: str | None = None
    error: str = ""  # why, for finish_reason 'error' or 'rejected'
    text: str = ""
    logprobs: list[TopLogprobs] = field(default_factory=list)  # the new tokens', when the params ask
    prompt_logprobs: list[TopLogprobs | None] | None = None  # on the first update, when the params ask

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, eq=False)
class LoopRequest:
    """A request as the loop tracks it. seq_id is set when the loop adds it to the engine.
    token_ids: the prompt already checked and tokenized (LLMEngine.input_processor.check_request) in the
    caller's thread, so the loop thread never tokenizes a client's text."""

    prompt: str | list[int]
    params: SamplingParams | BeamSearchParams
    on_update: Callable[[RequestUpdate], object]
    notes: dict[str, Any] = field(default_factory=dict)  # written into the trace's request entry
    token_ids: list[int] | None = None
    arrival_time: float = field(default_factory=time.time)
    seq_id: int | None = None
    num_prompt_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)  # what the model saw, once added
    num_delivered: int = 0  # completion tokens handed to on_update so far
    aborted: bool = False


class EngineLoop:
    def __init__(self, engine: LLMEngine, recorder: Any = None) -> None:
        """recorder: a tracer.trace.recorder.TraceRecorder on this engine, told each request's notes."""
        self.engine = engine
        self.recorder = recorder
        self.commands: deque[Callable[[], None]] = deque()
        self.wake = threading.Condition()
        self.live: dict[int, LoopRequest] = {}  # seq_id -> request, until its last update
        self.step_callbacks: list[Callable[[list[Sequence]], None]] = []
        self.paused = False
        self.steps_allowed = 0  # step_once() while paused
        self.stopping = False
        self.error = ""  # the last failure (a step, command, callback or idle work), in one line
        self.idle_work: Iterator[object] | None = None  # advanced one item at a time while idle
        self.thread = threading.Thread(target=self.run, name="nanoengine-loop", daemon=True)

    # ---- any thread ---------------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def add(
        self,
        prompt: str | list[int],
        params: SamplingParams | BeamSearchParams,
        on_update: Callable[[RequestUpdate], object],
        notes: dict[str, Any] | None = None,
        token_ids: list[int] | None = None,
    ) -> LoopRequest:
        """token_ids: the token ids engine.input_processor.check_request(prompt, params) returned (the prompt is then not tokenized again)."""
        request = LoopRequest(prompt, params, on_update, dict(notes or {}), token_ids=token_ids)
        self.submit(lambda: self.admit(request))
        return request

    def abort(self, request: LoopRequest) -> None:
        """A TypeError here, in the caller's thread, for anything but a request this loop's add returned."""
        if not isinstance(request, LoopRequest):
            raise TypeError(f"abort takes the LoopRequest that add returned, got {type(request).__name__}")
        self.submit(lambda: self.abort_now(request))

    def call(self, fn: Callable[[LLMEngine], Any]) -> Future:
        """Run fn(engine) in the loop thread between two steps; its result comes in the Future."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn(self.engine))
            except Exception as e:
                future.set_exception(e)

        self.submit(run)
        return future

    def pause(self) -> None:
        with self.wake:
            self.paused, self.steps_allowed = True, 0

    def resume(self) -> None:
        with self.wake:
            self.paused, self.steps_allowed = False, 0
            self.wake.notify()

    def step_once(self) -> None:
        """While paused: run exactly one more step (if there is work)."""
        with self.wake:
            self.steps_allowed += 1
            self.wake.notify()

    def add_step_callback(self, fn: Callable[[list[Sequence]], None]) -> None:
        self.submit(lambda: self.step_callbacks.append(fn))

    def when_idle(self, work: Iterator[object]) -> None:
        """Advance work one item at a time whenever the loop has no command to run and no step to
        take, until it is exhausted: a request that arrives waits for one item at most."""
        self.submit(lambda: setattr(self, "idle_work", work))

    def stop(self, timeout: float | None = None) -> None:
        """Abort every request left (each gets its last update) and end the thread."""
        with self.wake:
            self.stopping = True
            self.wake.notify()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def submit(self, command: Callable[[], None]) -> None:
        with self.wake:
            self.commands.append(command)
            self.wake.notify()

    # ---- the loop thread ------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            commands, stopping = self.wait_for_work()
            for command in commands:
                self.run_command(command)
            if stopping:
                self.finish_all()
                return
            if self.may_step():
                self.step()
            elif not commands:
                self.work_while_idle()

    def wait_for_work(self) -> tuple[list[Callable[[], None]], bool]:
        with self.wake:
            while not (self.commands or self.stopping or self.may_step() or self.idle_work is not None):
                self.wake.wait()
            commands = list(self.commands)
            self.commands.clear()
            return commands, self.stopping

    def run_command(self, command: Callable[[], None]) -> None:
        try:
            command()
        except Exception as e:  # a bug in one command must not stop the engine for everyone
            self.error = first_line(e)
            log(f"a command failed and was skipped ({self.error})")

    def may_step(self) -> bool:
        if not self.engine.has_unfinished():
            return False
        return not self.paused or self.steps_allowed > 0

    def step(self) -> None:
        if self.paused:
            self.steps_allowed -= 1
        try:
            appended = self.engine.step()
        except Exception as e:  # the engine isolates one request's failure; this is the whole step's
            self.error = first_line(e)
            log(f"step {self.engine.num_steps} failed ({self.error}): its requests end with an error")
            self.fail_all(f"{self.error}; the whole step failed, so every running request ended with it")
            return
        self.deliver()
        for fn in self.step_callbacks:
            try:
                fn(appended)
            except Exception as e:  # a viewer's bug must not stop the engine
                self.error = f"step callback {type(e).__name__}: {e}".splitlines()[0][:200]

    def work_while_idle(self) -> None:
        if self.idle_work is None:
            return
        try:
            next(self.idle_work)
        except StopIteration:
            self.idle_work = None
        except Exception as e:  # idle work is a bonus: its failure ends it, never the loop
            self.idle_work, self.error = None, first_line(e)
            log(f"idle work failed and was dropped ({self.error})")

    def admit(self, request: LoopRequest) -> None:
        try:
            seq_id = self.engine.add_request(request.token_ids or request.prompt, request.params)
        except ValueError as e:
            notify(request, RequestUpdate(request, [], REJECTED, str(e)))
            return
        except Exception as e:  # e.g. a tokenizer's TypeError: refuse this request, keep the loop
            log(f"a request could not be added ({first_line(e)})")
            notify(request, RequestUpdate(request, [], REJECTED, f"it could not be added: {first_line(e)}"))
            return
        request.seq_id = seq_id
        seq = self.engine.sequences[seq_id]
        if request.token_ids and isinstance(request.prompt, str):
            seq.prompt = request.prompt  # added as token ids: keep the text it came from (the trace shows it)
        request.num_prompt_tokens = seq.num_prompt_tokens
        request.prompt_token_ids = seq.token_ids[: seq.num_prompt_tokens]
        self.live[seq_id] = request
        if self.recorder is not None:
            self.recorder.annotate(seq_id, arrival_time=round(request.arrival_time, 6), **request.notes)

    def abort_now(self, request: LoopRequest) -> None:
        if request.seq_id in self.live and not request.aborted:
            request.aborted = True
            self.engine.abort(request.seq_id)

    def deliver(self) -> None:
        """Each live request's new tokens; its last update (and collect) once it finished."""
        for seq_id, request in list(self.live.items()):
            if isinstance(request.params, BeamSearchParams):
                self.deliver_beam_search(seq_id, request)
                continue
            seq = self.engine.sequences[seq_id]
            start = seq.num_prompt_tokens + request.num_delivered
            new = seq.token_ids[start:]
            if not new and not seq.is_finished:
                continue
            logprobs = seq.logprobs[request.num_delivered : request.num_delivered + len(new)]
            prompt = list(seq.prompt_logprobs) if request.num_delivered == 0 and seq.prompt_logprobs else None
            request.num_delivered += len(new)
            if seq.is_finished:
                del self.live[seq_id]
                out = self.engine.collect(seq_id)
                error = f"{out.error}; other requests were not affected" if out.error else ""
                notify(request, RequestUpdate(request, new, out.finish_reason, error, out.text, logprobs, prompt))
            elif not notify(request, RequestUpdate(request, new, logprobs=logprobs, prompt_logprobs=prompt)):
                self.abort_now(request)

    def deliver_beam_search(self, request_id: int, request: LoopRequest) -> None:
        """A beam search's tokens may be rewritten (and its first sequence pruned) until the whole
        search ends: one update then, with the best hypothesis (collect gives every beam)."""
        if not all(s.is_finished for s in self.engine.requests[request_id]):
            return
        del self.live[request_id]
        out = self.engine.collect(request_id)
        best = out.outputs[0]
        update = RequestUpdate(request, best.token_ids, best.finish_reason, best.error, best.text)
        notify(request, update)

    def fail_all(self, error: str) -> None:
        for seq_id, request in list(self.live.items()):
            del self.live[seq_id]
            self.engine.drop(seq_id)
            notify(request, RequestUpdate(request, [], FinishReason.ERROR.value, error))

    def finish_all(self) -> None:
        """On stop: abort what is left in one recorded step, so a trace shows how each request ended."""
        for request in self.live.values():
            self.abort_now(request)
        if self.live:
            self.step()
        self.fail_all("the engine loop stopped")


def log(message: str) -> None:
    print(f"nanoengine loop: {message}", file=sys.stderr, flush=True)


def notify(request: LoopRequest, update: RequestUpdate) -> bool:
    """Hand the update to the request's callback; False if the callback failed (nobody is listening)."""
    try:
        request.on_update(update)
    except Exception:
        return False
    return True
