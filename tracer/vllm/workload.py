"""A workload: what the vLLM recorder replays, as plain JSON (no engine, no tokenizer needed).

    {"name": "08_preemption", "title": "...", "created": "2026-12-01T00:00:00+00:00",
     "source": "nanoengine 0.1.0, model tiny",
     "config": {"block_size": 4, "num_kv_blocks": 10, "max_num_batched_tokens": 512,
                "max_num_seqs": 64, "max_model_len": 2048, "enable_prefix_caching": true},
     "eos_token_ids": [3], "tokenizer": {"name": "ByteTokenizer", "vocab_size": 260},
     "focus": {"event": "preempted", "nth": 1},
     "requests": [{"prompt": "First come", "prompt_token_ids": [1, 2], "arrive": 0,
                   "params": {"max_tokens": 10, "ignore_eos": true, ...},
                   "output_token_ids": [7, 7, 9]}],
     "token_texts": {"7": "a"}}

A request of n > 1 samples is n requests in a row (each with its own seed + i and the request's
`n` in its params, as nanoengine's trace lists them); samples 1 .. n-1 carry `sample_of`, the index
of sample 0. The vLLM recorder adds them as vLLM's front end fans n out (ParentRequest: child i's
request id is f"{i}_{parent}"); a workload without n > 1 has no `sample_of` anywhere.

Requests are in the order they were added (their seq_id order in the reference run). `arrive` is
the engine step before which a request is added (a scenario's `arrive`; from a bare trace, the
request's `first_step`); an idle engine takes the next arrival at once (is_due in
tracer/loop/arrivals.py, the rule nanoengine's own driver keeps). `output_token_ids` are the tokens
nanoengine's reference run sampled: the recorder feeds them to vLLM so both runs see the same tokens
(and so the same EOS steps and block hashes).
`token_texts` are those ids decoded by the reference run's tokenizer (for the replay's text).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracer.trace.step_line import request_of
from tracer.trace.trace_file import SCHEDULER_CONFIG, read_json_file


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message is one line."""


@dataclass(slots=True)
class WorkloadRequest:
    prompt: str
    prompt_token_ids: list[int]
    params: dict[str, Any]
    arrive: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    sample_of: int | None = None  # sample i > 0 of an n > 1 request: the index of its sample 0


@dataclass(slots=True)
class Workload:
    name: str
    title: str
    config: dict[str, Any]
    requests: list[WorkloadRequest]
    eos_token_ids: list[int] = field(default_factory=list)
    tokenizer: dict[str, Any] = field(default_factory=dict)
    focus: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    source: str = ""
    token_texts: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        for r in data["requests"]:
            if r["sample_of"] is None:  # a single-sample workload's file is what it was before n existed
                del r["sample_of"]
        return json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    return workload_from_dict(read_json_file(path, "workload", WorkloadError), str(path))


def workload_from_dict(data: Any, source: str = "workload") -> Workload:
    if not isinstance(data, dict) or not data.get("requests") or "config" not in data:
        raise WorkloadError(f"{source}: a workload needs 'config' and a non-empty 'requests' list")
    missing = [f for f in SCHEDULER_CONFIG if f not in data["config"]]
    if missing:
        raise WorkloadError(f"{source}: config lacks {', '.join(missing)}")
    requests = []
    for i, r in enumerate(data["requests"]):
        if not isinstance(r, dict) or not isinstance(r.get("prompt_token_ids"), list) or not r["prompt_token_ids"]:
            raise WorkloadError(f"{source}: request {i} needs a non-empty 'prompt_token_ids' list")
        requests.append(
            WorkloadRequest(
                prompt=str(r.get("prompt", "")),
                prompt_token_ids=[int(t) for t in r["prompt_token_ids"]],
                params=dict(r.get("params", {})),
                arrive=int(r.get("arrive", 0)),
                output_token_ids=[int(t) for t in r.get("output_token_ids", [])],
                sample_of=sample_of(r, i, source),
            )
        )
    return Workload(
        name=str(data.get("name", Path(source).stem)),
        title=str(data.get("title", data.get("name", ""))),
        config={f: data["config"][f] for f in SCHEDULER_CONFIG},
        requests=requests,
        eos_token_ids=[int(t) for t in data.get("eos_token_ids", [])],
        tokenizer=dict(data.get("tokenizer", {})),
        focus=dict(data.get("focus", {})),
        created=str(data.get("created", "")),
        source=str(data.get("source", "")),
        token_texts={str(k): str(v) for k, v in data.get("token_texts", {}).items()},
    )


def sample_of(r: dict, i: int, source: str) -> int | None:
    """A request's `sample_of`: None, or the index of an earlier request (its sample 0)."""
    value = r.get("sample_of")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < i:
        raise WorkloadError(f"{source}: request {i} has sample_of {value!r}: give the index of an earlier request")
    return value


def workload_from_trace(trace: Any, name: str, arrivals: list[int] | None = None) -> Workload:
    """The workload of a nanoengine trace (tracer.trace.trace_file.Trace): its requests in seq_id
    order with the tokens they sampled. `arrivals` (one per request, in that order) replaces each
    request's first_step as its arrival step (a scenario's own `arrive`)."""
    header = trace.header
    requests = sorted(trace.requests.values(), key=lambda r: r["seq_id"])
    outputs: dict[int, list[int]] = {r["seq_id"]: [] for r in requests}
    texts: dict[str, str] = {}
    request_ids: dict[int, int] = {}  # seq_id -> its request (sample 0's seq_id)
    for step in trace.steps:
        for row in step["seqs"]:
            request_ids[row["seq_id"]] = request_of(row)
            outputs.setdefault(row["seq_id"], []).extend(row["new_token_ids"])
            texts.update(zip(map(str, row["new_token_ids"]), row.get("new_token_texts", [])))
    for r in requests:
        texts.update(zip(map(str, r.get("prompt_token_ids", [])), r.get("prompt_token_texts", [])))
    if arrivals is not None and len(arrivals) != len(requests):
        raise WorkloadError(f"{name}: {len(arrivals)} arrivals for {len(requests)} requests")
    index = {r["seq_id"]: i for i, r in enumerate(requests)}
    first = {sid: index.get(request_ids.get(sid, sid)) for sid in index}
    return Workload(
        name=name,
        title=header.get("title") or name,
        config={f: header["config"][f] for f in SCHEDULER_CONFIG},
        requests=[
            WorkloadRequest(
                prompt=r.get("prompt", ""),
                prompt_token_ids=list(r["prompt_token_ids"]),
                params=dict(r.get("params", {})),
                arrive=arrivals[i] if arrivals is not None else int(r.get("first_step", 0)),
                output_token_ids=outputs[r["seq_id"]],
                sample_of=first[r["seq_id"]] if first[r["seq_id"]] != i else None,
            )
            for i, r in enumerate(requests)
        ],
        eos_token_ids=list(header.get("eos_token_ids", [])),
        tokenizer=dict(header.get("tokenizer", {})),
        created=header.get("created", ""),
        source=f"nanoengine {header.get('nanoengine_version', '?')}, model {header.get('model', '?')}",
        token_texts=dict(sorted(texts.items(), key=lambda kv: int(kv[0]))),
    )
