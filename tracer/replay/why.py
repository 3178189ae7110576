"""Why each scheduler decision of a step was taken, in a phrase: from the numbers its event records
(trace schema 3, docs/trace-format.md "Decisions and their numbers") and the step's own fields.

Every method answers None where the trace lacks the numbers (older traces, vLLM's): the narration
then keeps its old wording.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import _, ngettext
from tracer.replay.colors import seq_letter
from tracer.trace.step_line import queues_of


def number(detail: dict, key: str) -> int | None:
    value = detail.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(slots=True)
class Why:
    step: dict
    header: dict
    seqs: dict[int, dict]  # the step's rows by seq_id

    @property
    def config(self) -> dict:
        return self.header.get("config") or {}

    @property
    def block_size(self) -> int:
        return int(self.step.get("pool", {}).get("block_size") or self.config.get("block_size") or 0)

    def kinds(self, kind: EventKind) -> list[dict]:
        return [e for e in self.step.get("events", []) if e["kind"] == kind]

    def scheduled_before(self, seq_id: int) -> list[tuple[int, int]]:
        """(seq_id, tokens) of the sequences ahead of seq_id in the batch."""
        inputs = self.step.get("inputs", {})
        order, starts = list(inputs.get("seq_ids", [])), list(inputs.get("query_start_loc", []))
        if seq_id not in order or len(starts) != len(order) + 1:
            return []
        ahead = order[: order.index(seq_id)]
        return [(sid, starts[i + 1] - starts[i]) for i, sid in enumerate(ahead)]

    def spent_on(self, seq_id: int) -> str:
        """'16 decodes', '2 decodes and a 20-token chunk': what the budget went to before seq_id."""
        chunked = {e["seq_id"] for e in self.kinds(EventKind.PREFILL_CHUNK)}
        ahead = self.scheduled_before(seq_id)
        chunks = [n for sid, n in ahead if sid in chunked]
        decodes = len(ahead) - len(chunks)
        parts = [ngettext("{count} decode", "{count} decodes", decodes).format(count=decodes)] if decodes else []
        if len(chunks) == 1:
            parts.append(_("a {tokens}-token chunk").format(tokens=chunks[0]))
        elif chunks:
            parts.append(_("{count} chunks ({tokens} tokens)").format(count=len(chunks), tokens=sum(chunks)))
        if len(parts) == 2:
            return _("{decodes} and {chunks}").format(decodes=parts[0], chunks=parts[1])
        return parts[0] if parts else ""

    def chunk(self, event: dict, seq: dict) -> str | None:
        """What capped a chunk: '48 budget tokens left after 16 decodes'; None when the chunk is
        the rest of the sequence (nothing capped it) or the trace has no budget."""
        detail = event.get("detail") or {}
        budget, end = number(detail, "budget"), number(detail, "end")
        num_tokens = seq.get("num_tokens", detail.get("num_tokens"))
        if budget is None or end is None or not isinstance(num_tokens, int) or end >= num_tokens:
            return None
        spent = self.spent_on(event["seq_id"])
        if not spent:
            return _("the whole {budget}-token budget").format(budget=budget)
        text = ngettext("{count} budget token left after {spent}", "{count} budget tokens left after {spent}", budget)
        return text.format(count=budget, spent=spent)

    def blocks(self, detail: dict, admitted: bool) -> str | None:
        """'takes 3 of the 10 free blocks' for an admission, 'needs 3 blocks, 1 free' for a wait."""
        need, free = number(detail, "need"), number(detail, "free")
        if need is None or free is None:
            return None
        if admitted:
            text = ngettext("takes {need} of the {free} free block", "takes {need} of the {free} free blocks", free)
            return text.format(need=need, free=free)
        return ngettext("needs {need} block, {free} free", "needs {need} blocks, {free} free", need).format(
            need=need, free=free
        )

    def preemption(self, event: dict) -> str | None:
        """'seq 0 (A) needed 1 block, 0 free': who needed the room, and what the pool had."""
        detail = event.get("detail") or {}
        by, free = number(detail, "by"), number(detail, "free")
        if by is None or free is None:
            return None
        row = self.seqs.get(by, {})
        who = (
            _("it") if by == event["seq_id"] else _("seq {seq_id} ({letter})").format(seq_id=by, letter=seq_letter(by))
        )
        if row.get("num_scheduled_tokens") and self.block_size > 0:
            held = -(-int(row.get("num_cached_tokens", 0)) // self.block_size)
            count = len(row.get("block_table", [])) - held
            text = ngettext(
                "{who} needed {count} block, {free} free", "{who} needed {count} blocks, {free} free", count
            )
            return text.format(who=who, count=count, free=free)
        return _("{who} needed a block, {free} free").format(who=who, free=free)

    def hit_stop(self, detail: dict, seq: dict) -> str | None:
        """Why a prefix hit stopped where it did: at a block not in the cache, or as far as a hit
        may go (the last token is always computed). None for a trace without the numbers."""
        admitted = [e for e in self.kinds(EventKind.ADMITTED) if e["seq_id"] == seq.get("seq_id")]
        blocks, num_tokens = detail.get("blocks") or [], seq.get("num_tokens")
        if not admitted or number(admitted[0].get("detail") or {}, "need") is None:
            return None
        if not isinstance(num_tokens, int) or self.block_size <= 0:
            return None
        if len(blocks) >= (num_tokens - 1) // self.block_size:
            return _("the rest holds its last token, which is always computed")
        missing = len(blocks) + 1
        return _("its {ordinal} block was not in the cache").format(ordinal=ordinal(missing), number=missing)

    def waiting_head(self) -> tuple[int, str] | None:
        """The head of the waiting queue after the step, when nothing it recorded says why it was
        not admitted: (seq_id, why). Only for nanoengine's version-3 traces."""
        queues = queues_of(self.step)
        if self.header.get("engine") or int(self.header.get("schema_version") or 0) < 3 or not queues:
            return None
        preempted = [e["seq_id"] for e in self.kinds(EventKind.PREEMPTED)]
        admitted = {e["seq_id"] for e in self.kinds(EventKind.ADMITTED)}
        finished = self.kinds(EventKind.FINISHED)
        gone = admitted | {e["seq_id"] for e in finished} | set(preempted)
        queue = preempted[::-1] + [sid for sid in queues["waiting"] if sid not in gone]
        waited = {e["seq_id"] for e in self.kinds(EventKind.NOT_ADMITTED)}
        if not queue or queue[0] in waited or preempted:
            return None
        limit = int(self.config.get("max_num_batched_tokens") or 0)
        if limit and sum(int(s.get("num_scheduled_tokens", 0)) for s in self.seqs.values()) >= limit:
            return queue[0], _("the {limit}-token budget is spent").format(limit=limit)
        aborted = {e["seq_id"] for e in finished if (e.get("detail") or {}).get("reason") == FinishReason.ABORT}
        running = len([sid for sid in queues.get("running", []) if sid not in aborted]) + len(admitted)
        max_num_seqs = int(self.config.get("max_num_seqs") or 0)
        if max_num_seqs and running >= max_num_seqs:
            text = ngettext(
                "{count} sequence running, max_num_seqs is {max_num_seqs}",
                "{count} sequences running, max_num_seqs is {max_num_seqs}",
                running,
            )
            return queue[0], text.format(count=running, max_num_seqs=max_num_seqs)
        return None

    def grammar_masked(self) -> str | None:
        """The sequences that drew a token this step through their request's logits processors (the
        server's structured output: a grammar's token mask), named in one clause; None if none."""
        requests = {r.get("seq_id"): r for r in self.header.get("requests", [])}
        masked = [
            sid
            for sid, seq in self.seqs.items()
            if seq.get("new_token_ids") and (requests.get(sid, {}).get("params") or {}).get("logits_processors")
        ]
        if not masked:
            return None
        names = ", ".join(_("seq {seq_id} ({letter})").format(seq_id=sid, letter=seq_letter(sid)) for sid in masked)
        text = ngettext(
            "{names}'s logits went through the grammar's token mask first; vLLM v1 carries this bitmask "
            "in the scheduler output",
            "{names}: their logits went through each one's grammar token mask first; vLLM v1 carries these "
            "bitmasks in the scheduler output",
            len(masked),
        )
        return text.format(names=names)
