"""Runs a profile's rules on each step in order, keeping what carries over between steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tracer.trace.invariants.profiles import DEFAULT_PROFILE, profile_for, rules_of
from tracer.trace.invariants.reading import forked, preempted
from tracer.trace.invariants.rule import Context, Violation
from tracer.trace.kv_shadow import KvShadow
from tracer.trace.step_line import bare_line


class InvariantChecker:
    """Checks steps in order; keeps what carries over between steps."""

    def __init__(
        self,
        config: dict | None = None,
        requests: Iterable[dict] = (),
        eos_token_ids: Iterable[int] | None = None,
        profile: str = DEFAULT_PROFILE,
    ):
        self.rules = rules_of(profile)
        self.config = dict(config or {})
        self.prev: dict[int, dict] | None = None
        self.tokens: dict[int, list[int]] = {}
        self.params: dict[int, dict] = {}
        self.memo: dict = {}
        self.kv = KvShadow()
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else None
        self.preempted: list[int] | None = None
        self.forgotten: dict[int, dict] = {}  # seq_id -> its last row, for one listed again
        self.add_requests(requests)

    def add_requests(self, requests: Iterable[dict]) -> None:
        for r in requests:
            ids = r.get("prompt_token_ids")
            if ids is not None and len(ids) == r.get("num_prompt_tokens", len(ids)):  # else: prompt unknown
                self.tokens.setdefault(r["seq_id"], list(r["prompt_token_ids"]))
            if r.get("params"):
                self.params.setdefault(r["seq_id"], r["params"])

    def check(self, step: Mapping[str, Any]) -> list[Violation]:
        self.add_requests(step.get("new_requests", ()))
        if self.forgotten and self.prev is not None:
            for row in step["seqs"]:
                if row["seq_id"] in self.forgotten:
                    self.prev[row["seq_id"]] = self.forgotten.pop(row["seq_id"])
        ctx = Context(
            step,
            {s["seq_id"]: s for s in step["seqs"]},
            list(step["inputs"]["seq_ids"]),
            self.config.get("block_size") or step["pool"]["block_size"],
            self.config,
            self.prev,
            self.tokens,
            self.memo,
            self.kv,
            self.params,
            self.eos_token_ids,
            self.preempted,
        )
        number = step["step"]
        found: list[Violation] = []
        for rule in self.rules:
            try:
                found.extend(Violation(number, seq_id, rule.name, message) for seq_id, message in rule.find(ctx))
            except (KeyError, IndexError, TypeError, ValueError) as e:
                message = f"the step is malformed for this check ({type(e).__name__}: {e})"
                found.append(Violation(number, None, rule.name, message))
        self.remember(ctx)
        return found

    def remember(self, ctx: Context) -> None:
        self.prev = ctx.seqs
        self.preempted = [sid for sid in preempted(ctx.step) if ctx.seqs.get(sid, {}).get("status_after") == "WAITING"]
        children = forked(ctx.step)
        for sid, s in ctx.seqs.items():
            if sid in self.tokens and sid not in children:
                self.tokens[sid].extend(s.get("new_token_ids") or ())
                self.cut_back(sid, s["num_tokens_after"])
        for child, parent in children.items():
            self.take_parents_tokens(ctx, child, parent)

    def forget(self, seq_ids: Iterable[int]) -> None:
        """Sequences the next steps leave out (finished ones a recorder no longer lists): not missing
        from them. One listed again starts from the row it had."""
        for sid in seq_ids:
            if self.prev is not None and sid in self.prev:
                self.forgotten[sid] = self.prev.pop(sid)

    def cut_back(self, sid: int, num_tokens: int) -> None:
        """A beam search restarted from its prompt (a preemption): its first beam's tokens (and the KV
        they chain) are cut back; the search computes them again."""
        if len(self.tokens[sid]) > num_tokens >= 0:
            del self.tokens[sid][num_tokens:]
            self.kv.cut(sid, num_tokens)

    def take_parents_tokens(self, ctx: Context, child: int, parent: int) -> None:
        """A forked beam's tokens: its parent's before the step, then its own new token."""
        row = ctx.seqs.get(child)
        self.tokens.pop(child, None)  # its request entry knows only the prompt
        if row is None or parent not in self.tokens:
            return  # its parent's tokens are unknown: nothing to compare with
        self.tokens[child] = self.tokens[parent][: row["num_tokens"]] + list(row.get("new_token_ids") or ())


def check_steps(
    steps: Iterable[dict],
    config: dict | None = None,
    requests: Iterable[dict] = (),
    eos_token_ids: Iterable[int] | None = None,
    profile: str = DEFAULT_PROFILE,
) -> list[Violation]:
    checker = InvariantChecker(config, requests, eos_token_ids, profile)
    return [v for step in steps for v in checker.check(step)]


def check_trace(trace, profile: str | None = None) -> list[Violation]:
    """Every violation in a loaded trace (tracer.trace.trace_file.Trace), by the profile asked for
    or else by that of the engine that wrote it (its header's `engine`)."""
    header = trace.header
    config, requests, eos = header.get("config"), header.get("requests", ()), header.get("eos_token_ids")
    return check_steps(trace.steps, config, requests, eos, profile or profile_for(header))


def check_record(record, block_size: int | None = None, profile: str = DEFAULT_PROFILE) -> list[Violation]:
    """Check one bare nanoengine StepRecord (no history: cross-step checks are skipped)."""
    config = {"block_size": block_size} if block_size else None
    return InvariantChecker(config, profile=profile).check(bare_line(record))
