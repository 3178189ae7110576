"""Turn a benchmark report (the JSON dict) into target verdicts and rich tables."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rich.markup import escape

from tracer.bench.efficiency import FULL_DECODE
from tracer.bench.machine import cpu_line
from tracer.bench.run import BF16_RUN
from tracer.kernels import kv_cache_words
from tracer.kernels.huge_pages import MOVE_AT_BUILD_S

if TYPE_CHECKING:
    from rich.console import Console

REACH_GOAL = 0.8  # decode at batch >= FULL_BATCH: the share of its reach asked for (issue 39)


@dataclass(slots=True)
class Target:
    name: str
    value: float | None
    limit: float
    higher_is_better: bool
    unit: str  # "x", "%" (value is a signed fraction), "share" (a fraction) or "s"
    most_here: float | None = None  # the best value this machine allows, where the bench knows it

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def to_dict(self) -> dict:
        return {**asdict(self), "met": self.met}


def evaluate_targets(report: dict) -> list[dict]:
    runs, engine = report["runs"], report["engine"]
    tracer, startup = report.get("tracer") or {}, report.get("startup") or {}
    targets = [
        Target("throughput vs HF generate", runs.get("hf_generate", {}).get("nanoengine_speedup"), 2.5, True, "x"),
        Target(
            "throughput vs HF generate_batch",
            runs.get("hf_generate_batch", {}).get("nanoengine_speedup"),
            3.0,
            True,
            "x",
        ),
        Target("total / model-only time", engine.get("total_over_model_only"), 1.15, False, "x"),
        Target("tracer overhead", tracer.get("recording_share"), 0.03, False, "%"),
        Target("start-up to first token", startup.get("total_s"), 3.0, False, "s"),
        *decode_targets(report),
    ]
    return [t.to_dict() for t in targets + single_targets(report.get("single"))]


def decode_targets(report: dict) -> list[Target]:
    """Decode at batch >= FULL_BATCH judged by its reach (what the machine's linears allow), in the
    run's dtype and in the bfloat16 row where it ran; and bfloat16's speed-up over float32 there."""
    dtype = report.get("dtype", "float32")
    kv = (report.get("engine_options") or {}).get("kv_cache_dtype")
    targets = [reach_target(report, "nanoengine", dtype + kv_cache_words(kv))]
    if BF16_RUN in report["runs"]:
        targets.append(reach_target(report, BF16_RUN, "bfloat16"))
    fp32, bf16 = decode_phase(report), decode_phase(report, BF16_RUN)
    timed = dtype == "float32" and fp32.get("seconds") and bf16.get("seconds")
    over_fp32 = fp32["seconds"] / bf16["seconds"] if timed else None
    targets.append(Target(f"{FULL_DECODE}: bfloat16 over float32 (AMX hosts)", over_fp32, 2.0, True, "x"))
    return targets


def decode_phase(report: dict, key: str = "nanoengine") -> dict:
    return report.get("efficiency", {}).get(key, {}).get(FULL_DECODE) or {}


def reach_share(report: dict, key: str = "nanoengine", rate: float | None = None) -> float | None:
    """Decode at batch >= FULL_BATCH's share of its roofline bound, over the share it could reach:
    1.0 would be running as fast as the model's linears alone allow. None without a reach."""
    reach, of_roofline = decode_reach(report, key, rate), decode_phase(report, key).get("of_roofline")
    if reach is None or of_roofline is None:
        return None
    return round(of_roofline / reach[0], 4)


def single_row(single: dict | None, system: str, dtype: str) -> dict:
    rows = (single or {}).get("rows", [])
    return next((r for r in rows if r["system"] == system and r["dtype"] == dtype), {})


def single_targets(single: dict | None) -> list[Target]:
    """Issue 39's single-stream targets; not measured where the rows are missing (--skip-single, CUDA)."""
    ours, hf = single_row(single, "nanoengine", "float32"), single_row(single, "HF generate", "float32")
    bf16 = single_row(single, "nanoengine", "bfloat16")
    speedup = ours["tok_s"] / hf["tok_s"] if ours and hf else None
    over_fp32 = bf16["tok_s"] / ours["tok_s"] if ours and bf16 else None
    return [
        Target("single stream vs HF generate (batch 1, float32)", speedup, 1.5, True, "x"),
        Target("single stream: share of the batch-1 bandwidth bound", ours.get("of_bound"), 0.75, True, "share"),
        Target("single stream: bfloat16 over float32", over_fp32, 2.0, True, "x"),
    ]


# ---- rendering ------------------------------------------------------------------------------------
RUN_LABELS = {
    "nanoengine": "nanoengine",
    BF16_RUN: "nanoengine (bfloat16)",
    "hf_generate": "HF generate",
    "hf_generate_onednn": "HF generate (oneDNN linears)",
    "hf_generate_batch": "HF generate_batch",
}


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value * 100:+.1f} %"
    if unit == "share":
        return f"{value * 100:.1f} %"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.2f}x"


