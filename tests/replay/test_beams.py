"""A beam search in the replay (tracer/replay/beams.py, why.py, the sequences and KV views): a recorded
trace of a width-3 beam search beside a plain request in a pool too small for both replays; at its
fork, copy-on-write, pruning and restart steps the narration (TUI, `replay --text`, zh) says why,
the sequences panel groups the beams (parent, width, ✂ for a pruned one) and the KV pages show each
copy (source→copy, ⧉).

The engine numbers sequences with one counter per process, so nothing here assumes a seq_id: each
test finds its step and its sequences by their events. The engine's own cumulative logprobs, taken
by a step hook while recording, are the truth the replay's sums are held to."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import make_tiny_engine, run_async, torch_threads, wait_until
from test_app_zh import english_words

from nanoengine import BeamSearchParams, SamplingParams
from nanoengine.engine import LLMEngine
from nanoengine.sequence import EventKind
from nanoengine.step_record import StepRecord
from tracer.cli.main import main
from tracer.i18n import language, set_language
from tracer.replay.app import ReplayApp
from tracer.replay.beams import COPY_MARK, PRUNED_MARK, Beam, BeamScores, beam_label, in_group_order, score_step
from tracer.replay.colors import seq_letter, seq_tag
from tracer.replay.decision_code import decision_code
from tracer.replay.glossary import GLOSSARY
from tracer.replay.model import ReplayModel, viewer_header
from tracer.replay.narration import name, narrate
from tracer.replay.views.kv_pages import KVPagesView
from tracer.replay.views.narration_bar import NarrationBar
from tracer.replay.views.sequences import SequencesView, plain
from tracer.trace.recorder import TraceRecorder
from tracer.trace.trace_file import Trace, load_trace

WIDTH = 3
# a plain request admitted first, then the beam search: the pool (10 blocks of 4) runs short, the
# newest running sequence (a beam) is the victim, and the whole search restarts from its prompt
OPTIONS = dict(num_kv_blocks=10, max_num_batched_tokens=64, max_num_seqs=8)
PLAIN = (list(range(20, 28)), SamplingParams(max_tokens=12, ignore_eos=True))
BEAMS = ([5, 6, 7, 8, 9], BeamSearchParams(beam_width=WIDTH, max_tokens=6, ignore_eos=True))


def live_scores(engine: LLMEngine, truth: dict[int, dict[int, float]]):
    """A step hook: each beam's cumulative logprob as the engine holds it after the step (the live
    ones, and those finished in the step, but for those a restart dropped: their sum is left as it was)."""

    def hook(record: StepRecord) -> None:
        ended = {e.seq_id for e in record.events if e.kind == EventKind.FINISHED}
        dropped = {e.seq_id for e in record.events if e.kind == EventKind.PREEMPTED} & ended  # by a restart
        truth[record.step] = {
            sid: seq.cumulative_logprob
            for sid, seq in engine.sequences.items()
            if seq.group is not None and (not seq.is_finished or sid in ended - dropped)
        }

    return hook


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Trace, dict[int, dict[int, float]]]:
    path = tmp_path_factory.mktemp("beams") / "beams.jsonl"
    engine = make_tiny_engine(**OPTIONS)
    truth: dict[int, dict[int, float]] = {}
    with torch_threads(1), TraceRecorder(engine, path, title="beam search"):
        engine.add_step_hook(live_scores(engine, truth))
        engine.add_request(*PLAIN)
        engine.add_request(*BEAMS)
        while engine.has_unfinished():
            engine.step()
    return load_trace(path, validate="all"), truth


@pytest.fixture(scope="module")
def trace(recorded) -> Trace:
    return recorded[0]


@pytest.fixture
def zh():
    before = language()
    set_language("zh")
    yield
    set_language(before)


def first_step_with(trace: Trace, kind: EventKind, detail_test=lambda d: True) -> tuple[int, dict]:
    """(index, event) of the first step with an event of kind whose detail passes detail_test."""
    for index, step in enumerate(trace.steps):
        for event in step["events"]:
            if event["kind"] == kind and detail_test(event["detail"]):
                return index, event
    raise AssertionError(f"the trace has no {kind.value} event")


def pruned_by_ranking(step: dict) -> list[int]:
    """The beams a step pruned because none of their candidates ranked (not dropped by a restart)."""
    preempted = {e["seq_id"] for e in step["events"] if e["kind"] == EventKind.PREEMPTED}
    return [
        e["seq_id"]
        for e in step["events"]
        if e["kind"] == EventKind.FINISHED and e["detail"]["reason"] == "pruned" and e["seq_id"] not in preempted
    ]


def narration_of(trace: Trace, index: int) -> str:
    model = ReplayModel(trace, index)
    return narrate(model.current, model.header, model.beam_scores())


# ---- the trace the tests read -------------------------------------------------------------------
def test_the_workload_forks_copies_prunes_and_restarts(trace):
    kinds = {e["kind"] for step in trace.steps for e in step["events"]}
    assert {EventKind.FORKED, EventKind.COPY_ON_WRITE, EventKind.PREEMPTED} <= kinds
    assert any(pruned_by_ranking(step) for step in trace.steps)
    assert any(step.get("blocks_to_copy") for step in trace.steps)


# ---- why-lines ----------------------------------------------------------------------------------
def test_the_fork_step_says_why_the_beam_forked(trace):
    index, event = first_step_with(trace, EventKind.FORKED)
    child, parent = event["seq_id"], event["detail"]["parent"]
    chosen = 1 + sum(
        1 for e in trace.steps[index]["events"] if e["kind"] == EventKind.FORKED and e["detail"]["parent"] == parent
    )
    ranked = "both of" if chosen == 2 else f"{chosen} of"
    blocks = len(event["detail"]["blocks"])
    letter = seq_letter(parent)
    expected = (
        f"{name(child)} forked from {name(parent)}: {ranked} {letter}'s next tokens ranked among the {WIDTH} best; "
        f"it shares {letter}'s {blocks} block"
    )
    assert expected in narration_of(trace, index)


def test_a_copy_on_write_says_which_block_was_shared_and_by_how_many(trace):
    """The count is checked against the pool the step started with: each earlier copy of the same
    block in the step took one holder off it."""
    index, event = first_step_with(trace, EventKind.COPY_ON_WRITE)
    step, prev = trace.steps[index], trace.steps[index - 1]
    source, copy = event["detail"]["source"], event["detail"]["copy"]
    copies = [e for e in step["events"] if e["kind"] == EventKind.COPY_ON_WRITE and e["detail"]["source"] == source]
    holders = prev["pool"]["ref_counts"][source] - copies.index(event)
    assert holders >= 2
    text = narration_of(trace, index)
    assert (
        f"{name(event['seq_id'])} was to write into block {source}, shared by {holders} beams: it got a copy, "
        f"block {copy}"
    ) in text
    assert [source, copy] in step["blocks_to_copy"]


def test_a_pruned_beam_says_none_of_its_candidates_ranked_with_the_engines_numbers(recorded):
    trace, truth = recorded
    index = next(i for i, step in enumerate(trace.steps) if pruned_by_ranking(step))
    step = trace.steps[index]
    (pruned, *_) = pruned_by_ranking(step)
    engine = truth[step["step"]]
    rows = {r["seq_id"]: r for r in step["seqs"]}
    live = [sid for sid in engine if rows[sid]["status_after"] == "RUNNING"]
    text = narration_of(trace, index)
    mine, least = engine[pruned], min(engine[sid] for sid in live)
    assert mine < least  # the engine's own ranking: it fell below the last beam kept
    sentence = re.search(
        rf"{re.escape(name(pruned))} [^;]* and was pruned: none of its candidates ranked among the {WIDTH} "
        r"best \(its likeliest token made a cumulative logprob of (-?[\d.]+); the 3 best reached (-?[\d.]+) or more\)",
        text,
    )
    assert sentence, text
    assert abs(float(sentence[1]) - mine) < 0.01 and abs(float(sentence[2]) - least) < 0.01


def test_the_summed_logprobs_are_the_engines_at_every_step(recorded):
    """Forks start from their parent's sum, a rewritten token counts its own logprob, a restart
    starts again from 0: every beam, every step, as the engine's cumulative_logprob."""
    trace, truth = recorded
    scores = BeamScores()
    for index, step in enumerate(trace.steps):
        mine, engine = scores.at(trace.steps, index), truth[step["step"]]
        assert set(engine) <= set(mine), (index, engine, mine)
        for sid, value in engine.items():
            assert abs(mine[sid] - value) < 0.005, (index, sid, mine[sid], value)


