"""One plain sentence per engine step, built only from that step's dict and the header; in the language
chosen (tracer.i18n: each message a whole phrase with named fields, so a translation may reorder them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import _, ngettext
from tracer.replay.colors import seq_letter
from tracer.replay.samples import sibling_hit
from tracer.replay.why import Why
from tracer.trace.readable import completed_character, printable, token_label
from tracer.trace.step_line import beam_width_of

MAX_LISTED_DECODES = 3  # more decode-only sequences than this are summarised in one clause


def narrate(step: dict, header: dict, scores: Mapping[int, float] | None = None) -> str:
    """'Step 7: seq 2 (C) prefilled 3 prompt tokens (chunk 3 of 3); seq 0 (A) generated ' Paris'.'

    scores: each beam's cumulative logprob after the step (beams.BeamScores), for the numbers of a
    pruning; without them the why of a pruning has none."""
    budget = int(header.get("config", {}).get("max_num_batched_tokens") or 0)
    seqs = {s["seq_id"]: s for s in step.get("seqs", [])}
    events = events_by_seq(step.get("events", []))
    writers = block_writers(step, int(step.get("pool", {}).get("block_size") or 0))
    why = Why(step, header, seqs, scores or {})
    clauses, decoders, waits = [], [], []
    for seq_id in involved_seqs(step, events):
        seq = seqs.get(seq_id, {"seq_id": seq_id})
        if is_plain_decode(seq, events.get(seq_id, [])):
            decoders.append(seq)
        elif {e["kind"] for e in events.get(seq_id, [])} == {EventKind.NOT_ADMITTED}:
            waits.append(describe_seq(seq, events[seq_id], budget, None, why))  # last: it waits
        else:
            clauses.append(describe_seq(seq, events.get(seq_id, []), budget, SameStep(writers, seqs), why))
    clauses.extend(describe_decodes(decoders))
    waiting = why.waiting_head()
    if waiting is not None:
        waits.append(_("{seq} was not admitted: {why}").format(seq=name(waiting[0]), why=waiting[1]))
    clauses.extend(waits)
    if masked := why.grammar_masked():
        clauses.append(masked)
    if not clauses:
        return _("Step {step}: nothing was scheduled.").format(step=step.get("step", "?"))
    return _("Step {step}: {clauses}.").format(step=step.get("step", "?"), clauses=join_clauses(clauses))


def events_by_seq(events: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for event in events:
        grouped.setdefault(event["seq_id"], []).append(event)
    return grouped


def involved_seqs(step: dict, events: dict[int, list[dict]]) -> list[int]:
    """Batch order first, then sequences that only had events (preempted, aborted)."""
    order = list(step.get("inputs", {}).get("seq_ids", []))
    order += [seq_id for seq_id in events if seq_id not in order]
    return order


def is_plain_decode(seq: dict, events: list[dict]) -> bool:
    return not events and len(seq.get("new_token_ids", [])) == 1


def quoted_tokens(seq: dict) -> list[str]:
    """This step's new tokens, each readable and quoted: 'Paris', '↵', ⟨id 160⟩. The byte token
    that completes a multi-byte character names it: ⟨id 233⟩ completing '👏'."""
    texts = seq.get("new_token_texts") or []
    ids = seq.get("new_token_ids") or [None] * len(texts)
    quoted = []
    for text, token_id in zip(texts, ids):
        label = token_label(text, token_id)
        if not label.startswith("⟨id "):
            quoted.append(f"'{label}'")
        elif whole := completed_character(text, seq.get("output_text", "")):
            quoted.append(_("{label} completing '{char}'").format(label=label, char=printable(whole)))
        else:
            quoted.append(label)
    return quoted


def name(seq_id: int) -> str:
    return _("seq {seq_id} ({letter})").format(seq_id=seq_id, letter=seq_letter(seq_id))


@dataclass(slots=True)
class SameStep:
    """Who writes which block in this step, to tell a hit on blocks computed in this very step."""

    writers: dict[int, int]  # block -> the sequence whose K/V lands there this step
    seqs: dict[int, dict]

    def describe_hit(self, blocks: list[int], tokens: int) -> str | None:
        """'reused A's blocks 0-2 (12 tokens), which A computes in this same step', or None."""
        now = [b for b in blocks if b in self.writers]
        if not now:
            return None
        owner = self.writers[now[0]]
        table = list(self.seqs.get(owner, {}).get("block_table", []))
        logical = [table.index(b) for b in now if b in table]
        if len(now) != len(blocks) or len(logical) != len(now) or any(self.writers[b] != owner for b in now):
            return _("reused {tokens} cached tokens, some of them from blocks computed in this same step").format(
                tokens=tokens
            )
        if len(logical) > 1:
            span = _("blocks {first}-{last}").format(first=logical[0], last=logical[-1])
        else:
            span = _("block {index}").format(index=logical[0])
        return _("reused {who}'s {span} ({tokens} tokens), which {who} computes in this same step").format(
            who=seq_letter(owner), span=span, tokens=tokens
        )