def reach_target(report: dict, key: str, dtype: str) -> Target:
    """A run's share of its reach, with the most this machine allows beside the goal."""
    limit = reach_limit(report, key)
    most = None if limit is None else round(limit[2], 4)
    return Target(
        f"{FULL_DECODE}: share of its reach ({dtype})", reach_share(report, key), REACH_GOAL, True, "share", most
    )


def fmt_limit(target: dict) -> str:
    sign = ">=" if target["higher_is_better"] else "<="
    limit = target["limit"]
    text = {"%": f"{limit * 100:.0f} %", "share": f"{limit * 100:.0f} %", "s": f"{limit:g} s"}.get(
        target["unit"], f"{limit:g}x"
    )
    most = target.get("most_here")
    return f"{sign} {text}" + ("" if most is None else f" (here at most {fmt_value(most, target['unit'])})")


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def throughput_table(report: dict):
    from rich.table import Table

    w = report["workload"]
    table = Table(
        title=f"Throughput: {w['num_requests']} requests, prompts {w['min_input_len']}-{w['max_input_len']}, "
        f"outputs {w['min_output_len']}-{w['max_output_len']} tokens "
        f"({w['num_prompt_tokens']} + {w['num_output_tokens']}), greedy, ignore_eos"
    )
    table.add_column("system")
    for name in ("time s", "output tok/s", "total tok/s", "nanoengine speed-up", "same tokens"):
        table.add_column(name, justify="right")
    n = w["num_requests"]
    if bf16 := report["runs"].get(BF16_RUN):
        table.caption = (
            f"{RUN_LABELS[BF16_RUN]}: {bf16['over_float32']:.2f}x the float32 run's output tok/s; "
            f"the float32 run's exact tokens in {bf16['matching_requests']}/{n} requests "
            "(bfloat16 rounding may flip a near-tie)"
        )
    for key, run in report["runs"].items():
        speedup, same = run.get("nanoengine_speedup"), run.get("matching_requests")
        table.add_row(
            RUN_LABELS.get(key, key),
            f"{run['elapsed_s']:.2f}",
            f"{run['output_tok_s']:.1f}",
            f"{run['total_tok_s']:.1f}",
            "-" if speedup is None else f"{speedup:.2f}x",
            "-" if same is None else f"{same}/{n}",
        )
    return table


def latency_table(report: dict):
    from rich.table import Table

    table = Table(title="Latency (ms; every request arrives at t = 0)")
    table.add_column("system")
    for name in ("TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99"):
        table.add_column(name, justify="right")
    for key, run in report["runs"].items():
        table.add_row(
            RUN_LABELS.get(key, key),
            *(fmt_ms(v) for v in run["ttft_ms"].values()),
            *(fmt_ms(v) for v in run["tpot_ms"].values()),
        )
    return table


