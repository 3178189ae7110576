"""The FastAPI app: OpenAI's /v1/completions and /v1/chat/completions (streaming over SSE, or one
JSON body), /v1/models and /health, on an EngineLoop.

Each request is checked in its own context before the engine thread sees it: the body read up to
a size limit (413 past it), parsed, and its prompt tokenized and checked (LLMEngine.check_request)
in a worker thread, so a huge or bad request is a 4xx for its client alone and never stalls the
other streams. The loop is handed the checked token ids.

Each request gets an asyncio queue; the loop thread's update callback hands it over with
call_soon_threadsafe. A client that goes away (mid-stream, or while waiting for a whole body) has
its request aborted: its blocks are freed in the next step and the trace shows the abort.

With an API key every route but /health wants `Authorization: Bearer KEY` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from nanoengine.sequence import FinishReason
from nanoengine.validation import first_line
from tracer.loop.engine_loop import REJECTED, EngineLoop, LoopRequest, RequestUpdate
from tracer.serve.detokenize import IncrementalDetokenizer
from tracer.serve.protocol import ChatCompletionRequest, CompletionRequest, RequestError, Sampling, parse_body

if TYPE_CHECKING:
    from nanoengine.engine import LLMEngine
    from nanoengine.sampling_params import SamplingParams

DONE = "data: [DONE]\n\n"
# 4 MiB: far more than any prompt nanoengine can run (128k tokens of text is about 0.5 MB, as JSON
# token ids about 1 MB), far less than a body that costs the server real memory or time to parse.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it
FAILED = (FinishReason.ERROR.value, FinishReason.IGNORED.value)  # finish reasons the client gets as an error


@dataclass(slots=True)
class ServedModel:
    name: str  # the id in /v1/models; requests name it (or one of the aliases) in "model"
    tokenizer: Any
    max_model_len: int
    aliases: tuple[str, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: RequestError) -> JSONResponse:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return JSONResponse(error_body(e.message, kind, e.param, e.code), status_code=e.status)


def build_app(
    loop: EngineLoop, served: ServedModel, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None
) -> FastAPI:
    app = FastAPI(title="nanoengine", docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(app)
    if api_key:
        app.add_middleware(RequireKey, key=api_key)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not loop.thread.is_alive():
            return JSONResponse(error_body("the engine loop has stopped", "server_error"), status_code=503)
        failed = getattr(loop.recorder, "failed", None)
        if failed is not None:  # serving goes on without its trace
            return JSONResponse({"status": "ok", "trace": f"recording stopped: {failed}"})
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {
            "id": served.name,
            "object": "model",
            "created": served.created,
            "owned_by": "nanoengine",
            "max_model_len": served.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = parse_body(await read_body(request, max_body_bytes), CompletionRequest)
        check_model(body.model, served)
        prompt = completion_prompt(body.prompt)
        max_tokens = checked_max_tokens(body.max_tokens, served)
        return await answer(request, body, lambda: prompt, max_tokens, "text_completion", "cmpl")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = parse_body(await read_body(request, max_body_bytes), ChatCompletionRequest)
        check_model(body.model, served)
        max_tokens = checked_max_tokens(body.max_completion_tokens or body.max_tokens, served)
        return await answer(
            request,
            body,
            lambda: render_chat(served.tokenizer, body.messages),
            max_tokens,
            "chat.completion",
            "chatcmpl",
        )

    async def answer(
        request: Request, body: Sampling, make_prompt: Any, max_tokens: int, kind: str, prefix: str
    ) -> Any:
        """make_prompt() -> the prompt; it runs in a worker thread with the check (a chat template may be slow)."""
        if body.n != 1:
            raise RequestError(
                f"n must be 1 (got {body.n}): nanoengine returns one choice per request; send n requests", "n"
            )
        reply = Reply(kind, f"{prefix}-{uuid.uuid4().hex}", served.name, body, served.tokenizer)
        params = body.sampling_params(max_tokens)
        param = "messages" if kind.startswith("chat") else "prompt"
        prompt, token_ids = await asyncio.to_thread(checked_prompt, loop.engine, make_prompt, params, param)
        aio = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        on_update = lambda u: aio.call_soon_threadsafe(queue.put_nowait, u)  # noqa: E731
        handle = loop.add(prompt, params, on_update, reply.notes(), token_ids)
        first = await unless_disconnected(request, queue.get(), lambda: loop.abort(handle))
        if first is None:
            return Response(status_code=CLIENT_CLOSED)
        if first.finish_reason == REJECTED:
            raise RequestError(first.error, param)
        if body.stream:
            return StreamingResponse(reply.stream(first, queue, loop, handle), media_type="text/event-stream")
        last = await unless_disconnected(request, reply.collect(first, queue), lambda: loop.abort(handle))
        if last is None:
            return Response(status_code=CLIENT_CLOSED)
        if last.finish_reason in FAILED:
            raise RequestError(reply.failure(last), code="engine_error", status=500)
        return JSONResponse(reply.whole(handle, last.finish_reason or "stop"))

    return app


class Reply:
    """One response being built: its id, the text so far, and its chunks or final body."""

    def __init__(self, kind: str, request_id: str, model: str, body: Sampling, tokenizer: Any) -> None:
        self.kind, self.id, self.model, self.body = kind, request_id, model, body
        self.created = int(time.time())
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        self.detokenizer = IncrementalDetokenizer(tokenizer, stop)
        self.text = ""
        self.token_ids: list[int] = []

    def notes(self) -> dict:
        return {"http_request_id": self.id}

    def add(self, update: RequestUpdate) -> str:
        """The text this update adds (the engine's final text decides the end)."""
        self.token_ids += update.new_token_ids
        final = update.text if update.finished and update.finish_reason not in FAILED else None
        delta = self.detokenizer.delta(update.new_token_ids, final)
        self.text += delta
        return delta

    def failure(self, update: RequestUpdate) -> str:
        why = update.error or "it could not be scheduled"
        return f"the engine failed on this request: {why}"

    def usage(self, handle: LoopRequest) -> dict:
        n = len(self.token_ids)
        return {
            "prompt_tokens": handle.num_prompt_tokens,
            "completion_tokens": n,
            "total_tokens": handle.num_prompt_tokens + n,
        }

    def choice(self, text: str, finish_reason: str | None, final: bool) -> dict:
        if self.kind == "chat.completion":
            key = "message" if final else "delta"
            choice: dict = {"index": 0, key: {"role": "assistant", "content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        return choice

    def envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.kind.startswith("chat") else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, handle: LoopRequest, finish_reason: str) -> dict:
        out = self.envelope([self.choice(self.text, finish_reason, final=True)], chunk=False)
        out["usage"] = self.usage(handle)
        if self.body.return_token_ids:
            out["choices"][0]["prompt_token_ids"] = handle.prompt_token_ids
            out["choices"][0]["token_ids"] = self.token_ids
        return out

    def chunk(self, text: str, finish_reason: str | None = None, token_ids: list[int] | None = None) -> str:
        choice: dict[str, Any] = {"index": 0}
        if self.kind.startswith("chat"):
            choice["delta"] = {"content": text} if finish_reason is None else {}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return sse(self.envelope([choice], chunk=True))

    async def collect(self, first: RequestUpdate, queue: asyncio.Queue[RequestUpdate]) -> RequestUpdate:
        update = first
        while not update.finished:
            self.add(update)
            update = await queue.get()
        self.add(update)
        return update

    async def stream(
        self, first: RequestUpdate, queue: asyncio.Queue[RequestUpdate], loop: EngineLoop, handle: LoopRequest
    ) -> AsyncIterator[str]:
        update, finished = first, False
        try:
            if self.kind.startswith("chat"):  # the role goes in the first chunk only
                role = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield sse(self.envelope([role], chunk=True))
            while True:
                delta = self.add(update)
                if update.finish_reason in FAILED:
                    yield sse(error_body(self.failure(update), "server_error", code="engine_error"))
                    break
                ids = update.new_token_ids if self.body.return_token_ids else None
                if delta or ids:
                    yield self.chunk(delta, token_ids=ids)
                if update.finished:
                    yield self.chunk("", update.finish_reason)
                    if self.body.include_usage:
                        usage = self.envelope([], chunk=True)
                        usage["usage"] = self.usage(handle)
                        yield sse(usage)
                    break
                update = await queue.get()
            finished = True
            yield DONE
        finally:
            if not finished:  # the client went away (the stream was cancelled): free its blocks
                loop.abort(handle)


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


async def unless_disconnected(request: Request, waiting: Any, on_gone: Any) -> RequestUpdate | None:
    """Await `waiting`, unless the client disconnects first: then on_gone() and None."""
    work = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(disconnected(request))
    done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        gone.cancel()
        return work.result()
    work.cancel()
    on_gone()
    return None


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to be longer than limit (before it is all read)."""
    too_long = RequestError(
        f"the request body is larger than this server's limit of {limit:,} bytes (serve --max-body-mb)",
        code="request_too_large",
        status=413,
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def checked_prompt(
    engine: LLMEngine, make_prompt: Any, params: SamplingParams, param: str
) -> tuple[str | list[int], list[int]]:
    """In a worker thread: the prompt and its token ids, checked as add_request checks them; a
    RequestError (400) saying why not. A list of ids is measured before each id is checked."""
    prompt = make_prompt()
    limit = engine.scheduler.max_model_len
    if isinstance(prompt, list) and len(prompt) >= limit:
        raise RequestError(f"prompt is {len(prompt)} tokens, but max_model_len is {limit}: shorten it", param)
    try:
        return prompt, engine.check_request(prompt, params)
    except ValueError as e:
        raise RequestError(str(e), param) from None
    except Exception as e:  # e.g. a tokenizer's TypeError on text it cannot read: this request only
        raise RequestError(f"the prompt could not be tokenized ({first_line(e)})", param) from None


def completion_prompt(prompt: str | list[int] | list[str]) -> str | list[int]:
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise RequestError(f"one prompt per request (got {len(prompt)}): send them as separate requests", "prompt")
        return str(prompt[0])
    return prompt  # type: ignore[return-value]


def checked_max_tokens(max_tokens: int | None, served: ServedModel) -> int:
    if max_tokens is None:
        return served.max_model_len  # as many as fit: the engine stops at max_model_len
    if max_tokens > served.max_model_len:
        raise RequestError(
            f"max_tokens is {max_tokens}, but the model's context is {served.max_model_len} tokens "
            f"(max_model_len): ask for fewer",
            "max_tokens",
        )
    return max_tokens


def check_model(name: str, served: ServedModel) -> None:
    if name != served.name and name not in served.aliases:
        raise RequestError(
            f"model {name!r} is not served here; this server serves {served.name!r} (GET /v1/models)",
            "model",
            "model_not_found",
            status=404,
        )


def render_chat(tokenizer: Any, messages: list) -> str:
    """The conversation through the model's chat template, ready for the assistant's turn. A model
    without one (the tiny model) gets 'role: content' lines."""
    conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant:"
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # the template itself refuses (e.g. roles out of order)
        raise RequestError(f"the chat template refused these messages: {e}", "messages") from None


def add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI error body; never a traceback."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(RequestError(str(e.errors()[0].get("msg", e))))

    app.add_middleware(NeverCrash)


class RequireKey:
    """Every route but /health wants `Authorization: Bearer KEY`; a 401 OpenAI error body otherwise."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not self.allowed(scope):
            message = "a valid API key is needed: send the header `Authorization: Bearer KEY`"
            body = error_body(message, "invalid_request_error", code="invalid_api_key")
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def allowed(self, scope: Any) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)  # in constant time: no guessing it byte by byte


class NeverCrash:
    """An unexpected exception in a handler (a bug) becomes a 500 OpenAI error body and one line on
    stderr, never a traceback; the server goes on serving the other clients."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def watched_send(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as e:
            what = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            print(f"nanoengine serve: internal error on {scope.get('path')}: {what}", file=sys.stderr, flush=True)
            if not started:
                body = error_body(f"internal error ({what}); the server goes on serving", "server_error")
                await JSONResponse(body, status_code=500)(scope, receive, send)
