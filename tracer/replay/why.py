"""Why each scheduler decision of a step was taken, in a phrase: from the numbers its event records
(trace schema 3, docs/trace-format.md "Decisions and their numbers") and the step's own fields.

Every method answers None where the trace lacks the numbers (older traces, vLLM's): the narration
then keeps its old wording.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import _, ngettext
from tracer.replay.beams import FINISHED
from tracer.replay.colors import seq_letter
from tracer.trace.step_line import beam_width_of, parent_of, queues_of, request_of


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
    scores: Mapping[int, float] = field(default_factory=dict)  # beams' cumulative logprobs after the step

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

    # ---- a beam search (nanoengine/beam_search.py) ----------------------------------------------
    def forked(self, event: dict) -> str:
        """'forked from seq 4 (E): both of E's next tokens ranked among the 3 best; it shares E's 5
        blocks': a beam chosen again is forked, the child holding every block of its parent."""
        detail, row = event.get("detail") or {}, self.seqs.get(event["seq_id"], {})
        parent = number(detail, "parent")
        parent = parent if parent is not None else parent_of(row)
        if parent < 0:
            return _("was forked from another beam")
        width = beam_width_of(row)
        chosen = 1 + len([e for e in self.kinds(EventKind.FORKED) if (e.get("detail") or {}).get("parent") == parent])
        letter = seq_letter(parent)
        both = chosen == 2
        if width:
            ranked = (
                _("both of {parent}'s next tokens ranked among the {width} best")
                if both
                else _("{count} of {parent}'s next tokens ranked among the {width} best")
            )
        else:
            ranked = (
                _("both of {parent}'s next tokens ranked among the best")
                if both
                else _("{count} of {parent}'s next tokens ranked among the best")
            )
        blocks = len(detail.get("blocks") or row.get("block_table_after") or [])
        shares = ngettext("it shares {parent}'s {count} block", "it shares {parent}'s {count} blocks", blocks)
        return _("forked from {parent}: {ranked}; {shares}").format(
            parent=_("seq {seq_id} ({letter})").format(seq_id=parent, letter=letter),
            ranked=ranked.format(parent=letter, count=chosen, width=width),
            shares=shares.format(parent=letter, count=blocks),
        )

    def copied(self, event: dict) -> str:
        """'was to write into block 12, shared by 2 beams: it got a copy, block 20' (copy-on-write)."""
        detail = event.get("detail") or {}
        source, copy = detail.get("source", "?"), detail.get("copy", "?")
        holders = self.holders(event)
        if holders < 2:
            return _("was to write into shared block {source}: it got a copy, block {copy}").format(
                source=source, copy=copy
            )
        text = ngettext(
            "was to write into block {source}, shared by {count} beam: it got a copy, block {copy}",
            "was to write into block {source}, shared by {count} beams: it got a copy, block {copy}",
            holders,
        )
        return text.format(source=source, count=holders, copy=copy)

    def holders(self, event: dict) -> int:
        """How many sequences held the copied block when this copy was made: those holding it at the
        step's end but for the beams forked after the copies (in the step's postprocess), plus this
        copy's beam and the beams that copied it after."""
        source = (event.get("detail") or {}).get("source")
        copies = [e for e in self.kinds(EventKind.COPY_ON_WRITE) if (e.get("detail") or {}).get("source") == source]
        later = next((len(copies) - i for i, e in enumerate(copies) if e is event), 1)
        forked = {e["seq_id"] for e in self.kinds(EventKind.FORKED)}
        still = [s for s, row in self.seqs.items() if s not in forked and source in (row.get("block_table") or [])]
        return len(still) + later

    def pruned(self, seq: dict) -> str:
        """'was pruned: none of its candidates ranked among the 3 best', with the cumulative logprobs
        where the trace has them (the rows' logprobs summed over the steps)."""
        width = beam_width_of(seq)
        if width:
            ranked = _("none of its candidates ranked among the {width} best").format(width=width)
        else:
            ranked = _("none of its candidates ranked among the best")
        numbers = self.pruned_numbers(seq, width)
        if numbers is None:
            return _("was pruned: {why}").format(why=ranked)
        mine, least = numbers
        return _(
            "was pruned: {why} (its likeliest token made a cumulative logprob of {mine}; the {width} best "
            "reached {least} or more)"
        ).format(why=ranked, mine=f"{mine:.2f}", width=width, least=f"{least:.2f}")

    def pruned_numbers(self, seq: dict, width: int) -> tuple[float, float] | None:
        """(the pruned beam's best cumulative logprob, the least of the beams that live on), when the
        trace tells them: a greedy search (its token is its likeliest) that did not draw an EOS (an
        EOS candidate is a finished hypothesis, not ranked with the others)."""
        seq_id, request = seq.get("seq_id", -1), request_of(seq) if "seq_id" in seq else -1
        params = self.request_params(seq_id) or self.request_params(request)
        drew_eos = not set(self.header.get("eos_token_ids") or []).isdisjoint(seq.get("new_token_ids") or [])
        if not width or seq_id not in self.scores or params.get("temperature", 1.0) != 0 or drew_eos:
            return None
        live = self.live_beams(request)
        if not live or any(s not in self.scores for s in live):
            return None
        return self.scores[seq_id], min(self.scores[s] for s in live)

    def live_beams(self, request: int) -> list[int]:
        """The beams of request's search that live on after the step."""
        return [
            s
            for s, row in self.seqs.items()
            if beam_width_of(row) and request_of(row) == request and row.get("status_after") != FINISHED
        ]

    def request_params(self, seq_id: int) -> dict:
        for entry in self.header.get("requests", []):
            if entry.get("seq_id") == seq_id and isinstance(entry.get("params"), dict):
                return entry["params"]
        return {}

    def restart(self, event: dict, seq: dict) -> str:
        """A beam search preempted: recompute drops every beam's KV and the search starts again from
        its prompt, with its first beam (the others are dropped)."""
        reason = self.preemption(event) or (event.get("detail") or {}).get("reason") or "?"
        if seq.get("status_after") == FINISHED:
            return _(
                "was preempted ({reason}) and dropped: the beam search restarts from its prompt with its first beam"
            ).format(reason=reason)
        return _(
            "was preempted back to WAITING ({reason}); the beam search restarts from its prompt: recompute drops "
            "every beam's KV"
        ).format(reason=reason)