def overhead_table(report: dict):
    from rich.table import Table

    engine, tracer, startup = report["engine"], report.get("tracer"), report.get("startup")
    table = Table(title="Overheads")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("how", style="dim")
    table.add_row("engine steps", str(engine["num_steps"]), "")
    table.add_row(
        "time in runner.run (forward + sampling)",
        f"{engine['model_time_s']:.2f} s",
        "the engine's StepRecord.model_time, summed",
    )
    table.add_row(
        "engine overhead share",
        f"{engine['overhead_share'] * 100:.1f} %",
        "share of the run outside runner.run: scheduling, inputs, bookkeeping",
    )
    if "model_only_s" in engine:
        table.add_row("model-only time", f"{engine['model_only_s']:.2f} s", "the same forward passes replayed bare")
    if tracer:
        table.add_row(
            "with the step recorder",
            f"{tracer['elapsed_s']:.2f} s",
            f"trace {tracer['trace_bytes'] / 1e6:.1f} MB, {tracer['trace_steps']} steps; "
            f"{tracer['overhead'] * 100:+.1f} % against the plain run (run-to-run noise included)",
        )
        if "recording_share" in tracer:
            table.add_row(
                "time spent recording",
                f"{tracer['recording_s']:.2f} s",
                f"{tracer['recording_share'] * 100:.2f} % of generation, "
                f"{tracer['recording_s'] * 1000 / max(tracer['trace_steps'], 1):.2f} ms a step: "
                f"building step records, checking invariants, writing JSONL",
            )
        if "header_s" in tracer:
            table.add_row(
                "the trace's header",
                f"{tracer['header_s'] * 1000:.0f} ms",
                "once, before the first step: the tokenizer's digest, the engine's sources",
            )
    moves = huge_page_moves(report)
    if moves:
        table.add_row(
            "weights in 2 MiB pages",
            moves,
            "moved before the timed runs, as a long run or an idle server has them (generate and trace "
            f"move for at most {MOVE_AT_BUILD_S:g} s at their start, khugepaged the rest)",
        )
    if startup:
        text = startup.get("error") or (f"{startup['total_s']:.2f} s")
        how = (
            ""
            if "error" in startup
            else (
                f"import {startup['import_s']:.2f} s + LLM() {startup['build_s']:.2f} s"
                f" + 1 token {startup['first_token_s']:.2f} s; process with exit "
                f"{startup.get('process_s', 0):.2f} s{startup_runs(startup)}"
            )
        )
        table.add_row("start-up to first token", text, how)
    return table


def huge_page_moves(report: dict) -> str:
    """Each engine's weights moved into huge pages (bench_engine), e.g. 'float32 520 of 526 MiB in
    1.21 s; bfloat16 252 of 262 MiB in 0.08 s'; '' for reports from before the forty-ninth round."""
    engines = [(f"{report['dtype']} ", report["engine"]), ("bfloat16 ", (report.get("bf16") or {}).get("engine", {}))]
    return "; ".join(
        f"{name}{moved['moved_mib']} of {moved['of_mib']} MiB in {moved['s']:.2f} s"
        for name, engine in engines
        if (moved := engine.get("huge_pages")) and moved["of_mib"]
    )


def startup_runs(startup: dict) -> str:
    runs = startup.get("runs_total_s") or []  # absent in reports from before 2026-12-01 22:50
    return f"; median of {len(runs)} fresh processes: {', '.join(f'{t:.2f}' for t in runs)} s" if runs else ""


def efficiency_table(report: dict):
    from rich.table import Table

    peak = report["gemm_peak"]
    library = f"{peak['library']}, " if "library" in peak else ""
    table = Table(
        title=f"Useful model FLOP/s against the GEMM peak: {peak['gflop_s']:.1f} GFLOP/s "
        f"({library}{peak['shape']} at batch {peak['batch']}, {peak['threads']} threads; at batch 32: "
        + ", ".join(f"{name} {v:.1f}" for name, v in peak["at_batch_32"].items())
        + ")",
        caption="\n".join(
            c
            for c in (
                ceiling_caption(peak),
                decode_reach_caption(report),
                own_batches_caption(report),
                roofline_caption(report),
                bf16_caption(report),
            )
            if c
        ),
    )
    table.add_column("system")
    table.add_column("phase")
    columns = ("s", "GFLOP", "GFLOP/s", "of peak", "GB moved", "bound s", "of roofline", "CPU share")
    for name in (*columns, "of peak per CPU s"):
        table.add_column(name, justify="right")
    for key, phases in report["efficiency"].items():
        for phase, e in phases.items():
            table.add_row(RUN_LABELS.get(key, key), phase, *efficiency_cells(e))
    return table


def efficiency_cells(e: dict) -> list[str]:
    share = "-" if e["efficiency"] is None else f"{e['efficiency'] * 100:.1f} %"
    rate = "-" if e["gflop_s"] is None else f"{e['gflop_s']:.1f}"
    if e.get("bound_s") is not None:
        roof = [f"{e['gbytes']:.2f}", f"{e['bound_s']:.2f} ({e['bound_by']})", fmt_value(e["of_roofline"], "share")]
    else:
        roof = ["", "", ""]
    cpu = [f"{e[k] * 100:.1f} %" if k in e else "" for k in ("cpu_share", "efficiency_per_cpu_s")]
    return [f"{e['seconds']:.2f}", f"{e['gflop']:.1f}", rate, share, *roof, *cpu]


