"""One response being built: its choices (n per prompt), their text so far, and its chunks or its
final body, in OpenAI's shapes.

A completions request with several prompts (a list of strings, or of token-id lists), or with
n > 1, is one engine request per choice, indexed as OpenAI's API does (prompt i's j-th sample is
choice i * n + j); sample j is seeded seed + j, vLLM v1's rule, its front end fans n out the same
way. All their updates come through one asyncio queue (update.request says whose), so a stream
interleaves the choices in the order the engine produced their tokens.

A beam search (beams.py) is one engine request per prompt whose hypotheses, best first, are that
prompt's n choices; they come whole at its end, and a stream sends each in one chunk (as vLLM does).

Logprobs ride on the updates (logprobs.py writes them in OpenAI's shapes). With echo (completions)
a choice's text and logprobs start with its prompt's; max_tokens 0 with echo runs one token, as the
engine makes at least one, and returns the prompt alone (what lm-eval's loglikelihood may send).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import FinishReason, TopLogprobs
from tracer.loop.engine_loop import REJECTED, EngineLoop, LoopRequest, RequestUpdate
from tracer.serve.beams import BeamResult
from tracer.serve.detokenize import IncrementalDetokenizer
from tracer.serve.logprobs import TokenTexts, chat_logprobs, legacy_logprobs, prompt_logprobs_entries
from tracer.serve.protocol import Sampling

DONE = "data: [DONE]\n\n"
FAILED = (FinishReason.ERROR.value, FinishReason.IGNORED.value)  # finish reasons the client gets as an error


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


@dataclass(slots=True, eq=False)
class Choice:
    """One engine request (a prompt's j-th sample) and its output so far."""

    index: int
    handle: LoopRequest
    detokenizer: IncrementalDetokenizer
    first_of_prompt: bool = True  # its prompt is counted in usage once, by sample 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TopLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TopLogprobs | None] | None = None
    finish_reason: str | None = None
    error: str = ""
    heard: bool = False  # has had an update (a stream echoes the prompt before the first)
    text_offset: int = 0  # where the next streamed token's text starts (the legacy logprobs' text_offset)

    def add(self, update: RequestUpdate, keep_tokens: bool = True) -> str:
        """The text this update adds (the engine's final text decides the end). keep_tokens False:
        max_tokens 0 with echo, the token the engine had to make is dropped."""
        self.heard = True
        if update.prompt_logprobs is not None:
            self.prompt_logprobs = update.prompt_logprobs
        self.finish_reason, self.error = update.finish_reason, update.error
        if not keep_tokens:
            return ""
        self.token_ids += update.new_token_ids
        self.logprobs += update.logprobs
        final = update.text if update.finished and update.finish_reason not in FAILED else None
        delta = self.detokenizer.delta(update.new_token_ids, final)
        self.text += delta
        return delta

    @property
    def failed(self) -> bool:
        return self.finish_reason in FAILED


class Reply:
    def __init__(
        self, kind: str, request_id: str, model: str, body: Sampling, tokenizer: Any, echo_only: bool = False
    ) -> None:
        """echo_only: max_tokens 0 with echo, the prompt alone."""
        self.kind, self.id, self.model, self.body, self.tokenizer = kind, request_id, model, body, tokenizer
        self.created = int(time.time())
        self.stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        self.choices: list[Choice] = []
        self.pending: list[RequestUpdate] = []  # read by start(), not yet handed to a choice
        self.chat = kind.startswith("chat")
        self.k = body.sampled_logprobs()  # None: no logprobs asked for
        self.echo = bool(getattr(body, "echo", False))
        self.echo_only = echo_only
        self.token_text = TokenTexts(tokenizer)

    def notes(self, num_choices: int) -> dict:
        """The trace's notes for the next choice (its index only when there are several)."""
        notes: dict = {"http_request_id": self.id}
        return notes | {"choice": len(self.choices)} if num_choices > 1 else notes

    def add_choice(self, handle: LoopRequest, first_of_prompt: bool = True) -> None:
        detokenizer = IncrementalDetokenizer(self.tokenizer, self.stop)
        self.choices.append(Choice(len(self.choices), handle, detokenizer, first_of_prompt))

    def add_hypotheses(self, result: BeamResult) -> None:
        """A beam search's hypotheses as choices, best first; its prompt is counted once, by the first.
        Each token keeps the k likeliest the request asked for (a beam has the 2 * n likeliest)."""
        for j, hypothesis in enumerate(result.hypotheses):
            self.add_choice(result.request, first_of_prompt=j == 0)
            choice = self.choices[-1]
            choice.token_ids, choice.text = list(hypothesis.token_ids), hypothesis.text
            choice.finish_reason, choice.heard = hypothesis.finish_reason, True
            if self.k is not None:
                pairs = zip(hypothesis.token_ids, hypothesis.logprobs)
                choice.logprobs = [likeliest(entry, token, self.k) for token, entry in pairs]

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
            self.choice_of(update).add(update, keep_tokens=not self.echo_only)
        return [c for c in self.choices if c.failed]

    def usage(self) -> dict:
        prompt = sum(c.handle.num_prompt_tokens for c in self.choices if c.first_of_prompt)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self) -> dict:
        out = self.envelope([self.final_choice(c) for c in self.choices], chunk=False)
        if self.chat and self.body.prompt_logprobs is not None and self.choices:  # vLLM: once, beside choices
            out["prompt_logprobs"] = self.prompt_logprobs(self.choices[0])
        out["usage"] = self.usage()
        return out

    def final_choice(self, choice: Choice) -> dict:
        if self.chat:
            body: dict = {"index": choice.index, "message": {"role": "assistant", "content": choice.text}}
            logprobs = self.chat_logprobs(choice, choice.token_ids, choice.logprobs)
        else:
            echoed = self.prompt_text(choice) if self.echo else ""
            body = {"index": choice.index, "text": echoed + choice.text}
            ids = choice.token_ids
            entries: list[TopLogprobs | None] = list(choice.logprobs)
            if self.echo:
                ids, entries = choice.handle.prompt_token_ids + ids, self.prompt_entries(choice) + entries
            logprobs = legacy_logprobs(ids, entries, self.token_text) if self.k is not None else None
        body |= {"logprobs": logprobs, "finish_reason": choice.finish_reason or "stop"}
        if not self.chat and self.body.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs(choice)
        if self.body.return_token_ids:
            body |= {"prompt_token_ids": choice.handle.prompt_token_ids, "token_ids": choice.token_ids}
        return body

    def prompt_text(self, choice: Choice) -> str:
        prompt = choice.handle.prompt
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt, skip_special_tokens=True)

    def prompt_entries(self, choice: Choice) -> list[TopLogprobs | None]:
        """The prompt's logprob entries, None for the first token (and for all, without logprobs)."""
        entries = list(choice.prompt_logprobs or [])
        return entries + [None] * (len(choice.handle.prompt_token_ids) - len(entries))

    def prompt_logprobs(self, choice: Choice) -> list[dict | None]:
        return prompt_logprobs_entries(self.prompt_entries(choice), self.token_text)

    def chat_logprobs(self, choice: Choice, ids: list[int], entries: list[TopLogprobs]) -> dict | None:
        if self.k is None:
            return None
        return chat_logprobs(ids, entries, self.token_text, self.k)

    def streamed_logprobs(self, choice: Choice, ids: list[int], entries: list[TopLogprobs | None]) -> dict | None:
        """A chunk's logprobs: its tokens', the legacy ones continuing the choice's text offsets."""
        if self.k is None or not ids:
            return None
        if self.chat:
            return chat_logprobs(ids, entries, self.token_text, self.k)  # type: ignore[arg-type]
        out = legacy_logprobs(ids, entries, self.token_text, choice.text_offset)
        choice.text_offset += sum(len(t) for t in out["tokens"])
        return out

    def chunk(
        self,
        choice: Choice,
        text: str,
        finish_reason: str | None = None,
        ids: list[int] | None = None,
        logprobs: dict | None = None,
    ) -> str:
        body: dict[str, Any] = {"index": choice.index}
        if self.chat:
            body["delta"] = {"content": text} if finish_reason is None else {}
        else:
            body["text"] = text
        body |= {"logprobs": logprobs, "finish_reason": finish_reason}
        if ids is not None:
            body["token_ids"] = ids
        return sse(self.envelope([body], chunk=True))

    def role_chunk(self, choice: Choice) -> str:
        role = {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return sse(self.envelope([role | {"finish_reason": None}], chunk=True))

    def echo_chunk(self, choice: Choice) -> str:
        """A completions stream's first chunk of a choice with echo: its prompt (and its logprobs)."""
        ids = choice.handle.prompt_token_ids
        return self.chunk(
            choice, self.prompt_text(choice), logprobs=self.streamed_logprobs(choice, ids, self.prompt_entries(choice))
        )

    def failure(self, choice: Choice) -> str:
        return f"the engine failed on this request: {choice.error or 'it could not be scheduled'}"

    async def stream(self, updates: asyncio.Queue[RequestUpdate], loop: EngineLoop) -> AsyncIterator[str]:
        finished = False
        try:
            if self.chat:  # the role goes in each choice's first chunk only
                for choice in self.choices:
                    yield self.role_chunk(choice)
            failed: Choice | None = None
            while self.unfinished():
                update = await self.next_update(updates)
                choice = self.choice_of(update)
                first = not choice.heard
                delta = choice.add(update, keep_tokens=not self.echo_only)
                if choice.failed:
                    failed = choice
                    break
                if first and self.echo:
                    yield self.echo_chunk(choice)
                kept = [] if self.echo_only else update.new_token_ids
                ids = kept if self.body.return_token_ids else None
                logprobs = self.streamed_logprobs(choice, kept, list(update.logprobs))
                if delta or ids or logprobs:
                    yield self.chunk(choice, delta, ids=ids, logprobs=logprobs)
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

    async def stream_whole(self) -> AsyncIterator[str]:
        """Finished choices (a beam search's) as a stream: each in one chunk, then its finish."""
        for choice in self.choices:
            if self.chat:
                yield self.role_chunk(choice)
            if self.echo:
                yield self.echo_chunk(choice)
            ids = choice.token_ids if self.body.return_token_ids else None
            logprobs = self.streamed_logprobs(choice, choice.token_ids, list(choice.logprobs))
            yield self.chunk(choice, choice.text, ids=ids, logprobs=logprobs)
            yield self.chunk(choice, "", choice.finish_reason)
        if self.body.include_usage:
            yield sse(self.envelope([], chunk=True) | {"usage": self.usage()})
        yield DONE


def likeliest(entry: TopLogprobs, token_id: int, k: int) -> TopLogprobs:
    """The entry's token and its k likeliest."""
    return {t: lp for t, lp in entry.items() if t == token_id or lp.rank <= k}
