"""Characters whose bytes come in several tokens (Chinese, emoji) on the default model: the
sequences panel draws a partial character as one placeholder that becomes the character when its
last byte arrives, the narration names the character then, and the prompt shows whole."""

from __future__ import annotations

import asyncio

import pytest
from conftest import torch_threads

from nanoengine.sampling_params import SamplingParams
from tracer.replay.app import ReplayApp
from tracer.trace.readable import UNDECODABLE, is_byte_fragment
from tracer.trace.recorder import record_run
from tracer.trace.trace_file import load_trace

PROMPT = "请用中文回答：你好吗？"  # "answer in Chinese: how are you?"


@pytest.fixture(scope="module")
def chinese_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("zh") / "zh.jsonl"
    with torch_threads(1):
        record_run([PROMPT], SamplingParams(max_tokens=12), path, model="default")
    return load_trace(path)


def drawn(chinese_trace) -> list[tuple[str, str, str]]:
    """Per step: the narration, the text cell's highlighted part, the whole text cell."""

    async def run() -> list[tuple[str, str, str]]:
        app = ReplayApp(chinese_trace, animations=False)
        rows = []
        async with app.run_test(size=(160, 40)) as pilot:
            for index in range(len(chinese_trace.steps)):
                app.go_to(index)
                await pilot.pause()
                cell = app.seqs.rows[0][-1]
                new = "".join(
                    cell.plain[span.start : span.end] for span in cell.spans if "on #ffd23f" in str(span.style)
                )
                rows.append((str(app.query_one("#narration").render()), new, cell.plain))
        return rows

    return asyncio.run(run())


@pytest.mark.real_model
def test_a_character_split_over_tokens_is_one_placeholder_then_the_character(chinese_trace):
    rows = drawn(chinese_trace)
    completed = partial = 0
    for step, (narration, new, cell) in zip(chinese_trace.steps, rows):
        seq = step["seqs"][0]
        if not seq["new_token_ids"] or not is_byte_fragment(seq["new_token_texts"][0]):
            continue
        assert "⟨id" not in cell  # a byte token never shows as its id in the text
        if seq["output_text"].endswith(UNDECODABLE):
            partial += 1
            assert new == "⟨?⟩" and cell.count("⟨?⟩") == 1, cell  # one placeholder for the bytes so far
            assert "completing" not in narration
        else:
            completed += 1
            char = seq["output_text"][-1]
            assert new == char and ord(char) > 127, (new, cell)  # the placeholder became the character
            assert f"completing '{char}'" in narration  # named once whole
    assert completed >= 2 and partial >= 2, (completed, partial)  # the prompt does bring both


@pytest.mark.real_model
def test_the_prompt_shows_whole_with_its_chat_template_dimmed(chinese_trace):
    from tracer.replay.views.sequences import PROMPT_STYLE, TEMPLATE_STYLE, prompt_parts

    (request,) = chinese_trace.requests.values()
    parts = prompt_parts(dict(chinese_trace.header, requests=[request]))[request["seq_id"]]
    assert (PROMPT, PROMPT_STYLE) in parts
    template = "".join(text for text, style in parts if style == TEMPLATE_STYLE)
    assert "<|im_start|>" in template and template.endswith("assistant↵") and "⟨" not in template
