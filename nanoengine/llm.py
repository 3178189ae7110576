"""The simple API, as vLLM's: LLM(model=...).generate(prompts, params) -> outputs in input order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nanoengine.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from nanoengine.engine import LLMEngine
from nanoengine.outputs import CompletionOutput, RequestOutput
from nanoengine.sampling_params import SamplingParams

Params = SamplingParams | BeamSearchParams


class LLM:
    def __init__(self, model: str = "default", **options: Any):
        self.engine = LLMEngine(model, **options)

    def generate(
        self,
        prompts: str | Iterable[str | list[int]],
        params: Params | list[Params] | None = None,
    ) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        ids: list[int] = []
        try:
            for prompt, sp in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, sp))
            while self.engine.has_unfinished():
                self.engine.step()
        except BaseException:
            # Ctrl-C or an error: leave the engine empty, not holding half-done requests.
            for seq_id in ids:
                self.engine.drop(seq_id)
            raise
        return [self.engine.collect(i) for i in ids]

    def beam_search(
        self, prompts: str | Iterable[str | list[int]], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: each prompt's best beam_width hypotheses, best first."""
        outputs = self.generate(prompts, params)
        return [BeamSearchOutput([as_beam(out, c) for c in out.outputs]) for out in outputs]


def as_beam(out: RequestOutput, c: CompletionOutput) -> BeamSearchSequence:
    tokens = out.prompt_token_ids + c.token_ids  # vLLM's: the prompt's too
    cum_logprob = c.cumulative_logprob or 0.0
    return BeamSearchSequence(tokens, c.logprobs or [], cum_logprob, c.text, c.finish_reason)
