"""The live engine loop: requests added from other threads while it runs, aborts, pause and
single steps, failures, and what the trace records. Every wait is for an update the loop sends."""

from __future__ import annotations

import queue
import threading

import pytest
from conftest import HANG_S, TINY_OPTIONS, make_tiny_engine

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams
from tracer.loop.engine_loop import REJECTED, EngineLoop, RequestUpdate
from tracer.trace.invariants import check_trace
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import load_trace

WAIT = HANG_S  # a bound on a wait for the loop, never a guess at when it is done
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = ["hello world", "hello there", "abc", "the quick brown fox"]


class Inbox:
    """One request's updates, as the loop thread delivers them. on_first runs in the loop thread at the
    first update, so what it does lands at a known step (the next), however slow this thread is."""

    def __init__(self, on_first=None) -> None:
        self.updates: queue.Queue[RequestUpdate] = queue.Queue()
        self.on_first = on_first

    def __call__(self, update: RequestUpdate) -> None:
        if self.on_first is not None:
            self.on_first(update)
            self.on_first = None
        self.updates.put(update)

    def until_finished(self) -> tuple[list[int], RequestUpdate]:
        tokens: list[int] = []
        while True:
            update = self.updates.get(timeout=WAIT)
            tokens += update.new_token_ids
            if update.finished:
                return tokens, update


def pool_state(engine) -> tuple[int, list[int]]:
    """Read in the loop thread, between two steps."""
    return engine.block_manager.num_free_blocks, list(engine.block_manager.ref_counts)


@pytest.fixture
def loop(one_torch_thread):
    loop = EngineLoop(make_tiny_engine()).start()
    yield loop
    loop.stop(timeout=WAIT)


