"""Build the immutable StepRecord for step hooks (only called when a hook is registered)."""
from __future__ import annotations

from nanoengine.block_manager import BlockManager
from nanoengine.model_runner import StepInputs
from nanoengine.scheduler import SchedulerOutput
from nanoengine.sequence import Sequence
from nanoengine import step_record as rec


def snapshot_statuses(seqs: list[Sequence]) -> dict[int, str]:
    return {s.seq_id: s.status.value for s in seqs}


def snapshot_scheduled(seqs: list[Sequence]) -> dict[int, tuple]:
    """The values the step inputs are built from, taken between schedule() and postprocess()."""
    return {s.seq_id: (s.num_tokens, s.num_cached_tokens, s.num_scheduled_tokens, tuple(s.block_table))
            for s in seqs}


def build_record(step: int, wall_time: float, model_time: float, live: list[Sequence],
                 status_before: dict[int, str], scheduled: dict[int, tuple], out: SchedulerOutput,
                 inputs: StepInputs | None, bm: BlockManager) -> rec.StepRecord:
    seqs = []
    for s in sorted(live, key=lambda s: s.seq_id):
        after = (s.num_tokens, s.num_cached_tokens, 0, tuple(s.block_table))
        num_tokens, num_cached, num_scheduled, table = scheduled.get(s.seq_id, after)
        new_tokens = tuple(s.token_ids[num_tokens:])
        seqs.append(rec.SeqStep(
            seq_id=s.seq_id, num_prompt_tokens=s.num_prompt_tokens,
            status_before=status_before[s.seq_id], status_after=s.status.value,
            num_tokens=num_tokens, num_cached_tokens=num_cached, num_scheduled_tokens=num_scheduled,
            block_table=table, num_tokens_after=s.num_tokens, num_cached_tokens_after=s.num_cached_tokens,
            num_scheduled_tokens_after=s.num_scheduled_tokens,
            block_table_after=tuple(s.block_table), new_token_ids=new_tokens,
            finish_reason=s.finish_reason.value if s.finish_reason else None))
    return rec.StepRecord(
        step=step, wall_time=wall_time, model_time=model_time, seqs=tuple(seqs),
        events=tuple(rec.StepEvent(kind, seq_id, detail) for kind, seq_id, detail in out.events),
        inputs=record_inputs(out.seqs, inputs, scheduled),
        pool=rec.BlockPool(bm.block_size, tuple(bm.ref_counts), tuple(bm.hashes), tuple(bm.free_blocks)))


def record_inputs(seqs: list[Sequence], inputs: StepInputs | None, scheduled: dict[int, tuple]) -> rec.StepInputs:
    if inputs is None:
        return rec.StepInputs((), (), (), (0,), (), (), (), (), ())
    tables = tuple(scheduled[s.seq_id][3] for s in seqs)   # unpadded, as the step saw them
    return rec.StepInputs(
        seq_ids=tuple(s.seq_id for s in seqs), input_ids=tuple(inputs.input_ids.tolist()),
        positions=tuple(inputs.positions.tolist()), query_start_loc=tuple(inputs.query_start_loc.tolist()),
        seq_lens=tuple(inputs.seq_lens.tolist()), slot_mapping=tuple(inputs.slot_mapping.tolist()),
        block_tables=tables, logits_indices=tuple(inputs.logits_indices.tolist()),
        discard=tuple(inputs.discard.tolist()))
