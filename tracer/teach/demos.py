"""`nanoengine demo NAME`: named, deterministic classroom scenarios.

    nanoengine demo list
    nanoengine demo prefix-sharing [--model tiny] [--no-tui] [--export DIR --steps 3,7,12]

Each demo records a trace (traces/demo-NAME.jsonl), prints what to notice with the numbers
from this run, and opens the replay TUI at the step that matters. --export writes SVG
frames of chosen steps without opening anything (for slides and handouts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import N_, _
from tracer.teach.look_for import look_for
from tracer.teach.scenarios import Request, Scenario, ScenarioRun, run_scenario, set_header_fields
from tracer.teach.swap import original, plugged
from tracer.trace.readable import printable

if TYPE_CHECKING:
    from nanoengine.outputs import CompletionOutput, RequestOutput

DEFAULT_SIZE = (160, 48)

NOTE = (
    "The KV cache stores the keys and values of every token the model has read, so no token "
    "is processed twice. Paged attention cuts that cache into fixed-size blocks, and a block "
    "table maps each request to its blocks. Question: "
)
BEAM_PROMPT = "Name a colour of the sea."
LONG_DOC = (
    "Continuous batching lets an inference engine admit a new request in any step, as soon "
    "as there is room, instead of waiting for a whole batch to finish. Chunked prefill "
    "splits a long prompt over several steps so that the requests that are already "
    "generating keep receiving a token in every step. Summarise this in one sentence."
)


@dataclass(slots=True)
class Demo:
    name: str
    summary: str
    build: Callable[[bool], Scenario]  # tiny? -> scenario
    report: Callable[[Console, list[ScenarioRun]], None]
    variants: tuple[str, ...] = ("",)  # several: the same workload run several ways ("static": static batching)


# ---- the scenarios -----------------------------------------------------------------------
def prefix_sharing(tiny: bool) -> Scenario:
    questions = ["What is stored?", "Why use blocks?", "What maps requests to blocks?", "What is not repeated?"]
    return Scenario(
        name="prefix-sharing",
        title=N_("Demo: prefix sharing"),
        requests=[
            Request(NOTE + q, {"max_tokens": 8, "ignore_eos": True}, arrive=2 * i) for i, q in enumerate(questions)
        ],
        engine={"block_size": 8 if tiny else 16, "num_kv_blocks": 160 if tiny else 64},
        focus={"event": EventKind.PREFIX_HIT, "nth": 1},
        look_for=N_(
            "The second request is admitted with a prefix hit: its block table starts with the first "
            "request's blocks (ref count 2) and only its question is computed."
        ),
    )


def chunked_prefill(tiny: bool) -> Scenario:
    return Scenario(
        name="chunked-prefill",
        title=N_("Demo: chunked prefill"),
        requests=[
            Request("Name a colour.", {"max_tokens": 14, "ignore_eos": True}),
            Request("Name a fruit.", {"max_tokens": 14, "ignore_eos": True}),
            Request(LONG_DOC, {"max_tokens": 4, "ignore_eos": True}, arrive=2),
        ],
        engine={
            "block_size": 8 if tiny else 16,
            "num_kv_blocks": 96 if tiny else 32,
            "max_num_batched_tokens": 48 if tiny else 32,
        },
        focus={"event": EventKind.PREFILL_CHUNK, "request": 2, "nth": 2},
        look_for=N_(
            "The long prompt is split into chunks that fill the token budget, while the two short "
            "requests keep decoding one token per step; its sampled token is discarded until the last chunk."
        ),
    )


def preemption(tiny: bool) -> Scenario:
    prompts = ["Count from one to twenty.", "List the days of the week.", "Spell the word engine."]
    return Scenario(
        name="preemption",
        title=N_("Demo: preemption under memory pressure"),
        requests=[Request(p, {"max_tokens": 16, "ignore_eos": True}) for p in prompts],
        engine={"block_size": 4 if tiny else 16, "num_kv_blocks": 26 if tiny else 10, "enable_prefix_caching": False},
        focus={"event": EventKind.PREEMPTED, "nth": 1},
        look_for=N_(
            "The pool is full and the oldest request needs a block, so the newest request is preempted: "
            "its blocks go back to the pool and it waits at the head of the queue, to recompute later."
        ),
    )


def batching(tiny: bool) -> Scenario:
    lengths = (2, 12, 4, 10, 3, 8)
    prompts = ["Say hi.", "Tell a story.", "Name a planet.", "Describe the sea.", "Say bye.", "Explain rain."]
    return Scenario(
        name="continuous-vs-static",
        title=N_("Demo: continuous vs static batching"),
        requests=[Request(p, {"max_tokens": n, "ignore_eos": True}) for p, n in zip(prompts, lengths)],
        engine={"block_size": 8 if tiny else 16, "num_kv_blocks": 64 if tiny else 48, "max_num_seqs": 3},
        focus={"event": EventKind.FINISHED, "nth": 1},
        look_for=N_(
            "A request has just finished; in the very next step a waiting request takes its place. "
            "In static batching it would wait until the whole batch is done."
        ),
    )


def beam_search(tiny: bool) -> Scenario:
    return Scenario(
        name="beam-search",
        title=N_("Demo: beam search, fork and copy-on-write"),
        requests=[Request(BEAM_PROMPT, {"beam_width": 3, "max_tokens": 10, "ignore_eos": tiny})],
        # a small pool and small blocks: the beams' tables fit on screen, and the shared last block
        # is copied on write every few steps
        engine={"block_size": 4, "num_kv_blocks": 32 if tiny else 64},
        focus={"event": EventKind.COPY_ON_WRITE, "nth": 1},
        look_for=N_(
            "The beams forked from one another share every block (ref count above 1). At this step a beam "
            "about to write into a shared block gets its own copy first, and the runner copies the K/V; "
            "the block's last holder writes into it itself. Press n for the next fork, copy or pruned beam."
        ),
    )


# ---- static batching, built from the scheduler's swappable functions --------------------
def static_batching() -> dict[str, Callable]:
    """Admit new requests only when the batch is empty: a new batch forms, then runs to the end."""
    open_for_admission: dict[int, bool] = {}
    schedule, try_admit = original("Scheduler.schedule"), original("Scheduler.try_admit")

    def static_schedule(self):
        open_for_admission[id(self)] = not self.running
        return schedule(self)

    def static_try_admit(self, seq, budget, out):
        if not open_for_admission.get(id(self), True):
            return False
        return try_admit(self, seq, budget, out)

    return {"Scheduler.schedule": static_schedule, "Scheduler.try_admit": static_try_admit}


# ---- what to tell the class --------------------------------------------------------------
def report_prefix(console: Console, runs: list[ScenarioRun]) -> None:
    run = runs[0]
    table = Table(title=_("prompt tokens per request"), title_justify="left")
    for col in (_("request"), _("prompt tokens"), _("reused from the cache"), _("computed")):
        table.add_column(col, justify="right")
    saved = saved_per_request(run)
    for i, out in enumerate(run.outputs):
        n = len(out.prompt_token_ids)
        table.add_row(chr(65 + i), str(n), str(saved.get(i, 0)), str(n - saved.get(i, 0)))
    console.print(table)
    total = sum(len(o.prompt_token_ids) for o in run.outputs)
    message = _("Prefix caching saved {saved} of {total} prompt tokens ({share:.0%}).")
    console.print(message.format(saved=sum(saved.values()), total=total, share=sum(saved.values()) / total))


def saved_per_request(run: ScenarioRun) -> dict[int, int]:
    from tracer.trace.trace_file import load_trace

    saved: dict[int, int] = {}
    if run.trace_path is None:
        return saved
    trace = load_trace(run.trace_path, validate="none")
    order = {r["seq_id"]: i for i, r in enumerate(sorted(trace.requests.values(), key=lambda r: r["seq_id"]))}
    for step in trace.steps:
        for e in step["events"]:
            if e["kind"] == EventKind.PREFIX_HIT:
                saved[order[e["seq_id"]]] = saved.get(order[e["seq_id"]], 0) + e["detail"]["tokens_saved"]
    return saved


def report_chunked(console: Console, runs: list[ScenarioRun]) -> None:
    run = runs[0]
    long_index = len(run.outputs) - 1
    chunks = [(s.step, n) for s in run.steps for i, n in s.batch if i == long_index and n > 1]
    budget = run.scenario.engine["max_num_batched_tokens"]
    decode_steps = [
        s.step
        for s in run.steps
        if any(i < long_index and n == 1 for i, n in s.batch) and any(i == long_index and n > 1 for i, n in s.batch)
    ]
    message = _("The long prompt ({n} tokens) was prefilled in {chunks} chunks: {steps}.")
    steps = ", ".join(_("step {step}: {n}").format(step=s, n=n) for s, n in chunks)
    console.print(message.format(n=len(run.outputs[long_index].prompt_token_ids), chunks=len(chunks), steps=steps))
    message = _(
        "No step computed more than {most} tokens (budget {budget}); in {n} of those chunk steps the short "
        "requests still got their next token."
    )
    console.print(message.format(most=max(s.num_batched_tokens for s in run.steps), budget=budget, n=len(decode_steps)))


def report_preemption(console: Console, runs: list[ScenarioRun]) -> None:
    run = runs[0]
    preempted = [(s.step, i) for s in run.steps for kind, i in s.events if kind == EventKind.PREEMPTED]
    recomputed = 0
    for step, i in preempted:
        later = next((s for s in run.steps if s.step > step and any(j == i for j, _ in s.batch)), None)
        if later is not None:
            recomputed += dict(later.batch)[i]
    which = ", ".join(_("request {name} at step {step}").format(name=chr(65 + i), step=s) for s, i in preempted)
    console.print(_("{n} preemption(s): {which}.").format(n=len(preempted), which=which))
    message = _(
        "Re-admitted requests recomputed {n} tokens (prompt + what they had generated); the run took {steps} steps."
    )
    console.print(message.format(n=recomputed, steps=run.num_steps))


def report_batching(console: Console, runs: list[ScenarioRun]) -> None:
    table = Table(title=_("the same 6 requests, at most 3 running at once"), title_justify="left")
    for col in (_("batching"), _("steps"), _("avg. sequences per step"), _("tokens generated")):
        table.add_column(col, justify="right")
    for label, run in zip((_("continuous"), _("static")), runs):
        occupancy = sum(len(s.batch) for s in run.steps) / max(1, run.num_steps)
        table.add_row(label, str(run.num_steps), f"{occupancy:.2f}", str(sum(len(o.token_ids) for o in run.outputs)))
    console.print(table)
    continuous, static = runs[0].num_steps, runs[1].num_steps
    message = _(
        "Continuous batching needed {continuous} steps, static batching {static} ({more} more, {ratio:.2f}x): in "
        "static mode a finished request's place stays empty until the longest request of its batch is done."
    )
    console.print(
        message.format(continuous=continuous, static=static, more=static - continuous, ratio=static / continuous)
    )


def beam_score_of(out: RequestOutput, c: CompletionOutput, eos_token_ids: frozenset[int], penalty: float) -> float:
    """The engine's beam score (nanoengine.beam_search.beam_score) of one of a beam search's outputs."""
    from nanoengine.beam_search import beam_score
    from nanoengine.sampling_params import SamplingParams
    from nanoengine.sequence import Sequence

    hypothesis = Sequence(out.prompt_token_ids + c.token_ids, SamplingParams())
    hypothesis.cumulative_logprob = c.cumulative_logprob or 0.0
    return beam_score(hypothesis, eos_token_ids, penalty)


def report_beam_search(console: Console, runs: list[ScenarioRun]) -> None:
    from tracer.trace.trace_file import load_trace

    run = runs[0]
    assert run.trace_path is not None, "demos always record a trace"
    trace = load_trace(run.trace_path, validate="none")
    eos, (out,) = frozenset(trace.header.get("eos_token_ids") or ()), run.outputs
    params = run.scenario.requests[0].params
    table = Table(title=_("the {n} beams, best first").format(n=params["beam_width"]), title_justify="left")
    for col in (_("beam"), _("score"), _("cumulative logprob"), _("finish"), _("text")):
        table.add_column(col, justify="left" if col == _("text") else "right")
    for rank, c in enumerate(out.outputs):
        score = beam_score_of(out, c, eos, params.get("length_penalty", 1.0))
        cum = c.cumulative_logprob or 0.0
        table.add_row(str(rank), f"{score:.4f}", f"{cum:.3f}", str(c.finish_reason), Text(printable(c.text)))
    console.print(table)
    kinds = [e for s in trace.steps for e in s["events"]]
    forks = sum(e["kind"] == EventKind.FORKED for e in kinds)
    pruned = sum((e.get("detail") or {}).get("reason") == FinishReason.PRUNED for e in kinds)
    copies = sum(len(s.get("blocks_to_copy", [])) for s in trace.steps)
    named, distinct = max(((sum(map(len, t)), len(set().union(*t))) for t in live_tables(trace.steps)), default=(0, 0))
    message = _(
        "{forks} forks, {copies} blocks copied on write, {pruned} beams pruned. At most the beams' block tables "
        "named {named} blocks, only {distinct} of them distinct: sharing saved {saved} blocks of K/V."
    )
    console.print(
        message.format(
            forks=forks, copies=copies, pruned=pruned, named=named, distinct=distinct, saved=named - distinct
        )
    )


def live_tables(steps: SequenceOf[Mapping[str, Any]]) -> list[list[set[int]]]:
    """Each step's block tables of the sequences running after it."""
    return [[set(r["block_table_after"]) for r in s["seqs"] if r["status_after"] == "RUNNING"] for s in steps]


