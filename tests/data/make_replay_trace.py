"""Regenerate tests/data/replay_small.jsonl, the fixed trace the replay TUI tests and snapshots use.

    .venv/bin/python tests/data/make_replay_trace.py

Tiny model (random weights, byte tokenizer), 16 blocks of 4 slots, a 12-token step budget:
seq 0 and 1 prefill in chunks, seq 2 (arriving before step 4) shares seq 0's prompt prefix and is
later preempted twice when the pool runs out of blocks. After regenerating it, regenerate the
snapshot baselines and docs/screenshots too (see tests/replay/test_app_snapshots.py).
"""

from __future__ import annotations

from pathlib import Path

from nanoengine.engine import LLMEngine
from nanoengine.sampling_params import SamplingParams
from tracer.trace.recorder import TraceRecorder

OUT = Path(__file__).with_name("replay_small.jsonl")


def main() -> None:
    engine = LLMEngine("tiny", block_size=4, num_kv_blocks=16, max_num_batched_tokens=12, max_num_seqs=4, num_threads=1)
    with TraceRecorder(engine, OUT, title="chunked prefill, prefix sharing, preemption"):
        engine.add_request("The capital of France is", SamplingParams(max_tokens=8, ignore_eos=True))
        engine.add_request("Paged attention stores KV", SamplingParams(max_tokens=10, ignore_eos=True))
        step = 0
        while engine.has_unfinished():
            if step == 4:
                engine.add_request("The capital of France is", SamplingParams(max_tokens=6, ignore_eos=True))
            engine.step()
            step += 1
    print(f"wrote {OUT} ({step} steps)")


if __name__ == "__main__":
    main()
