"""A checker for the Chrome Trace Event format's documented fields (the "Trace Event Format"
document that chrome://tracing and Perfetto's JSON importer follow): the JSON Object Format,
the fields every event has, and the per-phase rules for the phases nanoengine writes.

    format_errors(data) -> list[str]        [] for a well-formed trace
"""

from __future__ import annotations

from collections import defaultdict
from numbers import Real

PHASES = set("XBEiICsftM")
METADATA_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
INSTANT_SCOPES = {"g", "p", "t"}


def format_errors(data: object) -> list[str]:
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        return ["the top level must be an object with a traceEvents list (JSON Object Format)"]
    errors = []
    if data.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errors.append(f"displayTimeUnit must be 'ms' or 'ns', not {data['displayTimeUnit']!r}")
    for n, event in enumerate(data["traceEvents"]):
        errors += [f"event {n} ({event.get('name')!r}, ph {event.get('ph')!r}): {e}" for e in event_errors(event)]
    errors += slice_nesting_errors(data["traceEvents"])
    errors += flow_errors(data["traceEvents"])
    errors += begin_end_errors(data["traceEvents"])
    return errors


def is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def event_errors(event: dict) -> list[str]:
    errors = []
    ph = event.get("ph")
    if ph not in PHASES:
        return [f"unknown phase {ph!r}"]
    if not isinstance(event.get("name"), str):
        errors.append("name must be a string")
    for key in ("pid", "tid"):
        if not isinstance(event.get(key), int):
            errors.append(f"{key} must be an integer")
    if "args" in event and not isinstance(event["args"], dict):
        errors.append("args must be an object")
    if ph == "M":
        if event.get("name") not in METADATA_NAMES:
            errors.append(f"metadata name must be one of {sorted(METADATA_NAMES)}")
        if not isinstance(event.get("args"), dict) or not event["args"]:
            errors.append("metadata needs args")
        return errors
    if not is_number(event.get("ts")) or event["ts"] < 0:
        errors.append("ts must be a number of microseconds >= 0")
    if ph == "X" and (not is_number(event.get("dur")) or event["dur"] < 0):
        errors.append("a complete event (X) needs dur >= 0")
    if ph in "iI" and event.get("s", "t") not in INSTANT_SCOPES:
        errors.append("an instant event's scope s must be g, p or t")
    if ph == "C":
        args = event.get("args")
        if not isinstance(args, dict) or not args or not all(is_number(v) for v in args.values()):
            errors.append("a counter event (C) needs args of numbers, one per series")
    if ph in "stf":
        if "id" not in event:
            errors.append("a flow event needs an id")
        if not isinstance(event.get("cat"), str):
            errors.append("a flow event needs a cat (flows are matched by cat, name and id)")
        if ph == "f" and event.get("bp", "e") != "e":
            errors.append("bp, if given, must be 'e'")
    return errors


def slices(events: list[dict]) -> dict[tuple[int, int], list[tuple[float, float]]]:
    by_thread = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and is_number(e.get("ts")) and is_number(e.get("dur")):
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    return by_thread


def slice_nesting_errors(events: list[dict]) -> list[str]:
    """Complete events on one thread must nest: two slices are disjoint or one holds the other."""
    errors = []
    for thread, spans in slices(events).items():
        stack: list[float] = []  # ends of the open slices
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1] + 1e-6:
                errors.append(f"thread {thread}: slice {start}-{end} overlaps its parent ending at {stack[-1]}")
            stack.append(end)
    return errors


def flow_errors(events: list[dict]) -> list[str]:
    """Each flow starts once and finishes once, not before it starts, each end inside a slice
    of its thread (flow events bind to the enclosing slice)."""
    errors = []
    threads = slices(events)
    ends = defaultdict(dict)
    for e in events:
        if e.get("ph") in ("s", "f") and is_number(e.get("ts")):
            key = (e.get("cat"), e.get("name"), e.get("id"))
            if e["ph"] in ends[key]:
                errors.append(f"flow {key} has two '{e['ph']}' events")
            ends[key][e["ph"]] = e
            inside = any(s <= e["ts"] <= t for s, t in threads.get((e["pid"], e["tid"]), []))
            if not inside:
                errors.append(f"flow {key} '{e['ph']}' at {e['ts']} is not inside a slice of its thread")
    for key, pair in ends.items():
        if set(pair) != {"s", "f"}:
            errors.append(f"flow {key} has only {sorted(pair)}")
        elif pair["f"]["ts"] < pair["s"]["ts"]:
            errors.append(f"flow {key} finishes before it starts")
    return errors


def begin_end_errors(events: list[dict]) -> list[str]:
    depth: dict[tuple[int, int], int] = defaultdict(int)
    errors = []
    for e in sorted((e for e in events if e.get("ph") in ("B", "E") and is_number(e.get("ts"))), key=lambda e: e["ts"]):
        depth[(e["pid"], e["tid"])] += 1 if e["ph"] == "B" else -1
        if depth[(e["pid"], e["tid"])] < 0:
            errors.append(f"thread {(e['pid'], e['tid'])}: E without B at {e['ts']}")
    errors += [f"thread {t}: {d} B without E" for t, d in depth.items() if d > 0]
    return errors