def ceiling_caption(peak: dict, name: str = "Decode ceiling") -> str | None:
    """The most a decode step can reach: its linear layers alone, at its batch, weights from memory."""
    ceiling = peak.get("model_linears_gflop_s")
    if not ceiling:
        return None
    rates = ", ".join(
        f"{rows} rows {rate:.1f} GFLOP/s ({rate / peak['gflop_s'] * 100:.0f} % of peak)"
        for rows, rate in ceiling.items()
    )
    return (
        f"{name}: the model's linear layers alone (the faster of oneDNN and the engine's few-row kernels), "
        f"weights read from memory as a decode step reads them: {rates}"
    )


def peak_of(report: dict, key: str = "nanoengine") -> dict:
    """The GEMM peak (and decode ceiling) a run's phases were measured against: the bfloat16 row
    has its own, measured in bfloat16 in the same run."""
    if key == BF16_RUN:
        return (report.get("bf16") or {}).get("gemm_peak", {})
    return report.get("gemm_peak", {})


def decode_reach(report: dict, key: str = "nanoengine", rate: float | None = None) -> tuple[float, float, dict] | None:
    """The highest share of its roofline bound a run's decode at batch >= FULL_BATCH could reach on
    this machine: if its useful FLOPs all ran at its dtype's decode ceiling's best rate (the model's
    linears alone), or at `rate` GFLOP/s where given, and nothing else took any time. Returns (share,
    those seconds, the phase)."""
    ceiling = peak_of(report, key).get("model_linears_gflop_s")
    phase = decode_phase(report, key)
    if not ceiling or not phase.get("bound_s") or not max(ceiling.values()):  # no such phase in a short workload
        return None
    seconds = phase["gflop"] / (rate or max(ceiling.values()))
    return phase["bound_s"] / max(phase["bound_s"], seconds), seconds, phase


def run_bytes(report: dict, key: str = "nanoengine") -> dict:
    """A run's own byte counts and K/V read rate: the bfloat16 row's, else the float32 run's."""
    return (report.get("bf16") or {}) if key == BF16_RUN else (report.get("memory_bandwidth") or {})


def kv_read_rate(report: dict, key: str = "nanoengine") -> tuple[float, bool] | None:
    """GB/s at which a run's K/V are charged: its pool's pages read as its decode kernel reads them
    (kv_reads.py), else the machine's bandwidth (no kernel, or an older report); and whether it
    is the former."""
    memory = report.get("memory_bandwidth") or {}
    pages = (run_bytes(report, key).get("kv_reads") or {}).get("gb_s")
    if pages:
        return pages, True
    return (memory["gb_s"], False) if memory.get("gb_s") else None


def reach_limit(report: dict, key: str = "nanoengine", rate: float | None = None) -> tuple[float, float, float] | None:
    """The largest share of its reach a run's decode at batch >= FULL_BATCH can have on this machine:
    an engine that spent its time on nothing but the linears at the ceiling's best rate (or `rate`)
    and on reading the phase's K/V once at the rate its pages are read (kv_read_rate). Returns (K/V
    GB, their seconds, the share); None without the byte counts."""
    weight_mb = run_bytes(report, key).get("weight_mb_per_step")
    reach, kv_rate = decode_reach(report, key, rate), kv_read_rate(report, key)
    if reach is None or kv_rate is None or weight_mb is None:
        return None
    _, seconds, phase = reach
    if "gbytes" not in phase or "min_steps" not in phase:
        return None
    kv_gb = max(0.0, phase["gbytes"] - phase["min_steps"] * weight_mb / 1e3)  # the bytes less the weights
    kv_seconds = kv_gb / kv_rate[0]
    return kv_gb, kv_seconds, min(1.0, max(phase["bound_s"], seconds) / (seconds + kv_seconds))


def reach_budget(report: dict, key: str = "nanoengine") -> tuple[float, float, float] | None:
    """What REACH_GOAL leaves a run's decode at batch >= FULL_BATCH for all but its linears at the
    ceiling's best rate and its K/V read once (reach_limit): attention's arithmetic, norms, sampling,
    Python, the linears' time past the ceiling's. Returns (the most seconds the phase may take, the
    seconds that leaves for the rest, negative where the goal is out of reach here, and the seconds
    the rest took in the run)."""
    reach, limit = decode_reach(report, key), reach_limit(report, key)
    if reach is None or limit is None:
        return None
    _, seconds, phase = reach
    if not phase.get("seconds"):
        return None
    goal_s = max(phase["bound_s"], seconds) / REACH_GOAL  # the share of the reach is that over the time
    floor_s = seconds + limit[1]
    return goal_s, goal_s - floor_s, phase["seconds"] - floor_s