def test_a_preempted_beam_search_restarts_from_its_prompt(trace):
    index, _event = first_step_with(trace, EventKind.PREEMPTED)
    step = trace.steps[index]
    beams = [
        r
        for r in step["seqs"]
        if r.get("beam_width")
        and any(e["kind"] == EventKind.PREEMPTED and e["seq_id"] == r["seq_id"] for e in step["events"])
    ]
    kept = [r for r in beams if r["status_after"] == "WAITING"]
    dropped = [r for r in beams if r["status_after"] == "FINISHED"]
    assert len(kept) == 1 and dropped and kept[0]["num_tokens_after"] == kept[0]["num_prompt_tokens"]
    text = narration_of(trace, index)
    assert (
        f"{name(kept[0]['seq_id'])} was preempted back to WAITING (" in text
        and "); the beam search restarts from its prompt: recompute drops every beam's KV" in text
    )
    for row in dropped:
        assert f"{name(row['seq_id'])} was preempted (" in text
    assert text.count("and dropped: the beam search restarts from its prompt with its first beam") == len(dropped)
    assert "none of its candidates" not in text.split("and dropped")[0]  # a restart is not a ranking


def test_a_trace_without_beam_fields_keeps_finished_pruned_plain(trace):
    """Without the trace's beam fields (an older recorder), a pruning still reads, without a width."""
    index = next(i for i, step in enumerate(trace.steps) if pruned_by_ranking(step))
    step = dict(trace.steps[index])
    step["seqs"] = [{k: v for k, v in r.items() if k not in ("beam_width", "parent_id")} for r in step["seqs"]]
    text = narrate(step, viewer_header(trace))
    assert "was pruned: none of its candidates ranked among the best" in text