def block_writers(step: dict, block_size: int) -> dict[int, int]:
    """block -> the first sequence whose new K/V the step writes into it."""
    inputs = step.get("inputs", {})
    slots, starts = inputs.get("slot_mapping", []), inputs.get("query_start_loc", [])
    writers: dict[int, int] = {}
    if block_size <= 0:
        return writers
    for i, seq_id in enumerate(inputs.get("seq_ids", [])[: max(len(starts) - 1, 0)]):
        for slot in slots[starts[i] : starts[i + 1]]:
            writers.setdefault(slot // block_size, seq_id)
    return writers


def describe_seq(
    seq: dict, events: list[dict], budget: int, same_step: SameStep | None = None, why: Why | None = None
) -> str:
    ending = [e for e in events if e["kind"] == EventKind.FINISHED]
    parts = [describe_event(e, seq, budget, same_step, why) for e in events if e["kind"] != EventKind.FINISHED]
    texts = seq.get("new_token_texts") or []
    if texts:
        parts.append(_("generated {tokens}").format(tokens=join_tokens(quoted_tokens(seq))))
    parts.append(status_change(seq, events))
    parts += [describe_event(e, seq, budget, same_step, why) for e in ending]
    parts = [p for p in parts if p]
    if not parts:
        count = int(seq.get("num_scheduled_tokens", 0))
        parts.append(ngettext("computed {count} token", "computed {count} tokens", count).format(count=count))
    return _("{seq} {actions}").format(seq=name(seq["seq_id"]), actions=join_parts(parts))


def describe_event(
    event: dict, seq: dict, budget: int, same_step: SameStep | None = None, why: Why | None = None
) -> str:
    kind, detail = event["kind"], event.get("detail") or {}
    if kind == EventKind.ADMITTED:
        blocks = why.blocks(detail, admitted=True) if why else None
        if blocks:
            return _("was admitted to RUNNING ({blocks})").format(blocks=blocks)
        return _("was admitted to RUNNING")
    if kind == EventKind.NOT_ADMITTED:
        blocks = why.blocks(detail, admitted=False) if why else None
        return _("was not admitted: {why}").format(why=blocks) if blocks else _("was not admitted")
    if kind == EventKind.PREFIX_HIT:
        hit = describe_hit(detail, seq, same_step, why)
        shared = sibling_hit(detail.get("blocks", []), seq, same_step.seqs) if same_step else None
        return _("{hit}; {shared}").format(hit=hit, shared=shared) if shared else hit  # n samples meet in the cache
    if kind == EventKind.PREFILL_CHUNK:
        return describe_chunk(event, seq, budget, why)
    if kind == EventKind.FORKED:
        return why.forked(event) if why else _("was forked from another beam")
    if kind == EventKind.COPY_ON_WRITE:
        return (
            why.copied(event)
            if why
            else _("was to write into shared block {source}: it got a copy, block {copy}").format(
                source=detail.get("source", "?"), copy=detail.get("copy", "?")
            )
        )
    if kind == EventKind.PREEMPTED and why and beam_width_of(seq):
        return why.restart(event, seq)  # a beam search starts again from its prompt
    if kind == EventKind.PREEMPTED:
        reason = (why.preemption(event) if why else None) or detail.get("reason")
        if reason:
            return _("was preempted back to WAITING ({reason})").format(reason=reason)
        return _("was preempted back to WAITING")
    if kind == EventKind.FINISHED and detail.get("reason") == FinishReason.PRUNED.value and why:
        restarted = any(e["seq_id"] == event["seq_id"] for e in why.kinds(EventKind.PREEMPTED))
        return "" if restarted else why.pruned(seq)  # dropped by a restart: its preemption said so
    if kind == EventKind.FINISHED:
        return _("finished ({reason})").format(reason=detail.get("reason", "?"))
    return ""  # prefill_done: the generated token and the status already tell it


def describe_hit(detail: dict, seq: dict, same_step: SameStep | None, why: Why | None) -> str:
    """A prefix hit: the cached tokens reused, and where the hit stopped (when the trace says)."""
    blocks = detail.get("blocks", [])
    tokens = detail.get("tokens_saved", 0)
    stop = why.hit_stop(detail, seq) if why else None
    now = same_step.describe_hit(blocks, tokens) if same_step else None
    if now:
        return _("{hit} ({stop})").format(hit=now, stop=stop) if stop else now
    if stop:
        text = ngettext(
            "reused {tokens} cached tokens ({count} block from the prefix cache; {stop})",
            "reused {tokens} cached tokens ({count} blocks from the prefix cache; {stop})",
            len(blocks),
        )
    else:
        text = ngettext(
            "reused {tokens} cached tokens ({count} block from the prefix cache)",
            "reused {tokens} cached tokens ({count} blocks from the prefix cache)",
            len(blocks),
        )
    return text.format(tokens=tokens, count=len(blocks), stop=stop)


def describe_chunk(event: dict, seq: dict, budget: int, why: Why | None) -> str:
    """A prefill chunk: how many tokens, which chunk of how many, and what capped it."""
    detail = event.get("detail") or {}
    start, end = detail.get("start", 0), detail.get("end", 0)
    prompt = end <= seq.get("num_prompt_tokens", end)
    count = end - start
    chunk = _("chunk {chunk} of {chunks}").format(chunk=detail.get("chunk", 1), chunks=estimate_chunks(detail, budget))
    capped = why.chunk(event, seq) if why else None
    if capped:
        rest = int(seq.get("num_tokens", detail.get("num_tokens", end))) - start
        if prompt:
            text = _("prefilled {count} of {rest} prompt tokens ({chunk}: {capped})")
        else:
            text = _("prefilled {count} of {rest} tokens ({chunk}: {capped})")
        return text.format(count=count, rest=rest, chunk=chunk, capped=capped)
    if prompt:
        text = ngettext("prefilled {count} prompt token ({chunk})", "prefilled {count} prompt tokens ({chunk})", count)
    else:
        text = ngettext("prefilled {count} token ({chunk})", "prefilled {count} tokens ({chunk})", count)
    return text.format(count=count, chunk=chunk)


def estimate_chunks(detail: dict, budget: int) -> int:
    """Chunks so far plus the chunks the remaining tokens need at a full token budget."""
    chunk = int(detail.get("chunk", 1))
    remaining = int(detail.get("num_tokens", 0)) - int(detail.get("end", 0))
    if remaining <= 0 or budget <= 0:
        return chunk
    return chunk + math.ceil(remaining / budget)


def status_change(seq: dict, events: list[dict]) -> str:
    before, after = seq.get("status_before"), seq.get("status_after")
    if not before or before == after:
        return ""
    kinds = {e["kind"] for e in events}
    if after == "WAITING" and EventKind.PREEMPTED in kinds:
        return ""
    if after == "FINISHED" and EventKind.FINISHED in kinds or after == "RUNNING" and EventKind.ADMITTED in kinds:
        return ""
    return _("moved to {status}").format(status=after)


def describe_decodes(decoders: list[dict]) -> list[str]:
    if len(decoders) <= MAX_LISTED_DECODES:
        return [
            _("{seq} generated {token}").format(seq=name(s["seq_id"]), token=quoted_tokens(s)[0])
            if s.get("new_token_texts")
            else _("{seq} generated a token").format(seq=name(s["seq_id"]))
            for s in decoders
        ]
    ids = ", ".join(str(s["seq_id"]) for s in decoders[:MAX_LISTED_DECODES])
    return [_("{count} sequences (seq {ids}, ...) each generated one token").format(count=len(decoders), ids=ids)]


def join_parts(parts: list[str]) -> str:
    """'a, b and c': one sequence's actions in the step."""
    text = parts[0]
    for part in parts[1:-1]:
        text = _("{actions_so_far}, {next_action}").format(actions_so_far=text, next_action=part)
    if len(parts) > 1:
        text = _("{actions_so_far} and {last_action}").format(actions_so_far=text, last_action=parts[-1])
    return text


def join_clauses(clauses: list[str]) -> str:
    """'a; b; c': the step's clauses, one per sequence (or group of decodes)."""
    text = clauses[0]
    for clause in clauses[1:]:
        text = _("{clauses_so_far}; {next_clause}").format(clauses_so_far=text, next_clause=clause)
    return text


def join_tokens(tokens: list[str]) -> str:
    """ "'a', 'b'": the tokens one sequence generated in the step."""
    text = tokens[0] if tokens else ""
    for token in tokens[1:]:
        text = _("{tokens_so_far}, {next_token}").format(tokens_so_far=text, next_token=token)
    return text
