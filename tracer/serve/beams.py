"""Beam search requests (vLLM's `use_beam_search`) run on the engine loop and handed over whole.

A beam search's output is known only at its end: every step its beams are re-ranked, a beam's last
token may be rewritten, beams are forked and pruned. So, as vLLM's OpenAIServing.beam_search yields
one output at the end, a beam request is answered once, when every beam has finished: its
best `beam_width` hypotheses, best first.

The loop's own delivery answers a beam search once, at its end, but with its best hypothesis only
(EngineLoop.deliver_beam_search); a server answers with n of them, so a beam request goes to the
engine through the loop's public hooks instead: `loop.call` adds it between two steps, a step
callback collects it once all its beams are finished. Both run in the loop thread, the only one
that touches the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tracer.loop.engine_loop import EngineLoop, LoopRequest, RequestUpdate

if TYPE_CHECKING:
    from nanoengine.engine import LLMEngine
    from nanoengine.sequence import Sequence, TopLogprobs
    from tracer.serve.metrics import ServerMetrics


@dataclass(slots=True)
class Hypothesis:
    """One of a beam search's outputs: its tokens (a final EOS included), their logprobs (each
    with the 2 * beam_width likeliest), its text (without the EOS)."""

    token_ids: list[int]
    logprobs: list[TopLogprobs]
    text: str
    finish_reason: str
    cumulative_logprob: float


@dataclass(slots=True)
class BeamResult:
    request: LoopRequest
    hypotheses: list[Hypothesis] = field(default_factory=list)  # best first
    error: str = ""  # why the engine failed it ('' if it did not)


Deliver = Callable[[BeamResult], None]


class BeamSearches:
    """The beam requests of one server's loop."""

    def __init__(self, loop: EngineLoop, metrics: ServerMetrics) -> None:
        self.loop, self.metrics = loop, metrics
        self.running: dict[int, tuple[LoopRequest, Deliver]] = {}  # request id -> ...; loop thread only
        loop.add_step_callback(self.after_step)

    # ---- the server's event loop -------------------------------------------------------------
    async def run(self, requests: list[LoopRequest]) -> list[BeamResult]:
        """Each request's result, in order. A ValueError (none of them added) if the engine refuses one."""
        aio = asyncio.get_running_loop()
        done = [aio.create_future() for _ in requests]

        def deliver_to(future: asyncio.Future[BeamResult]) -> Deliver:
            def deliver(result: BeamResult) -> None:
                aio.call_soon_threadsafe(settle, future, result)

            return deliver

        added = self.loop.call(lambda engine: self.add_all(engine, requests, [deliver_to(f) for f in done]))
        await asyncio.wrap_future(added)
        return list(await asyncio.gather(*done))

    def abort(self, requests: list[LoopRequest]) -> None:
        """Finish them (reason 'abort') in the next step: their blocks are freed."""

        def abort_all(engine: LLMEngine) -> None:
            for request in requests:
                if request.seq_id is not None:
                    engine.abort(request.seq_id)

        self.loop.call(abort_all)

    # ---- the loop thread -----------------------------------------------------------------------
    def add_all(self, engine: LLMEngine, requests: list[LoopRequest], deliver: list[Deliver]) -> None:
        added: list[int] = []
        try:
            for request in requests:
                added.append(engine.add_request(request.token_ids or request.prompt, request.params))
        except ValueError:
            for request_id in added:
                engine.drop(request_id)
            raise
        for request_id, request, to in zip(added, requests, deliver):
            self.admitted(engine, request_id, request)
            self.running[request_id] = (request, to)

    def admitted(self, engine: LLMEngine, request_id: int, request: LoopRequest) -> None:
        """What the loop notes of a request it adds (its prompt's text, the trace's notes)."""
        seq = engine.sequences[request_id]
        if request.token_ids and isinstance(request.prompt, str):
            seq.prompt = request.prompt  # added as token ids: the trace shows the text it came from
        request.seq_id = request_id
        request.num_prompt_tokens = seq.num_prompt_tokens
        request.prompt_token_ids = seq.token_ids[: seq.num_prompt_tokens]
        if self.loop.recorder is not None:
            self.loop.recorder.annotate(request_id, arrival_time=round(request.arrival_time, 6), **request.notes)

    def after_step(self, appended: list[Sequence]) -> None:
        engine = self.loop.engine
        for request_id, (request, deliver) in list(self.running.items()):
            seqs = engine.requests.get(request_id)
            if seqs is not None and not all(s.is_finished for s in seqs):
                continue
            del self.running[request_id]
            result = collect(engine, request_id, request) if seqs else BeamResult(request, error="it was dropped")
            self.count(result)
            deliver(result)

    def count(self, result: BeamResult) -> None:
        """The metrics hear a beam request once, at its end, with every hypothesis' tokens."""
        tokens = [t for h in result.hypotheses for t in h.token_ids]
        reason = "error" if result.error else (result.hypotheses[0].finish_reason if result.hypotheses else "abort")
        self.metrics.on_update(RequestUpdate(result.request, tokens, reason))


def collect(engine: LLMEngine, request_id: int, request: LoopRequest) -> BeamResult:
    """The finished search's hypotheses, best first (as engine.collect orders them), with the
    logprobs as the engine keeps them (token ids, not yet decoded)."""
    group = engine.requests[request_id][0].group
    best = group.best(engine.eos_token_ids) if group else engine.requests[request_id]
    out = engine.collect(request_id)
    hypotheses = [
        Hypothesis(c.token_ids, list(seq.logprobs), c.text, c.finish_reason or "stop", seq.cumulative_logprob)
        for seq, c in zip(best, out.outputs)
    ]
    return BeamResult(request, hypotheses, next((c.error for c in out.outputs if c.error), ""))


def settle(future: asyncio.Future[BeamResult], result: BeamResult) -> None:
    if not future.done():  # not cancelled (the client went away)
        future.set_result(result)
