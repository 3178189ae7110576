"""What one benchmark run measured, and the per-request latency figures derived from it.

All requests arrive at t = 0 (the start of the timed window), so a request's time to first token
(TTFT) includes any wait for earlier work, and its time per output token (TPOT) is
(last token time - first token time) / (output tokens - 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)


def synchronize(device) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


@dataclass(slots=True)
class RunResult:
    name: str
    elapsed: float  # seconds in the timed window
    num_prompt_tokens: int
    num_output_tokens: int  # credited: only the tokens each request asked for
    ttft: list[float]  # seconds, one per request
    tpot: list[float]  # seconds, one per request with >= 2 output tokens
    outputs: list[list[int]] = field(default_factory=list)  # generated ids, workload order (credited part)
    notes: dict = field(default_factory=dict)
    token_times: list[list[float]] = field(default_factory=list)  # s from t0, per request (not in the JSON)
    cpu_time: float | None = None  # CPU seconds the process used in the timed window, all threads

    @property
    def output_tok_s(self) -> float:
        return self.num_output_tokens / self.elapsed

    @property
    def total_tok_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed

    def to_dict(self) -> dict:
        return {
            "elapsed_s": round(self.elapsed, 4),
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "output_tok_s": round(self.output_tok_s, 2),
            "total_tok_s": round(self.total_tok_s, 2),
            "ttft_ms": percentiles_ms(self.ttft),
            "tpot_ms": percentiles_ms(self.tpot),
            "cpu_s": None if self.cpu_time is None else round(self.cpu_time, 3),
            **self.notes,
        }


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentiles_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in PERCENTILES}
    return {f"p{q}": round(percentile(values, q) * 1000, 2) for q in PERCENTILES}


def measured_run(
    name: str,
    requests: list,
    outputs: list[list[int]],
    token_times: list[list[float]],
    start: float,
    elapsed: float,
    cpu_time: float,
    notes: dict | None = None,
) -> RunResult:
    """A RunResult from what a run saw: outputs and each request's token timestamps (absolute)."""
    ttft, tpot = latencies(token_times, start)
    return RunResult(
        name,
        elapsed,
        sum(r.num_prompt_tokens for r in requests),
        sum(min(len(o), r.max_tokens) for o, r in zip(outputs, requests)),  # credited: what was asked for
        ttft,
        tpot,
        outputs,
        notes or {},
        since(token_times, start),
        cpu_time,
    )


def since(token_times: list[list[float]], start: float) -> list[list[float]]:
    return [[t - start for t in times] for times in token_times]


def latencies(token_times: list[list[float]], start: float) -> tuple[list[float], list[float]]:
    """TTFT and TPOT per request from each request's output-token timestamps."""
    ttft, tpot = [], []
    for times in token_times:
        if not times:
            continue
        ttft.append(times[0] - start)
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
    return ttft, tpot


def count_matching(outputs: list[list[int]], reference: list[list[int]]) -> int:
    """Requests whose generated ids equal the reference's (greedy decoding: a sanity check that two
    systems computed the same thing; float rounding in different batch shapes can flip a near-tie)."""
    return sum(a == b for a, b in zip(outputs, reference))
