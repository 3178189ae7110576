"""The standard benchmark workload: random-token prompts with random lengths, from a fixed seed.

The shape of nano-vllm's and vLLM's offline throughput benchmarks: every request arrives at once,
decoding is greedy and ignores EOS, so each request produces exactly the tokens it asked for and
every system is credited with the same amount of work.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    num_requests: int = 32
    min_input_len: int = 16
    max_input_len: int = 256
    min_output_len: int = 16
    max_output_len: int = 256
    seed: int = 0

    def validate(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"the workload needs at least 1 request, got {self.num_requests}")
        for low, high, what in (
            (self.min_input_len, self.max_input_len, "input"),
            (self.min_output_len, self.max_output_len, "output"),
        ):
            if not 1 <= low <= high:
                raise ValueError(f"{what} lengths must satisfy 1 <= min <= max, got {low}..{high}")

    def to_dict(self) -> dict:
        return asdict(self)


STANDARD = WorkloadSpec()
QUICK = WorkloadSpec(num_requests=8, min_input_len=16, max_input_len=64, min_output_len=8, max_output_len=32)
GPU = WorkloadSpec(num_requests=256)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # exactly this many output tokens are generated and credited

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def token_id_range(vocab_size: int) -> tuple[int, int]:
    """Ids drawn from [low, high): past the special tokens that sit at the start of small vocabularies,
    and below 10000 as in nano-vllm's bench (any id works: EOS is ignored)."""
    low = 3 if vocab_size < 1000 else 100
    return low, min(vocab_size, 10_000)


def build_workload(spec: WorkloadSpec, vocab_size: int) -> list[BenchRequest]:
    spec.validate()
    rng = random.Random(spec.seed)
    low, high = token_id_range(vocab_size)
    requests = []
    for _ in range(spec.num_requests):
        num_input = rng.randint(spec.min_input_len, spec.max_input_len)
        num_output = rng.randint(spec.min_output_len, spec.max_output_len)
        prompt = tuple(rng.randrange(low, high) for _ in range(num_input))
        requests.append(BenchRequest(prompt, num_output))
    return requests


def workload_summary(spec: WorkloadSpec, requests: list[BenchRequest]) -> dict:
    return {
        **spec.to_dict(),
        "num_prompt_tokens": sum(r.num_prompt_tokens for r in requests),
        "num_output_tokens": sum(r.max_tokens for r in requests),
    }