def test_requests_added_from_other_threads_get_the_same_tokens_as_generate(loop):
    inboxes = [Inbox() for _ in PROMPTS]
    threads = [
        threading.Thread(target=loop.add, args=(prompt, PARAMS, inbox)) for prompt, inbox in zip(PROMPTS, inboxes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [inbox.until_finished() for inbox in inboxes]
    expected = LLM("tiny", **TINY_OPTIONS).generate(PROMPTS, PARAMS)
    for (tokens, last), want in zip(results, expected):
        assert tokens == want.token_ids
        assert last.finish_reason == "length" and last.text == want.text
    assert loop.call(lambda engine: engine.sequences).result(WAIT) == {}  # collected: nothing kept


def test_an_abort_finishes_the_request_and_frees_its_blocks(loop):
    long = Inbox(on_first=lambda update: loop.abort(update.request))
    loop.add("a long one", SamplingParams(max_tokens=30, ignore_eos=True), long)
    tokens, last = long.until_finished()
    assert last.finish_reason == "abort" and len(tokens) == 1  # aborted in the step after its first token
    num_free, ref_counts = loop.call(pool_state).result(WAIT)
    assert num_free == TINY_OPTIONS["num_kv_blocks"] and not any(ref_counts)


def test_pause_then_step_once_runs_exactly_one_step(one_torch_thread):
    loop = EngineLoop(make_tiny_engine())
    loop.pause()
    loop.start()
    stepped = queue.Queue()
    loop.add_step_callback(lambda appended: stepped.put(len(appended)))
    inbox = Inbox()
    loop.add("hello", PARAMS, inbox)
    assert loop.call(lambda engine: (engine.num_steps, engine.has_unfinished())).result(WAIT) == (0, True)
    loop.step_once()
    assert stepped.get(timeout=WAIT) == 1
    assert loop.call(lambda engine: engine.num_steps).result(WAIT) == 1  # and no second step
    loop.resume()
    tokens, last = inbox.until_finished()
    assert len(tokens) == PARAMS.max_tokens and last.finish_reason == "length"
    loop.stop(timeout=WAIT)


def test_a_request_the_engine_refuses_is_rejected_and_the_loop_goes_on(loop):
    refused, fine = Inbox(), Inbox()
    loop.add("x" * 5000, PARAMS, refused)  # longer than the tiny model's max_model_len
    loop.add("hello", PARAMS, fine)
    tokens, last = refused.until_finished()
    assert tokens == [] and last.finish_reason == REJECTED and "max_model_len" in last.error
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens


def test_a_failed_step_fails_the_live_requests_and_the_loop_goes_on(loop):
    def explode_once(record):
        loop.engine.remove_step_hook(explode_once)
        raise RuntimeError("planted hook failure")

    loop.call(lambda engine: engine.add_step_hook(explode_once)).result(WAIT)
    doomed, later = Inbox(), Inbox()
    loop.add("hello", PARAMS, doomed)
    tokens, last = doomed.until_finished()
    assert last.finish_reason == "error" and "planted hook failure" in last.error
    assert "planted hook failure" in loop.error
    loop.add("hello", PARAMS, later)
    tokens, last = later.until_finished()
    assert len(tokens) == PARAMS.max_tokens and last.finish_reason == "length"


def test_a_callback_that_raises_aborts_only_its_request(loop):
    def deaf(update):
        raise ConnectionError("the client went away")

    fine = Inbox()
    loop.add("hello", SamplingParams(max_tokens=30, ignore_eos=True), deaf)
    loop.add("world", PARAMS, fine)
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens
    assert loop.call(lambda engine: engine.has_unfinished()).result(WAIT) is False  # the deaf one was aborted


def test_the_trace_records_arrivals_notes_and_aborts_and_checks_clean(tmp_path, one_torch_thread):
    engine = make_tiny_engine()
    path = tmp_path / "live.jsonl"
    recorder = TraceRecorder(engine, path)
    loop = EngineLoop(engine, recorder).start()
    second = Inbox(on_first=lambda update: loop.abort(update.request))
    late = SamplingParams(max_tokens=30, ignore_eos=True)
    first = Inbox(on_first=lambda update: loop.add("world", late, second, {"http_request_id": "cmpl-2"}))
    loop.add("hello", PARAMS, first, notes={"http_request_id": "cmpl-1"})
    assert second.until_finished()[1].finish_reason == "abort"
    first.until_finished()
    loop.stop(timeout=WAIT)
    recorder.close()
    trace = load_trace(path, "all")
    assert check_trace(trace) == []
    entries = sorted(trace.requests.values(), key=lambda r: r["seq_id"])
    assert [r["http_request_id"] for r in entries] == ["cmpl-1", "cmpl-2"]
    assert entries[0]["first_step"] == 0 and entries[1]["first_step"] == 1
    assert entries[0]["arrival_time"] <= entries[1]["arrival_time"]
    aborts = [e for s in trace.steps for e in s["events"] if e["detail"].get("reason") == "abort"]
    assert [e["seq_id"] for e in aborts] == [entries[1]["seq_id"]]


def test_stop_aborts_what_is_left_in_a_recorded_step(tmp_path, one_torch_thread):
    engine = make_tiny_engine()
    path = tmp_path / "stopped.jsonl"
    recorder = TraceRecorder(engine, path)
    loop = EngineLoop(engine, recorder).start()
    inbox = Inbox(on_first=lambda update: loop.stop())
    loop.add("hello", SamplingParams(max_tokens=30, ignore_eos=True), inbox)
    inbox.updates.get(timeout=WAIT)
    loop.stop(timeout=WAIT)
    assert not loop.thread.is_alive()
    assert inbox.until_finished()[1].finish_reason == "abort"
    recorder.close()
    trace = load_trace(path, "all")
    assert check_trace(trace) == []
    assert trace.steps[-1]["events"][-1]["detail"]["reason"] == "abort"


def test_an_unexpected_error_while_adding_fails_that_request_only(loop, capsys):
    refused, fine = Inbox(), Inbox()
    loop.add(range(10**20), PARAMS, refused)  # list() of it raises OverflowError, not ValueError
    tokens, last = refused.until_finished()
    assert tokens == [] and last.finish_reason == REJECTED and "OverflowError" in last.error
    loop.add("hello", PARAMS, fine)
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens and loop.thread.is_alive()
    assert "OverflowError" in capsys.readouterr().err  # logged, in one line


def test_a_command_that_raises_is_logged_and_the_loop_goes_on(loop, capsys):
    def broken() -> None:
        raise RuntimeError("a planted bug")

    loop.submit(broken)
    assert_it_was_logged_and_the_loop_goes_on(loop, capsys, "RuntimeError: a planted bug")


def assert_it_was_logged_and_the_loop_goes_on(loop: EngineLoop, capsys, failure: str) -> None:
    """A request added now runs to its end, and the failure was logged in one line, no traceback."""
    fine = Inbox()
    loop.add("hello", PARAMS, fine)
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens and loop.thread.is_alive()
    err = capsys.readouterr().err
    assert failure in err and "Traceback" not in err


@pytest.mark.parametrize("wrong", ["x", None, 3.5])
def test_an_abort_of_a_wrongly_typed_request_is_refused_in_the_callers_thread(loop, wrong):
    with pytest.raises(TypeError, match="LoopRequest"):
        loop.abort(wrong)
    fine = Inbox()
    loop.add("hello", PARAMS, fine)
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens and loop.thread.is_alive()


@pytest.mark.parametrize("wrong", ["x", None, 3.5, -1, 10**30])
def test_the_live_apps_abort_of_a_wrong_id_is_a_notice_and_the_loop_goes_on(loop, wrong):
    from tracer.live.control import EngineControl

    control = EngineControl(loop, PARAMS)
    control.abort(wrong)
    fine = Inbox()
    loop.add("hello", PARAMS, fine)
    tokens, last = fine.until_finished()
    assert len(tokens) == PARAMS.max_tokens and loop.thread.is_alive()
    assert [severity for severity, _ in control.take_notices()] == ["warning"]


def test_a_failed_step_says_every_running_request_ended_with_it(loop):
    def explode_once(record):
        loop.engine.remove_step_hook(explode_once)
        raise RuntimeError("planted hook failure")

    loop.call(lambda engine: engine.add_step_hook(explode_once)).result(WAIT)
    doomed = Inbox()
    loop.add("hello", PARAMS, doomed)
    _, last = doomed.until_finished()
    assert "not affected" not in last.error and "every running request" in last.error


def test_a_beam_search_gets_one_update_with_its_best_beam_when_the_whole_search_ends(loop):
    """Its first sequence may be pruned while other beams run, and a beam's last token may be rewritten:
    the loop waits for every beam, then delivers the best hypothesis once (as LLM.beam_search ranks it)."""
    from nanoengine.beam_search import BeamSearchParams

    params = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    inbox = Inbox()
    loop.add("abc", params, inbox)
    tokens, last = inbox.until_finished()
    assert inbox.updates.empty()  # that was the only update
    (want,) = LLM("tiny", **TINY_OPTIONS).beam_search(["abc"], params)
    best = want.sequences[0]
    assert last.finish_reason == "length" and tokens == best.tokens[-8:] and last.text == best.text
    assert loop.call(lambda engine: engine.sequences).result(WAIT) == {}


def test_idle_work_runs_only_while_nothing_can_step_and_a_request_waits_one_item_at_most(loop):
    seen: list[tuple[bool, int]] = []  # (work to step, steps taken) at each item, in the loop thread
    inbox, done = Inbox(), threading.Event()

    def work():
        for item in range(8):
            seen.append((loop.engine.has_unfinished(), loop.engine.num_steps))
            if item == 3:
                loop.add("hello", PARAMS, inbox)  # admitted before the next item is taken
            yield item
        done.set()

    loop.when_idle(work())
    tokens, last = inbox.until_finished()
    assert done.wait(WAIT) and len(tokens) == PARAMS.max_tokens and last.finish_reason == "length"
    assert not any(busy for busy, _ in seen)  # never while a step could be taken
    steps = [num_steps for _, num_steps in seen]
    assert steps[:4] == [0] * 4 and steps[4:] == [steps[4]] * 4 and steps[4] >= PARAMS.max_tokens
    assert loop.call(lambda engine: engine.num_steps).result(WAIT) == steps[4]  # no step since


def test_idle_work_that_raises_is_logged_and_dropped_and_the_loop_goes_on(loop, capsys):
    raising = threading.Event()

    def work():
        yield
        raising.set()  # in the loop thread, just before the failure
        raise RuntimeError("a planted bug")

    loop.when_idle(work())
    assert raising.wait(WAIT)
    assert loop.call(lambda engine: loop.idle_work).result(WAIT) is None  # dropped
    assert_it_was_logged_and_the_loop_goes_on(loop, capsys, "RuntimeError: a planted bug")
