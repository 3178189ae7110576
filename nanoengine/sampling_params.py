from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nanoengine.validation import check_text, is_int, is_real, short_repr

MIN_TEMPERATURE = 1e-5  # below this, logits / temperature overflows float32: use 0 (greedy)
# The sampler seeds each draw with seed * 1_000_003 + num_tokens, which must fit 64 bits.
MAX_SEED = 2**32
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_N = 64
# (name, lowest, highest): OpenAI's ranges for its penalties, vLLM's for the others
PENALTY_RANGES = (
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repetition_penalty", 0.0, 2.0),
    ("min_p", 0.0, 1.0),
)


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token and when to stop. temperature 0 means greedy.

    Checked when made and again by add_request, so a bad value is a one-line ValueError
    there, never a failure inside a step."""

    n: int = 1  # samples of the prompt: n sequences, each seeded seed + i when seed is set
    temperature: float = 0.0
    top_k: int = 0  # 0 = off; -1 = off too (vLLM's spelling)
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # finish on any of these, as on EOS
    logprobs: int | None = None  # per output token: the chosen one's and the k likeliest
    prompt_logprobs: int | None = None  # the same for each prompt token after the first
    # vLLM's logits processors (nanoengine/logits_processors.py); each neutral by default
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens were made
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    repetition_penalty: float = 1.0  # > 1 discourages every token of the prompt and the output
    frequency_penalty: float = 0.0  # minus this times the token's count in the output
    presence_penalty: float = 0.0  # minus this once the token is in the output
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest
    # vLLM v0's per-request hook, last in line: fn(output_token_ids, logits_row) -> logits_row
    # (the server's structured output masks the tokens its grammar forbids this way)
    logits_processors: list[Callable[[list[int], Any], Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.stop is None or isinstance(self.stop, (str, tuple)):  # None, "a", ("a", "b")
            self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.validate()

    def validate(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        temperature = self.temperature
        if not is_real(temperature) or not (temperature == 0 or temperature >= MIN_TEMPERATURE):
            raise ValueError(
                "temperature must be >= 0 (0 = greedy, else finite and "
                f">= {MIN_TEMPERATURE}), got {temperature!r}"
            )
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= -1 (0 or -1 = off), got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < MAX_SEED):
            raise ValueError(f"seed must be None or an integer in [0, 2**32), got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            shown = short_repr(self.stop)
            raise ValueError(f"stop must be a list of non-empty strings, got {shown}")
        for s in self.stop:
            check_text(s, "a stop string")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not is_int(k) or not 0 <= k <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or in [0, {MAX_LOGPROBS}], got {k!r}")
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        if self.n > 1 and self.logits_processors:  # one processor's state cannot follow n texts
            raise ValueError("n > 1 with logits_processors: add n requests, each its own")
        self.validate_processors()

    def validate_processors(self) -> None:
        """The logits processors' values, in vLLM's ranges."""
        ids = self.stop_token_ids
        if not isinstance(ids, list) or not all(is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {short_repr(ids)}")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}")
        bias = self.logit_bias
        if not isinstance(bias, dict) or not all(
            is_int(t) and t >= 0 and is_real(b) and -100 <= b <= 100 for t, b in bias.items()
        ):
            raise ValueError(
                f"logit_bias maps token ids to numbers in [-100, 100], got {short_repr(bias)}"
            )
        for name, low, high in PENALTY_RANGES:
            value = getattr(self, name)
            if not is_real(value) or not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
        if not isinstance(self.logits_processors, list) or not all(
            callable(fn) for fn in self.logits_processors
        ):
            raise ValueError("logits_processors must be a list of functions (token ids, logits)")
        if self.repetition_penalty == 0:
            raise ValueError("repetition_penalty must be > 0 (1 = off), got 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