# ---- the `c` key and `replay --text` ----------------------------------------------------------------
def test_the_code_panel_shows_the_code_behind_a_fork_and_a_copy(trace):
    header = viewer_header(trace)
    for kind in (EventKind.FORKED, EventKind.COPY_ON_WRITE):
        index, event = first_step_with(trace, kind)
        code = decision_code(trace.steps[index], header, event["seq_id"])
        assert code.title.startswith(f"{kind.value.upper()} {seq_tag(event['seq_id'])} · decided in ")
        for function, line in event["where"]:  # each emitting line shown, marked
            assert any(section.name == function and line in section.marked for section in code.sections)


def test_replay_text_prints_the_fork_copy_and_prune_lines(trace, capsys):
    fork, _ = first_step_with(trace, EventKind.FORKED)
    cow, copied = first_step_with(trace, EventKind.COPY_ON_WRITE)
    prune = next(i for i, step in enumerate(trace.steps) if pruned_by_ranking(step))
    outputs = {}
    for index in (fork, cow, prune):
        assert main(["replay", str(trace.path), "--step", str(index), "--text"]) == 0
        outputs[index] = capsys.readouterr().out
    assert " forked from " in outputs[fork] and f"ranked among the {WIDTH} best; it shares " in outputs[fork]
    assert f"was to write into block {copied['detail']['source']}, shared by " in outputs[cow]
    assert f"was pruned: none of its candidates ranked among the {WIDTH} best" in outputs[prune]


# ---- the TUI ------------------------------------------------------------------------------------
def beam_tags(app: ReplayApp) -> dict[int, str]:
    view = app.query_one(SequencesView)
    return {sid: plain(row[0]) for sid, row in zip(view.row_ids, view.rows)}


@run_async
async def test_the_beam_trace_replays_step_by_step(trace):
    app = ReplayApp(trace, animations=False)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(len(trace.steps) - 1):
            await pilot.press("right")
            await pilot.pause()
            assert app.failure is None
        assert app.step_index == len(trace.steps) - 1
        assert app.query_one(NarrationBar).text.startswith(f"Step {trace.steps[-1]['step']}: ")


