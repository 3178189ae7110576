"""The kit for lesson check.py authors: build engine parts, compare, and run the real engine.

Every lesson's check.py imports from here, so the same situation is built the same way in
every lesson:

    make_scheduler(num_kv_blocks=6)         a Scheduler over a fresh BlockManager (block size 4)
    make_block_manager(8)                   a BlockManager of 8 free blocks (block size 4)
    make_sequence(8, name="A")              a request with 8 distinct prompt tokens
    add_sequences(sched, 10, 10, 10)        three waiting requests A, B, C (no shared prefix)
    add_sequences(sched, 5, names="D")      one more, named D
    prefilled(sched, 8, 8)                  ... admitted and prefilled by the engine's own code
    make_beam_search(6, 3, name="B")        a beam search of 3 beams, its first beam (waiting)
    fork_beams(sched, first)                ... after its prefill: its live beams, sharing blocks
    expect(ok, "message for the student")   fail a check
    frames_of(e)                            the frames an exception from the student's code passed
    expect_same_list(got, want, "slots")    fail with the first differing index and both values
    cache_prefix(bm, tokens)                a prefix computed once, its full blocks in the cache
    scenario = lesson_scenario(__file__, engine={...})   the lesson's scenario.json, changed
    add_request(scenario, "text", arrive=8, max_tokens=3)   one more request, before step 8
    expect_engine_matches(scenario)         run the engine, compare with its own code
    run = run_engine(scenario)              the engine itself after the run, and every step's record
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nanoengine.beam_search import BeamGroup, BeamSearchParams
from nanoengine.block_manager import BlockManager
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import Sequence
from tracer.i18n import _, ngettext
from tracer.teach.sandbox import frames_of as frames_of  # re-exported for check.py
from tracer.teach.scenarios import (
    Request,
    Scenario,
    ScenarioError,
    ScenarioRun,
    StepSummary,
    load_scenario,
    run_scenario,
)
from tracer.teach.swap import SWAPPABLE, original, plugged

if TYPE_CHECKING:
    from nanoengine.engine import LLMEngine
    from nanoengine.outputs import RequestOutput
    from nanoengine.step_record import StepRecord

BLOCK_SIZE = 4
EOS = 2  # the end-of-sequence id of make_scheduler(eos=True)
FIRST_TOKEN = 10  # prompt token ids start here (0-9 stay free for EOS and made-up samples)
TOKENS_PER_NAME = 40  # request "B" starts 40 ids after "A": no two named requests share a prefix


# ---- building engine parts -------------------------------------------------------------------
def make_block_manager(
    num_kv_blocks: int = 16, block_size: int = BLOCK_SIZE, prefix_caching: bool = True
) -> BlockManager:
    """A fresh pool: every block free, ref count 0, nothing cached."""
    return BlockManager(num_kv_blocks, block_size, enable_prefix_caching=prefix_caching)


def make_scheduler(
    num_kv_blocks: int = 16,
    *,
    block_size: int = BLOCK_SIZE,
    budget: int = 64,
    max_num_seqs: int = 8,
    max_model_len: int = 256,
    eos: bool = False,
    prefix_caching: bool = True,
) -> Scheduler:
    """A Scheduler over a fresh pool of `num_kv_blocks` blocks; `budget` is max_num_batched_tokens."""
    return Scheduler(
        make_block_manager(num_kv_blocks, block_size, prefix_caching),
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        eos_token_ids=frozenset({EOS}) if eos else frozenset(),
    )


def make_sequence(
    tokens: int | Iterable[int],
    *,
    name: str = "",
    generated: Iterable[int] = (),
    num_cached_tokens: int = 0,
    num_scheduled_tokens: int = 0,
    block_table: Iterable[int] = (),
    **params,
) -> Sequence:
    """A request: `tokens` prompt ids (or that many distinct ids, different per `name`), then
    `generated` tokens appended as postprocess would; `params` are SamplingParams fields."""
    if isinstance(tokens, int):
        start = FIRST_TOKEN + TOKENS_PER_NAME * (ord(name) - ord("A") if name else 0)
        tokens = range(start, start + tokens)
    seq = Sequence(list(tokens), SamplingParams(**params), prompt=name)
    seq.token_ids.extend(generated)
    seq.num_cached_tokens, seq.num_scheduled_tokens = num_cached_tokens, num_scheduled_tokens
    seq.block_table = list(block_table)
    return seq


def add_sequences(sched: Scheduler, *sizes: int, names: str = "ABCDEFGH", max_tokens: int = 50) -> list[Sequence]:
    """One waiting request per size, named A, B, C, ... (or from `names`); ignore_eos, so only
    lengths stop them."""
    seqs = [make_sequence(n, name=name, max_tokens=max_tokens, ignore_eos=True) for n, name in zip(sizes, names)]
    for seq in seqs:
        sched.add(seq)
    return seqs


def prefilled(sched: Scheduler, *sizes: int) -> list[Sequence]:
    """add_sequences, then one step of the engine's own schedule() and postprocess()."""
    seqs = add_sequences(sched, *sizes)
    engine_step(sched)
    return seqs


