"""KV memory saved by sharing blocks among n samples or the beams of a beam search (issue 33, item 9;
PagedAttention, SOSP 2023, section 6.3: 6.1-9.8 % saved for parallel sampling and 37.6-55.2 % for beam
search, OPT-13B on Alpaca).

    python -m tracer.bench.sharing [--prompts 32] [--n 4 | --beam-width 4] [--max-tokens 128]
                                   [--model tiny] [--json]
    nanoengine bench --sharing ...   (the same)

Beam search (--beam-width K): one trace (prefix caching off, so the only sharing is the beams'
own: forked beams share every block by reference count, copy-on-write copies the one they write);
without sharing, every live beam would hold its own copy of each block it lists: per step that is
the sum of the pool's ref counts, against the blocks in use. Unlike the samples' case the beams'
paths, hence their sharing, depend on the model: run it with --model default for the real figure.

The workload: 32 instructions, each wrapped in the default model's chat template (its system prompt
included) and tokenized by the default model's tokenizer, n = 4 samples each (temperature 1, seeds
0..), 128 output tokens each (EOS ignored), every request at once, a pool that never preempts. Two
traces of it, read back like any trace:

    sharing      prefix caching on: a sample admitted after its sibling hits the prompt's full blocks
                 (and a prompt hits the system prompt's blocks another prompt computed)
    no sharing   enable_prefix_caching=False: every sequence holds its own copy of every block

Per step, blocks in use = blocks with ref count > 0. Within the sharing run each held block's ref count
says how many copies it saves, split into those the samples of one request share (the paper's measure)
and those different prompts share (the chat template's system prompt). The tiny model runs it by
default: the blocks depend on the token counts and on which prompts share a prefix, not on the model,
so the default model's ids are folded into the tiny vocabulary (id % 256 + 3: equal ids stay equal).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

# Alpaca-style instructions (our own wording): short prompts, long answers, as in the paper's dataset.
INSTRUCTIONS = (
    "Give three tips for staying healthy.",
    "Explain why the sky is blue.",
    "Write a short poem about autumn leaves.",
    "Describe how a bicycle works.",
    "List five uses for a paper clip.",
    "Summarize the plot of a detective story in a paragraph.",
    "Explain the difference between weather and climate.",
    "Write a friendly email inviting a colleague to lunch.",
    "Describe the water cycle.",
    "Suggest a name for a bakery and explain it.",
    "Explain what a prime number is to a child.",
    "Write a haiku about the sea.",
    "Give advice to someone starting to learn the piano.",
    "Explain how a vaccine trains the immune system.",
    "Describe a busy market in the morning.",
    "List the steps to plant a tree.",
    "Explain why we have seasons.",
    "Write a product description for a reusable bottle.",
    "Compare cats and dogs as pets.",
    "Explain what an algorithm is.",
    "Write a short story opening set on a train.",
    "Give four ways to save energy at home.",
    "Explain how rainbows form.",
    "Describe the taste of a lemon to someone who never had one.",
    "Write a thank-you note to a teacher.",
    "Explain how a compass finds north.",
    "List three benefits of reading every day.",
    "Describe how bread rises.",
    "Explain the rules of tic-tac-toe.",
    "Write a limerick about a clumsy robot.",
    "Explain why ice floats on water.",
    "Give a recipe for a simple salad.",
)


@dataclass(frozen=True, slots=True)
class SharingSpec:
    num_prompts: int = 32
    n: int = 4
    max_tokens: int = 128
    model: str = "tiny"  # which model runs; the prompts are always the default model's token ids
    block_size: int = 16
    beam_width: int = 0  # > 0: a beam search of this width per prompt instead of n samples


@dataclass(frozen=True, slots=True)
class Usage:
    """Blocks in use over one run's steps."""

    steps: int
    peak: int  # the most blocks in use at the end of a step
    mean: float  # blocks in use, averaged over the steps
    block_steps: int  # blocks in use summed over the steps: memory x time
    saved_by_samples: int  # block-steps the samples of one request save by sharing (sum of ref - 1)
    saved_across_prompts: int  # block-steps different requests save (a shared system prompt)


