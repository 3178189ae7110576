"""One response being built: its choices (one per prompt), their text so far, and its chunks or its
final body, in OpenAI's shapes.

A completions request with several prompts (a list of strings, or of token-id lists) is one engine
request per prompt; each is a choice, indexed in prompt order, as OpenAI's API returns them. All
their updates come through one asyncio queue (update.request says whose), so a stream interleaves
the choices in the order the engine produced their tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import FinishReason
from tracer.loop.engine_loop import REJECTED, EngineLoop, LoopRequest, RequestUpdate
from tracer.serve.detokenize import IncrementalDetokenizer
from tracer.serve.protocol import Sampling

DONE = "data: [DONE]\n\n"
FAILED = (FinishReason.ERROR.value, FinishReason.IGNORED.value)  # finish reasons the client gets as an error


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


@dataclass(slots=True, eq=False)
class Choice:
    """One prompt's engine request and its output so far."""

    index: int
    handle: LoopRequest
    detokenizer: IncrementalDetokenizer
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str = ""

    def add(self, update: RequestUpdate) -> str:
        """The text this update adds (the engine's final text decides the end)."""
        self.token_ids += update.new_token_ids
        final = update.text if update.finished and update.finish_reason not in FAILED else None
        delta = self.detokenizer.delta(update.new_token_ids, final)
        self.text += delta
        self.finish_reason, self.error = update.finish_reason, update.error
        return delta

    @property
    def failed(self) -> bool:
        return self.finish_reason in FAILED


class Reply:
    def __init__(self, kind: str, request_id: str, model: str, body: Sampling, tokenizer: Any) -> None:
        self.kind, self.id, self.model, self.body, self.tokenizer = kind, request_id, model, body, tokenizer
        self.created = int(time.time())
        self.stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        self.choices: list[Choice] = []
        self.pending: list[RequestUpdate] = []  # read by start(), not yet handed to a choice
        self.chat = kind.startswith("chat")

    def notes(self, num_prompts: int) -> dict:
        """The trace's notes for the next choice (its index only when there are several)."""
        notes: dict = {"http_request_id": self.id}
        return notes | {"choice": len(self.choices)} if num_prompts > 1 else notes

    def add_choice(self, handle: LoopRequest) -> None:
        detokenizer = IncrementalDetokenizer(self.tokenizer, self.stop)
        self.choices.append(Choice(len(self.choices), handle, detokenizer))

    def choice_of(self, update: RequestUpdate) -> Choice:
        return next(c for c in self.choices if c.handle is update.request)

    def abort(self, loop: EngineLoop) -> None:
        for choice in self.choices:
            if choice.finish_reason is None:
                loop.abort(choice.handle)

    async def start(self, updates: asyncio.Queue[RequestUpdate]) -> str:
        """Wait until every choice has its first update (kept for later); the error of one the
        engine rejected ('' if none): only then is the status line (200 or 400) known."""
        heard: set[int] = set()
        while len(heard) < len(self.choices):
            update = await updates.get()
            if update.finish_reason == REJECTED:
                self.choice_of(update).finish_reason = REJECTED
                return update.error
            heard.add(id(update.request))
            self.pending.append(update)
        return ""

    async def next_update(self, updates: asyncio.Queue[RequestUpdate]) -> RequestUpdate:
        return self.pending.pop(0) if self.pending else await updates.get()

    def unfinished(self) -> bool:
        return any(c.finish_reason is None for c in self.choices)

    async def collect(self, updates: asyncio.Queue[RequestUpdate]) -> list[Choice]:
        """Every choice to its end; those that failed."""
        while self.unfinished():
            update = await self.next_update(updates)
            self.choice_of(update).add(update)
        return [c for c in self.choices if c.failed]

    def usage(self) -> dict:
        prompt = sum(c.handle.num_prompt_tokens for c in self.choices)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self) -> dict:
        out = self.envelope([self.final_choice(c) for c in self.choices], chunk=False)
        out["usage"] = self.usage()
        return out

    def final_choice(self, choice: Choice) -> dict:
        if self.chat:
            body: dict = {"index": choice.index, "message": {"role": "assistant", "content": choice.text}}
        else:
            body = {"index": choice.index, "text": choice.text}
        body |= {"logprobs": None, "finish_reason": choice.finish_reason or "stop"}
        if self.body.return_token_ids:
            body |= {"prompt_token_ids": choice.handle.prompt_token_ids, "token_ids": choice.token_ids}
        return body

    def chunk(self, choice: Choice, text: str, finish_reason: str | None = None, ids: list[int] | None = None) -> str:
        body: dict[str, Any] = {"index": choice.index}
        if self.chat:
            body["delta"] = {"content": text} if finish_reason is None else {}
        else:
            body["text"] = text
        body |= {"logprobs": None, "finish_reason": finish_reason}
        if ids is not None:
            body["token_ids"] = ids
        return sse(self.envelope([body], chunk=True))

    def failure(self, choice: Choice) -> str:
        return f"the engine failed on this request: {choice.error or 'it could not be scheduled'}"

    async def stream(self, updates: asyncio.Queue[RequestUpdate], loop: EngineLoop) -> AsyncIterator[str]:
        finished = False
        try:
            if self.chat:  # the role goes in the first chunk only
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                yield sse(self.envelope([role | {"finish_reason": None}], chunk=True))
            failed: Choice | None = None
            while self.unfinished():
                update = await self.next_update(updates)
                choice = self.choice_of(update)
                delta = choice.add(update)
                if choice.failed:
                    failed = choice
                    break
                ids = update.new_token_ids if self.body.return_token_ids else None
                if delta or ids:
                    yield self.chunk(choice, delta, ids=ids)
                if update.finished:
                    yield self.chunk(choice, "", update.finish_reason)
            if failed is not None:  # the others end too: one error for the whole response
                yield sse(error_body(self.failure(failed), "server_error", code="engine_error"))
                self.abort(loop)
            elif self.body.include_usage:
                yield sse(self.envelope([], chunk=True) | {"usage": self.usage()})
            finished = True
            yield DONE
        finally:
            if not finished:  # the client went away (the stream was cancelled): free the blocks
                self.abort(loop)