DEMOS: dict[str, Demo] = {
    d.name: d
    for d in (
        Demo(
            "prefix-sharing",
            N_("requests with a common prompt prefix share KV blocks (prefix caching)"),
            prefix_sharing,
            report_prefix,
        ),
        Demo(
            "chunked-prefill",
            N_("a long prompt is split over several steps while others keep decoding"),
            chunked_prefill,
            report_chunked,
        ),
        Demo(
            "preemption",
            N_("a tiny KV pool forces the scheduler to preempt and recompute a request"),
            preemption,
            report_preemption,
        ),
        Demo(
            "continuous-vs-static",
            N_("the same workload with continuous and with static batching"),
            batching,
            report_batching,
            variants=("continuous", "static"),
        ),
        Demo(
            "beam-search",
            N_("a beam search: beams forked from one another share blocks, copied on write, pruned"),
            beam_search,
            report_beam_search,
        ),
    )
}


# ---- running --------------------------------------------------------------------------------
def run_demo(
    demo: Demo,
    model: str,
    out_dir: Path,
    console: Console | None = None,
    threads: int | None = None,
    engine: dict | None = None,
) -> list[ScenarioRun]:
    """Record every variant of a demo; returns the runs in variant order. `engine` overrides
    the scenario's engine options (block_size, num_kv_blocks, ...)."""
    scenario = demo.build(model == "tiny")
    scenario.title = _(scenario.title)  # the trace is titled in the language the demo is shown in
    scenario.engine = {**scenario.engine, **(engine or {})}
    runs = []
    for n, variant in enumerate(demo.variants):
        path = out_dir / f"demo-{demo.name}{'-' + variant if n else ''}.jsonl"
        if console:
            title = f"{scenario.title} ({variant})" if variant else scenario.title
            console.print(_("[bold]{title}[/]: model {model} ...").format(title=escape(title), model=escape(model)))
        swaps = static_batching() if variant == "static" else {}
        with plugged(swaps):
            run = run_scenario(
                scenario,
                path,
                model=model,
                engine_overrides={"num_threads": threads} if threads else None,
                title=scenario.title + (f": {variant}" if variant else ""),
            )
        set_header_fields(path, look_for=look_for(run))  # this run's steps and sequences, named
        if console:
            message = _("  {n} steps → {path}; the step that matters: {step}")
            console.print(message.format(n=run.num_steps, path=escape(str(path)), step=run.focus_step))
            if run.violations:  # an engine bug: say so, and still show the run
                v = run.violations[0]
                message = _("{n} invariant violation(s); the first, at step {step}: {message}")
                console.print(
                    Text("  " + message.format(n=len(run.violations), step=v.step, message=v.message), style="red")
                )
        runs.append(run)
    return runs


