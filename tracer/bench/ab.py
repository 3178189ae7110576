"""Two builds of the compiled kernels in one engine, taking turns step by step: the A/B by which
docs/benchmarks.md's rounds keep or drop a kernel change.

    nanoengine bench --ab OLD NEW [--model default] [--dtype float32] [--kv-cache-dtype auto]
                     [--threads 2] [--workload standard|quick|few|single] [--repeat 3]
                     [--first old|new] [--json] [--out FILE]

OLD and NEW each name a build of tracer/kernels' C sources: a git revision of this repository
(HEAD~1, a commit, a branch), a folder holding the sources (a copy of tracer/kernels), or a
checkout that holds them under tracer/kernels. One engine runs the workload `--repeat` times;
before each step every kernel library a step may call (the one-call decode step, the few-row
linears, the paged attention, the fused small steps, greedy sampling's pick) is pointed at OLD's
build or NEW's in turn, so both meet the same requests, the same KV pages and the same minute of
the machine (a VM's memory can change speed between two runs minutes apart). Steps in which every
running sequence decodes are timed and counted by their rows: per row count the median step of
each build, and per group of rows (1, 2-3, 4-15, 16 or more) NEW over OLD as the geometric mean of
those ratios, weighted by steps. Below 1 NEW is faster. Then each build alone generates the quick
workload, and the report says whether their tokens agree (prefix caching is off throughout: a
build that found the other's prompts cached would compute other shapes, and in bfloat16 other
bits).

Only the C comes from OLD and NEW: this checkout's Python calls both builds, so each must take its
arguments; a build whose exported functions, or the structs they take, differ from this
checkout's is refused before anything runs. The library loaded second ran up to 1 % slower in
some pairs (docs/benchmarks.md, twenty-ninth round): run the other order too (`--first new`), and
OLD against itself to see the noise.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import re
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from nanoengine.engine import LLMEngine
from tracer.bench.engine import bench_engine, greedy_params, run_requests, warm_up
from tracer.bench.run import warmup_requests
from tracer.bench.workload import QUICK, STANDARD, BenchRequest, WorkloadSpec, build_workload, token_id_range
from tracer.kernels import (
    KV_CACHE_DTYPES,
    decode_layers,
    fused_ops,
    greedy_sample,
    kv_cache_words,
    packed_linear,
    paged_attention,
)
from tracer.kernels.build import KernelUnavailable
from tracer.kernels.paged_attention import PagedDecodeAttention

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
REPOSITORY = KERNELS.parents[1]
# every library a step may call: (its module, the loader the step calls, the loader's source)
LOADERS: tuple[tuple[ModuleType, str, str], ...] = (
    (decode_layers, "decode_layers_library", "decode_layers.c"),
    (packed_linear, "packed_gemv_library", "packed_gemv.c"),
    (packed_linear, "amx_gemv_library", "amx_gemv.c"),
    (packed_linear, "dpbf16_gemv_library", "dpbf16_gemv.c"),
    (paged_attention, "paged_decode_library", "paged_decode.c"),
    (fused_ops, "fused_ops_library", "fused_ops.c"),
    (greedy_sample, "greedy_library", "greedy_sample.c"),
)
GROUPS = ((1, 1), (2, 3), (4, 15), (16, None))  # rows a step: first, last (None: no limit)
WORKLOADS = {
    "standard": STANDARD,
    "quick": QUICK,
    "single": WorkloadSpec(1, min_input_len=32, max_input_len=32, min_output_len=256, max_output_len=256),
}
FEW_OUTPUTS = (64, 128, 192, 256)  # "few": four requests ending in turn: steps of 4, 3, 2, 1 rows

EXPORTED = re.compile(r"^(?:int|void)\s+(\w+)\s*\(([^)]*)\)\s*\{", re.MULTILINE)
STRUCT = re.compile(r"typedef struct\s*\{(.*?)\}\s*(\w+)\s*;", re.DOTALL)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Build:
    label: str  # as the user named it
    folder: Path  # its kernel sources


# ---- the two builds ------------------------------------------------------------------------------
def resolve(label: str, scratch: Path) -> Build:
    """A folder holding the sources, a checkout holding them under tracer/kernels, or a git
    revision of this repository (its tracer/kernels written out into scratch)."""
    folder = Path(label)
    for candidate in (folder, folder / "tracer" / "kernels"):
        if (candidate / LOADERS[0][2]).is_file():
            return Build(label, candidate)
    if folder.exists():
        raise ValueError(
            f"{label}: no {LOADERS[0][2]} there nor in its tracer/kernels; give a copy of tracer/kernels, "
            "a checkout, or a git revision"
        )
    return Build(label, export_revision(label, scratch))


def export_revision(revision: str, scratch: Path) -> Path:
    def git(*args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ValueError(f"{revision}: neither a folder nor a git revision git could tell ({e})") from None

    found = git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if found.returncode != 0:
        raise ValueError(f"{revision}: neither a folder nor a git revision of {REPOSITORY}; give one of those")
    commit = found.stdout.decode().strip()
    archive = git("archive", "--format=tar", commit, "tracer/kernels")
    if archive.returncode != 0:
        raise ValueError(f"{revision}: git revision {commit[:12]} holds no tracer/kernels")
    into = scratch / commit
    into.mkdir(exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            if member.isfile() and (data := tar.extractfile(member)) is not None:
                (into / Path(member.name).name).write_bytes(data.read())  # the folder is flat
    return into


def interface(folder: Path) -> list[str]:
    """What this checkout's Python relies on in a build: its exported functions' parameters and
    the structs they take (and the structs those hold), spaces and comments aside."""
    texts = [COMMENT.sub(" ", p.read_text(errors="replace")) for p in sorted(folder.glob("*.[ch]"))]
    text = " ".join(" ".join(t.split()) for t in texts)
    exported = EXPORTED.findall("\n".join(texts))
    functions = sorted({" ".join(f"{name}({params})".split()) for name, params in exported})
    structs = {name: body.strip() for body, name in STRUCT.findall(text)}
    needed: set[str] = set()
    words = set(re.findall(r"\w+", " ".join(functions)))
    while fresh := {n for n in structs if n in words} - needed:
        needed |= fresh
        words |= set(re.findall(r"\w+", " ".join(structs[n] for n in fresh)))
    return functions + [f"{name} {{{structs[name]}}}" for name in sorted(needed)]


def check_interfaces(builds: list[Build]) -> None:
    ours = interface(KERNELS)
    for build in builds:
        theirs = interface(build.folder)
        differing = [item for item in ours + theirs if (item in ours) != (item in theirs)]
        if differing:
            name = re.match(r"\w+", differing[0])
            raise ValueError(
                f"{build.label}: its kernels take other arguments than this checkout's Python passes "
                f"({name.group() if name else differing[0]} differs); compare builds with this checkout's interface"
            )


# ---- switching between them ----------------------------------------------------------------------
class Switch:
    """Each build's libraries, built and loaded once, build `first`'s first (the library loaded
    second ran up to 1 % slower in some pairs); use(i) points the loaders at build i's."""

    def __init__(self, builds: list[Build], first: int) -> None:
        self.originals = {(module, name): getattr(module, name) for module, name, _ in LOADERS}
        self.libraries: list[dict] = [{}, {}]
        for i in (first, 1 - first):
            try:
                self.libraries[i] = {
                    (m, name): self.originals[m, name](builds[i].folder / source) for m, name, source in LOADERS
                }
            except KernelUnavailable as e:
                raise ValueError(f"{builds[i].label}: {e}") from None
        # made once: use() runs before every step
        self.loaders = [
            {key: (lambda library=library: library) for key, library in build.items()} for build in self.libraries
        ]
        self.current = -1

    def use(self, i: int) -> None:
        if i != self.current:
            for (module, name), loader in self.loaders[i].items():
                setattr(module, name, loader)
            self.current = i

    def restore(self) -> None:
        for (module, name), loader in self.originals.items():
            setattr(module, name, loader)


