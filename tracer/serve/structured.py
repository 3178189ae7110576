"""Structured output: the grammar a request asks for (JSON, a JSON schema, a regex, one of a few
strings, an EBNF grammar) applied as a token mask before each token is drawn.

    structured = StructuredOutput(tokenizer, vocab_size, eos_token_ids)  # one per served model
    compiled = structured.compile(Grammar("json", schema))                # once per request (400 if bad)
    params.logits_processors = [structured.mask(compiled)]                # one per sequence: it has state

xgrammar, the library vLLM uses, does the work. Its GrammarCompiler knows the tokenizer's whole
vocabulary (read once, the first time a request asks for a grammar), and turns a grammar into a
table of which tokens may follow which grammar states. A GrammarMatcher walks one sequence's
tokens through that table; before each token it fills a bitmask (one bit per vocabulary entry)
and the logits of every token whose bit is clear become -inf, so the sampler can only draw a
token that keeps the text inside the grammar. Once the grammar is complete only EOS is allowed;
after EOS (with ignore_eos) still only EOS.

vLLM v1 computes these bitmasks for the whole batch in the scheduler process and sends them to the
workers in its scheduler output (`grammar_bitmask`); nanoengine applies them row by row as a
request's logits processor, the hook vLLM v0 used.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import torch

from tracer.serve.protocol import Grammar, RequestError


class StructuredOutput:
    """The served model's grammar compiler, built on first use (reading the vocabulary takes about a
    second on a 49k-token tokenizer)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int] | set[int]) -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, sorted(eos_token_ids)
        self.compiler: Any = None
        self.lock = threading.Lock()  # requests are compiled in worker threads

    def compile(self, grammar: Grammar) -> Any:
        """The compiled grammar (an xgrammar CompiledGrammar); a RequestError (400) naming the problem."""
        compiler = self.grammar_compiler(grammar.param)
        try:
            if grammar.kind == "json":
                schema = {"type": "object"} if grammar.spec is None else grammar.spec
                check_schema(schema, grammar.param)
                # compact JSON: a small model given free whitespace may write nothing else
                return compiler.compile_json_schema(json.dumps(schema, allow_nan=False), any_whitespace=False)
            if grammar.kind == "regex":
                return compiler.compile_regex(grammar.spec)
            if grammar.kind == "choice":
                return compiler.compile_grammar(choice_grammar(grammar.spec, grammar.param))
            return compiler.compile_grammar(grammar.spec)
        except RuntimeError as e:  # xgrammar's own message, without its time stamp and source file
            raise RequestError(f"invalid {grammar.param!r}: {xgrammar_message(e)}", grammar.param) from None

    def mask(self, compiled: Any) -> GrammarMask:
        import xgrammar

        matcher = xgrammar.GrammarMatcher(compiled)
        return GrammarMask(matcher, xgrammar.allocate_token_bitmask(1, self.vocab_size), self.eos_token_ids)

    def grammar_compiler(self, param: str) -> Any:
        with self.lock:
            if self.compiler is None:
                self.compiler = make_compiler(self.tokenizer, self.vocab_size, self.eos_token_ids, param)
            return self.compiler


def make_compiler(tokenizer: Any, vocab_size: int, eos_token_ids: list[int], param: str) -> Any:
    try:
        import xgrammar
    except ImportError:
        message = "structured output needs the xgrammar package on the server: pip install xgrammar"
        raise RequestError(message, param, status=501) from None
    info = tokenizer_info(xgrammar, tokenizer, vocab_size, eos_token_ids)
    if info is None:
        message = f"structured output is not available for this model: xgrammar cannot read its tokenizer ({type(tokenizer).__name__})"
        raise RequestError(message, param)
    return xgrammar.GrammarCompiler(info, max_threads=1)  # requests compile in their own threads


def tokenizer_info(xgrammar: Any, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> Any:
    """What xgrammar needs to know of the vocabulary: each token's bytes and how they are encoded."""
    from nanoengine.loading.tiny import SPECIAL_TOKENS, ByteTokenizer

    stop = eos_token_ids or None
    if isinstance(tokenizer, ByteTokenizer):  # one token per byte; the special tokens have no text
        vocab = [b""] * len(SPECIAL_TOKENS) + [bytes([b]) for b in range(256)]
        return xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stop)
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast) and hasattr(tokenizer, "backend_tokenizer"):
        # nanoengine's own tokenizers-based wrapper: the same tokenizer.json, seen as transformers sees it
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    try:
        return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
    except (ValueError, TypeError, AttributeError):
        return None


def check_schema(schema: Any, param: str) -> None:
    """A schema that is not a JSON Schema at all is named by jsonschema; one xgrammar cannot turn
    into a grammar is named by xgrammar (compile)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise RequestError(f"invalid {param!r}: a JSON schema is an object, got {type(schema).__name__}", param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/" + "/".join(str(p) for p in e.absolute_path) if e.absolute_path else "the top level"
        raise RequestError(f"invalid {param!r}: not a valid JSON schema at {where}: {e.message}", param) from None


def choice_grammar(choices: list[str], param: str) -> str:
    """One of the strings, exactly: an EBNF alternative of string literals (JSON escapes are EBNF's)."""
    if not choices:
        raise RequestError(f"invalid {param!r}: give at least one choice", param)
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False, allow_nan=False) for c in choices)


def xgrammar_message(error: Exception) -> str:
    """'[07:35:09] /project/cpp/json_schema_converter.cc:5082: Unsupported type "objekt"' -> the part after the place."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text).removeprefix("Check failed: (error.empty()) is false: ")


@dataclass(slots=True, eq=False)
class GrammarMask:
    """One sequence's logits processor: follows its tokens through the grammar and masks the logits
    of every token the grammar does not allow next. Called with the completion so far each time a
    row of this sequence's logits is computed (also on a prefill chunk whose logits are thrown away:
    the completion is then empty and the mask is the first token's, which does no harm)."""

    matcher: Any
    bitmask: torch.Tensor  # [1, ceil(vocab / 32)] int32: bit i set = token i allowed
    eos_token_ids: list[int]
    seen: int = 0  # completion tokens already given to the matcher

    def __call__(self, output_token_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        self.follow(output_token_ids)
        if self.matcher.is_terminated():  # EOS was accepted (ignore_eos keeps it going): EOS only
            eos = logits_row[self.eos_token_ids].clone()
            logits_row.fill_(float("-inf"))
            logits_row[self.eos_token_ids] = eos
            return logits_row
        import xgrammar

        self.matcher.fill_next_token_bitmask(self.bitmask)
        xgrammar.apply_token_bitmask_inplace(logits_row.unsqueeze(0), self.bitmask.to(logits_row.device))
        return logits_row

    def follow(self, output_token_ids: list[int]) -> None:
        """Give the matcher the tokens drawn since the last call."""
        for token_id in output_token_ids[self.seen :]:
            if not self.matcher.is_terminated():
                self.matcher.accept_token(token_id)  # always accepted: it was drawn under the mask
        self.seen = len(output_token_ids)
