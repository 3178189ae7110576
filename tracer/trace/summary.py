"""A rich summary of a trace: totals, per-request results and invariant violations."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

from nanoengine.sequence import EventKind
from tracer.trace.invariants import INVARIANTS, Violation
from tracer.trace.readable import printable
from tracer.trace.trace_file import Trace


@dataclass(slots=True)
class TraceSummary:
    num_steps: int = 0
    num_requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    computed_tokens: int = 0  # tokens the model ran on, prefill and decode
    preemptions: int = 0
    prefix_hits: int = 0
    tokens_saved: int = 0  # prompt tokens skipped thanks to prefix hits
    chunked_prefills: int = 0  # prefills that took more than one chunk
    peak_blocks_used: int = 0
    wall_time: float = 0.0
    model_time: float = 0.0
    finish_reasons: Counter = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)


def summarize(trace: Trace, violations: list[Violation]) -> TraceSummary:
    s = TraceSummary(num_steps=trace.num_steps, num_requests=len(trace.requests), violations=violations)
    s.prompt_tokens = sum(r["num_prompt_tokens"] for r in trace.requests.values())
    for step in trace.steps:
        s.wall_time += step["wall_time"]
        s.model_time += step["model_time"]
        s.computed_tokens += len(step["inputs"]["input_ids"])
        s.generated_tokens += sum(len(q["new_token_ids"]) for q in step["seqs"])
        s.peak_blocks_used = max(s.peak_blocks_used, sum(1 for r in step["pool"]["ref_counts"] if r))
        for e in step["events"]:
            s.preemptions += e["kind"] == EventKind.PREEMPTED
            s.prefix_hits += e["kind"] == EventKind.PREFIX_HIT
            s.tokens_saved += e["detail"].get("tokens_saved", 0) if e["kind"] == EventKind.PREFIX_HIT else 0
            s.chunked_prefills += e["kind"] == EventKind.PREFILL_DONE and e["detail"].get("chunks", 1) > 1
    if trace.steps:
        s.finish_reasons = Counter(q["finish_reason"] or "unfinished" for q in trace.steps[-1]["seqs"])
    return s


def print_summary(trace: Trace, summary: TraceSummary, console: Console) -> None:
    console.print(totals_table(trace, summary))
    if trace.steps:
        console.print(requests_table(trace))
    if summary.violations:
        console.print(violations_table(summary.violations))
    else:
        console.print(f"[green]No invariant violations[/] ({len(INVARIANTS)} invariants checked at every step)")


def totals_table(trace: Trace, s: TraceSummary) -> Table:
    cfg = trace.config
    title = f"Trace {trace.path.name}" + (f": {trace.title}" if isinstance(trace.title, str) and trace.title else "")
    t = Table(title=plain(title), show_header=False)  # the title and every value below are user text: never markup
    t.add_column(style="bold")
    t.add_column()
    rate = s.generated_tokens / s.wall_time if s.wall_time else 0.0
    rows = [
        (
            "model",
            f"{trace.header['model']}  (block_size {cfg['block_size']}, {cfg['num_kv_blocks']} KV blocks, "
            f"budget {cfg['max_num_batched_tokens']} tokens/step, prefix caching "
            f"{'on' if cfg['enable_prefix_caching'] else 'off'})",
        ),
        ("steps", str(s.num_steps)),
        ("requests", f"{s.num_requests}  ({', '.join(f'{n} {k}' for k, n in sorted(s.finish_reasons.items()))})"),
        ("tokens", f"{s.prompt_tokens} prompt, {s.generated_tokens} generated, {s.computed_tokens} computed"),
        ("preemptions", str(s.preemptions)),
        ("prefix-cache hits", f"{s.prefix_hits}  ({s.tokens_saved} prompt tokens not recomputed)"),
        ("chunked prefills", str(s.chunked_prefills)),
        ("KV blocks", f"peak {s.peak_blocks_used} of {cfg['num_kv_blocks']} in use"),
        ("time", f"{s.wall_time:.2f} s in steps ({s.model_time:.2f} s in the model), {rate:.1f} tok/s"),
    ]
    for key, value in rows:
        t.add_row(key, plain(value))
    if trace.warning:
        t.add_row("warning", Text(printable(trace.warning), style="yellow"))
    t.add_row("violations", Text(str(len(s.violations)), style="red" if s.violations else "green"))
    return t


def requests_table(trace: Trace, width: int = 48) -> Table:
    t = Table(title="Requests")
    for col in ("seq", "prompt", "prompt tokens", "generated", "finish", "output"):
        t.add_column(col, overflow="fold" if col in ("prompt", "output") else "ellipsis")
    for q in trace.steps[-1]["seqs"]:
        prompt = trace.requests.get(q["seq_id"], {}).get("prompt", "")
        t.add_row(
            str(q["seq_id"]),
            Text(clip(prompt, width)),
            str(q["num_prompt_tokens"]),
            str(q["num_tokens_after"] - q["num_prompt_tokens"]),
            plain(str(q["finish_reason"] or q["status_after"])),
            Text(clip(q["output_text"], width)),
        )
    return t


def violations_table(violations: list[Violation], limit: int = 50) -> Table:
    t = Table(title=f"Invariant violations ({len(violations)})", title_style="bold red")
    for col in ("step", "seq", "invariant", "what is wrong"):
        t.add_column(col, overflow="fold")
    for v in violations[:limit]:
        t.add_row(str(v.step), "-" if v.seq_id is None else str(v.seq_id), plain(v.invariant), plain(v.message))
    if len(violations) > limit:
        t.caption = f"{len(violations) - limit} more not shown"
    return t


def plain(text: str) -> Text:
    """User text for rich, shown literally: never markup, no raw control characters."""
    return Text(printable(text))


def clip(text: str, width: int) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"
