"""The scenarios recorded under vLLM: the lessons', the demos' and issue 26's two shared-prefix
workloads, each run by nanoengine (tiny model) to get the tokens and the reference trace; and the
demos in their default-model form (`demo-NAME.default`, run by the default model: the token ids
`nanoengine demo NAME --vs-vllm` compares on).

Runs in nanoengine's venv (it runs the engine); the vLLM recorder then reads the workload files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tracer.teach.scenarios import Scenario, ScenarioRun, load_scenario, run_scenario, scenario_from_dict
from tracer.vllm.workload import Workload, workload_from_trace

TRACES_DIR = Path(__file__).with_name("traces")
CREATED = "2026-12-01T00:00:00+00:00"  # fixed, so a re-recording is byte-identical
PREFIX = list(range(100, 148))  # issue 26's 48-token shared prefix
DEFAULT_SUFFIX = ".default"  # demo-NAME.default: the demo on the default model's token ids


def lessons_root() -> Path:
    from tracer.teach.lessons import lessons_root as root

    return root()


def shared_prefix_six() -> Scenario:
    """Issue 26: six prompts sharing a 48-token prefix (12 tokens of their own), block_size 16,
    32 blocks, a 128-token budget."""
    requests = [{"prompt": PREFIX + [150 + 12 * i + k for k in range(12)]} for i in range(6)]
    data = {
        "title": "Six prompts sharing a 48-token prefix",
        "engine": {"block_size": 16, "num_kv_blocks": 32, "max_num_batched_tokens": 128},
        "params": {"ignore_eos": True, "max_tokens": 64},
        "requests": requests,
    }
    return scenario_from_dict(data, "shared-prefix-six")


def shared_prefix_staggered() -> Scenario:
    """Issue 26: four prompts sharing a 32-token prefix arriving in pairs, block_size 8, budget 48."""
    requests = [{"prompt": PREFIX[:32] + [210 + 5 * i + k for k in range(5)], "arrive": i // 2} for i in range(4)]
    data = {
        "title": "Four prompts sharing a 32-token prefix, arriving in pairs",
        "engine": {"block_size": 8, "num_kv_blocks": 40, "max_num_batched_tokens": 48},
        "params": {"ignore_eos": True, "max_tokens": 12},
        "requests": requests,
    }
    return scenario_from_dict(data, "shared-prefix-staggered")


def parallel_sampling() -> Scenario:
    """Issue 33: n samples. A single request, then one of n = 4 whose 30-token prompt its samples share
    (admitted together, the first one's prefill cut by the budget), then one of n = 2 on the same
    prompt's first 24 tokens arriving while the four decode; block_size 4, 40 blocks, a 24-token budget."""
    prompt = PREFIX[:30]
    data = {
        "title": "n samples: one request of 4 samples, one of 2, sharing a prompt",
        "engine": {"block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 24},
        "params": {"ignore_eos": True, "max_tokens": 10, "temperature": 1.0},
        "requests": [
            {"prompt": [200 + k for k in range(9)], "max_tokens": 6},
            {"prompt": prompt, "n": 4, "seed": 5, "arrive": 1},
            {"prompt": prompt[:24] + [250, 251], "n": 2, "seed": 9, "arrive": 4},
        ],
    }
    return scenario_from_dict(data, "parallel-sampling")


def all_scenarios() -> dict[str, Scenario]:
    """name -> scenario: every lesson (15 of 16: not lesson 16's beam search), the demos (their tiny-model
    form; not the beam search's), issue 26's 2 workloads, issue 33's n samples."""
    from tracer.teach.demos import DEMOS

    found = {p.parent.name: load_scenario(p) for p in sorted(lessons_root().glob("[0-9][0-9]_*/scenario.json"))}
    for name, demo in DEMOS.items():
        found[f"demo-{name}"] = demo.build(True)
    # vLLM v1's scheduler runs no beam search (its LLM.beam_search lives outside it): nothing to compare
    found = {name: s for name, s in found.items() if not any(r.is_beam_search for r in s.requests)}
    found["shared-prefix-six"] = shared_prefix_six()
    found["shared-prefix-staggered"] = shared_prefix_staggered()
    found["parallel-sampling"] = parallel_sampling()
    return found


def default_model_demos() -> dict[str, Scenario]:
    """name -> scenario: the demos as `nanoengine demo NAME` runs them on the default model."""
    from tracer.teach.demos import DEMOS

    return {f"demo-{name}{DEFAULT_SUFFIX}": demo.build(False) for name, demo in DEMOS.items()}


def model_of(name: str) -> str:
    """The model a workload's reference run uses: the default model for demo-NAME.default."""
    return "default" if name.endswith(DEFAULT_SUFFIX) else "tiny"


def arrivals_in_seq_order(scenario: Scenario) -> list[int]:
    """Each sequence's arrive step in the order the driver adds them (their seq_id order): a request
    of n samples is n sequences."""
    return sorted(r.arrive for r in scenario.requests for _ in range(int(r.params.get("n", 1))))


def run_reference(name: str, scenario: Scenario, trace_path: Path) -> tuple[ScenarioRun, Workload]:
    """nanoengine's run of the scenario (tiny model, or the default one for demo-NAME.default),
    recorded to trace_path, and its workload."""
    from tracer.trace.trace_file import load_trace

    run = run_scenario(scenario, trace_path, model=model_of(name))
    workload = workload_from_trace(load_trace(trace_path, validate="none"), name, arrivals_in_seq_order(scenario))
    workload.title = scenario.title
    workload.focus = dict(scenario.focus)
    workload.created = CREATED
    return run, workload


def write_workloads(out_dir: Path = TRACES_DIR, names: list[str] | None = None) -> list[Path]:
    """Run nanoengine on each scenario and write NAME.workload.json files."""
    paths = []
    scenarios = {**all_scenarios(), **default_model_demos()}
    with tempfile.TemporaryDirectory(prefix="nanoengine-ref-") as tmp:
        for name in names or list(scenarios):
            _, workload = run_reference(name, scenarios[name], Path(tmp) / f"{name}.jsonl")
            paths.append(workload.save(out_dir / f"{name}.workload.json"))
    return paths


if __name__ == "__main__":
    import sys

    for path in write_workloads(names=sys.argv[1:] or None):  # NAME ...: only those
        print(path)
