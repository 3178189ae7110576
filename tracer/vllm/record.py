"""Record vLLM v1's own scheduler on a workload, in nanoengine's trace format.

    /work/vllm-venv/bin/python -m tracer.vllm.record WORKLOAD.json -o out.jsonl
    /work/vllm-venv/bin/python -m tracer.vllm.record NANOENGINE_TRACE.jsonl -o out.jsonl

Run it with the python of a venv holding vllm==0.33.0 (docs/vllm.md), with nanoengine's folder on
PYTHONPATH; nanoengine's own install never needs vLLM. It drives vllm.v1.core.sched.scheduler.Scheduler
step by step: schedule(), then update_from_output() with fake model outputs (no token for a request
still inside a prefill chunk, else the token nanoengine's reference run sampled at that position, or
a fixed filler once those run out). Each step becomes one step line (docs/trace-format.md, "Traces
of vLLM"): vLLM's counters and block tables as its scheduler and KV cache manager hold them, the flat
batch as vLLM's GPU model runner builds it from those block tables, nothing that vLLM does not expose.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracer.loop.arrivals import is_due
from tracer.trace.step_line import (
    EngineRow,
    EventLine,
    InputsLine,
    PoolLine,
    QueuesLine,
    SeqRow,
    StepLine,
    pool_layout,
    seq_row,
)
from tracer.trace.trace_file import FULL_STEPS_VERSION
from tracer.vllm.workload import Workload, WorkloadError, load_workload, workload_from_dict

FILLER_TOKEN = 32  # fed once a request outlives its reference tokens (a space in byte and BPE vocabularies)
MAX_STEPS = 5000
FINISH_REASONS = {
    "FINISHED_STOPPED": "stop",
    "FINISHED_LENGTH_CAPPED": "length",
    "FINISHED_ABORTED": "abort",
    "FINISHED_IGNORED": "ignored",
    "FINISHED_ERROR": "error",
    "FINISHED_REPETITION": "stop",
}
# What the trace format has and vLLM's scheduler does not expose; absent from (or 0 in) the lines.
ABSENT = {
    "wall_time": "0: no model runs (fake outputs); the scheduler's own time is not recorded, so a re-record is identical",
    "model_time": "0: no model runs",
    "output_text": "empty: no detokenizer runs (new_token_texts are the reference run's texts of the same ids)",
    "preempted.reason": "which request needed the block is not exposed; the reason says only that the pool was full",
    "inputs order": "the scheduler's order (running, then admitted); vLLM's persistent input batch may order rows "
    "differently, the rows are the same",
}


def mapped_status(name: str) -> str:
    """nanoengine's three statuses: vLLM's PREEMPTED request waits, its WAITING_FOR_* ones too."""
    if name.startswith("FINISHED"):
        return "FINISHED"
    return "RUNNING" if name == "RUNNING" else "WAITING"


class VllmRow(SeqRow):
    """A row of a vLLM trace: nanoengine's, and vLLM's own status names beside its three."""

    vllm_status_before: str
    vllm_status_after: str


class VllmStepLine(StepLine):
    vllm: dict[str, Any]  # what vLLM's SchedulerOutput reports of the step itself


@dataclass(slots=True)
class Snapshot:
    status: str  # vLLM's RequestStatus name
    num_tokens: int
    num_computed_tokens: int
    block_table: list[int]


@dataclass(slots=True)
class Tracked:
    seq_id: int
    request: Any  # vllm.v1.request.Request
    reference: list[int]  # the tokens nanoengine sampled
    chunk: int = 0  # nanoengine's prefill_chunk counter: 1.. while prefilling, 0 once a token is sampled
    num_emitted: int = 0  # output tokens already written to the trace
    sample_of: int | None = None  # sample i > 0 of an n > 1 request: sample 0's seq_id


@dataclass(slots=True)
class Recorder:
    workload: Workload
    scheduler: Any
    bridge: Any
    tracked: dict[str, Tracked] = field(default_factory=dict)
    step: int = 0

    # ---- state reading ----------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        manager = self.scheduler.kv_cache_manager
        if request_id not in manager.coordinator.single_type_managers[0].req_to_blocks:
            return []
        return [int(b) for b in manager.get_block_ids(request_id)[0]]

    def snapshot(self, t: Tracked) -> Snapshot:
        r = t.request
        return Snapshot(r.status.name, r.num_tokens, r.num_computed_tokens, self.block_ids(r.request_id))

    def pool(self) -> PoolLine:
        block_pool = self.scheduler.kv_cache_manager.block_pool
        return {
            "block_size": int(self.workload.config["block_size"]),
            "ref_counts": [b.ref_cnt for b in block_pool.blocks],
            "hashes": [hash_number(b.block_hash) for b in block_pool.blocks],
            "free_block_ids": [b.block_id for b in block_pool.free_block_queue.get_all_free_blocks()],
        }

    def queues(self) -> QueuesLine:
        s = self.scheduler
        waiting = [*s.kv_holding_waiting, *s.waiting]
        seq = self.seq_id
        return {
            "running": [seq(r.request_id) for r in s.running],
            "waiting": [seq(r.request_id) for r in waiting[: int(self.workload.config["max_num_seqs"])]],
            "num_waiting": len(waiting),
        }

    def seq_id(self, request_id: str) -> int:
        return self.tracked[request_id].seq_id

    # ---- one step -----------------------------------------------------------------------
    def run_step(self) -> VllmStepLine:
        before = {rid: self.snapshot(t) for rid, t in self.tracked.items()}
        queues = self.queues()
        stats = self.scheduler.kv_cache_manager
        out = self.scheduler.schedule()
        mid = {rid: self.snapshot(t) for rid, t in self.tracked.items()}
        scheduled: dict[str, int] = dict(out.num_scheduled_tokens)
        prefix = stats.prefix_cache_stats
        prefix_stats = {
            "queries": prefix.queries,
            "hits": prefix.hits,
            "preempted_queries": prefix.preempted_queries,
            "preempted_hits": prefix.preempted_hits,
        }
        new_ids = [r.req_id for r in out.scheduled_new_reqs]
        resumed = sorted(out.scheduled_cached_reqs.resumed_req_ids)
        preempted = sorted(out.preempted_req_ids or (), key=self.seq_id)
        events: list[EventLine] = []
        for rid in preempted:
            events.append(event("preempted", self.seq_id(rid), {"reason": "KV cache full (vLLM preempts running[-1])"}))
        admitted = [rid for rid in scheduled if before[rid].status != "RUNNING"]
        for rid, n in scheduled.items():
            t = self.tracked[rid]
            start = mid[rid].num_computed_tokens - n
            if rid in admitted:
                events.append(event("admitted", t.seq_id, {}))
                t.chunk = 1
                if start > 0:
                    bs = int(self.workload.config["block_size"])
                    hit = mid[rid].block_table[: start // bs]
                    events.append(event("prefix_hit", t.seq_id, {"blocks": hit, "tokens_saved": start}))
            if t.chunk:
                detail = {"chunk": t.chunk, "start": start, "end": start + n, "num_tokens": mid[rid].num_tokens}
                events.append(event("prefill_chunk", t.seq_id, detail))
        inputs = self.flat_inputs(scheduled, mid)
        mid_prefill = {rid: self.tracked[rid].request.is_prefill_chunk for rid in scheduled}
        self.scheduler.update_from_output(out, self.model_output(scheduled))
        after = {rid: self.snapshot(t) for rid, t in self.tracked.items()}
        rows = sorted(
            (self.row(t, before[rid], mid[rid], after[rid], scheduled.get(rid, 0)) for rid, t in self.tracked.items()),
            key=lambda r: r["seq_id"],
        )
        for rid in scheduled:
            t = self.tracked[rid]
            if not t.chunk:
                continue
            if mid_prefill[rid]:  # its logits were discarded: the next chunk follows
                t.chunk += 1
                continue
            events.append(event("prefill_done", t.seq_id, {"chunks": t.chunk}))
            t.chunk = 0
        for rid, t in self.tracked.items():
            if after[rid].status.startswith("FINISHED") and not before[rid].status.startswith("FINISHED"):
                events.append(event("finished", t.seq_id, {"reason": FINISH_REASONS[after[rid].status]}))
        line: VllmStepLine = {
            "type": "step",
            "step": self.step,
            "wall_time": 0.0,
            "model_time": 0.0,
            "seqs": rows,
            "new_requests": [],
            "events": events,
            "inputs": inputs,
            "pool": with_layout(self.pool(), rows),
            "queues": queues,
            "vllm": {
                "scheduled_new_req_ids": [self.seq_id(r) for r in new_ids],
                "resumed_req_ids": [self.seq_id(r) for r in resumed],
                "preempted_req_ids": [self.seq_id(r) for r in preempted],
                "finished_req_ids": sorted(self.seq_id(r) for r in out.finished_req_ids),
                "prefix_cache_stats": prefix_stats,
            },
            "violations": [],
        }
        self.step += 1
        return line

    def row(self, t: Tracked, before: Snapshot, mid: Snapshot, after: Snapshot, n: int) -> VllmRow:
        new_tokens = list(t.request.output_token_ids[t.num_emitted :])
        t.num_emitted += len(new_tokens)
        texts = self.workload.token_texts
        engine = EngineRow(
            seq_id=t.seq_id,
            num_prompt_tokens=t.request.num_prompt_tokens,
            status_before=mapped_status(before.status),
            status_after=mapped_status(after.status),
            num_tokens=mid.num_tokens,
            num_cached_tokens=mid.num_computed_tokens - n,
            num_scheduled_tokens=n,
            block_table=mid.block_table,
            num_tokens_after=after.num_tokens,
            num_cached_tokens_after=after.num_computed_tokens,
            num_scheduled_tokens_after=0,
            block_table_after=after.block_table,
            new_token_ids=new_tokens,
            finish_reason=FINISH_REASONS.get(after.status),
        )
        if t.sample_of is not None:
            engine["request_id"] = t.sample_of
        new_token_texts = [texts.get(str(tok), "") for tok in new_tokens]
        row = seq_row(engine, new_token_texts, "")  # output_text absent: no detokenizer runs
        return {**row, "vllm_status_before": before.status, "vllm_status_after": after.status}

    def flat_inputs(self, scheduled: dict[str, int], mid: dict[str, Snapshot]) -> InputsLine:
        """The flat batch as vLLM's GPU model runner builds it (_prepare_inputs, BlockTable.compute_slot_mapping)."""
        bs = int(self.workload.config["block_size"])
        seq_ids: list[int] = []
        input_ids: list[int] = []
        positions: list[int] = []
        seq_lens: list[int] = []
        slot_mapping: list[int] = []
        block_tables: list[list[int]] = []
        logits_indices: list[int] = []
        query_start_loc, discard = [0], []
        for rid, n in scheduled.items():
            t, snap = self.tracked[rid], mid[rid]
            start = snap.num_computed_tokens - n
            chunk = list(range(start, start + n))
            tokens = t.request.all_token_ids
            seq_ids.append(t.seq_id)
            input_ids += [tokens[p] for p in chunk]
            positions += chunk
            slot_mapping += [snap.block_table[p // bs] * bs + p % bs for p in chunk]
            block_tables.append(snap.block_table)
            seq_lens.append(start + n)
            query_start_loc.append(query_start_loc[-1] + n)
            logits_indices.append(query_start_loc[-1] - 1)
            discard.append(start + n < snap.num_tokens)  # the runner's discard_request_mask
        texts = self.workload.token_texts
        return {
            "seq_ids": seq_ids,
            "input_ids": input_ids,
            "positions": positions,
            "seq_lens": seq_lens,
            "slot_mapping": slot_mapping,
            "block_tables": block_tables,
            "logits_indices": logits_indices,
            "input_texts": [texts.get(str(tok), "") for tok in input_ids],
            "query_start_loc": query_start_loc,
            "discard": discard,
        }

    def model_output(self, scheduled: dict[str, int]) -> Any:
        req_ids = list(scheduled)
        sampled: list[list[int]] = []
        for rid in req_ids:
            t = self.tracked[rid]
            if t.request.is_prefill_chunk:
                sampled.append([])
                continue
            k = t.request.num_output_tokens
            sampled.append([t.reference[k] if k < len(t.reference) else FILLER_TOKEN])
        return self.bridge.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    # ---- requests -----------------------------------------------------------------------
    def add(self, index: int) -> dict[str, Any]:
        w = self.workload
        r = w.requests[index]
        request_id = vllm_request_id(w, index)
        request = self.bridge.make_request(
            request_id, r.prompt_token_ids, r.params, w.eos_token_ids, int(w.config["block_size"]), float(index)
        )
        self.scheduler.add_request(request)
        self.tracked[request_id] = Tracked(index, request, r.output_token_ids, sample_of=r.sample_of)
        return request_entry(w, index, self.step)


def vllm_request_id(w: Workload, index: int) -> str:
    """The id vLLM's scheduler knows the request by: its index, or for sample i of an n > 1 request the
    child id vLLM's front end gives it (ParentRequest.get_child_info: f"{i}_{parent}"), sample 0 included."""
    r = w.requests[index]
    if r.sample_of is not None:
        return f"{index - r.sample_of}_{r.sample_of}"
    return f"0_{index}" if int(r.params.get("n", 1)) > 1 else str(index)


def with_layout(pool: PoolLine, rows: list[VllmRow]) -> PoolLine:
    """The pool with its owners and filled, derived from the rows (by seq_id) as nanoengine's recorder does."""
    return {**pool, **pool_layout(rows, pool)}


def event(kind: str, seq_id: int, detail: dict[str, Any]) -> EventLine:
    return {"kind": kind, "seq_id": seq_id, "detail": detail}


def hash_number(block_hash: Any) -> int | None:
    """A block's hash (bytes: sha256 of its parent's hash and its tokens, plus the group id) as a
    63-bit JSON number: its first 8 bytes."""
    if block_hash is None:
        return None
    return int.from_bytes(bytes(block_hash)[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def request_entry(w: Workload, index: int, step: int) -> dict[str, Any]:
    r = w.requests[index]
    return {
        "seq_id": index,
        "prompt": r.prompt,
        "num_prompt_tokens": len(r.prompt_token_ids),
        "prompt_token_ids": r.prompt_token_ids,
        "prompt_token_texts": [w.token_texts.get(str(t), "") for t in r.prompt_token_ids],
        "params": r.params,
        "first_step": step,
    }


def header(w: Workload, requests: list[dict[str, Any]], bridge: Any) -> dict[str, Any]:
    config = {**w.config, "num_kv_blocks": int(w.config["num_kv_blocks"]) + 1}
    return {
        "type": "header",
        "schema_version": FULL_STEPS_VERSION,  # whole steps in every line
        "nanoengine_version": nanoengine_version(),
        "engine": f"vllm {bridge.VLLM_VERSION}",
        "model": "none (vLLM's scheduler with fake model outputs)",
        "created": w.created,
        "config": config,
        "requests": requests,
        "title": f"{w.title} (vLLM {bridge.VLLM_VERSION})",
        "focus_step": None,
        "eos_token_ids": w.eos_token_ids,
        "tokenizer": w.tokenizer or {"name": "none", "vocab_size": 0},
        "vllm": {
            "version": bridge.VLLM_VERSION,
            "workload": w.name,
            "workload_source": w.source,
            "null_block_id": 0,
            "usable_blocks": int(w.config["num_kv_blocks"]),
            "max_num_seqs": bridge.vllm_max_num_seqs(w.config),
            "scheduler": "v1 Scheduler, FCFS, chunked prefill, watermark 0, no async scheduling, no spec decode",
            "absent": ABSENT,
        },
    }


def nanoengine_version() -> str:
    """Read from nanoengine's __init__.py without importing it (that would import torch and the model)."""
    spec = importlib.util.find_spec("nanoengine")
    text = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    found = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    return found.group(1) if found else "unknown"


def record(w: Workload, out_path: str | Path, max_steps: int = MAX_STEPS) -> int:
    """Drive vLLM's scheduler on the workload and write the trace; returns the number of steps."""
    from tracer.vllm import bridge

    scheduler = bridge.build_scheduler(w.config)
    rec = Recorder(w, scheduler, bridge)
    lines = list(drive(rec, max_steps))
    header_requests = lines[0]["new_requests"]
    lines[0]["new_requests"] = []
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header(w, header_requests, bridge), ensure_ascii=False, allow_nan=False) + "\n")
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n")
    return len(lines)


def drive(rec: Recorder, max_steps: int) -> Iterator[VllmStepLine]:
    """nanoengine's workload driver (tracer/loop/drive.py), for vLLM's scheduler, which is not an
    LLMEngine: add each request when its arrival is due (is_due: the same rule), step until every
    request is finished."""
    w, scheduler = rec.workload, rec.scheduler
    order = sorted(range(len(w.requests)), key=lambda i: w.requests[i].arrive)
    while order or scheduler.has_unfinished_requests():
        added = []
        while order and is_due(w.requests[order[0]].arrive, rec.step, not scheduler.has_unfinished_requests()):
            added.append(rec.add(order.pop(0)))
        if rec.step >= max_steps:
            raise RuntimeError(f"vLLM's scheduler did not finish {w.name!r} within {max_steps} steps")
        line = rec.run_step()
        line["new_requests"] = added
        yield line


def read_input(path: Path) -> Workload:
    """A workload file, or a nanoengine trace (its requests, first_step as arrival, its sampled tokens)."""
    if path.suffix == ".jsonl":
        from tracer.trace.trace_file import load_trace
        from tracer.vllm.workload import workload_from_trace

        return workload_from_trace(load_trace(path, validate="none"), path.stem)
    return load_workload(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.vllm.record", description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a workload .json, or a nanoengine trace .jsonl")
    parser.add_argument("-o", "--out", type=Path, required=True, help="where to write the vLLM trace")
    args = parser.parse_args(argv)
    try:
        w = read_input(args.source)
    except (WorkloadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import vllm  # noqa: F401
    except ImportError:
        print(
            "error: vllm is not installed in this python: run the recorder with the vLLM venv's python (docs/vllm.md)",
            file=sys.stderr,
        )
        return 2
    n = record(w, args.out)
    print(f"{n} steps -> {args.out}")
    return 0


__all__ = ["main", "record", "workload_from_dict"]

if __name__ == "__main__":
    raise SystemExit(main())
