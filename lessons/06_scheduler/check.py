"""Checks for lesson 6: schedule."""

from nanoengine.block_manager import BlockManager
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import Sequence, SequenceStatus
from tracer.teach.lessons import expect, expect_engine_matches, lesson_scenario

TARGETS = {"schedule": "Scheduler.schedule"}


def make(budget: int = 16, max_num_seqs: int = 4, num_blocks: int = 32) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, 4),
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=256,
        eos_token_ids=frozenset(),
    )


def add(sched: Scheduler, num_tokens: int, name: str) -> Sequence:
    start = 10 + 30 * (ord(name) - ord("A"))  # different tokens per request: no prefix-cache hits
    seq = Sequence(list(range(start, start + num_tokens)), SamplingParams(max_tokens=50, ignore_eos=True), prompt=name)
    sched.add(seq)
    return seq


def step(fns, sched: Scheduler) -> SchedulerOutput:
    """Your schedule(), then the engine's postprocess() with a made-up token per sequence."""
    out = fns.schedule(sched)
    expect(isinstance(out, SchedulerOutput), f"schedule must return a SchedulerOutput, got {out!r}")
    sched.postprocess(out, [50] * len(out.seqs))
    return out


def batch(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.prompt, s.num_scheduled_tokens) for s in out.seqs]


def batch_now(fns, sched: Scheduler) -> tuple[SchedulerOutput, list[tuple[str, int]]]:
    out = fns.schedule(sched)
    expect(isinstance(out, SchedulerOutput), f"schedule must return a SchedulerOutput, got {out!r}")
    return out, batch(out)


def check_admits_a_waiting_request(fns):
    """A lone waiting request is admitted with its whole prompt."""
    sched = make()
    a = add(sched, 6, "A")
    out, got = batch_now(fns, sched)
    expect(got == [("A", 6)], f"one 6-token request waiting, budget 16: expected batch [('A', 6)], got {got}")
    expect(a.status == SequenceStatus.RUNNING and sched.running == [a], "A must now be RUNNING, in self.running")


def check_running_before_waiting(fns):
    """Running sequences are scheduled first (1 decode token each), then new ones are admitted."""
    sched = make()
    add(sched, 6, "A")
    step(fns, sched)
    add(sched, 5, "B")
    out, got = batch_now(fns, sched)
    expect(got == [("A", 1), ("B", 5)], f"A is decoding and B just arrived: expected [('A', 1), ('B', 5)], got {got}")


def check_token_budget(fns):
    """The step never schedules more than max_num_batched_tokens; the last admission gets a chunk."""
    sched = make(budget=16)
    add(sched, 10, "A"), add(sched, 10, "B"), add(sched, 10, "C")
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 10), ("B", 6)],
        f"budget 16, three 10-token prompts: expected [('A', 10), ('B', 6)] "
        f"(B gets a 6-token chunk, C waits), got {got}",
    )


def check_continues_a_chunked_prefill(fns):
    """A running sequence mid-prefill gets the rest of its prompt, up to the budget."""
    sched = make(budget=16)
    add(sched, 10, "A"), add(sched, 10, "B")
    step(fns, sched)  # A 10, B 6
    out, got = batch_now(fns, sched)
    expect(got == [("A", 1), ("B", 4)], f"B has 4 prompt tokens left: expected [('A', 1), ('B', 4)], got {got}")


def check_max_num_seqs(fns):
    """No more than max_num_seqs sequences run at once."""
    sched = make(max_num_seqs=2)
    for name in "ABC":
        add(sched, 3, name)
    out, got = batch_now(fns, sched)
    expect(
        [n for n, _ in got] == ["A", "B"], f"max_num_seqs=2 and three short requests: only A and B may run, got {got}"
    )


def check_fifo_no_overtaking(fns):
    """If the head of the queue does not fit, nothing behind it is admitted either."""
    sched = make(budget=64, num_blocks=4)  # 4 blocks of 4 = 16 tokens of KV
    add(sched, 12, "A")
    step(fns, sched)  # A holds 3 blocks (4 after it grows)
    add(sched, 12, "B"), add(sched, 2, "C")  # B needs 3 blocks: does not fit; C would
    out, got = batch_now(fns, sched)
    expect(got == [("A", 1)], f"B does not fit, so C must wait behind it (first come, first served); got {got}")


def check_stops_when_budget_is_spent(fns):
    """Running sequences beyond the budget wait for the next step."""
    sched = make(budget=16)
    for name in "ABC":
        add(sched, 4, name)
    step(fns, sched)  # all three prefilled: 12 tokens
    sched.max_num_batched_tokens = 2
    out, got = batch_now(fns, sched)
    expect(
        got == [("A", 1), ("B", 1)], f"budget 2 with three decoding sequences: expected [('A', 1), ('B', 1)], got {got}"
    )


def check_uses_make_room(fns):
    """When a running sequence needs a block and none is free, the newest one is preempted (make_room)."""
    sched = make(budget=64, num_blocks=4)
    add(sched, 8, "A"), add(sched, 8, "B")  # 2 blocks each: the pool is full
    step(fns, sched)
    out, got = batch_now(fns, sched)  # A's 9th token needs a 3rd block
    expect(
        got == [("A", 1)],
        f"the pool is full and A needs a block: B must be preempted (call "
        f"self.make_room(seq, num_new, out)); expected [('A', 1)], got {got}",
    )
    expect([kind for kind, _, _ in out.events] == ["preempted"], f"expected one 'preempted' event, got {out.events}")


def engine_lesson_scenario(fns):
    """The engine, running the lesson's scenario with your schedule, matches the engine's own."""
    expect_engine_matches(lesson_scenario(__file__))


def engine_tight_memory(fns):
    """With a small pool (preemptions) and a budget of 5 it still matches."""
    run = expect_engine_matches(
        lesson_scenario(
            __file__, engine={"block_size": 4, "num_kv_blocks": 7, "max_num_seqs": 3, "max_num_batched_tokens": 5}
        )
    )
    expect(run.event_counts["preempted"] >= 1, "this run should preempt a request; none was preempted")
