"""Which engine code a step shows: the function behind its event, or behind its phase when it has
no event, read from the trace's own sources (docs/trace-format.md, "Sources"), never from the
engine installed here; and vLLM v1's counterpart of that decision (from glossary.py).

    decision_code(step, header, seq_id=None, violation=None) -> DecisionCode
        with a violation (one of the step's): the engine function its invariant checks, when the
        checker can tell (Rule.checks), else the sequence's event this step
    ordered_violations(step) -> list[dict]      those whose invariant names a function first
    violation_lines(violation, sources) -> [head, rule, message, code]    the `v` list's entry
    code_lines(code) -> list[str]               as plain text
    step_code_text(step, header) -> list[str]   every violation and the code, for replay --text

An event's `where` lists the lines that emitted it, innermost first ([name, line]): the panel shows
each of those functions (outermost first) with its line marked, then any function the shown lines
call that a lesson swapped in (the student's own code, which decided but had returned).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _, ngettext
from tracer.replay.colors import seq_tag
from tracer.replay.glossary import vllm_counterpart
from tracer.trace.decisions import DECISIONS, SCHEDULES_TOKENS, Role
from tracer.trace.invariants.rule import rule_named, shown_text

# The event a step's panel shows when no sequence is selected: the most telling first.
EVENT_ORDER = (
    EventKind.PREEMPTED,
    EventKind.COPY_ON_WRITE,
    EventKind.FORKED,
    EventKind.PREFIX_HIT,
    EventKind.ADMITTED,
    EventKind.NOT_ADMITTED,
    EventKind.FINISHED,
    EventKind.PREFILL_DONE,
    EventKind.PREFILL_CHUNK,
)
MAX_FRAMES = 3
# Functions that carry out a decision their caller took: the caller's line is the deciding one.
EFFECTORS = frozenset(name for name, d in DECISIONS.items() if d.role == Role.CARRIES_OUT)
NO_SOURCE = N_("no source recorded in this trace (an older trace, or another engine's): the code is not in it")
CANNOT_TELL = N_("the checker cannot tell which function broke this invariant")
PHASE = "Scheduler.schedule"  # a step without events: its running loop gave each sequence a token
PHASE_LINE = SCHEDULES_TOKENS.rsplit(".", 1)[-1] + "("  # the running loop's line that schedules a decode
CALL = re.compile(r"\b(\w+)\(")


@dataclass(frozen=True, slots=True)
class Section:
    """One function: its source as the trace holds it, the lines to mark (file line numbers)."""

    name: str  # qualified: Scheduler.make_room
    file: str
    first_line: int
    source: str
    engine: bool  # False: swapped in (a lesson's own code)
    marked: tuple[int, ...] = ()
    role: str = ""  # why it is shown: "emitted it", "called it", "decided"
    deciding: int | None = None  # the marked line that took the decision, if it is in this function

    @property
    def lines(self) -> list[str]:
        return self.source.rstrip("\n").split("\n")

    @property
    def heading(self) -> str:
        whose = _("the engine's") if self.engine else _("swapped in: your code")
        role = f" · {self.role}" if self.role else ""
        return f"{self.name} — {self.file}:{self.first_line} ({whose}){role}"


@dataclass(frozen=True, slots=True)
class DecisionCode:
    title: str  # what the code is behind: "PREEMPTED B#1" or "decode (no event this step)"
    vllm: str  # "vLLM v1: ..." or ""
    sections: list[Section] = field(default_factory=list)
    note: str = ""  # said instead of code (no sources in the trace, nothing scheduled)

    @property
    def focus(self) -> tuple[int, int] | None:
        """(section index, line index inside it) of the line to scroll to: the deciding one, else
        the innermost mark."""
        marked = [(i, s.deciding or s.marked[-1], s.deciding) for i, s in enumerate(self.sections) if s.marked]
        if not marked:
            return None
        i, line, _deciding = max(marked, key=lambda m: (m[2] is not None, m[0]))
        return i, line - self.sections[i].first_line


def chief_event(step: dict, seq_id: int | None = None) -> dict | None:
    """The selected sequence's most telling event this step, else the step's."""
    events = step.get("events") or []
    mine = [e for e in events if e.get("seq_id") == seq_id] if seq_id is not None else []
    for pool in (mine, events):
        for kind in EVENT_ORDER:
            found = [e for e in pool if e.get("kind") == kind]
            if found:
                return found[0]
    return None


def decision_code(step: dict, header: dict, seq_id: int | None = None, violation: dict | None = None) -> DecisionCode:
    sources = header.get("sources") or {}
    if violation is not None:
        return violation_code(violation, step, sources)
    event = chief_event(step, seq_id)
    if event is None:
        return phase_code(step, sources)
    return event_code(event, sources)


def event_code(event: dict, sources: dict) -> DecisionCode:
    title = f"{str(event.get('kind', '?')).upper()} {seq_tag(int(event.get('seq_id', 0)))}"
    where = [(str(name), int(line)) for name, line in event.get("where") or [] if name in sources]
    if not sources or not where:
        return DecisionCode(title, vllm_line([]), note=_(NO_SOURCE))
    where = where[:MAX_FRAMES]
    decider = next((name for name, _line in where if name not in EFFECTORS), where[-1][0])
    sections = [section_of(name, sources[name], (line,), role_of(name, where, decider)) for name, line in where]
    sections = [
        replace(s, deciding=s.marked[0]) if s.name == decider else s for s in reversed(sections)
    ]  # outermost first: the reader follows the call down
    sections = with_called_swaps(sections, sources)
    line = dict(where)[decider]
    return DecisionCode(
        _("{event} · decided in {function}, line {line}").format(event=title, function=decider, line=line),
        vllm_line([name for name, _line in where]),
        sections,
    )


def role_of(name: str, where: list[tuple[str, int]], decider: str) -> str:
    emitted = name == where[0][0]
    if name == decider:
        return _("decided, emitted it") if emitted else _("decided, called it")
    return _("emitted it") if emitted else _("called it")


def phase_code(step: dict, sources: dict) -> DecisionCode:
    if not step.get("inputs", {}).get("seq_ids"):
        return DecisionCode(_("step {step}: nothing scheduled").format(step=step.get("step", "?")), "")
    title = _("decode (no event this step): each running sequence got one token")
    if PHASE not in sources:
        return DecisionCode(title, vllm_line([PHASE]), note=_(NO_SOURCE))
    entry = sources[PHASE]
    first = int(entry.get("line", 1))
    lines = str(entry.get("source", "")).split("\n")
    marked = tuple(first + i for i, text in enumerate(lines) if PHASE_LINE in text)[:1]
    section = section_of(PHASE, entry, marked, _("its running loop"))
    return DecisionCode(title, vllm_line([PHASE]), [replace(section, deciding=marked[0] if marked else None)])


def section_of(name: str, entry: dict, marked: tuple[int, ...], role: str) -> Section:
    return Section(
        name,
        str(entry.get("file", "?")),
        int(entry.get("line", 1)),
        str(entry.get("source", "")),
        bool(entry.get("engine", True)),
        marked,
        role,
    )


def with_called_swaps(sections: list[Section], sources: dict) -> list[Section]:
    """The sections, each followed by the swapped-in functions (a lesson's) it calls: they decided,
    then returned, so no event's lines name them."""
    shown = {s.name for s in sections}
    by_short = {name.rsplit(".", 1)[-1]: name for name, entry in sources.items() if not entry.get("engine", True)}
    out: list[Section] = []
    for section in sections:
        out.append(section)
        for i, text in enumerate(section.lines):
            for short in CALL.findall(text):
                name = by_short.get(short)
                if name is not None and name not in shown:
                    shown.add(name)
                    role = _("called by {function} at line {line}").format(
                        function=section.name, line=section.first_line + i
                    )
                    out.append(section_of(name, sources[name], (), role))
    return out


def checks_of(violation: dict) -> tuple[str, ...]:
    rule = rule_named(str(violation.get("invariant", "")))
    return rule.checks if rule is not None else ()


def ordered_violations(step: dict) -> list[dict]:
    """The step's violations, those whose invariant names the function it checks first (the
    clearest), otherwise in the checker's order."""
    violations = [v for v in step.get("violations") or [] if isinstance(v, dict)]
    return sorted(violations, key=lambda v: not checks_of(v))


def violation_code(violation: dict, step: dict, sources: dict) -> DecisionCode:
    seq_id = violation.get("seq_id")
    seq_id = seq_id if isinstance(seq_id, int) else None
    title = f"✗ {violation.get('invariant', 'invariant')}" + (f" {seq_tag(seq_id)}" if seq_id is not None else "")
    if not sources:
        return DecisionCode(title, "", note=_(NO_SOURCE))
    events = [e for e in step.get("events") or [] if seq_id is not None and e.get("seq_id") == seq_id]
    for name in checks_of(violation):
        if name in sources:
            lines = tuple(sorted({int(line) for e in events for n, line in e.get("where") or [] if n == name}))
            section = section_of(name, sources[name], lines, _("the function this invariant checks"))
            section = replace(section, deciding=lines[0] if lines else None)
            title = _("{violation} · it checks {function}").format(violation=title, function=name)
            return DecisionCode(title, vllm_line([name]), [section])
    event = chief_event({"events": events}) if events else None
    if event is None:
        return DecisionCode(title, "", note=_(CANNOT_TELL))
    code = event_code(event, sources)
    note = _("the checker cannot tell which function broke this invariant: its sequence's event this step")
    return replace(code, title=f"{title} · {code.title}", note=note)


def vllm_line(names: list[str]) -> str:
    """vLLM v1's counterpart of the first of names (innermost first) the glossary knows."""
    for name in names:
        counterpart = vllm_counterpart(name)
        if counterpart:
            return f"vLLM v1: {counterpart}"
    return ""


def code_lines(code: DecisionCode) -> list[str]:
    """The panel as plain text: ▶ marks the deciding lines (no colour needed)."""
    out = [code.title]
    if code.vllm:
        out.append(code.vllm)
    if code.note:
        out.append(code.note)
    for section in code.sections:
        out.append(f"── {section.heading}")
        width = len(str(section.first_line + len(section.lines)))
        for i, text in enumerate(section.lines):
            number = section.first_line + i
            out.append(f"{marker(section, number)} {number:>{width}} │ {text}")
    return out


def marker(section: Section, number: int) -> str:
    """▶ the deciding line, › another line of the call chain, blank otherwise."""
    if number == section.deciding:
        return "▶"
    return "›" if number in section.marked else " "


def violation_lines(violation: dict, sources: dict) -> list[str]:
    """One violation in full: its invariant, sequence and cell; the rule; what is wrong; its code."""
    seq_id = violation.get("seq_id")
    rule = rule_named(str(violation.get("invariant", "")))
    head = f"✗ {violation.get('invariant', 'invariant')}"
    head += f" · {seq_tag(seq_id)}" if isinstance(seq_id, int) else ""
    head += " · " + _("cell: {field}").format(field=rule.field) if rule is not None and rule.field else ""
    text = shown_text(rule) if rule is not None else _("not one of this nanoengine's invariants")
    return [
        head,
        "  " + _("rule: {rule}").format(rule=text),
        f"  {violation.get('message', '')}",
        "  " + _("code: {code}").format(code=code_of(violation, sources)),
    ]


def code_of(violation: dict, sources: dict) -> str:
    if not sources:
        return _(NO_SOURCE)
    for name in checks_of(violation):
        if name in sources:
            entry = sources[name]
            whose = _("the engine's") if entry.get("engine", True) else _("swapped in: your code")
            return f"{name} — {entry.get('file', '?')}:{entry.get('line', '?')} ({whose})"
    return _(
        "the checker cannot tell which function broke this invariant "
        "(the code panel shows its sequence's event this step)"
    )


def step_code_text(step: dict, header: dict) -> list[str]:
    """Every violation at the step in full, then the code panel (the clearest violation's function,
    else the step's event or phase), as plain text."""
    violations = ordered_violations(step)
    sources = header.get("sources") or {}
    count = len(violations)
    lines = [ngettext("{count} invariant violation:", "{count} invariant violations:", count).format(count=count)]
    lines = lines if violations else []
    for violation in violations:
        lines += violation_lines(violation, sources)
    code = decision_code(step, header, None, violations[0] if violations else None)
    return [*lines, "", _("code:"), *code_lines(code)]
