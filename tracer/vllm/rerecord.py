"""Re-record every committed vLLM trace from its committed workload (tracer/vllm/traces/).

    /work/vllm-venv/bin/python -m tracer.vllm.rerecord [--out DIR] [NAME ...]

Run with the vLLM venv's python (nanoengine's folder on PYTHONPATH). Writes DIR/NAME.jsonl for each
NAME.workload.json (DIR defaults to the committed folder) and prints the seconds each took. The
workloads themselves come from nanoengine's runs: `python -m tracer.vllm.scenarios` (nanoengine's venv).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tracer.vllm.record import record
from tracer.vllm.workload import load_workload

TRACES_DIR = Path(__file__).with_name("traces")


def workload_paths(names: list[str]) -> list[Path]:
    paths = sorted(TRACES_DIR.glob("*.workload.json"))
    if names:
        paths = [p for p in paths if p.name.removesuffix(".workload.json") in names]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.vllm.rerecord", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workload names (default: all)")
    parser.add_argument("--out", type=Path, default=TRACES_DIR, help="folder for the traces")
    args = parser.parse_args(argv)
    paths = workload_paths(args.names)
    if not paths:
        print(f"error: no workload named {', '.join(args.names)} in {TRACES_DIR}", file=sys.stderr)
        return 2
    for path in paths:
        name = path.name.removesuffix(".workload.json")
        start = time.perf_counter()
        steps = record(load_workload(path), args.out / f"{name}.jsonl")
        print(f"{name}: {steps} steps in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
