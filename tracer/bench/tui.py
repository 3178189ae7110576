"""Replay TUI benchmark: time to the first frame on a long trace, and redraw time per step key.

    .venv/bin/python -m tracer.bench.tui [--trace FILE] [--steps 10000] [--presses 200] [--size 120x40]

If FILE (default: nanoengine_tui_bench_10k.jsonl in the temp folder) does not exist, a trace of
about --steps steps is recorded into it first (tiny model, two sequences at a time, a pool small
enough to preempt; about a minute on a CPU) and kept for later runs.

Measured headless (App.run_test):
  first frame  load_trace (as run_replay does) + building the app + mounting + drawing the first
               step, then one full repaint of the screen (every widget rendered, all visible lines)
  step redraw  the → key's action (every view updated from the next step), a layout pass and one
               full repaint: the work between the key and the new frame. Pilot.press wall time
               is printed too, but it includes Pilot's own waiting (an unbound key costs tens of
               milliseconds), so it is shown next to that baseline rather than used as the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

DEFAULT_TRACE = Path(tempfile.gettempdir()) / "nanoengine_tui_bench_10k.jsonl"  # ~400 MB, kept for reruns


def record_long_trace(path: Path, steps: int) -> None:
    """About `steps` engine steps: 2 running sequences decoding long completions, with preemption."""
    from nanoengine.engine import LLMEngine
    from nanoengine.sampling_params import SamplingParams
    from tracer.trace.recorder import TraceRecorder

    engine = LLMEngine(
        "tiny", block_size=16, num_kv_blocks=128, max_num_batched_tokens=64, max_num_seqs=2, num_threads=1
    )
    max_tokens = 1250
    num_requests = max(1, round(steps * 2 / max_tokens))
    start = time.perf_counter()
    with TraceRecorder(engine, path, title=f"TUI benchmark ({num_requests} requests)") as recorder:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for i in range(num_requests):
            engine.add_request(f"Request {i % 4}: tell me a long story about paged attention", params)
        while engine.has_unfinished() and recorder.num_steps < steps:
            engine.step()
    print(f"recorded {recorder.num_steps} steps into {path} in {time.perf_counter() - start:.0f} s")


def full_repaint(app) -> float:
    """Render the whole screen once, as the terminal driver would, and return the seconds it took."""
    start = time.perf_counter()
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return time.perf_counter() - start


async def measure(path: Path, presses: int, size: tuple[int, int]) -> dict:
    from tracer.replay.app import ReplayApp
    from tracer.trace.trace_file import load_trace

    start = time.perf_counter()
    trace = load_trace(path)  # what run_replay uses
    loaded = time.perf_counter()
    app = ReplayApp(trace, animations=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        full_repaint(app)
        first_frame = time.perf_counter()
        redraws = []
        for _ in range(presses):
            if app.step_index >= len(app.steps) - 1:
                app.go_to(0)
                await pilot.pause()
            redraws.append(redraw(app, lambda: app.action_step(1)))
            await pilot.pause()
        jump = redraw(app, lambda: app.action_jump_end(1))
        await pilot.pause()
        press_ms = [await timed_press(pilot, key) for key in ("left", "right", "x") for _ in range(10)]
    return {
        "steps": len(trace.steps),
        "size_mb": path.stat().st_size / 1e6,
        "load_s": loaded - start,
        "first_frame_s": first_frame - start,
        "redraws": redraws,
        "jump_s": jump,
        "press_ms": statistics.median(press_ms[:20]),
        "idle_press_ms": statistics.median(press_ms[20:]),
    }


def redraw(app, action) -> float:
    """Seconds for an action plus the layout pass and full repaint that show its result."""
    start = time.perf_counter()
    action()
    app.screen._refresh_layout(app.size)
    full_repaint(app)
    return time.perf_counter() - start


async def timed_press(pilot, key: str) -> float:
    start = time.perf_counter()
    await pilot.press(key)
    return (time.perf_counter() - start) * 1000


def size_argument(text: str) -> tuple[int, int]:
    from tracer.replay.app import parse_terminal_size

    try:
        return parse_terminal_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.bench.tui", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--steps", type=int, default=10_000, help="steps to record when --trace does not exist")
    p.add_argument("--presses", type=int, default=200)
    p.add_argument("--size", type=size_argument, default=(120, 40), help="terminal size, e.g. 120x40")
    args = p.parse_args(argv)
    if not args.trace.exists():
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        record_long_trace(args.trace, args.steps)
    r = asyncio.run(measure(args.trace, args.presses, args.size))
    ms = sorted(d * 1000 for d in r["redraws"])
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    print(f"trace: {args.trace} ({r['steps']} steps, {r['size_mb']:.1f} MB), terminal {args.size[0]}x{args.size[1]}")
    print(f"first frame: {r['first_frame_s']:.2f} s (opening the trace {r['load_s']:.2f} s)   target <= 1.5 s")
    print(
        f"step redraw (→ action + layout + full repaint, {len(ms)} steps): median {statistics.median(ms):.1f} ms, "
        f"p95 {p95:.1f} ms, max {ms[-1]:.1f} ms   target <= 50 ms"
    )
    print(f"jump to the last step (End + layout + full repaint): {r['jump_s'] * 1000:.1f} ms")
    print(
        f"Pilot.press wall time: ←/→ median {r['press_ms']:.0f} ms; an unbound key {r['idle_press_ms']:.0f} ms "
        f"(Pilot's own waiting)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
