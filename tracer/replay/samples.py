"""The n samples of one request in the replay: their group label in the sequences panel, the why of a
sample's prefix hit on its sibling's blocks, and the logprob of a new token where the trace has it.

A sample's row names its request (step_line.request_of: sample 0's seq_id); sample i is the i-th of
the group by seq_id. Rows of a request of one sequence get no label: n = 1 traces replay as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tracer.i18n import _, ngettext
from tracer.trace.step_line import request_of


@dataclass(frozen=True, slots=True)
class Sample:
    request_id: int
    index: int  # i of n
    n: int


def samples_of(rows: Iterable[Mapping[str, Any]]) -> dict[int, Sample]:
    """seq_id -> its place in its request, for the rows of requests with more than one sample."""
    groups: dict[int, list[int]] = {}
    for row in rows:
        groups.setdefault(request_of(row), []).append(row["seq_id"])
    found = {}
    for request_id, sids in groups.items():
        if len(sids) > 1:
            for i, sid in enumerate(sorted(sids)):
                found[sid] = Sample(request_id, i, len(sids))
    return found


def group_label(sample: Sample | None) -> str:
    """'┌7.0', '├7.1', '└7.2': a bracket that joins the rows of one request (not colour alone), then
    request.sample; '' for a request of one sequence."""
    if sample is None:
        return ""
    bracket = "┌" if sample.index == 0 else ("└" if sample.index == sample.n - 1 else "├")
    return f"{bracket}{sample.request_id}.{sample.index}"


def sibling_hit(blocks: list[int], seq: Mapping[str, Any], seqs: Mapping[int, Mapping[str, Any]]) -> str | None:
    """Why a sample's prefix hit found its blocks: a sibling holds the prompt's full blocks; None when
    the hit is not on a sibling's blocks (or the sequence is a request's only one)."""
    if not blocks:
        return None
    samples = samples_of(seqs.values())
    mine = samples.get(seq.get("seq_id", -1))
    if mine is None:
        return None
    for sid, row in sorted(seqs.items()):
        other = samples.get(sid)
        table = list(row.get("block_table") or [])
        earlier = other is not None and other.request_id == mine.request_id and other.index < mine.index
        if earlier and other and table[: len(blocks)] == blocks:
            text = ngettext(
                "sample {i} of request {request} shares the prompt's {count} full block with sample {j}: "
                "n samples are n sequences that meet in the prefix cache, as in vLLM v1",
                "sample {i} of request {request} shares the prompt's {count} full blocks with sample {j}: "
                "n samples are n sequences that meet in the prefix cache, as in vLLM v1",
                len(blocks),
            )
            return text.format(i=mine.index, request=mine.request_id, count=len(blocks), j=other.index)
    return None


def logprob_label(seq: Mapping[str, Any]) -> str:
    """' logprob -0.53' for the step's new token, where the request asked for logprobs; else ''."""
    values = seq.get("new_token_logprobs") or []
    if not values:
        return ""
    return " " + _("logprob {value}").format(value=", ".join(f"{v:.2f}" for v in values))