def make_beam_search(tokens: int, width: int, *, name: str = "B", max_tokens: int = 50) -> Sequence:
    """A beam search of `width` beams as the engine adds one: a single sequence (its first beam)
    in a BeamGroup; `tokens` distinct prompt ids, as make_sequence."""
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=True)
    first = make_sequence(tokens, name=name)
    first.params = params.sampling_params()  # what each beam runs with
    first.group = BeamGroup(params, [first])
    return first


def fork_beams(sched: Scheduler, first: Sequence) -> list[Sequence]:
    """After its prefill, fork the first beam into its group's beam_width live beams, as the
    engine's advance_beams does: each child shares every block (ref count + 1), is RUNNING at
    the end of sched.running and ends in a token of its own. Children are named B1, B2, ..."""
    group = first.group
    assert group is not None and first.num_completion_tokens == 1, "fork a beam search after its prefill"
    for i in range(1, group.params.beam_width):
        child = first.fork()
        sched.block_manager.fork(first, child)
        child.token_ids[-1] += i
        child.prompt = f"{first.prompt}{i}"
        sched.running.append(child)
        group.live.append(child)
    return list(group.live)


def engine_step(sched: Scheduler, token_id: int = 5) -> SchedulerOutput:
    """One step of whatever schedule/postprocess are plugged in, with a made-up sampled token."""
    out = sched.schedule()
    sched.postprocess(out, [token_id] * len(out.seqs))
    return out


def cache_prefix(bm: BlockManager, tokens: list[int], keep: bool = False) -> Sequence:
    """Compute `tokens` as one request and register its full blocks in the prefix cache.

    keep=False frees it again (its blocks stay cached with ref count 0, in the free list)."""
    seq = make_sequence(tokens)
    bm.allocate(seq, len(tokens))
    seq.num_cached_tokens = len(tokens)
    bm.register_full_blocks(seq)
    if not keep:
        bm.free(seq)
    return seq


def names(seqs: Iterable[Sequence]) -> list[str]:
    """The names (prompt field) of sequences built with make_sequence(name=...)."""
    return [s.prompt if isinstance(s.prompt, str) and s.prompt else f"seq {s.seq_id}" for s in seqs]


def batch_of(out: SchedulerOutput) -> list[tuple[str, int]]:
    """A step's batch as (name, num_scheduled_tokens) pairs."""
    return [(name, s.num_scheduled_tokens) for name, s in zip(names(out.seqs), out.seqs)]


def event_kinds(out: SchedulerOutput) -> list[str]:
    return [e.kind for e in out.events]


# ---- failing a check -----------------------------------------------------------------------
def expect(ok: bool, message: str) -> None:
    """Fail the check with `message` (written for the student) unless ok."""
    if not ok:
        raise AssertionError(message)


