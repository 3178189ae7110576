from __future__ import annotations

from dataclasses import dataclass, field

from nanoengine.validation import check_text, is_int, is_real, short_repr

MIN_TEMPERATURE = 1e-5  # below this, logits / temperature overflows float32: use 0 (greedy)
# The sampler seeds each draw with seed * 1_000_003 + num_tokens, which must fit 64 bits.
MAX_SEED = 2**32


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token and when to stop. temperature 0 means greedy.

    Checked when made and again by add_request, so a bad value is a one-line ValueError
    there, never a failure inside a step."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off; -1 = off too (vLLM's spelling)
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)

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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