def budget_words(report: dict, key: str = "nanoengine") -> str:
    """reach_budget, for the reach caption."""
    budget = reach_budget(report, key)
    if budget is None:
        return ""
    goal_s, left_s, took_s = budget
    asks = f"; {REACH_GOAL * 100:.0f} % of the reach asks for at most {goal_s:.2f} s"
    if left_s <= 0:
        return f"{asks}, less than the linears and the K/V reads alone take here"
    return (
        f"{asks}, which leaves {left_s:.2f} s for all else (attention's arithmetic, norms, sampling, "
        f"Python, the linears' time past the ceiling's): {took_s:.2f} s in this run"
    )


def ceiling_rate_at(ceiling: dict[str, float], rows: int) -> float:
    """The decode ceiling's rate at `rows` rows: a step's time at that many (rows over the rate) read
    off linearly between the row counts measured; beyond them the nearest one's rate."""
    points = sorted((int(r), rate) for r, rate in ceiling.items() if rate > 0)
    (first, first_rate), (last, last_rate) = points[0], points[-1]
    if rows <= first or rows >= last:
        return first_rate if rows <= first else last_rate
    r0, a, r1, b = next((r0, a, r1, b) for (r0, a), (r1, b) in zip(points, points[1:]) if rows <= r1)
    return rows / (r0 / a + (r1 / b - r0 / a) * (rows - r0) / (r1 - r0))


def step_rows(report: dict, key: str = "nanoengine") -> dict[int, int]:
    """How many of decode at batch >= FULL_BATCH's steps had each number of rows (older reports: none)."""
    return {int(rows): n for rows, n in (decode_phase(report, key).get("step_rows") or {}).items()}


def own_batches_reach(report: dict, key: str = "nanoengine") -> tuple[float, float, float, float | None] | None:
    """decode_reach with the linears at the ceiling's rate at each step's own rows, not at its best
    rate (the most rows measured): a step of 16-31 rows reads the same weights as one of 32 in more
    time a row. Returns (the rate, the linears' seconds, the share of that reach, the most of it this
    machine allows, as reach_limit reckons it); None without the phase's step rows (older reports)."""
    ceiling, rows = peak_of(report, key).get("model_linears_gflop_s"), step_rows(report, key)
    if not ceiling or not rows:
        return None
    rate = sum(n * r for r, n in rows.items()) / sum(n * r / ceiling_rate_at(ceiling, r) for r, n in rows.items())
    reach, share, limit = (
        decode_reach(report, key, rate),
        reach_share(report, key, rate),
        reach_limit(report, key, rate),
    )
    if reach is None or share is None:
        return None
    return rate, reach[1], share, None if limit is None else limit[2]


def own_batches_caption(report: dict, key: str = "nanoengine") -> str | None:
    reach = own_batches_reach(report, key)
    if reach is None:
        return None
    rate, seconds, share, most = reach
    rows = step_rows(report, key)
    steps = sum(rows.values())
    best = max(peak_of(report, key)["model_linears_gflop_s"].values())
    at_most = "" if most is None else f", at most {most * 100:.0f} % here"
    return (
        f"The same at the phase's own batches ({steps} steps of {min(rows)}-{max(rows)} rows, "
        f"{sum(r * n for r, n in rows.items()) / steps:.1f} on average): the ceiling's rates at those rows give "
        f"{rate:.1f} GFLOP/s, not its best {best:.1f}; the linears alone take {seconds:.2f} s, and the phase is at "
        f"{share * 100:.1f} % of that reach{at_most} (the target reads the best rate)"
    )