@contextmanager
def switching(builds: list[Build], first: int) -> Iterator[Switch]:
    switch = Switch(builds, first)
    try:
        yield switch
    finally:
        switch.restore()


# ---- the runs ------------------------------------------------------------------------------------
def workload(name: str, vocab_size: int) -> list[BenchRequest]:
    if name != "few":
        return build_workload(WORKLOADS[name], vocab_size)
    rng, (low, high) = random.Random(3), token_id_range(vocab_size)
    return [BenchRequest(tuple(rng.randrange(low, high) for _ in range(32)), n) for n in FEW_OUTPUTS]


def time_in_turns(
    engine: LLMEngine, switch: Switch, requests: list[BenchRequest], repeat: int, first: int
) -> dict[tuple[int, int], list[float]]:
    """(build, rows) -> the seconds of each step in which every running sequence decoded."""
    seconds: dict[tuple[int, int], list[float]] = defaultdict(list)
    turn = first
    for _ in range(repeat):
        ids = [engine.add_request(list(r.prompt_token_ids), greedy_params(r)) for r in requests]
        while engine.has_unfinished():
            scheduler = engine.scheduler
            decoding = not scheduler.waiting and not any(s.is_prefilling for s in scheduler.running)
            rows = len(scheduler.running)
            switch.use(turn)
            start = time.perf_counter()
            engine.step()
            if decoding:
                seconds[turn, rows].append(time.perf_counter() - start)
            turn = 1 - turn
        for seq_id in ids:
            engine.collect(seq_id)
    return seconds


