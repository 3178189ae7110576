"""Each invariant fires on a deliberately broken copy of a real recorded step, and only then.

The steps come from the tiny scenario trace (conftest.py). Each MUTATIONS entry breaks one step (or
the config) the way a buggy engine would, and returns the index of the broken step.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from conftest import SCENARIO_PARAMS, SCENARIO_PROMPTS, make_tiny_engine

from nanoengine.sequence import EventKind
from tracer.trace.invariants import (
    INVARIANTS,
    PROFILES,
    InvariantChecker,
    Violation,
    check_record,
    check_steps,
    check_trace,
)

MUTATIONS = {}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def mutation(name):
    def register(fn):
        MUTATIONS[name] = fn
        return fn

    return register


def seq(step: dict, seq_id: int) -> dict:
    return next(q for q in step["seqs"] if q["seq_id"] == seq_id)


def first(steps: list[dict], pred) -> int:
    return next(i for i, s in enumerate(steps) if pred(s))


def batched(step: dict, k: int = 0) -> dict:
    return seq(step, step["inputs"]["seq_ids"][k])


def multi_batch(steps) -> int:
    """A step with at least two sequences and a decode in its batch."""
    return first(steps, lambda s: len(s["inputs"]["seq_ids"]) >= 2 and batched(s)["num_scheduled_tokens"] == 1)


def decode_step(steps) -> int:
    return first(
        steps,
        lambda s: (
            s["inputs"]["seq_ids"]
            and batched(s)["num_scheduled_tokens"] == 1
            and batched(s)["status_after"] == "RUNNING"
            and s["step"] < steps[-1]["step"]
        ),
    )


def prefill_step(steps) -> int:
    return first(steps, lambda s: any(s["inputs"]["discard"]))


@mutation("scheduled_zero_after")
def leave_scheduled_tokens(steps, config):
    i = decode_step(steps)
    batched(steps[i])["num_scheduled_tokens_after"] = 1
    return i


@mutation("batch_membership")
def schedule_outside_the_batch(steps, config):
    i = first(steps, lambda s: any(q["status_after"] == "WAITING" and not q["num_scheduled_tokens"] for q in s["seqs"]))
    next(q for q in steps[i]["seqs"] if q["status_after"] == "WAITING")["num_scheduled_tokens"] = 2
    return i


@mutation("cached_le_tokens")
def cache_too_much(steps, config):
    i = decode_step(steps)
    q = batched(steps[i])
    q["num_cached_tokens_after"] = q["num_tokens_after"] + 1
    return i


@mutation("scheduled_within_tokens")
def schedule_past_the_end(steps, config):
    i = prefill_step(steps)
    q = batched(steps[i])
    q["num_scheduled_tokens"] = q["num_tokens"] + 5
    return i


@mutation("token_count")
def drop_an_input_token(steps, config):
    i = prefill_step(steps)
    steps[i]["inputs"]["input_ids"].pop()
    return i


@mutation("batch_shapes")
def drop_a_seq_len(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["seq_lens"].pop()
    return i


@mutation("query_start_loc")
def start_query_at_one(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["query_start_loc"][0] = 1
    return i


@mutation("positions")
def shift_a_position(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["positions"][-1] += 1
    return i


@mutation("seq_lens")
def grow_a_seq_len(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["seq_lens"][0] += 1
    return i


@mutation("logits_indices")
def sample_the_wrong_token(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["logits_indices"][-1] -= 1
    return i


@mutation("input_ids")
def feed_the_wrong_token(steps, config):
    i = multi_batch(steps)
    ids = steps[i]["inputs"]["input_ids"]
    ids[0] = 3 + (ids[0] - 3 + 1) % 256
    return i


@mutation("block_tables_match")
def pad_a_batch_block_table(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["block_tables"][0].append(0)
    return i


@mutation("slot_mapping")
def write_the_next_slot(steps, config):
    i = multi_batch(steps)
    steps[i]["inputs"]["slot_mapping"][0] += 1 if steps[i]["inputs"]["positions"][0] % 4 != 3 else -1
    return i


@mutation("slot_in_own_block")
def write_into_a_free_block(steps, config):
    i = first(steps, lambda s: s["inputs"]["seq_ids"] and s["pool"]["free_block_ids"])
    inp, bs = steps[i]["inputs"], steps[i]["pool"]["block_size"]
    inp["slot_mapping"][0] = steps[i]["pool"]["free_block_ids"][-1] * bs + inp["positions"][0] % bs
    return i


@mutation("slot_unique")
def write_a_slot_twice(steps, config):
    i = prefill_step(steps)
    slots = steps[i]["inputs"]["slot_mapping"]
    slots[1] = slots[0]
    return i


@mutation("block_table_coverage")
def lose_a_block(steps, config):
    i = decode_step(steps)
    q = batched(steps[i])
    q["block_table_after"] = q["block_table_after"][:1]
    return i


@mutation("ref_counts")
def count_a_ghost_reference(steps, config):
    i = decode_step(steps)
    steps[i]["pool"]["ref_counts"][batched(steps[i])["block_table_after"][0]] += 1
    return i


@mutation("free_blocks")
def forget_a_free_block(steps, config):
    i = first(steps, lambda s: s["pool"]["free_block_ids"])
    steps[i]["pool"]["free_block_ids"].pop()
    return i


@mutation("pool_shape")
def grow_the_pool(steps, config):
    steps[0]["pool"]["ref_counts"].append(0)
    steps[0]["pool"]["free_block_ids"].append(len(steps[0]["pool"]["ref_counts"]) - 1)
    return 0


@mutation("unique_prefix_hash")
def duplicate_a_hash(steps, config):
    i = first(steps, lambda s: None in s["pool"]["hashes"] and any(h is not None for h in s["pool"]["hashes"]))
    hashes = steps[i]["pool"]["hashes"]
    hashes[hashes.index(None)] = next(h for h in hashes if h is not None)
    return i


@mutation("prefix_caching_off")
def hash_with_caching_off(steps, config):
    config["enable_prefix_caching"] = False
    return first(steps, lambda s: any(h is not None for h in s["pool"]["hashes"]))


@mutation("prefix_hit")
def overstate_a_prefix_hit(steps, config):
    i = first(steps, lambda s: any(e["kind"] == "prefix_hit" for e in s["events"]))
    next(e for e in steps[i]["events"] if e["kind"] == "prefix_hit")["detail"]["tokens_saved"] += 1
    return i


@mutation("mid_prefill_discard")
def keep_mid_prefill_logits(steps, config):
    i = prefill_step(steps)
    steps[i]["inputs"]["discard"] = [False] * len(steps[i]["inputs"]["discard"])
    return i


@mutation("token_gain")
def decode_without_a_token(steps, config):
    i = decode_step(steps)
    q = batched(steps[i])
    q["new_token_ids"], q["new_token_texts"] = [], []
    q["num_tokens_after"] -= 1
    return i


@mutation("token_growth")
def grow_without_a_token(steps, config):
    i = decode_step(steps)
    batched(steps[i])["num_tokens_after"] += 1
    return i


@mutation("cached_advance")
def forget_a_computed_token(steps, config):
    i = decode_step(steps)
    batched(steps[i])["num_cached_tokens_after"] -= 1
    return i


@mutation("status_edges")
def finish_a_waiting_sequence_by_length(steps, config):
    i = first(steps, lambda s: any(q["status_before"] == q["status_after"] == "WAITING" for q in s["seqs"]))
    q = next(q for q in steps[i]["seqs"] if q["status_before"] == q["status_after"] == "WAITING")
    q["status_after"], q["finish_reason"] = "FINISHED", "length"
    steps[i]["events"].append({"kind": "finished", "seq_id": q["seq_id"], "detail": {"reason": "length"}})
    return i


@mutation("finish_reason")
def give_a_running_sequence_a_reason(steps, config):
    i = decode_step(steps)
    batched(steps[i])["finish_reason"] = "stop"
    return i


@mutation("continuity")
def change_the_prompt_length(steps, config):
    i = decode_step(steps) + 1
    steps[i]["seqs"][0]["num_prompt_tokens"] += 1
    return i


@mutation("finished_holds_no_blocks")
def keep_blocks_after_finishing(steps, config):
    i = first(steps, lambda s: any(q["status_after"] == "FINISHED" for q in s["seqs"]))
    next(q for q in steps[i]["seqs"] if q["status_after"] == "FINISHED")["block_table_after"] = [0]
    return i


@mutation("no_leak")
def leak_a_block(steps, config):
    pool = steps[-1]["pool"]
    pool["ref_counts"][0] = 1
    pool["free_block_ids"].remove(0)
    return len(steps) - 1


@mutation("token_budget")
def exceed_the_budget(steps, config):
    config["max_num_batched_tokens"] = 2
    return prefill_step(steps)


@mutation("kv_content")
def compute_kv_for_another_token(steps, config):
    i = decode_step(steps)
    inputs = steps[i]["inputs"]
    inputs["input_ids"][0] += 1  # the K/V written at that position is for another token
    return i


def events_of(step: dict, kind: str) -> list[dict]:
    return [e for e in step["events"] if e["kind"] == kind]


@mutation("shared_block_write")
def write_into_a_shared_prefix_block(steps, config):
    """A sequence that hit cached blocks writes its first token into one of them."""

    def shared_hit(s):
        for e in events_of(s, "prefix_hit"):
            others = [q for q in s["seqs"] if q["seq_id"] != e["seq_id"]]
            if any(e["detail"]["blocks"][0] in q["block_table"] for q in others):
                return True
        return False

    i = first(steps, shared_hit)
    e = next(e for e in events_of(steps[i], "prefix_hit"))
    start = steps[i]["inputs"]["query_start_loc"][steps[i]["inputs"]["seq_ids"].index(e["seq_id"])]
    steps[i]["inputs"]["slot_mapping"][start] = e["detail"]["blocks"][0] * config["block_size"]
    return i


@mutation("preempt_resets")
def keep_the_cached_count_after_preemption(steps, config):
    i = first(steps, lambda s: events_of(s, "preempted"))
    seq(steps[i], events_of(steps[i], "preempted")[0]["seq_id"])["num_cached_tokens_after"] = 4
    return i


@mutation("victim_policy")
def preempt_the_oldest(steps, config):
    i = first(steps, lambda s: events_of(s, "preempted") and len(s["queues"]["running"]) >= 2)
    running = steps[i]["queues"]["running"]
    running.insert(0, running.pop())  # the victim now looks like the oldest running sequence
    return i


@mutation("preempted_to_head")
def queue_the_preempted_at_the_tail(steps, config):
    i = first(steps, lambda s: events_of(s, "preempted")) + 1
    steps[i]["queues"]["waiting"].insert(0, 99)
    return i


@mutation("admission_order")
def admit_out_of_order(steps, config):
    i = first(steps, lambda s: len(events_of(s, "admitted")) >= 2)
    waiting = steps[i]["queues"]["waiting"]
    waiting[0], waiting[1] = waiting[1], waiting[0]
    return i


@mutation("eos_finish")
def stop_without_eos(steps, config):
    i = first(steps, lambda s: any(e["detail"].get("reason") == "length" for e in events_of(s, "finished")))
    e = next(e for e in events_of(steps[i], "finished") if e["detail"]["reason"] == "length")
    e["detail"]["reason"] = "stop"
    seq(steps[i], e["seq_id"])["finish_reason"] = "stop"
    return i


@mutation("abort_step")
def abort_late(steps, config):
    i = first(steps, lambda s: any(e["detail"].get("reason") == "abort" for e in events_of(s, "finished")))
    next(e for e in events_of(steps[i], "finished") if e["detail"]["reason"] == "abort")["detail"][
        "requested_step"
    ] -= 1
    return i


@mutation("sample_params")
def a_request_claims_another_prompt_as_its_sample(steps, config):
    """The second request of the first step says it is the first's sample: another prompt, and n = 1."""
    first_sid, second = sorted(s["seq_id"] for s in steps[0]["seqs"])[:2]
    seq(steps[0], second)["request_id"] = first_sid
    return 0


