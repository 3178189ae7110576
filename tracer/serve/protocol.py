"""The OpenAI request bodies the server accepts, and their sampling parameters.

Parameters nanoengine does not implement are refused by name (400), never silently ignored, and
values are taken as their JSON type says (strict): `max_tokens: true` or `"temperature": "0.5"` is
a 400, never converted. Extensions, as vLLM spells them: top_k (-1 or 0: off), ignore_eos,
return_token_ids.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nanoengine.sampling_params import MAX_SEED, SamplingParams


class RequestError(ValueError):
    """A request the server refuses: an OpenAI error body with this status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


STRICT = ConfigDict(extra="forbid", strict=True)
PARAM_NAMES = [f.name for f in fields(SamplingParams)]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = STRICT
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)  # extension; 0 or -1 (vLLM's) = off
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension
    return_token_ids: bool = False  # extension: the prompt's and the completion's token ids

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            return SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=max_tokens,
                seed=self.seed,
                ignore_eos=self.ignore_eos,
                stop=stop,
            )
        except ValueError as e:
            raise RequestError(str(e), param=param_named_in(str(e))) from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # the legacy API's default


def param_named_in(message: str) -> str | None:
    """Which parameter a SamplingParams message is about ('top_p must be ...', 'a stop string holds ...')."""
    return next((name for name in PARAM_NAMES if name in message.split()[:3]), "stop" if "stop" in message else None)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def parse_body(raw: bytes, model_class: type[Sampling]) -> Any:
    """The request body as model_class; a RequestError that names what is wrong otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not UTF-8 (byte {e.start}): send JSON encoded as UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request body is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise RequestError("the request body is nested too deep: send a flat OpenAI request object") from None
    except ValueError:  # Python refuses to convert an integer this long (a guard against slow parsing)
        limit = sys.get_int_max_str_digits()
        raise RequestError(f"the request body holds a number with more than {limit:,} digits") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return model_class.model_validate(data)
    except RecursionError:
        raise RequestError("the request body is nested too deep: send a flat OpenAI request object") from None
    except ValidationError as e:
        raise describe(e.errors()[0]) from None


def describe(error: Any) -> RequestError:
    """One pydantic error as an OpenAI one: which parameter, and what to send instead."""
    loc = [str(part) for part in error["loc"] if not is_union_tag(str(part))]
    param = ".".join(loc) or None
    if error["type"] == "extra_forbidden":
        return RequestError(f"unsupported parameter {param!r}: nanoengine does not implement it", param)
    if error["type"] == "missing":
        return RequestError(f"missing required parameter {param!r}", param)
    return RequestError(f"invalid {param!r}: {error['msg']}", param)


def is_union_tag(part: str) -> bool:
    """pydantic names the member of a union it tried ('str', 'list[int]') in an error's location."""
    return "[" in part or part in ("str", "int", "float", "bool", "list") or part.startswith("function-")