def compare(seconds: dict[tuple[int, int], list[float]]) -> list[dict]:
    """Per group of rows: steps and median milliseconds of each build, NEW over OLD."""
    groups = []
    for low, high in GROUPS:
        counts = sorted({rows for _, rows in seconds if rows >= low and (high is None or rows <= high)})
        both = [n for n in counts if seconds.get((0, n)) and seconds.get((1, n))]
        if not both:
            continue
        weights = [len(seconds[0, n]) + len(seconds[1, n]) for n in both]
        medians = [(statistics.median(seconds[0, n]), statistics.median(seconds[1, n])) for n in both]
        log_ratio = sum(w * math.log(new / old) for w, (old, new) in zip(weights, medians)) / sum(weights)
        groups.append(
            {
                "rows": f"{low}" if low == high else f"{low}+" if high is None else f"{low}-{high}",
                "steps_old": sum(len(seconds[0, n]) for n in both),
                "steps_new": sum(len(seconds[1, n]) for n in both),
                "old_ms": round(1e3 * sum(w * old for w, (old, _) in zip(weights, medians)) / sum(weights), 3),
                "new_ms": round(1e3 * sum(w * new for w, (_, new) in zip(weights, medians)) / sum(weights), 3),
                "new_over_old": round(math.exp(log_ratio), 4),
            }
        )
    return groups


def run_ab(builds: list[Build], model: str, options: dict, name: str, repeat: int, first: int) -> dict:
    with switching(builds, first) as switch:
        switch.use(first)
        engine, _ = bench_engine(model, options)
        if not isinstance(engine.runner.attend, PagedDecodeAttention):
            raise ValueError("the compiled kernels do not run with these options: nothing to compare")
        vocab_size = engine.model.config.vocab_size
        kv_dtype = str(engine.runner.kv_caches[0].dtype).removeprefix("torch.")
        warm = warmup_requests(WORKLOADS["quick"], vocab_size)
        for i in (first, 1 - first):
            switch.use(i)
            warm_up(engine, warm)
        seconds = time_in_turns(engine, switch, workload(name, vocab_size), repeat, first)
        check = build_workload(QUICK, vocab_size)
        tokens = []
        for i in (0, 1):
            switch.use(i)
            tokens.append(run_requests(engine, check).outputs)
    differ = [i for i, (a, b) in enumerate(zip(*tokens)) if a != b]
    return {
        "old": {"label": builds[0].label, "folder": str(builds[0].folder)},
        "new": {"label": builds[1].label, "folder": str(builds[1].folder)},
        "model": model,
        "dtype": options["dtype"],
        "kv_cache_dtype": kv_dtype,  # the pool as the engine built it
        "threads": options.get("num_threads"),
        "workload": name,
        "repeat": repeat,
        "loaded_first": "old" if first == 0 else "new",
        "groups": compare(seconds),
        "same_tokens": not differ,
        "first_request_differing": differ[0] if differ else None,
    }