@mutation("sample_prefix_share")
def a_sample_admitted_beside_its_sibling_misses_its_blocks(steps, config):
    """A fresh admission now says it is a sample of a running request, and hits none of its blocks."""
    bs = config["block_size"]

    def pair(step: dict) -> tuple[int, int] | None:
        running = [s for s in step["seqs"] if s["status_before"] == "RUNNING"]
        holder = next((s for s in running if s["num_cached_tokens"] + s["num_scheduled_tokens"] >= bs), None)
        for e in events_of(step, "admitted"):
            late = seq(step, e["seq_id"])
            if holder and late["num_prompt_tokens"] > bs and late["num_tokens"] == late["num_prompt_tokens"]:
                return holder["seq_id"], late["seq_id"]
        return None

    i = first(steps, pair)
    sibling, sample = pair(steps[i]) or (0, 0)
    row = seq(steps[i], sample)
    row["request_id"] = sibling
    row["num_scheduled_tokens"] += row["num_cached_tokens"]  # as if it hit nothing: the prompt again
    row["num_cached_tokens"] = 0
    config["enable_prefix_caching"] = True
    return i


# The scenario has no beam search: these make two of its requests one (tests/trace/test_beams*.py break
# real beam-search traces).
def make_beams(step: dict, sids: list[int]) -> None:
    """The rows of sids become the beams of one beam search, the first's."""
    for sid in sids:
        seq(step, sid)["beam_width"] = len(sids)
        if sid != sids[0]:
            seq(step, sid)["request_id"] = sids[0]


