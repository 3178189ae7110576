"""The OpenAI request bodies the server accepts, and their sampling parameters.

Values are taken as their JSON type says (strict): `max_tokens: true` or `"temperature": "0.5"` is
a 400, never converted. A top-level `null` means "left out" (the default), as in OpenAI's API.

Every field a client may send is in one of three places:
- declared on the models below: implemented (the sampler's fields carry vLLM's names and ranges);
- KNOWN_FIELDS: known to OpenAI or vLLM but not implemented. Bookkeeping fields (`user`, `store`,
  ...) change no output and are accepted as they are; the others are accepted at their neutral
  value only (`suffix: ""`, `best_of` equal to `n`, ...) and refused by name
  otherwise, never silently ignored;
- nowhere: unknown, refused by name.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nanoengine.beam_search import BeamSearchParams
from nanoengine.loading.validation import MAX_BEAM_WIDTH, MAX_LOGPROBS, MAX_SEED
from nanoengine.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request the server refuses: an OpenAI error body with this status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


STRICT = ConfigDict(extra="forbid", strict=True)
PARAM_NAMES = [f.name for f in fields(SamplingParams)]
ANY = None  # a bookkeeping field: every value is accepted (and changes nothing)
SAME_AS_N = "same as n"  # best_of: neutral when it equals n


@dataclass(frozen=True, slots=True)
class KnownField:
    """A field known to OpenAI or vLLM that nanoengine does not implement."""

    endpoints: tuple[str, ...]  # "completions", "chat"
    neutral: tuple[Any, ...] | str | None  # the values that change nothing; ANY: bookkeeping


BOTH, COMPLETIONS, CHAT = ("completions", "chat"), ("completions",), ("chat",)
# Null is neutral for every one of them (it means "left out"); the values listed are the others.
KNOWN_FIELDS: dict[str, KnownField] = {
    # OpenAI: not implemented yet, neutral values only
    "top_logprobs": KnownField(COMPLETIONS, (0,)),  # chat's is implemented; completions has logprobs: k
    "echo": KnownField(CHAT, (False,)),  # vLLM's chat echo (the last message); completions' is implemented
    "best_of": KnownField(COMPLETIONS, SAME_AS_N),
    "suffix": KnownField(COMPLETIONS, ("",)),
    "tools": KnownField(CHAT, ()),
    "tool_choice": KnownField(CHAT, ("none",)),
    "functions": KnownField(CHAT, ()),
    "function_call": KnownField(CHAT, ("none",)),
    "modalities": KnownField(CHAT, (["text"],)),
    "audio": KnownField(CHAT, ()),
    "prediction": KnownField(CHAT, ()),
    "web_search_options": KnownField(CHAT, ()),
    "reasoning_effort": KnownField(CHAT, ()),
    "verbosity": KnownField(CHAT, ()),
    "stream_options.continuous_usage_stats": KnownField(BOTH, (False,)),
    # OpenAI: bookkeeping, accepted as sent
    "user": KnownField(BOTH, ANY),
    "store": KnownField(BOTH, ANY),
    "metadata": KnownField(BOTH, ANY),
    "service_tier": KnownField(BOTH, ANY),
    "prompt_cache_key": KnownField(BOTH, ANY),
    "safety_identifier": KnownField(BOTH, ANY),
    "parallel_tool_calls": KnownField(CHAT, ANY),  # without tools it changes nothing
    "stream_options.include_obfuscation": KnownField(BOTH, ANY),  # padding a client ignores
    # vLLM's extras: neutral values only
    "include_stop_str_in_output": KnownField(BOTH, (False,)),
    "skip_special_tokens": KnownField(BOTH, (True,)),  # nanoengine always skips them
    "spaces_between_special_tokens": KnownField(BOTH, (True,)),
    "truncate_prompt_tokens": KnownField(BOTH, ()),
    "allowed_token_ids": KnownField(BOTH, ()),
    "bad_words": KnownField(BOTH, ([],)),
    "logits_processors": KnownField(BOTH, ()),
    "return_tokens_as_token_ids": KnownField(BOTH, (False,)),
    "priority": KnownField(BOTH, (0,)),
    "add_generation_prompt": KnownField(CHAT, (True,)),
    "continue_final_message": KnownField(CHAT, (False,)),
    "chat_template": KnownField(CHAT, ()),
    "chat_template_kwargs": KnownField(CHAT, ({},)),
    "documents": KnownField(CHAT, ()),
    "kv_transfer_params": KnownField(BOTH, ()),
    "vllm_xargs": KnownField(BOTH, ()),
    # vLLM's bookkeeping
    "request_id": KnownField(BOTH, ANY),
    "cache_salt": KnownField(BOTH, ANY),
}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


@dataclass(frozen=True, slots=True)
class Grammar:
    """The structured output a request asks for (tracer/serve/structured.py compiles it). spec: a
    JSON schema (a dict; None for any JSON object), a regex, a list of strings, or an EBNF grammar
    (GBNF, as llama.cpp writes it)."""

    kind: Literal["json", "regex", "choice", "grammar"]
    spec: Any
    param: str  # the request field it came from, for error messages


class JsonSchemaFormat(BaseModel):
    """response_format's json_schema: OpenAI's shape (the schema itself under "schema")."""

    model_config = STRICT
    name: str = "response"  # OpenAI wants one; it changes nothing here
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: bool | None = None  # the schema is always followed exactly (xgrammar's strict mode)


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs "json_schema": {"name": ..., "schema": {...}}')
        return self


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: one of these."""

    model_config = STRICT
    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = STRICT
    ENDPOINT: ClassVar[str]
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)  # vLLM's; 0 or -1 = off
    min_p: float = 0.0  # vLLM's; this and the ones below are checked by SamplingParams
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's
    logit_bias: dict[str, float] = Field(default_factory=dict)  # OpenAI's: token ids as strings
    min_tokens: int = 0  # vLLM's
    stop_token_ids: list[int] = Field(default_factory=list)  # vLLM's
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    stop: str | list[str] | None = None
    n: int = 1  # each choice its own engine request, seeded seed + i (vLLM v1's fan-out)
    stream: bool = False
    stream_options: StreamOptions | None = None
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and the k likeliest
    ignore_eos: bool = False  # vLLM's
    return_token_ids: bool = False  # vLLM's: the prompt's and the completion's token ids
    # structured output (tracer/serve/structured.py): OpenAI's, then vLLM's older and newer extras
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's beam search: n beams, scored cum_logprob / length ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        if self.length_penalty != 1.0:
            raise RequestError(
                "length_penalty scores the beams of a beam search: send use_beam_search: true too, or leave it out",
                "length_penalty",
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            return SamplingParams(
                n=self.n,
                logprobs=self.sampled_logprobs(),
                prompt_logprobs=self.prompt_logprobs_asked(),
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=max_tokens,
                seed=self.seed,
                ignore_eos=self.ignore_eos,
                stop=stop,
                stop_token_ids=self.stop_token_ids,
                min_tokens=self.min_tokens,
                logit_bias=token_bias(self.logit_bias),
                repetition_penalty=self.repetition_penalty,
                frequency_penalty=self.frequency_penalty,
                presence_penalty=self.presence_penalty,
                min_p=self.min_p,
            )
        except ValueError as e:
            raise RequestError(str(e), param=param_named_in(str(e))) from None

    def beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        """vLLM's to_beam_search_params: n beams; a field a beam search would ignore is refused by name."""
        if not 1 <= self.n <= MAX_BEAM_WIDTH:
            raise RequestError(f"n is a beam search's width: send 1 to {MAX_BEAM_WIDTH}, got {self.n}", "n")
        check_beam_fields(self)
        try:
            return BeamSearchParams(
                beam_width=self.n,
                max_tokens=max_tokens,
                ignore_eos=self.ignore_eos,
                temperature=self.temperature,
                length_penalty=self.length_penalty,
            )
        except ValueError as e:
            raise RequestError(str(e), param_named_in(str(e))) from None

    def sampled_logprobs(self) -> int | None:
        """k for SamplingParams.logprobs: how many likeliest tokens each output token comes with."""
        return None

    def prompt_logprobs_asked(self) -> int | None:
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def grammar(self) -> Grammar | None:
        """The one grammar the request asks for, if any; a RequestError if it asks for several."""
        asked = [g for g in (*self.response_format_grammar(), *self.guided_grammars()) if g is not None]
        if len(asked) > 1:
            names = " and ".join(repr(g.param) for g in asked)
            raise RequestError(f"send one structured-output constraint, not several: got {names}", asked[1].param)
        return asked[0] if asked else None

    def response_format_grammar(self) -> list[Grammar | None]:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return []
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        return [Grammar("json", schema, "response_format")]

    def guided_grammars(self) -> list[Grammar | None]:
        so = self.structured_outputs or StructuredOutputs()
        return [
            json_grammar(self.guided_json, "guided_json"),
            Grammar("regex", self.guided_regex, "guided_regex") if self.guided_regex is not None else None,
            Grammar("choice", self.guided_choice, "guided_choice") if self.guided_choice is not None else None,
            Grammar("grammar", self.guided_grammar, "guided_grammar") if self.guided_grammar is not None else None,
            json_grammar(so.json_, "structured_outputs.json"),
            Grammar("regex", so.regex, "structured_outputs.regex") if so.regex is not None else None,
            Grammar("choice", so.choice, "structured_outputs.choice") if so.choice is not None else None,
            Grammar("grammar", so.grammar, "structured_outputs.grammar") if so.grammar is not None else None,
            Grammar("json", None, "structured_outputs.json_object") if so.json_object else None,
        ]


# What a beam search does not do (nanoengine's, as vLLM's, takes n, max_tokens, ignore_eos,
# temperature and length_penalty): these fields are accepted with it at these values only.
NOT_IN_BEAM_SEARCH: dict[str, tuple[Any, ...]] = {
    "top_p": (1.0,),
    "top_k": (0, -1),
    "min_p": (0.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "logit_bias": ({},),
    "min_tokens": (0,),
    "stop": (None, "", []),
    "stop_token_ids": ([],),
    "prompt_logprobs": (None,),
}


def check_beam_fields(body: Sampling) -> None:
    """A RequestError naming the first field a beam search would not honour."""
    for name, neutral in NOT_IN_BEAM_SEARCH.items():
        if getattr(body, name) not in neutral:
            raise RequestError(f"{name!r} does not apply to a beam search (use_beam_search): leave it out", name)
    if body.seed is not None and body.temperature > 0:
        raise RequestError("a beam search cannot be seeded: leave 'seed' out, or send temperature 0", "seed")
    grammar = body.grammar()
    if grammar is not None:
        raise RequestError(
            f"a beam search cannot follow structured output ({grammar.param!r}): leave it out", grammar.param
        )
    k, limit = body.sampled_logprobs(), 2 * body.n
    if k is not None and k > limit:  # each beam keeps its 2 * n likeliest tokens
        name = "top_logprobs" if body.ENDPOINT == "chat" else "logprobs"
        raise RequestError(
            f"a beam search of n {body.n} keeps each token's {limit} likeliest: ask {name} <= {limit}", name
        )
    if body.prompt_logprobs_asked() is not None:  # completions' echo with logprobs
        raise RequestError("a beam search gives no prompt logprobs: send echo or logprobs, not both", "echo")


def json_grammar(schema: str | dict[str, Any] | None, param: str) -> Grammar | None:
    """vLLM's guided_json: a schema as an object or as a JSON string."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema, parse_constant=refuse_constant)
        except json.JSONDecodeError as e:
            raise RequestError(f"invalid {param!r}: the schema string is not JSON ({e.msg})", param) from None
    return None if schema is None else Grammar("json", schema, param)


def token_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's logit_bias keys are token ids written as strings ({"50256": -100})."""
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise RequestError(
                f"logit_bias keys are token ids written as strings, such as \"42\"; got {key!r}", "logit_bias"
            )
    return {int(key): value for key, value in bias.items()}


PROMPT_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"
CONTENT_SHAPES = 'a string, a list of {"type": "text", "text": ...} parts, or null on an assistant message'


class CompletionRequest(Sampling):
    ENDPOINT = "completions"
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)  # the legacy API's default; 0 only with echo
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | Literal[False] | None = None  # the legacy shape's k
    echo: bool = False  # the prompt first, in the text and (with logprobs) in the logprobs

    @model_validator(mode="after")
    def zero_tokens_with_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 returns nothing: ask for at least 1, or send echo: true for the prompt alone"
            )
        return self

    def sampled_logprobs(self) -> int | None:
        return None if self.logprobs is False else self.logprobs

    def prompt_logprobs_asked(self) -> int | None:
        """echo with logprobs: the prompt's tokens get logprobs too (what lm-eval's loglikelihood reads)."""
        k = self.sampled_logprobs()
        if self.echo and k is not None:
            return max(k, self.prompt_logprobs or 0)
        return self.prompt_logprobs