def decode_reach_caption(report: dict, key: str = "nanoengine") -> str | None:
    reach = decode_reach(report, key)
    if reach is None:
        return None
    share, seconds, phase = reach
    who = "Reach in bfloat16" if key == BF16_RUN else "Reach"
    caption = (
        f"{who}: at the decode ceiling's best rate, {FULL_DECODE}'s {phase['gflop']:.0f} useful "
        f"GFLOP alone take {seconds:.2f} s against its bound of {phase['bound_s']:.2f} s: no engine running these "
        f"linears can exceed {share * 100:.0f} % of the roofline bound here"
    )
    limit = reach_limit(report, key)
    if limit is None:
        return caption
    kv_gb, kv_seconds, most = limit
    gb_s, pages = kv_read_rate(report, key) or (0.0, False)
    kv_reads = run_bytes(report, key).get("kv_reads") or {}
    between = ", a step's weights read between" if kv_reads.get("read_between_mb") else ""
    how = f"as its pages are read here (scattered, nothing computed{between})" if pages else "the measured bandwidth"
    return (
        f"{caption}; reading the phase's {kv_gb:.1f} GB of K/V once adds {kv_seconds:.2f} s at {gb_s:.1f} GB/s, "
        f"{how}, so an engine doing nothing else reaches at most {most * 100:.0f} % of the reach"
        + budget_words(report, key)
    )


def bf16_caption(report: dict) -> str | None:
    """What the bfloat16 row's phases are measured against: its own peak, ceiling and byte counts."""
    bf16 = report.get("bf16")
    if not bf16 or BF16_RUN not in report.get("efficiency", {}):
        return None
    peak = bf16["gemm_peak"]
    lines = [
        f"{RUN_LABELS[BF16_RUN]} rows: against the bfloat16 GEMM peak, {peak['gflop_s']:.1f} GFLOP/s "
        f"({peak['library']}, {peak['shape']} at batch {peak['batch']}); a step moves "
        f"{bf16['weight_mb_per_step']:.0f} MB of weights, each key {bf16['kv_kb_per_key']:.1f} kB of K/V"
        + kv_reads_words(bf16.get("kv_reads")),
        ceiling_caption(peak, "Decode ceiling in bfloat16"),
        decode_reach_caption(report, BF16_RUN),
        own_batches_caption(report, BF16_RUN),
    ]
    return "\n".join(line for line in lines if line)


def roofline_caption(report: dict) -> str | None:
    bw = report.get("memory_bandwidth")
    if not bw:
        return None
    kernels = ", ".join(f"{k} {v:.1f}" for k, v in bw["by_kernel"].items())
    pages = " asked for 2 MiB pages" if bw.get("huge_pages") else ""
    return (
        f"Roofline: bound = max(GFLOP / GEMM peak, GB moved / {bw['gb_s']:.1f} GB/s memory bandwidth "
        f"({kernels} GB/s on {bw['buffer_mib']} MiB buffers{pages})); a step moves {bw['weight_mb_per_step']:.0f} MB "
        f"of weights, each key {bw['kv_kb_per_key']:.1f} kB of K/V" + kv_reads_words(bw.get("kv_reads"))
    )


def kv_reads_words(kv_reads: dict | None) -> str:
    """The probe of attention's reads alone (kv_reads.py), for a caption."""
    if not kv_reads:
        return ""
    return (
        f"; the KV pool's scattered pages read as decode attention reads them, nothing computed: "
        f"{kv_reads['gb_s']:.1f} GB/s ({kv_reads['sequences']} sequences of {kv_reads['keys_each']} keys, "
        f"{kv_reads['mb_a_step']:.0f} MB a step, {kv_reads['dtype']}{between_words(kv_reads)})"
    )


def between_words(kv_reads: dict) -> str:
    """What the probe read between two reads of its pool (older reports: nothing)."""
    mb = kv_reads.get("read_between_mb")
    return f", {mb:.0f} MB of weights read between two reads of the pool" if mb else ""


def profile_table(report: dict):
    from rich.table import Table

    phases = report["profile"]
    table = Table(title="Where nanoengine's time goes (torch.profiler run; seconds and share of each phase)")
    table.add_column("category")
    for phase, p in phases.items():
        table.add_column(f"{phase} ({p['num_steps']} steps, {p['seconds']:.1f} s)", justify="right")
    for name in next(iter(phases.values()))["categories"]:
        cells = []
        for p in phases.values():
            c = p["categories"][name]
            cells.append("-" if c["share"] is None else f"{c['seconds']:.2f} s  {c['share'] * 100:4.1f} %")
        table.add_row(name, *cells)
    return table