@mutation("cow_copy")
def copy_on_write_into_a_block_it_held(steps, config):
    """A decode says it copied another block into the block it writes: the block it already held."""
    i = decode_step(steps)
    row = batched(steps[i])
    copy = row["block_table"][row["num_cached_tokens"] // config["block_size"]]
    source = next(b for b in range(len(steps[i]["pool"]["ref_counts"])) if b != copy)
    steps[i]["events"].append(
        {"kind": EventKind.COPY_ON_WRITE, "seq_id": row["seq_id"], "detail": {"source": source, "copy": copy}}
    )
    steps[i]["blocks_to_copy"] = [[source, copy]]
    return i


@mutation("beams_together")
def run_one_beam_while_its_sibling_waits(steps, config):
    """A request preempted while another ran becomes a beam of the running one's beam search."""

    def split(step: dict) -> list[int] | None:
        running = [q["seq_id"] for q in step["seqs"] if q["status_before"] == "RUNNING"]
        ran = [sid for sid in running if seq(step, sid)["num_scheduled_tokens"]]
        idle = [sid for sid in running if sid not in ran]
        return [ran[0], idle[0]] if ran and idle else None

    i = first(steps, split)
    make_beams(steps[i], split(steps[i]) or [])
    return i


@mutation("fork_shares_parent")
def fork_a_beam_with_blocks_of_its_own(steps, config):
    """The second of two decoding requests is said to be forked from the first: its blocks are its own."""
    i = multi_batch(steps)
    parent, child = steps[i]["inputs"]["seq_ids"][:2]
    make_beams(steps[i], [parent, child])
    seq(steps[i], child)["parent_id"] = parent
    blocks = list(seq(steps[i], child)["block_table_after"])
    steps[i]["events"].append(
        {"kind": EventKind.FORKED, "seq_id": child, "detail": {"parent": parent, "blocks": blocks}}
    )
    return i


def test_every_invariant_has_a_mutation_test():
    assert set(MUTATIONS) == set(INVARIANTS)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_invariant_fires_on_a_broken_step(tiny_trace, name):
    config, requests = tiny_trace.header["config"], tiny_trace.header["requests"]
    eos = tiny_trace.header["eos_token_ids"]
    steps = copy.deepcopy(tiny_trace.steps)
    broken_config = dict(config)
    i = MUTATIONS[name](steps, broken_config)
    number = steps[i]["step"]
    before = [v for v in check_steps(tiny_trace.steps, config, requests, eos) if v.step == number]
    after = check_steps(steps, broken_config, requests, eos)
    assert not [v for v in before if v.invariant == name], "the unbroken step already violates it"
    fired = [v for v in after if v.invariant == name and v.step == number]
    assert fired, f"{name} did not fire on step {number}; got {after}"
    for v in fired:
        assert v.message and "\n" not in v.message and "malformed" not in v.message


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_names_exactly_its_own_invariants(tiny_trace, profile):
    config, requests = tiny_trace.header["config"], tiny_trace.header["requests"]
    eos = tiny_trace.header["eos_token_ids"]
    names = {rule.name for rule in PROFILES[profile]}
    for name, mutate in MUTATIONS.items():
        steps, broken_config = copy.deepcopy(tiny_trace.steps), dict(config)
        mutate(steps, broken_config)
        fired = {v.invariant for v in check_steps(steps, broken_config, requests, eos, profile=profile)}
        assert fired <= names, f"{profile} named {fired - names}"
        assert (name in fired) == (name in names), f"{name} under the {profile} profile: {fired}"


def test_violations_name_step_sequence_and_invariant(tiny_trace):
    steps = copy.deepcopy(tiny_trace.steps)
    i = decode_step(steps)
    batched(steps[i])["num_tokens_after"] += 1
    found = [v for v in check_steps(steps, tiny_trace.config) if v.invariant == "token_growth"]
    sid = batched(steps[i])["seq_id"]
    assert found[0] == Violation(steps[i]["step"], sid, "token_growth", found[0].message)
    assert f"seq {sid}" in found[0].message
    assert Violation.from_dict(found[0].to_dict()) == found[0]


def test_a_malformed_step_is_reported_not_crashed_on(tiny_trace):
    steps = copy.deepcopy(tiny_trace.steps)
    i = multi_batch(steps)
    steps[i]["inputs"]["positions"] = []
    steps[i]["seqs"][0]["num_tokens"] = "many"
    found = {v.invariant for v in InvariantChecker(tiny_trace.config).check(steps[i])}
    assert {"token_count", "positions"} <= found


def test_checker_runs_on_live_step_records():
    engine = make_tiny_engine()
    records = []
    engine.add_step_hook(records.append)
    for prompt in SCENARIO_PROMPTS:
        engine.add_request(prompt, SCENARIO_PARAMS)
    while engine.has_unfinished():
        engine.step()
    assert all(check_record(r, engine.config.block_size) == [] for r in records)
    record = next(r for r in records if len(r.inputs.seq_ids) >= 2)
    shifted = tuple(p + 1 for p in record.inputs.positions)
    broken = dataclasses.replace(record, inputs=dataclasses.replace(record.inputs, positions=shifted))
    assert {v.invariant for v in check_record(broken, engine.config.block_size)} >= {"positions", "slot_mapping"}


def test_kv_content_on_an_engine_that_ran_before_the_trace(tmp_path):
    """KV cached before the recorder was attached is trusted on its first read, then held to it."""
    from tracer.trace.recorder import TraceRecorder
    from tracer.trace.trace_file import load_trace

    engine = make_tiny_engine(num_kv_blocks=16)
    prompt = "hello world, how are you"
    engine.add_request(prompt, SCENARIO_PARAMS)
    while engine.has_unfinished():
        engine.step()
    with TraceRecorder(engine, tmp_path / "warm.jsonl") as recorder:
        engine.add_request(prompt, SCENARIO_PARAMS)  # a prefix hit on blocks written before the trace
        while engine.has_unfinished():
            engine.step()
    trace = load_trace(tmp_path / "warm.jsonl")
    assert trace.steps[0]["step"] > 0 and any(e["kind"] == "prefix_hit" for e in trace.steps[0]["events"])
    assert recorder.violations == [] and check_trace(trace) == []


def twins_trace(tmp_path):
    """Lesson 10's situation: three identical 16-token prompts in one step, block size 4."""
    from tracer.trace.recorder import TraceRecorder
    from tracer.trace.trace_file import load_trace

    engine = make_tiny_engine(num_kv_blocks=24, max_num_batched_tokens=64)
    with TraceRecorder(engine, tmp_path / "twins.jsonl") as recorder:
        for _ in range(3):
            engine.add_request("twins share this", SCENARIO_PARAMS)
        while engine.has_unfinished():
            engine.step()
    assert recorder.violations == []
    return load_trace(tmp_path / "twins.jsonl")


def test_a_hit_on_blocks_computed_in_the_same_step_is_legal_and_its_bugs_are_still_named(tmp_path):
    trace = twins_trace(tmp_path)
    step0 = trace.steps[0]
    a, b, c = step0["inputs"]["seq_ids"]
    hits = events_of(step0, "prefix_hit")
    written = {slot // 4 for slot in step0["inputs"]["slot_mapping"]}
    assert [e["seq_id"] for e in hits] == [b, c] and set(hits[0]["detail"]["blocks"]) <= written
    assert check_trace(trace) == []
    config, requests = trace.header["config"], trace.header["requests"]
    # The same step, broken three ways: the checker names each.
    broken = {}
    steps = copy.deepcopy(trace.steps)  # B writes its first token into a block it hit (A's)
    start = steps[0]["inputs"]["query_start_loc"][1]
    steps[0]["inputs"]["slot_mapping"][start] = hits[0]["detail"]["blocks"][0] * 4
    broken["shared_block_write"] = steps
    steps = copy.deepcopy(trace.steps)  # B's last block carries A's last block's hash too
    pool = steps[0]["pool"]
    pool["hashes"][seq(steps[0], b)["block_table"][3]] = pool["hashes"][seq(steps[0], a)["block_table"][3]]
    broken["unique_prefix_hash"] = steps
    steps = copy.deepcopy(trace.steps)  # C hits blocks nobody wrote: A's K/V went elsewhere
    for k in range(steps[0]["inputs"]["query_start_loc"][1]):
        steps[0]["inputs"]["slot_mapping"][k] = 23 * 4 + k % 4  # A's tokens all land in a spare block
    broken["kv_content"] = steps
    for name, steps in broken.items():
        fired = [v for v in check_steps(steps, config, requests) if v.invariant == name]
        assert fired and fired[0].step == 0, name


@mutation("chunk_budget")
def record_the_budget_after_the_chunk(steps, config):
    i = first(steps, lambda s: events_of(s, "prefill_chunk"))
    e = events_of(steps[i], "prefill_chunk")[0]
    e["detail"]["budget"] -= e["detail"]["end"] - e["detail"]["start"]
    return i


@mutation("chunk_size")
def chunk_one_token_short(steps, config):
    i = first(
        steps, lambda s: any(e["detail"]["end"] - e["detail"]["start"] >= 2 for e in events_of(s, "prefill_chunk"))
    )
    e = next(e for e in events_of(steps[i], "prefill_chunk") if e["detail"]["end"] - e["detail"]["start"] >= 2)
    e["detail"]["end"] -= 1
    return i


@mutation("admission_blocks")
def admit_more_blocks_than_the_table_holds(steps, config):
    i = first(steps, lambda s: events_of(s, "admitted"))
    e = events_of(steps[i], "admitted")[0]
    e["detail"]["need"] = len(seq(steps[i], e["seq_id"])["block_table"]) + 1
    return i


@mutation("preemption_need")
def preempt_with_room_to_spare(steps, config):
    def for_a_batched_sequence(s):
        return any(e["detail"]["by"] in s["inputs"]["seq_ids"] for e in events_of(s, "preempted"))

    i = first(steps, for_a_batched_sequence)
    e = next(e for e in events_of(steps[i], "preempted") if e["detail"]["by"] in steps[i]["inputs"]["seq_ids"])
    e["detail"]["free"] += 50
    return i
