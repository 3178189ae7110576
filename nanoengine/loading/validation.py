"""Checking what a user passed in, and saying in one line what was wrong with it."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanoengine.beam_search import BeamSearchParams
    from nanoengine.sampling_params import SamplingParams

MIN_TEMPERATURE = 1e-5  # below this, logits / temperature overflows float32: use 0 (greedy)
# The sampler seeds each draw with seed * 1_000_003 + num_tokens, which must fit 64 bits.
MAX_SEED = 2**32
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_N = 64
MAX_BEAM_WIDTH = 10  # each beam asks for 2 * beam_width logprobs: MAX_LOGPROBS
# (name, lowest, highest): OpenAI's ranges for its penalties, vLLM's for the others
PENALTY_RANGES = (
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repetition_penalty", 0.0, 2.0),
    ("min_p", 0.0, 1.0),
)


def is_int(value: object) -> bool:
    """An integer of any integral type, but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite int or float (not a bool, not nan or inf)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def short_repr(value: object, limit: int = 60) -> str:
    """repr(value), cut to at most `limit` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_text(value: str, what: str) -> None:
    """A ValueError for text no tokenizer can read: a lone surrogate (valid JSON, not UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = short_repr(value[e.start : e.end])
        raise ValueError(
            f"{what} holds {bad} at index {e.start}, a lone surrogate that is not text: "
            "send valid UTF-8"
        ) from None


def first_line(error: Exception) -> str:
    """An exception in one short line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]


def check_sampling_params(p: SamplingParams) -> None:
    if not is_int(p.max_tokens) or p.max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {p.max_tokens!r}")
    temperature = p.temperature
    if not is_real(temperature) or not (temperature == 0 or temperature >= MIN_TEMPERATURE):
        raise ValueError(
            "temperature must be >= 0 (0 = greedy, else finite and "
            f">= {MIN_TEMPERATURE}), got {temperature!r}"
        )
    if not is_real(p.top_p) or not 0 < p.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p!r}")
    if not is_int(p.top_k) or p.top_k < -1:
        raise ValueError(f"top_k must be an integer >= -1 (0 or -1 = off), got {p.top_k!r}")
    if p.seed is not None and (not is_int(p.seed) or not 0 <= p.seed < MAX_SEED):
        raise ValueError(f"seed must be None or an integer in [0, 2**32), got {p.seed!r}")
    if not isinstance(p.ignore_eos, bool):
        raise ValueError(f"ignore_eos must be True or False, got {p.ignore_eos!r}")
    if not isinstance(p.stop, list) or not all(isinstance(s, str) and s for s in p.stop):
        shown = short_repr(p.stop)
        raise ValueError(f"stop must be a list of non-empty strings, got {shown}")
    for s in p.stop:
        check_text(s, "a stop string")
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(p, name)
        if k is not None and (not is_int(k) or not 0 <= k <= MAX_LOGPROBS):
            raise ValueError(f"{name} must be None or in [0, {MAX_LOGPROBS}], got {k!r}")
    if not is_int(p.n) or not 1 <= p.n <= MAX_N:
        raise ValueError(f"n must be an integer in [1, {MAX_N}], got {p.n!r}")
    if p.n > 1 and p.logits_processors:  # one processor's state cannot follow n texts
        raise ValueError("n > 1 with logits_processors: add n requests, each its own")
    check_processors(p)


def check_processors(p: SamplingParams) -> None:
    """The logits processors' values, in vLLM's ranges."""
    ids = p.stop_token_ids
    if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
        raise ValueError(f"stop_token_ids must be a list of token ids, got {short_repr(ids)}")
    if not is_int(p.min_tokens) or not 0 <= p.min_tokens <= p.max_tokens:
        raise ValueError(f"min_tokens must be in [0, max_tokens], got {p.min_tokens!r}")
    bias = p.logit_bias
    if not isinstance(bias, dict) or not all(
        is_int(t) and t >= 0 and is_real(b) and -100 <= b <= 100 for t, b in bias.items()
    ):
        raise ValueError(
            f"logit_bias maps token ids to numbers in [-100, 100], got {short_repr(bias)}"
        )
    for name, low, high in PENALTY_RANGES:
        value = getattr(p, name)
        if not is_real(value) or not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    if not isinstance(p.logits_processors, list) or not all(
        callable(fn) for fn in p.logits_processors
    ):
        raise ValueError("logits_processors must be a list of functions (token ids, logits)")
    if p.repetition_penalty == 0:
        raise ValueError("repetition_penalty must be > 0 (1 = off), got 0")


def check_beam_search_params(p: BeamSearchParams) -> None:
    if not is_int(p.beam_width) or not 1 <= p.beam_width <= MAX_BEAM_WIDTH:
        raise ValueError(
            f"beam_width must be an integer in [1, {MAX_BEAM_WIDTH}], got {p.beam_width!r}"
        )
    if not is_real(p.length_penalty):
        raise ValueError(f"length_penalty must be a number, got {p.length_penalty!r}")
    p.sampling_params()  # the others are checked as SamplingParams checks them
