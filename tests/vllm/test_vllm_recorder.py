"""The vLLM recorder: never part of nanoengine's install, light to import, one-line errors, and its
committed traces re-record byte for byte (with a vLLM venv: NANOENGINE_VLLM_PYTHON, or
/work/vllm-venv; skipped without one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracer.vllm.workload import load_workload

ROOT = Path(__file__).parents[2]
TRACES = ROOT / "tracer" / "vllm" / "traces"


def vllm_python() -> str | None:
    for candidate in (os.environ.get("NANOENGINE_VLLM_PYTHON"), "/work/vllm-venv/bin/python"):
        if candidate and Path(candidate).exists():
            found = subprocess.run([candidate, "-c", "import vllm"], capture_output=True, env=env_for_vllm())
            if found.returncode == 0:
                return candidate
    return None


def env_for_vllm() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}


def run_recorder(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "tracer.vllm.record", *args], capture_output=True, text=True, env=env_for_vllm(), cwd=ROOT
    )


def test_nanoengines_install_does_not_need_vllm():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [
        *project["dependencies"],
        *(d for extra in project.get("optional-dependencies", {}).values() for d in extra),
    ]
    assert wanted and not [d for d in wanted if d.lower().startswith("vllm")]


def test_the_recorder_imports_no_torch_no_transformers_and_no_engine():
    code = (
        "import sys, tracer.vllm.record, tracer.vllm.rerecord;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm')"
        " or m.startswith('nanoengine'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_a_bad_workload_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": []}', encoding="utf-8")
    out = run_recorder(str(bad), "-o", str(tmp_path / "out.jsonl"))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "needs 'config'" in out.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_without_vllm_the_recorder_says_which_python_to_use(tmp_path):
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, cwd=tmp_path).returncode == 0:
        pytest.skip("vllm is installed in this python")
    out = run_recorder(str(TRACES / "08_preemption.workload.json"), "-o", str(tmp_path / "out.jsonl"))
    assert out.returncode == 2
    assert "vllm is not installed" in out.stderr and "Traceback" not in out.stderr


def test_the_committed_workloads_are_the_scenarios_of_today():
    """Each workload's requests, arrivals, params and engine sizes are those the scenario gives now
    (the tokens sampled come from nanoengine's run and are not compared: a scheduler change may move them)."""
    from tracer.vllm.scenarios import TRACES_DIR, all_scenarios, arrivals_in_seq_order, default_model_demos

    committed = {p.name.removesuffix(".workload.json") for p in TRACES_DIR.glob("*.workload.json")}
    scenarios = {**all_scenarios(), **{n: s for n, s in default_model_demos().items() if n in committed}}
    assert sorted(scenarios) == sorted(committed)
    for name, scenario in scenarios.items():
        w = load_workload(TRACES_DIR / f"{name}.workload.json")
        assert [r.arrive for r in w.requests] == arrivals_in_seq_order(scenario), name
        ordered = sorted(scenario.requests, key=lambda r: r.arrive)
        assert [r.params for r in w.requests] == [p for r in ordered for p in samples_params(r.params)], name
        for key, value in scenario.engine.items():
            assert w.config[key] == value, (name, key)


def samples_params(params: dict) -> list[dict]:
    """A request's entries: one, or n for n samples (each with its seed + i and the request's n)."""
    n, seed = int(params.get("n", 1)), params.get("seed")
    if n == 1:
        return [asdict_params(params)]
    return [{**asdict_params({**params, "n": 1, "seed": None if seed is None else seed + i}), "n": n} for i in range(n)]


def asdict_params(params: dict) -> dict:
    """As a trace's request entry lists them (the logits processors' fields only when set)."""
    from nanoengine.sampling_params import SamplingParams
    from tracer.trace.recorder import params_entry

    return params_entry(SamplingParams(**params))


def test_rerecording_every_committed_trace_is_byte_identical(tmp_path):
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vllm==0.33.0 (set NANOENGINE_VLLM_PYTHON; docs/vllm.md)")
    out = subprocess.run(
        [python, "-m", "tracer.vllm.rerecord", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env_for_vllm(),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    committed = sorted(TRACES.glob("*.jsonl"))
    assert committed and sorted(p.name for p in tmp_path.glob("*.jsonl")) == [p.name for p in committed]
    for path in committed:
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_the_recorder_reads_a_nanoengine_trace_directly(tmp_path):
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vllm==0.33.0 (set NANOENGINE_VLLM_PYTHON; docs/vllm.md)")
    from tracer.teach.scenarios import load_scenario, run_scenario

    reference = tmp_path / "ref.jsonl"
    run_scenario(load_scenario(ROOT / "lessons" / "08_preemption" / "scenario.json"), reference)
    out = run_recorder(str(reference), "-o", str(tmp_path / "vllm.jsonl"), python=python)
    assert out.returncode == 0, out.stderr[-2000:]
    ours = [json.loads(line) for line in (tmp_path / "vllm.jsonl").read_text().splitlines()[1:]]
    committed = [json.loads(line) for line in (TRACES / "08_preemption.jsonl").read_text().splitlines()[1:]]
    assert ours == committed  # no later arrivals: first_step is the scenario's arrive


def test_demo_vs_vllm_records_vllm_on_the_runs_own_tokens_when_no_committed_trace_fits(tmp_path, capsys, monkeypatch):
    """Issue 37: with a vLLM python at hand, --vs-vllm records vLLM's scheduler on the demo's own run
    (any model, any engine flags) instead of falling back to the tiny model's committed trace."""
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vllm==0.33.0 (set NANOENGINE_VLLM_PYTHON; docs/vllm.md)")
    from tracer.cli.main import main

    monkeypatch.setenv("NANOENGINE_VLLM_PYTHON", python)
    argv = ["demo", "preemption", "--vs-vllm", "--model", "tiny", "--block-size", "8", "--no-tui"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert (tmp_path / "demo-preemption.vllm.jsonl").exists() and "Beside vLLM v1:" in out