@run_async
async def test_the_sequences_panel_groups_the_beams_with_parent_width_and_pruned_marks(trace):
    index = next(i for i, step in enumerate(trace.steps) if pruned_by_ranking(step))
    step = trace.steps[index]
    app = ReplayApp(trace, start_step=index, animations=False)
    async with app.run_test(size=(160, 48)):
        tags = beam_tags(app)
        order = app.query_one(SequencesView).row_ids
    beams = sorted(r["seq_id"] for r in step["seqs"] if r.get("beam_width"))
    request = beams[0]  # the search's first beam: its seq_id is the request's
    assert order[order.index(request) : order.index(request) + len(beams)] == beams  # drawn together
    assert tags[request].startswith(f"{seq_tag(request)} ┌{request} k={WIDTH}")
    assert all(f" ├{request}" in tags[sid] for sid in beams[1:-1]) and f" └{request}" in tags[beams[-1]]
    for row in step["seqs"]:
        sid = row["seq_id"]
        if sid not in beams:
            assert "<" not in tags[sid] and PRUNED_MARK not in tags[sid]
            continue
        if "parent_id" in row:
            assert tags[sid].startswith(f"{seq_tag(sid)}<{seq_tag(row['parent_id'])} ")
        assert tags[sid].endswith(f" {PRUNED_MARK}") == (row["finish_reason"] == "pruned"), tags[sid]
    assert any(tags[sid].endswith(PRUNED_MARK) for sid in pruned_by_ranking(step))


@run_async
async def test_the_kv_pages_show_each_copy_and_mark_shared_blocks(trace):
    index, event = first_step_with(trace, EventKind.COPY_ON_WRITE)
    step = trace.steps[index]
    pairs = [tuple(pair) for pair in step["blocks_to_copy"]]
    app = ReplayApp(trace, start_step=index, animations=False)
    async with app.run_test(size=(160, 48)) as pilot:
        kv = app.query_one("#kv", KVPagesView)
        summary = kv.summary()
        cells = {block: "".join(s.text for s in kv.cell(block)) for block in range(len(step["pool"]["ref_counts"]))}
        kv_rows = "\n".join("".join(s.text for s in kv.render_line(y)) for y in range(kv.size.height))
        app.select(event["seq_id"], pairs[0][1])
        await pilot.pause()
        details = kv.summary()
    listed = ", ".join(f"{s}→{c}" for s, c in pairs)
    assert f"copy-on-write {COPY_MARK} {listed}" in summary and f"copy-on-write {COPY_MARK}" in kv_rows
    for _source, copy in pairs:
        assert cells[copy].rstrip().endswith(COPY_MARK)
    shared = [b for b, ref in enumerate(step["pool"]["ref_counts"]) if ref > 1]
    assert shared, "a beam search shares its prompt's blocks"
    for block in shared:  # the ref count in text, not by colour alone
        assert f"×{step['pool']['ref_counts'][block]}" in cells[block]
    assert f"copy of block {pairs[0][0]} (copy-on-write this step)" in details


@run_async
async def test_the_narration_bar_has_the_fork_line_and_c_shows_its_code(trace):
    index, event = first_step_with(trace, EventKind.FORKED)
    app = ReplayApp(trace, start_step=index, animations=False)
    async with app.run_test(size=(160, 48)) as pilot:
        text = app.query_one(NarrationBar).text
        app.select(event["seq_id"])
        await pilot.press("c")
        await pilot.pause()
        title, sections = app.code.code.title, app.code.code.sections
    assert f"{name(event['seq_id'])} forked from {name(event['detail']['parent'])}: " in text
    decided = re.fullmatch(rf"FORKED {re.escape(seq_tag(event['seq_id']))} · decided in ([\w.]+), line (\d+)", title)
    assert decided, title
    function, line = decided[1], int(decided[2])
    assert [function, line] in event["where"]  # a line the trace says emitted it
    assert any(section.name == function and section.deciding == line for section in sections)


# ---- Chinese ------------------------------------------------------------------------------------
def test_every_beam_narration_is_chinese_prose(zh, trace):
    model = ReplayModel(trace)
    said = []
    for index in range(len(trace.steps)):
        model.go_to(index)
        text = narrate(model.current, model.header, model.beam_scores())
        assert english_words(text) == [], text
        said.append(text)
    whole = "\n".join(said)
    for words in (
        "派生：",
        "个下一 token",
        "将要写入块",
        "个束共享：于是得到一个副本",
        "被剪枝：",
        "累积对数概率",
        "束搜索从 prompt 重新开始",
    ):
        assert words in whole, words


