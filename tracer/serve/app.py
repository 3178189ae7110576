"""The FastAPI app: OpenAI's /v1/completions and /v1/chat/completions (streaming over SSE, or one
JSON body), /v1/models and /health, on an EngineLoop; vLLM's /tokenize, /detokenize,
/tokenizer_info, /version and /metrics are in tools.py. Structured output (response_format, guided_*)
is compiled in structured.py and rides on each choice's SamplingParams as a logits processor.

Each request is checked in its own context before the engine thread sees it: the body read up to
a size limit (413 past it), parsed, and its prompt tokenized and checked (LLMEngine.input_processor.check_request)
in a worker thread, so a huge or bad request is a 4xx for its client alone and never stalls the
other streams. The loop is handed the checked token ids.

A beam search (vLLM's use_beam_search) is answered whole at its end (beams.py), as vLLM answers it.

Each request gets an asyncio queue; the loop thread's update callback counts it in the metrics and
hands it over with call_soon_threadsafe (reply.py builds the response from it). A client that goes away (mid-stream, or while waiting for a whole body) has
its request aborted: its blocks are freed in the next step and the trace shows the abort.

With an API key every route but /health wants `Authorization: Bearer KEY` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from nanoengine.engine import child_params
from nanoengine.loading.validation import first_line
from tracer.loop.engine_loop import EngineLoop, LoopRequest, RequestUpdate
from tracer.serve.beams import BeamSearches
from tracer.serve.chat import render_chat
from tracer.serve.metrics import CONTENT_TYPE, ServerMetrics
from tracer.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    RequestError,
    Sampling,
    TokenizeRequest,
    param_named_in,
    parse_body,
)
from tracer.serve.reply import Reply, error_body
from tracer.serve.structured import GrammarMask, StructuredOutput
from tracer.serve.tools import detokenize, tokenize, tokenizer_info, version

if TYPE_CHECKING:
    from nanoengine.beam_search import BeamSearchParams
    from nanoengine.engine import LLMEngine
    from nanoengine.sampling_params import SamplingParams

# 4 MiB: far more than any prompt nanoengine can run (128k tokens of text is about 0.5 MB, as JSON
# token ids about 1 MB), far less than a body that costs the server real memory or time to parse.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it


@dataclass(slots=True)
class ServedModel:
    name: str  # the id in /v1/models; requests name it (or one of the aliases) in "model"
    tokenizer: Any
    max_model_len: int
    aliases: tuple[str, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))


def error_response(e: RequestError) -> JSONResponse:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return JSONResponse(error_body(e.message, kind, e.param, e.code), status_code=e.status)


def build_app(
    loop: EngineLoop,
    served: ServedModel,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    api_key: str | None = None,
    metrics: ServerMetrics | None = None,
) -> FastAPI:
    """metrics: already watching loop's engine (Server does it before the loop starts); else one is made here."""
    if metrics is None:
        metrics = ServerMetrics(served.name)
        loop.call(metrics.watch)
    structured = StructuredOutput(served.tokenizer, loop.engine.vocab_size, loop.engine.eos_token_ids)
    beams = BeamSearches(loop, metrics)
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
        prompts = completion_prompts(body.prompt)
        max_tokens = checked_max_tokens(body.max_tokens, served)
        echo_only = max_tokens == 0  # the engine makes at least one token: the reply drops it
        return await answer(request, body, lambda: prompts, max(max_tokens, 1), "text_completion", "cmpl", echo_only)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = parse_body(await read_body(request, max_body_bytes), ChatCompletionRequest)
        check_model(body.model, served)
        max_tokens = checked_max_tokens(body.max_completion_tokens or body.max_tokens, served)
        return await answer(
            request,
            body,
            lambda: [render_chat(served.tokenizer, body.messages)],
            max_tokens,
            "chat.completion",
            "chatcmpl",
        )

    async def answer(
        request: Request,
        body: Sampling,
        make_prompts: Any,
        max_tokens: int,
        kind: str,
        prefix: str,
        echo_only: bool = False,
    ) -> Any:
        """make_prompts() -> the prompts, n choices each; it runs in a worker thread with the check
        (a chat template may be slow)."""
        reply = Reply(kind, f"{prefix}-{uuid.uuid4().hex}", served.name, body, served.tokenizer, echo_only)
        param = "messages" if kind.startswith("chat") else "prompt"
        if body.use_beam_search:
            return await answer_beams(request, body, make_prompts, max_tokens, reply, param)
        params = body.sampling_params(max_tokens)
        grammar = body.grammar()
        checked = await asyncio.to_thread(checked_prompts, loop.engine, make_prompts, params, param)
        compiled = await asyncio.to_thread(structured.compile, grammar) if grammar is not None else None
        aio = asyncio.get_running_loop()
        updates: asyncio.Queue[RequestUpdate] = asyncio.Queue()

        def on_update(update: RequestUpdate) -> None:  # in the loop thread
            metrics.on_update(update)
            aio.call_soon_threadsafe(updates.put_nowait, update)

        for prompt, token_ids in checked:
            for j in range(params.n):
                own = child_params(params, j)  # the engine's own rule: n 1, seeded seed + j
                own = own if compiled is None else with_mask(own, structured.mask(compiled))
                handle = loop.add(prompt, own, on_update, reply.notes(len(checked) * params.n), token_ids)
                reply.add_choice(handle, first_of_prompt=j == 0)
        rejected = await unless_disconnected(request, reply.start(updates), lambda: reply.abort(loop))
        if rejected is None:
            return Response(status_code=CLIENT_CLOSED)
        if rejected:
            reply.abort(loop)
            raise RequestError(rejected, param)
        if body.stream:
            return StreamingResponse(reply.stream(updates, loop), media_type="text/event-stream")
        done = await unless_disconnected(request, reply.collect(updates), lambda: reply.abort(loop))
        if done is None:
            return Response(status_code=CLIENT_CLOSED)
        if done:  # the choices that failed
            raise RequestError(reply.failure(done[0]), code="engine_error", status=500)
        return JSONResponse(reply.whole())

    async def answer_beams(
        request: Request, body: Sampling, make_prompts: Any, max_tokens: int, reply: Reply, param: str
    ) -> Any:
        """A beam search per prompt, n beams each; its hypotheses are the choices, best first."""
        if reply.echo_only:
            raise RequestError("a beam search makes at least one token: send max_tokens >= 1", "max_tokens")
        params = body.beam_search_params(max_tokens)
        checked = await asyncio.to_thread(checked_prompts, loop.engine, make_prompts, params, param)
        several = len(checked) > 1
        handles = [
            LoopRequest(prompt, params, ignore, reply.notes(1) | ({"prompt": i} if several else {}), token_ids)
            for i, (prompt, token_ids) in enumerate(checked)
        ]
        try:
            results = await unless_disconnected(request, beams.run(handles), lambda: beams.abort(handles))
        except ValueError as e:  # the engine refused one: none of them runs
            raise RequestError(str(e), param_named_in(str(e)) or param) from None
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        failed = next((r.error for r in results if r.error), "")
        if failed:
            raise RequestError(f"the engine failed on this request: {failed}", code="engine_error", status=500)
        for result in results:
            reply.add_hypotheses(result)
        if body.stream:  # vLLM streams a beam search too: all of it at its end
            return StreamingResponse(reply.stream_whole(), media_type="text/event-stream")
        return JSONResponse(reply.whole())

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        body = parse_body(await read_body(request, max_body_bytes), TokenizeRequest)
        check_model(body.model or served.name, served)
        return JSONResponse(await asyncio.to_thread(tokenize, body, served.tokenizer, served.max_model_len))

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> JSONResponse:
        body = parse_body(await read_body(request, max_body_bytes), DetokenizeRequest)
        check_model(body.model or served.name, served)
        return JSONResponse(await asyncio.to_thread(detokenize, body, served.tokenizer, loop.engine.vocab_size))

    @app.get("/tokenizer_info")
    async def tokenizer_info_route() -> JSONResponse:
        return JSONResponse(tokenizer_info(served.tokenizer, served.max_model_len))

    @app.get("/version")
    async def version_route() -> JSONResponse:
        return JSONResponse(version())

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


