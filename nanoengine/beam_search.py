"""Beam search inside the engine, as vLLM v0 ran it: a request is a group of beams that share
their blocks, are scheduled as a whole, and are ranked against each other after every step.
(vLLM v1 moved it out of its scheduler, into LLM.beam_search; the names here are that API's.)

Every step each live beam brings its 2 * beam_width likeliest next tokens (its logprobs); of all
those candidates, one ending in EOS is a finished hypothesis, and the beam_width best others live
on: a beam chosen once keeps its sequence, chosen again it is forked, never chosen it is pruned.
At max_tokens the best beam_width of the finished and the live hypotheses are the output."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nanoengine.loading.validation import check_beam_search_params
from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import FinishReason, Sequence, TopLogprobs


@dataclass(slots=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # > 0: the sampled token is a candidate too (vLLM's rule)
    length_penalty: float = 1.0  # a hypothesis scores cum_logprob / length ** length_penalty

    def __post_init__(self) -> None:
        check_beam_search_params(self)

    def sampling_params(self) -> SamplingParams:
        """What each beam runs with: EOS is the search's to judge, not the scheduler's."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            ignore_eos=True,
            logprobs=2 * self.beam_width,
        )


@dataclass(slots=True)
class BeamSearchSequence:
    tokens: list[int]  # the prompt's and the output's, as vLLM's
    logprobs: list[TopLogprobs]
    cum_logprob: float = 0.0
    text: str | None = None  # the output's, without a final EOS
    finish_reason: str | None = None


@dataclass(slots=True)
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


def beam_score(seq: Sequence, eos_token_ids: frozenset[int], length_penalty: float) -> float:
    """vLLM's get_beam_search_score: cum_logprob / length ** length_penalty, where the length
    (prompt included) does not count a final EOS."""
    length = seq.num_tokens - (seq.token_ids[-1] in eos_token_ids)
    return seq.cumulative_logprob / math.pow(length, length_penalty)


@dataclass(slots=True, eq=False)
class BeamGroup:
    params: BeamSearchParams
    live: list[Sequence]  # the beams still searched, best first; they share blocks
    # finished hypotheses: ended by EOS (or by max_tokens); sequences that hold no blocks
    completed: list[Sequence] = field(default_factory=list)

    def candidates(self, eos_token_ids: frozenset[int]) -> list[tuple[float, Sequence, int]]:
        """(cumulative logprob, beam, token) of every live candidate, best first. Each beam has
        just appended its sampled token, with the logprobs of its 2 * beam_width likeliest."""
        found = []
        for beam in self.live:
            if beam.finish_reason == FinishReason.ERROR:  # its step failed: it leaves the search
                continue
            entry = beam.logprobs[-1]
            before = beam.cumulative_logprob - entry[beam.token_ids[-1]].logprob
            for token, logprob in entry.items():
                cum = before + logprob.logprob
                if token in eos_token_ids and not self.params.ignore_eos:
                    self.completed.append(hypothesis(beam, token, cum, FinishReason.STOP))
                else:
                    found.append((cum, beam, token))
        found.sort(key=lambda c: c[0], reverse=True)  # one length: the score's order
        return found[: self.params.beam_width]

    def best(self, eos_token_ids: frozenset[int]) -> list[Sequence]:
        """The output: the best beam_width of the finished and the live hypotheses."""
        p = self.params
        everything = self.completed + self.live
        everything.sort(key=lambda s: beam_score(s, eos_token_ids, p.length_penalty), reverse=True)
        return everything[: p.beam_width]

    def restart(self) -> Sequence:
        """Start again from the prompt with the first beam (its KV was dropped by a preemption):
        at temperature 0 the search finds the same beams again."""
        first = self.live[0]
        del first.token_ids[first.num_prompt_tokens :]
        first.logprobs.clear()
        first.cumulative_logprob = 0.0
        self.live[:] = [first]
        self.completed.clear()
        return first


def hypothesis(beam: Sequence, token: int, cum: float, reason: FinishReason) -> Sequence:
    """A finished copy of beam that ends in token instead: it needs no blocks."""
    finished = beam.fork()
    finished.token_ids[-1] = token
    finished.cumulative_logprob = cum
    finished.finish(reason)
    return finished
