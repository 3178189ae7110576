"""One plain-English sentence per engine step, built only from that step's dict and the header."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nanoengine.sequence import EventKind
from tracer.replay.colors import seq_letter
from tracer.replay.why import Why
from tracer.trace.readable import completed_character, printable, token_label

MAX_LISTED_DECODES = 3  # more decode-only sequences than this are summarised in one clause


def narrate(step: dict, header: dict) -> str:
    """'Step 7: seq 2 (C) prefilled 3 prompt tokens (chunk 3 of 3); seq 0 (A) generated ' Paris'.'"""
    budget = int(header.get("config", {}).get("max_num_batched_tokens") or 0)
    seqs = {s["seq_id"]: s for s in step.get("seqs", [])}
    events = events_by_seq(step.get("events", []))
    writers = block_writers(step, int(step.get("pool", {}).get("block_size") or 0))
    why = Why(step, header, seqs)
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
        waits.append(f"{name(waiting[0])} was not admitted: {waiting[1]}")
    clauses.extend(waits)
    if not clauses:
        return f"Step {step.get('step', '?')}: nothing was scheduled."
    return f"Step {step.get('step', '?')}: " + "; ".join(clauses) + "."


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
            quoted.append(f"{label} completing '{printable(whole)}'")
        else:
            quoted.append(label)
    return quoted


def name(seq_id: int) -> str:
    return f"seq {seq_id} ({seq_letter(seq_id)})"


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
            return f"reused {tokens} cached tokens, some of them from blocks computed in this same step"
        span = f"blocks {logical[0]}-{logical[-1]}" if len(logical) > 1 else f"block {logical[0]}"
        who = seq_letter(owner)
        return f"reused {who}'s {span} ({tokens} tokens), which {who} computes in this same step"


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
        parts.append("generated " + ", ".join(quoted_tokens(seq)))
    parts.append(status_change(seq, events))
    parts += [describe_event(e, seq, budget, same_step, why) for e in ending]
    parts = [p for p in parts if p]
    if not parts:
        parts.append(f"computed {seq.get('num_scheduled_tokens', 0)} tokens")
    return f"{name(seq['seq_id'])} " + join_parts(parts)


def describe_event(
    event: dict, seq: dict, budget: int, same_step: SameStep | None = None, why: Why | None = None
) -> str:
    kind, detail = event["kind"], event.get("detail") or {}
    if kind == EventKind.ADMITTED:
        blocks = why.blocks(detail, admitted=True) if why else None
        return "was admitted to RUNNING" + (f" ({blocks})" if blocks else "")
    if kind == EventKind.NOT_ADMITTED:
        blocks = why.blocks(detail, admitted=False) if why else None
        return "was not admitted" + (f": {blocks}" if blocks else "")
    if kind == EventKind.PREFIX_HIT:
        blocks = detail.get("blocks", [])
        stop = why.hit_stop(detail, seq) if why else None
        now = same_step.describe_hit(blocks, detail.get("tokens_saved", 0)) if same_step else None
        if now:
            return now + (f" ({stop})" if stop else "")
        return (
            f"reused {detail.get('tokens_saved', 0)} cached tokens "
            f"({len(blocks)} block{'s' if len(blocks) != 1 else ''} from the prefix cache{'; ' + stop if stop else ''})"
        )
    if kind == EventKind.PREFILL_CHUNK:
        start, end = detail.get("start", 0), detail.get("end", 0)
        what = "prompt token" if end <= seq.get("num_prompt_tokens", end) else "token"
        count = end - start
        chunk = f"chunk {detail.get('chunk', 1)} of {estimate_chunks(detail, budget)}"
        capped = why.chunk(event, seq) if why else None
        if capped:
            rest = int(seq.get("num_tokens", detail.get("num_tokens", end))) - start
            return f"prefilled {count} of {rest} {what}s ({chunk}: {capped})"
        return f"prefilled {count} {what}{'' if count == 1 else 's'} ({chunk})"
    if kind == EventKind.PREEMPTED:
        reason = (why.preemption(event) if why else None) or detail.get("reason")
        return "was preempted back to WAITING" + (f" ({reason})" if reason else "")
    if kind == EventKind.FINISHED:
        return f"finished ({detail.get('reason', '?')})"
    return ""  # prefill_done: the generated token and the status already tell it


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
    return f"moved to {after}"


def describe_decodes(decoders: list[dict]) -> list[str]:
    if len(decoders) <= MAX_LISTED_DECODES:
        return [
            f"{name(s['seq_id'])} generated {quoted_tokens(s)[0]}"
            if s.get("new_token_texts")
            else f"{name(s['seq_id'])} generated a token"
            for s in decoders
        ]
    ids = ", ".join(str(s["seq_id"]) for s in decoders[:MAX_LISTED_DECODES])
    return [f"{len(decoders)} sequences (seq {ids}, ...) each generated one token"]


def join_parts(parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]