async def unless_disconnected(request: Request, waiting: Any, on_gone: Any) -> Any:
    """Await `waiting` (its result), unless the client disconnects first: then on_gone() and None."""
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


def checked_prompts(
    engine: LLMEngine, make_prompts: Any, params: SamplingParams | BeamSearchParams, param: str
) -> list[tuple[str | list[int], list[int]]]:
    """In a worker thread: each prompt and its token ids, checked as add_request checks them; a
    RequestError (400) saying why not. A list of ids is measured before each id is checked."""
    prompts = make_prompts()
    checked = []
    for i, prompt in enumerate(prompts):
        which = f"prompt {i}: " if len(prompts) > 1 else ""
        limit = engine.scheduler.max_model_len
        if isinstance(prompt, list) and len(prompt) >= limit:
            raise RequestError(
                f"{which}prompt is {len(prompt)} tokens, but max_model_len is {limit}: shorten it", param
            )
        try:
            checked.append((prompt, engine.input_processor.check_request(prompt, params)[0]))
        except ValueError as e:  # about the prompt, or a sampling field checked against the vocabulary
            raise RequestError(f"{which}{e}", param_named_in(str(e)) or param) from None
        except Exception as e:  # e.g. a tokenizer's TypeError on text it cannot read: this request only
            raise RequestError(f"{which}the prompt could not be tokenized ({first_line(e)})", param) from None
    return checked


def ignore(update: RequestUpdate) -> None:
    """A beam request's updates: it is answered from its result (beams.py), not token by token."""


def with_mask(params: SamplingParams, mask: GrammarMask) -> SamplingParams:
    """The request's params with its own grammar mask (a mask follows one sequence)."""
    return replace(params, logits_processors=[*params.logits_processors, mask])


def completion_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a completions request, one choice each: a string or a list of token ids is one."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise RequestError("empty prompt: send a string, a list of strings, token ids or token-id lists", "prompt")
    if isinstance(prompt[0], int):
        return [prompt]  # type: ignore[list-item]
    return list(prompt)  # type: ignore[arg-type]


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