def first_difference(got: SequenceOf, want: SequenceOf) -> str:
    """'first difference at index 3: got 7, expected 12' (or which list is longer)."""
    got, want = list(got), list(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return _("first difference at index {i}: got {got!r}, expected {want!r}").format(i=i, got=g, want=w)
    if len(got) != len(want):
        return _("got {got} items, expected {want}").format(got=len(got), want=len(want))
    return _("they are equal")


def expect_same_list(got: SequenceOf, want: SequenceOf, what: str, why: str = "") -> None:
    """Fail with the first differing index and both values (lists too long to print whole)."""
    if list(got) != list(want):
        difference = _("{what}: {difference}").format(what=what, difference=first_difference(got, want))
        raise AssertionError(_("{message}. {why}").format(message=difference, why=why) if why else difference)


# ---- running the real engine ---------------------------------------------------------------
def lesson_scenario(check_file: str, **changes) -> Scenario:
    """The scenario.json next to a check.py, optionally with some top-level fields changed."""
    path = Path(check_file).parent / "scenario.json"
    scenario = load_scenario(path, name=path.parent.name)
    for key, value in changes.items():
        setattr(scenario, key, value)
    return scenario


def add_request(scenario: Scenario, prompt: str | list[int], *, arrive: int = 0, **params) -> Scenario:
    """Append one request, added before engine step `arrive`; `params` override the scenario's
    SamplingParams defaults (as a request in scenario.json does)."""
    scenario.requests.append(Request(prompt, params, arrive))
    return scenario


def beam_search_under_pressure(check_file: str, **changes) -> Scenario:
    """A plain request, then a 3-beam search one step later, in 12 blocks of 4 tokens: too few for
    both, so the beam search is preempted and restarts from its prompt (lessons 8 and 16)."""
    engine = {"block_size": 4, "num_kv_blocks": 12}
    scenario = lesson_scenario(check_file, engine=engine, requests=[], **changes)
    add_request(scenario, "Once upon a time", max_tokens=10, ignore_eos=True)
    return add_request(scenario, "Beams!", arrive=1, beam_width=3, max_tokens=6, ignore_eos=True)


REFERENCE_RUNS: dict[str, ScenarioRun] = {}


def reference_run(scenario: Scenario) -> ScenarioRun:
    """The scenario run with the engine's own code everywhere (cached per process)."""
    key = repr(scenario)
    if key not in REFERENCE_RUNS:
        with plugged({name: original(name) for name in SWAPPABLE}):
            REFERENCE_RUNS[key] = run_scenario(scenario)
    return REFERENCE_RUNS[key]


def expect_engine_matches(
    scenario: Scenario, same_schedule: bool = True, requests: list[int] | None = None
) -> ScenarioRun:
    """Run the scenario with whatever is plugged in now; compare it with the engine's own run.

    Checks, in order: no invariant was broken, every request (or those listed in `requests`)
    generated the same tokens and finished for the same reason, and (same_schedule) every step
    scheduled the same tokens.
    """
    try:
        run = run_scenario(scenario)
    except ScenarioError as e:
        raise AssertionError(str(e)) from None
    expect_no_violations(run)
    ref = reference_run(scenario)
    for i, (mine, theirs) in enumerate(zip(run.outputs, ref.outputs)):
        if requests is not None and i not in requests:
            continue
        expect_same_list(
            mine.token_ids,
            theirs.token_ids,
            _("request {i} generated other tokens than the engine's own code does in the same run").format(i=i),
        )
        expect(
            mine.finish_reason == theirs.finish_reason,
            _("request {i} finished with reason {mine!r}, expected {theirs!r}").format(
                i=i, mine=mine.finish_reason, theirs=theirs.finish_reason
            ),
        )
    if same_schedule:
        expect_same_schedule(run, ref)
    return run


@dataclass(slots=True)
class EngineRun:
    engine: LLMEngine  # as the run left it: its block manager's ref counts and free list
    outputs: list[RequestOutput]  # in request order
    records: list[StepRecord]  # every step's


def run_engine(scenario: Scenario, reference: bool = False) -> EngineRun:
    """The scenario on a fresh engine with whatever is plugged in now (reference: the engine's own
    code), without a recorder: the checks read the engine itself after the run."""
    from nanoengine.engine import LLMEngine
    from tracer.loop.drive import StepLimitError, drive
    from tracer.teach.scenarios import scenario_arrivals

    with plugged({name: original(name) for name in SWAPPABLE} if reference else {}):
        engine = LLMEngine(scenario.model, **scenario.engine)
        records: list[StepRecord] = []
        engine.add_step_hook(records.append)
        try:
            ids = drive(engine, scenario_arrivals(scenario), max_steps=scenario.max_steps)
        except StepLimitError as e:
            raise AssertionError(str(e)) from None
        outputs = [engine.collect(ids[i]) for i in range(len(scenario.requests))]
    return EngineRun(engine, outputs, records)


def expect_no_violations(run: ScenarioRun) -> None:
    if run.violations:
        v = run.violations[0]
        seq = _(", seq {seq}").format(seq=v.seq_id) if v.seq_id is not None else ""
        more = _(" (and {n} more)").format(n=len(run.violations) - 1) if len(run.violations) > 1 else ""
        message = _("the engine broke the invariant '{invariant}' at step {step}{seq}: {message}{more}")
        raise AssertionError(message.format(invariant=v.invariant, step=v.step, seq=seq, message=v.message, more=more))


def expect_same_schedule(run: ScenarioRun, ref: ScenarioRun) -> None:
    for mine, theirs in zip(run.steps, ref.steps):
        if mine.batch != theirs.batch or sorted(mine.events) != sorted(theirs.events):
            message = _("step {step} differs from the engine's own code: yours ran {mine}; the engine's runs {theirs}")
            raise AssertionError(message.format(step=mine.step, mine=describe_step(mine), theirs=describe_step(theirs)))
    expect(
        run.num_steps == ref.num_steps,
        _("the run took {n} steps, the engine's own code takes {ref}").format(n=run.num_steps, ref=ref.num_steps),
    )


def describe_step(step: StepSummary) -> str:
    batch = ", ".join(
        ngettext("request {i}: {n} token", "request {i}: {n} tokens", n).format(i=i, n=n) for i, n in step.batch
    )
    events = ", ".join(f"{kind} {i}" for kind, i in step.events)
    shown = "[" + (batch or _("nothing")) + "]"
    return _("{batch} with events [{events}]").format(batch=shown, events=events) if events else shown
