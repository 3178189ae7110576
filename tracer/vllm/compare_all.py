"""nanoengine, as it is now, beside the committed vLLM v1 traces: every lesson, demo and issue 26
workload, step by step.

    python -m tracer.vllm.compare_all [NAME ...] [--all-kinds] [--markdown] [--keep DIR]

Runs nanoengine (tiny model, nanoengine's venv; no vLLM needed) on each scenario of
tracer/vllm/scenarios.py and diffs its trace against tracer/vllm/traces/NAME.jsonl. By default it
compares the schedule: the tokens each request is given in each step (and the step counts); with
--all-kinds also admissions, victims, prefix hits, finishes and block ids. Prints one line per
scenario (the first difference and each side's why) and exits 1 if any scenario differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tracer.trace.diff import KINDS, Difference, TraceDiff, diff_traces, first_difference_line
from tracer.trace.trace_file import load_trace
from tracer.vllm.scenarios import TRACES_DIR, all_scenarios


def compare(name: str, scenario, folder: Path, kinds: tuple[str, ...]) -> TraceDiff:
    from tracer.teach.scenarios import run_scenario

    ours = folder / f"{name}.nanoengine.jsonl"
    run_scenario(scenario, ours, model="tiny")
    diff = diff_traces(load_trace(ours, validate="none"), load_trace(TRACES_DIR / f"{name}.jsonl", validate="none"))
    diff.differences = [d for d in diff.differences if d.kind in kinds]
    return diff


def markdown_rows(name: str, diff: TraceDiff) -> list[str]:
    """One row per run of consecutive steps where the same request differs the same way (its first
    step's why)."""
    rows: list[str] = []
    runs: list[tuple[Difference, int]] = []  # (first difference of the run, its last step)
    for d in diff.differences:
        i = next(
            (
                k
                for k, (f, last) in enumerate(runs)
                if (f.kind, f.request) == (d.kind, d.request) and last == d.step - 1
            ),
            None,
        )
        if i is None:
            runs.append((d, d.step))
        else:
            runs[i] = (runs[i][0], d.step)
    for d, last in sorted(runs, key=lambda r: (r[0].step, r[0].request or 0)):
        steps = str(d.step) if last == d.step else f"{d.step}-{last}"
        who = "" if d.request is None else d.request
        rows.append(f"| {name} | {steps} | {d.kind} | {who} | {cell(d, 'a')} | {cell(d, 'b')} |")
    if diff.num_steps[0] != diff.num_steps[1]:
        rows.append(f"| {name} | end | steps | | {diff.num_steps[0]} steps | {diff.num_steps[1]} steps |")
    return rows


def cell(d: Difference, side: str) -> str:
    return (d.a if side == "a" else d.b).replace("|", "/")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.vllm.compare_all", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="scenario names (default: all)")
    p.add_argument("--all-kinds", action="store_true", help="also admissions, victims, hits, finishes, blocks")
    p.add_argument("--markdown", action="store_true", help="print every difference as a markdown table")
    p.add_argument("--keep", type=Path, default=None, help="keep nanoengine's traces in this folder")
    args = p.parse_args(argv)
    scenarios = all_scenarios()
    unknown = [n for n in args.names if n not in scenarios]
    if unknown:
        print(f"error: no scenario {', '.join(unknown)}; choose from {', '.join(scenarios)}", file=sys.stderr)
        return 2
    kinds = KINDS if args.all_kinds else ("tokens",)
    differ, table = 0, []
    with tempfile.TemporaryDirectory(prefix="nanoengine-vs-vllm-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.names or list(scenarios):
            diff = compare(name, scenarios[name], folder, kinds)
            same = not diff.differences and diff.num_steps[0] == diff.num_steps[1]
            differ += not same
            steps = f"{diff.num_steps[0]} vs {diff.num_steps[1]} steps"
            print(
                f"{'same' if same else 'DIFF'}  {name} ({steps})" + ("" if same else ": " + first_difference_line(diff))
            )
            table += markdown_rows(name, diff)
    if args.markdown and table:
        print("\n| scenario | step | what | request | nanoengine | vLLM v1 |\n|---|---|---|---|---|---|")
        print("\n".join(table))
    print(f"{differ} of {len(args.names or scenarios)} scenarios differ from vLLM v1 ({', '.join(kinds)})")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