def default_model_prompts(count: int) -> list[list[int]]:
    """The instructions as the default model sees them: its chat template, its tokenizer."""
    from nanoengine.loading.checkpoint import ensure_default_model
    from nanoengine.loading.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ensure_default_model())
    prompts = []
    for text in (INSTRUCTIONS * (count // len(INSTRUCTIONS) + 1))[:count]:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(list(tokenizer.encode(chat, add_special_tokens=False)))
    return prompts


def for_model(prompts: list[list[int]], model: str) -> list[list[int]]:
    """The tiny model's vocabulary holds 260 ids: fold the default model's into it (equal stays equal)."""
    return [[t % 256 + 3 for t in p] for p in prompts] if model == "tiny" else prompts


def record(spec: SharingSpec, prompts: list[list[int]], path: Path, sharing: bool) -> Path:
    from nanoengine import BeamSearchParams, SamplingParams
    from nanoengine.block_manager import blocks_needed
    from nanoengine.engine import LLMEngine
    from tracer.trace.recorder import TraceRecorder

    per_seq = blocks_needed(max(map(len, prompts)) + spec.max_tokens, spec.block_size)
    width = spec.beam_width or spec.n
    engine = LLMEngine(
        spec.model,
        block_size=spec.block_size,
        num_kv_blocks=per_seq * len(prompts) * width,  # never preempts: the blocks follow the demand alone
        max_num_seqs=len(prompts) * width,
        max_num_batched_tokens=max(2048, max(map(len, prompts))),
        enable_prefix_caching=sharing,
    )
    with TraceRecorder(engine, path, title=f"sharing={sharing}"):
        for i, prompt in enumerate(prompts):
            params: SamplingParams | BeamSearchParams = SamplingParams(
                n=spec.n, max_tokens=spec.max_tokens, temperature=1.0, seed=spec.n * i, ignore_eos=True
            )
            if spec.beam_width:
                params = BeamSearchParams(spec.beam_width, spec.max_tokens, ignore_eos=True)
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
    return path


def usage_of(path: Path) -> Usage:
    """Blocks in use per step, read from the trace's pool and rows."""
    from tracer.trace.step_line import request_of
    from tracer.trace.trace_file import load_trace

    trace = load_trace(path, validate="none")
    in_use, by_samples, across = [], 0, 0
    for step in trace.steps:
        request = {row["seq_id"]: request_of(row) for row in step["seqs"]}
        in_use.append(sum(1 for r in step["pool"]["ref_counts"] if r > 0))
        for owners in step["pool"]["owners"]:
            if len(owners) > 1:
                requests = {request[s] for s in owners}
                by_samples += len(owners) - len(requests)  # copies saved inside each request
                across += len(requests) - 1
    return Usage(len(in_use), max(in_use), sum(in_use) / len(in_use), sum(in_use), by_samples, across)


@dataclass(frozen=True, slots=True)
class BeamUsage:
    """A beam search run's blocks in use, and what its beams would hold without sharing."""

    steps: int
    peak: int
    mean: float
    peak_own_copies: int  # the most blocks the live beams would hold, each its own copy of each
    mean_own_copies: float
    copies_on_write: int  # blocks copied because a beam was to write into a shared one
    forks: int


def beam_usage_of(path: Path) -> BeamUsage:
    from nanoengine.sequence import EventKind
    from tracer.trace.trace_file import load_trace

    trace = load_trace(path, validate="none")
    in_use, own = [], []
    copies = forks = 0
    for step in trace.steps:
        refs = step["pool"]["ref_counts"]
        in_use.append(sum(1 for r in refs if r > 0))
        own.append(sum(refs))  # every holder its own copy
        copies += len(step.get("blocks_to_copy", []))
        forks += sum(1 for e in step["events"] if e["kind"] == EventKind.FORKED.value)
    n = len(in_use)
    return BeamUsage(n, max(in_use), sum(in_use) / n, max(own), sum(own) / n, copies, forks)


def measure_beams(spec: SharingSpec, prompts: list[list[int]], folder: Path | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="nanoengine-sharing-") as tmp:
        where = folder or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        u = beam_usage_of(record(spec, prompts, where / "beam-search.jsonl", False))
    return {
        "spec": asdict(spec),
        "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts))},
        "beams": asdict(u),
        "saved_peak_pct": pct(u.peak_own_copies - u.peak, u.peak_own_copies),
        "saved_mean_pct": pct(u.mean_own_copies - u.mean, u.mean_own_copies),
    }


def beam_table(report: dict) -> str:
    u, spec, tokens = report["beams"], report["spec"], report["prompt_tokens"]
    return "\n".join(
        [
            f"{spec['num_prompts']} prompts (the default model's chat template: {tokens['min']}-{tokens['max']} "
            f"tokens), beam search of width {spec['beam_width']}, {spec['max_tokens']} output tokens, "
            f"block_size {spec['block_size']}, model {spec['model']}",
            "",
            "| beams | steps | peak blocks | mean blocks |",
            "|---|---|---|---|",
            f"| each its own copy of every block | {u['steps']} | {u['peak_own_copies']} | {u['mean_own_copies']:.1f} |",
            f"| sharing (fork by reference count, copy-on-write) | {u['steps']} | {u['peak']} | {u['mean']:.1f} |",
            f"| saved | | {report['saved_peak_pct']:.1f} % | {report['saved_mean_pct']:.1f} % |",
            "",
            f"{u['forks']} forks, {u['copies_on_write']} blocks copied on write.",
        ]
    )


def measure(spec: SharingSpec, folder: Path | None = None) -> dict:
    """Both runs' usage and what sharing saves, as a report dict (a beam search: one run)."""
    prompts = for_model(default_model_prompts(spec.num_prompts), spec.model)
    if spec.beam_width:
        return measure_beams(spec, prompts, folder)
    with tempfile.TemporaryDirectory(prefix="nanoengine-sharing-") as tmp:
        where = folder or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        shared = usage_of(record(spec, prompts, where / "sharing.jsonl", True))
        alone = usage_of(record(spec, prompts, where / "no-sharing.jsonl", False))
    return {
        "spec": asdict(spec),
        "prompt_tokens": {
            "min": min(map(len, prompts)),
            "max": max(map(len, prompts)),
            "total": sum(map(len, prompts)),
        },
        "sharing": asdict(shared),
        "no_sharing": asdict(alone),
        "saved_peak_pct": pct(alone.peak - shared.peak, alone.peak),
        "saved_mean_pct": pct(alone.mean - shared.mean, alone.mean),
        # within the sharing run: what each kind of sharing saves, of the blocks it would hold without any
        "samples_share_pct": pct(shared.saved_by_samples, own_copies(shared)),
        "prompts_share_pct": pct(shared.saved_across_prompts, own_copies(shared)),
    }


def own_copies(u: Usage) -> int:
    return u.block_steps + u.saved_by_samples + u.saved_across_prompts


def pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


def table(report: dict) -> str:
    s, a, spec = report["sharing"], report["no_sharing"], report["spec"]
    tokens = report["prompt_tokens"]
    lines = [
        f"{spec['num_prompts']} prompts (the default model's chat template: {tokens['min']}-{tokens['max']} tokens), "
        f"n = {spec['n']}, {spec['max_tokens']} output tokens, block_size {spec['block_size']}, model {spec['model']}",
        "",
        "| run | steps | peak blocks | mean blocks |",
        "|---|---|---|---|",
        f"| no sharing (prefix caching off) | {a['steps']} | {a['peak']} | {a['mean']:.1f} |",
        f"| sharing (prefix caching on) | {s['steps']} | {s['peak']} | {s['mean']:.1f} |",
        f"| saved | | {report['saved_peak_pct']:.1f} % | {report['saved_mean_pct']:.1f} % |",
        "",
        f"Within the sharing run, of the block-steps held without any sharing: the samples of one request share "
        f"{report['samples_share_pct']:.1f} %, different prompts (the system prompt) {report['prompts_share_pct']:.1f} %.",
    ]
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None, prog: str = "python -m tracer.bench.sharing") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    d = SharingSpec()
    p.add_argument("--prompts", type=int, default=d.num_prompts, help="number of prompts")
    p.add_argument("--n", type=int, default=d.n, help="samples per prompt")
    p.add_argument("--beam-width", type=int, default=0, help="a beam search per prompt instead (1-10)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output tokens per sample")
    p.add_argument("--model", default=d.model, help="the model that runs: tiny (default) or default")
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--keep", type=Path, help="keep the two traces in this folder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(list(argv) if argv is not None else None)
    for name in ("prompts", "n", "max_tokens", "block_size"):  # one line, not a traceback
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.beam_width <= 10:
        p.error(f"--beam-width must be in [1, 10], got {args.beam_width}")
    spec = SharingSpec(args.prompts, args.n, args.max_tokens, args.model, args.block_size, args.beam_width)
    report = measure(spec, args.keep)
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(beam_table(report) if spec.beam_width else table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