def test_the_text_replay_of_a_fork_is_chinese(zh, trace, capsys):
    index, _ = first_step_with(trace, EventKind.FORKED)
    assert main(["replay", str(trace.path), "--step", str(index), "--text", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    narration = out.split("\n")[0]
    assert "派生：" in narration and english_words(narration) == [], narration


def test_the_kv_summary_and_help_terms_are_translated(zh):
    from tracer.i18n import _
    from tracer.replay.help import LEGEND, concepts_text

    terms = concepts_text().plain
    assert "束搜索" in terms and "写时复制" in terms and "派生" in terms
    legend = {key: _(meaning) for key, meaning in LEGEND}
    assert "剪枝" in legend[PRUNED_MARK] and "写时复制" in legend[f"{COPY_MARK} 1→2"]


# ---- pieces -------------------------------------------------------------------------------------
def test_a_beams_label_names_its_parent_its_place_and_a_pruning():
    assert beam_label(Beam(0, 0, 3, 3, None, False)) == " ┌0 k=3"
    assert beam_label(Beam(0, 1, 3, 3, 0, False)) == f"<{seq_tag(0)} ├0"
    assert beam_label(Beam(0, 2, 3, 3, 1, True)) == f"<{seq_tag(1)} └0 {PRUNED_MARK}"
    assert beam_label(Beam(4, 0, 1, 1, None, False)) == " ─4 k=1"
    assert beam_label(None) == ""


def test_a_later_fork_is_drawn_beside_its_search():
    rows = [
        {"seq_id": 0, "beam_width": 2},
        {"seq_id": 1},
        {"seq_id": 2, "request_id": 0, "parent_id": 0, "beam_width": 2},
        {"seq_id": 3, "request_id": 1},
    ]
    assert [r["seq_id"] for r in in_group_order(rows)] == [0, 2, 1, 3]


def test_a_beams_score_needs_its_history():
    """A beam that did not start in the step and has no sum before it is left out, not counted from 0."""
    row = {"seq_id": 7, "beam_width": 2, "status_before": "RUNNING", "new_token_ids": [5], "new_token_logprobs": [-1.0]}
    assert score_step({}, {"seqs": [row], "events": []}) == {}
    assert score_step({7: -2.0}, {"seqs": [row], "events": []}) == {7: -3.0}
    fresh = dict(row, status_before="WAITING")
    assert score_step({}, {"seqs": [fresh], "events": []}) == {7: -1.0}


def test_the_glossary_says_beam_search_and_copy_on_write_are_built():
    (term,) = [t for t in GLOSSARY if "beam" in t.ours.lower()]
    assert "not built" not in term.ours.split("swap preemption")[0]
    assert "copy-on-write" in term.ours and "restarts from its prompt" in term.ours
    assert "LLM.beam_search" in term.vllm and "no copy-on-write" in term.vllm and "asserted on recompute" in term.vllm


def test_the_beam_replay_runs_in_one_terminal_row_width_in_zh(zh, trace):
    """Every row exactly as wide as the terminal at the fork step in Chinese (a character takes two cells)."""
    from rich.cells import cell_len
    from test_app_zh import CJK, screen_rows

    index, _ = first_step_with(trace, EventKind.COPY_ON_WRITE)

    async def run() -> list[str]:
        app = ReplayApp(trace, start_step=index, animations=False)
        async with app.run_test(size=(80, 24)) as pilot:  # painted, in Chinese, before measured
            await wait_until(pilot, app, lambda: CJK.search("".join(screen_rows(app))), "the Chinese screen")
            return screen_rows(app)

    for row in asyncio.run(run()):
        assert cell_len(row) == 80, row


def test_the_replay_of_a_plain_trace_is_unchanged():
    """A trace of plain requests: no beam label, no copy line (the committed small trace)."""
    small = load_trace(Path(__file__).parents[1] / "data" / "replay_small.jsonl")
    model = ReplayModel(small)
    assert model.beam_scores() == {}
    assert all(not step.get("blocks_to_copy") for step in small.steps)