def export_frames(
    trace_path: Path,
    steps: list[int],
    out_dir: Path,
    prefix: str,
    size: tuple[int, int] = DEFAULT_SIZE,
    console: Console | None = None,
) -> list[Path]:
    """SVG screenshots of the replay TUI at the given step numbers (headless)."""
    from tracer.trace.trace_file import load_trace

    trace = load_trace(trace_path)
    index = {s["step"]: i for i, s in enumerate(trace.steps)}
    missing = [s for s in steps if s not in index]
    if missing:
        last = trace.steps[-1]["step"] if trace.steps else 0
        message = _("step(s) {steps} not in {name} (steps 0..{last})").format(
            steps=", ".join(map(str, missing)), name=trace_path.name, last=last
        )
        if len(missing) == len(steps):
            raise ValueError(_("{message}: choose steps inside the trace").format(message=message))
        if console:
            console.print(Text(_("skipping {message}").format(message=message), style="yellow"))
    wanted = [s for s in steps if s in index]
    out_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(screenshots(trace, [(s, index[s]) for s in wanted], out_dir, prefix, size))


async def screenshots(
    trace, steps: list[tuple[int, int]], out_dir: Path, prefix: str, size: tuple[int, int]
) -> list[Path]:
    from tracer.replay.app import ReplayApp

    app = ReplayApp(trace, start_step=steps[0][1] if steps else 0, animations=False)
    paths = []
    async with app.run_test(size=size) as pilot:
        for number, i in steps:
            app.go_to(i)
            await pilot.pause()
            name = f"{prefix}step-{number:03d}.svg"
            app.save_screenshot(filename=name, path=str(out_dir))
            paths.append(out_dir / name)
    return paths