# ---- the report ----------------------------------------------------------------------------------
def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    threads = report["threads"] or "torch's default"
    kv = report.get("kv_cache_dtype")  # the pool's dtype; absent in reports written before it was asked
    title = (
        f"NEW ({report['new']['label']}) over OLD ({report['old']['label']}): {report['dtype']}"
        f"{kv_cache_words(None if kv == report['dtype'] else kv)}, "
        f"{threads} threads, the {report['workload']} workload x{report['repeat']}, "
        f"{report['loaded_first'].upper()}'s libraries loaded first"
    )
    table = Table(title=escape(title), title_justify="left")
    for column in ("rows a step", "steps OLD / NEW", "OLD ms", "NEW ms", "NEW / OLD"):
        table.add_column(column, justify="left" if column == "rows a step" else "right")
    for g in report["groups"]:
        ratio = g["new_over_old"]
        word = "faster" if ratio < 1 else "slower" if ratio > 1 else "same"
        table.add_row(
            g["rows"],
            f"{g['steps_old']} / {g['steps_new']}",
            f"{g['old_ms']:.2f}",
            f"{g['new_ms']:.2f}",
            f"{ratio:.3f} ({word})",
        )
    console = Console()
    console.print(table)
    if report["same_tokens"]:
        console.print("same tokens: yes (each build alone, the quick workload)")
    else:
        console.print(f"same tokens: NO: request {report['first_request_differing']} of the quick workload differs")


def parse_args(argv: Iterable[str], prog: str, parser: type[argparse.ArgumentParser]) -> argparse.Namespace:
    p = parser(
        prog=prog,
        description="Two builds of the compiled kernels in one engine, taking turns step by step; per group "
        "of rows NEW's median step over OLD's (below 1: NEW is faster), and whether each build alone "
        "gives the same tokens (docs/benchmarks.md, 'Two builds of the kernels in one engine').",
    )
    p.add_argument("old", metavar="OLD", help="a git revision, a copy of tracer/kernels, or a checkout")
    p.add_argument("new", metavar="NEW", help="the same for the build measured against OLD")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny' or a folder")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument(
        "--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto", help="the KV pool's numbers (default: the model's)"
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--workload", choices=(*WORKLOADS, "few"), default="standard")
    p.add_argument("--repeat", type=int, default=3, help="runs of the workload (default 3)")
    p.add_argument(
        "--first",
        choices=("old", "new"),
        default="old",
        help="whose libraries load first and take the first step of each pair",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", type=Path, help="also write the JSON report to this file")
    args = p.parse_args(list(argv))
    for flag, value in (("--repeat", args.repeat), ("--threads", args.threads)):
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    return args


def main(
    argv: Iterable[str],
    prog: str = "python -m tracer.bench.ab",
    check_writable: Callable[[str, Path], None] | None = None,  # the bench command's, for --out
    parser: type[argparse.ArgumentParser] = argparse.ArgumentParser,  # the commands' one-line errors
) -> int:
    args = parse_args(argv, prog, parser)
    if check_writable is not None and args.out is not None:
        check_writable("--out", args.out)
    with tempfile.TemporaryDirectory(prefix="nanoengine-ab-") as scratch:
        builds = [resolve(label, Path(scratch)) for label in (args.old, args.new)]
        check_interfaces(builds)
        # no prefix caching: each build computes every prompt whole, so the tokens compare like with like
        options: dict = {
            "device": "cpu",
            "dtype": args.dtype,
            "kv_cache_dtype": args.kv_cache_dtype,
            "enable_prefix_caching": False,
        }
        if args.threads is not None:
            options["num_threads"] = args.threads
        report = run_ab(builds, args.model, options, args.workload, args.repeat, 0 if args.first == "old" else 1)
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print_report(report)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    try:
        raise SystemExit(main(sys.argv[1:]))
    except ValueError as error:  # one line, as the nanoengine command gives it
        raise SystemExit(f"nanoengine bench --ab: {error}") from None
