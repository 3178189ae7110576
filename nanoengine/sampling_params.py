from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nanoengine.loading.validation import check_sampling_params


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
        """One line saying what is wrong and what to do (loading/validation.py checks)."""
        check_sampling_params(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