def param_named_in(message: str) -> str | None:
    """Which parameter a SamplingParams message is about ('top_p must be ...', 'a stop string holds ...')."""
    return next((name for name in PARAM_NAMES if name in message.split()[:3]), "stop" if "stop" in message else None)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls, for the chat template
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def content_is_given(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content: {CONTENT_SHAPES}")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(Sampling):
    ENDPOINT = "chat"
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False  # each output token's logprob, in chat's shape
    top_logprobs: int = Field(default=0, ge=0, le=MAX_LOGPROBS)  # and the k likeliest, with logprobs: true

    @model_validator(mode="after")
    def top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs {self.top_logprobs} needs logprobs: true")
        return self

    def sampled_logprobs(self) -> int | None:
        return self.top_logprobs if self.logprobs else None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a prompt, or chat messages rendered as /v1/chat/completions renders them."""

    model_config = STRICT
    ENDPOINT: ClassVar[str] = "tokenize"
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = False  # as the completions endpoint reads a prompt
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either 'prompt' (a string) or 'messages' (a chat), not both or neither")
        return self


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    ENDPOINT: ClassVar[str] = "detokenize"
    model: str | None = None
    tokens: list[int]


def parse_body(raw: bytes, model_class: type[BaseModel]) -> Any:
    """The request body as model_class; a RequestError that names what is wrong otherwise."""
    data = read_json(raw)
    try:
        return model_class.model_validate(accepted_fields(data, getattr(model_class, "ENDPOINT", "")))
    except RecursionError:
        raise RequestError("the request body is nested too deep: send a flat OpenAI request object") from None
    except ValidationError as e:
        raise describe(e.errors()[0]) from None


def refuse_constant(name: str) -> None:
    """NaN and Infinity: Python's json reads them, JSON has no such numbers."""
    raise RequestError(f"the request body holds {name}, which is not a JSON number: send a finite number")


def read_json(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not UTF-8 (byte {e.start}): send JSON encoded as UTF-8") from None
    try:
        data = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request body is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise RequestError("the request body is nested too deep: send a flat OpenAI request object") from None
    except RequestError:  # NaN or Infinity (refuse_constant)
        raise
    except ValueError:  # Python refuses to convert an integer this long (a guard against slow parsing)
        limit = sys.get_int_max_str_digits()
        raise RequestError(f"the request body holds a number with more than {limit:,} digits") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    return data


def accepted_fields(data: dict, endpoint: str) -> dict:
    """The body without its nulls and its KNOWN_FIELDS (each checked to be neutral, or bookkeeping)."""
    data = {key: value for key, value in data.items() if value is not None}
    options = data.get("stream_options")
    if isinstance(options, dict):
        data["stream_options"] = {key: value for key, value in options.items() if value is not None}
    for path, known in KNOWN_FIELDS.items():
        if endpoint not in known.endpoints:
            continue
        *parents, name = path.split(".")
        holder = data.get(parents[0]) if parents else data
        if isinstance(holder, dict) and name in holder:
            check_neutral(path, holder.pop(name), known, data)
    return data


def check_neutral(path: str, value: Any, known: KnownField, data: dict) -> None:
    if known.neutral is ANY:
        return
    if known.neutral == SAME_AS_N:
        if same_value(value, data.get("n", 1)):
            return
        neutral = "the same number as n"
    elif any(same_value(value, n) for n in known.neutral):  # type: ignore[union-attr]
        return
    else:
        neutral = ", ".join(["null", *(json.dumps(n, allow_nan=False) for n in known.neutral)])  # type: ignore[union-attr]
    shown = json.dumps(value, allow_nan=False)[:60]  # a request's JSON holds no NaN: the parser refused it
    raise RequestError(
        f"unsupported value {shown} for {path!r}: nanoengine does not implement it, "
        f"so it accepts only the neutral value ({neutral}) or the field left out",
        path,
    )


def same_value(a: Any, b: Any) -> bool:
    """Equal as JSON values: `false` is not `0` (Python's False == 0 is)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def describe(error: Any) -> RequestError:
    """One pydantic error as an OpenAI one: which parameter, and what to send instead."""
    loc = [str(part) for part in error["loc"] if not is_union_tag(str(part))]
    param = ".".join(loc) or None
    if error["type"] == "extra_forbidden":
        return RequestError(f"unsupported parameter {param!r}: nanoengine does not implement it", param)
    if error["type"] == "missing":
        return RequestError(f"missing required parameter {param!r}", param)
    if loc[:1] == ["prompt"]:
        return RequestError(f"invalid 'prompt': a prompt is {PROMPT_SHAPES}", "prompt")
    if len(loc) >= 3 and loc[0] == "messages" and loc[2] == "content":
        param = ".".join(loc[:3])
        return RequestError(f"invalid {param!r}: a message's content is {CONTENT_SHAPES}", param)
    message = str(error["msg"]).removeprefix("Value error, ")
    if param is None:  # a check across fields ('max_tokens 0 returns nothing ...'): the field it names first
        named = message.split()[0]
        return RequestError(
            message, named if isinstance(error.get("input"), dict) and named in error["input"] else None
        )
    return RequestError(f"invalid {param!r}: {message}", param)


def is_union_tag(part: str) -> bool:
    """pydantic names the member of a union it tried ('str', 'list[int]') in an error's location."""
    plain = part in ("str", "int", "float", "bool", "list")
    return "[" in part or plain or part.startswith(("function-", "constrained-"))
