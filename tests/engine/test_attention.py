"""The torch attention backend plans its decode groups (sequences batched by length) itself: once a
step, at the first layer, kept on the step's metadata for every other layer."""

from __future__ import annotations

import pytest

import nanoengine.attention as attention
from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams


def test_the_torch_backend_plans_its_decode_groups_once_a_step(monkeypatch: pytest.MonkeyPatch):
    plans: list[list[attention.Decode]] = []
    metas: list[attention.AttentionMetadata] = []
    group_by_length, call = attention.group_by_length, attention.TorchAttention.__call__

    def planning(decodes: list[attention.Decode]) -> list[list[attention.Decode]]:
        plans.append(decodes)
        return group_by_length(decodes)

    def attending(self, q, kv, meta, scale):
        metas.append(meta)
        return call(self, q, kv, meta, scale)

    monkeypatch.setattr(attention, "group_by_length", planning)
    monkeypatch.setattr(attention.TorchAttention, "__call__", attending)
    llm = LLM("tiny", attention_backend="torch", block_size=4)
    prompts = ["the cat sat", "a much longer prompt than the first one, with more blocks", "hi"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    num_steps, num_layers = llm.engine.num_steps, len(llm.engine.model.model.layers)
    assert len(metas) == num_steps * num_layers  # every layer of every step attends here
    assert len(plans) == num_steps  # but plans once a step
    assert sum(map(len, plans)) > 2 * len(prompts)  # (decodes among them)
    for meta in metas[::num_layers]:
        assert meta.decode_groups is not None
        rows = sorted(row for g in meta.decode_groups for row in g.rows.tolist())
        assert rows == sorted(row for _, row, _ in meta.decodes)  # each decode in one group