def single_table(report: dict):
    from rich.table import Table

    single = report["single"]
    bandwidth = report.get("memory_bandwidth", {}).get("gb_s")
    table = Table(
        title=f"Single stream: one prompt of {single['prompt_tokens']} tokens, {single['new_tokens']} new tokens, "
        f"greedy, batch 1 (median of {single['runs']} runs by tok/s)",
        caption="bound: the memory bandwidth (GB/s: the median of those measured after each round of the "
        f"system's runs, else the bench's {bandwidth}) / the weight bytes a decode step reads"
        + (f"; llama.cpp: {escape(single['llama_cpp_skipped'])}" if single.get("llama_cpp_skipped") else ""),
    )
    table.add_column("system")
    table.add_column("dtype")
    for name in ("TTFT ms", "tok/s", "runs tok/s", "weights MB", "GB/s", "bound tok/s", "of bound", "same tokens"):
        table.add_column(name, justify="right")
    for r in single["rows"]:
        same = {True: "yes", False: "no"}.get(r.get("same_tokens"), "-")
        table.add_row(
            escape(r["system"]),
            r["dtype"],
            fmt_ms(r["ttft_ms"]),
            f"{r['tok_s']:.1f}",
            ", ".join(f"{t:.1f}" for t in r["runs_tok_s"]),
            f"{r['weight_mb']:.0f}" if "weight_mb" in r else "-",
            f"{r['gb_s']:.1f}" if "gb_s" in r else "-",
            f"{r['bound_tok_s']:.1f}" if "bound_tok_s" in r else "-",
            fmt_value(r.get("of_bound"), "share"),
            same,
        )
    return table


def batch_table(report: dict):
    from rich.table import Table

    batch = report["single"]["batch"]
    table = Table(
        title=f"A batch of {batch['num_requests']}: prompts of {batch['prompt_tokens']} tokens, "
        f"{batch['new_tokens']} new tokens each, all added at once, greedy"
    )
    table.add_column("system")
    table.add_column("dtype")
    for name in ("time s", "output tok/s", "nanoengine's tokens"):
        table.add_column(name, justify="right")
    for r in batch["rows"]:
        same = f"{r['same_requests']}/{batch['num_requests']}" if "same_requests" in r else "-"
        table.add_row(escape(r["system"]), r["dtype"], f"{r['elapsed_s']:.2f}", f"{r['output_tok_s']:.1f}", same)
    return table


def print_single_report(report: dict) -> None:
    """`nanoengine bench --single-only`."""
    console = report_console()
    console.print(
        f"[bold]nanoengine bench --single-only[/]  model {escape(report['model'])}, {report['threads']} threads, "
        f"{escape(report.get('attention', 'attention torch'))}, torch {report['versions']['torch']}"
    )
    if cpu := cpu_line(report.get("cpu")):
        console.print(escape(cpu))
    console.print(single_table(report))
    if report["single"].get("batch"):
        console.print(batch_table(report))
    targets = [t.to_dict() for t in single_targets(report["single"])]
    console.print(targets_table({"targets": targets}))


def targets_table(report: dict):
    from rich.table import Table

    table = Table(title="Targets")
    for name, right in (("target", False), ("value", True), ("goal", True), ("", False)):
        table.add_column(name, justify="right" if right else "left")
    for t in report["targets"]:
        verdict = {True: "[green]met", False: "[red]not met", None: "[dim]not measured"}[t["met"]]
        table.add_row(t["name"], fmt_value(t["value"], t["unit"]), fmt_limit(t), verdict)
    return table


def report_console() -> Console:
    """The terminal's width; 160 columns when the report goes to a file or a pipe (rich's 80-column
    default there cuts the efficiency table's headers to a letter or two)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def print_report(report: dict) -> None:
    console = report_console()
    console.print(
        f"[bold]nanoengine bench[/]  model {escape(report['model'])}, {report['device']}, {report['dtype']}, "
        f"{report['threads']} threads, {escape(report.get('attention', 'attention torch'))}, "
        f"torch {report['versions']['torch']}, transformers {report['versions']['transformers']}"
    )
    if cpu := cpu_line(report.get("cpu")):
        console.print(escape(cpu))
    console.print(throughput_table(report))
    if report.get("bf16_skipped"):
        console.print(escape(report["bf16_skipped"]))
    console.print(latency_table(report))
    console.print(overhead_table(report))
    console.print(efficiency_table(report))
    if report.get("profile"):
        console.print(profile_table(report))
    if report.get("single"):
        console.print(single_table(report))
        if report["single"].get("batch"):
            console.print(batch_table(report))
    console.print(targets_table(report))
