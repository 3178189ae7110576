"""The engine loop: add requests, then step() until done.

Each step is schedule -> run -> postprocess -> publish (to the step hooks)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from nanoengine.beam_search import BeamGroup, BeamSearchParams, hypothesis
from nanoengine.block_manager import BlockManager
from nanoengine.config import EngineConfig
from nanoengine.loading.engine_parts import load_engine_parts
from nanoengine.loading.inputs import InputProcessor
from nanoengine.loading.validation import first_line
from nanoengine.logprobs import Sampled
from nanoengine.model_runner import ModelRunner, StepInputs, prepare_inputs
from nanoengine.outputs import RequestOutput, output_of, stop_string_in_tail
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import EventKind, FinishReason, Sequence
from nanoengine.step_record import NO_WATCH, QueueOrder, StepHook, StepWatch


class LLMEngine:
    """Add requests, then step() while has_unfinished(); collect() each finished request.

    Sets torch's thread count, which is process-wide (torch has no per-engine setting), to
    num_threads, or when that is None to the cores other processes leave idle: on a busy
    machine more threads than idle cores make every step many times slower."""

    def __init__(self, model: str = "default", **options: Any):
        self.config = config = EngineConfig.from_kwargs(model=model, **options)
        # sets torch's threads (process-wide: see the class docstring); decides max_model_len and
        # num_kv_blocks if None
        parts = load_engine_parts(config)
        assert config.num_kv_blocks is not None and config.max_model_len is not None
        self.model_name = parts.model_name
        self.model = parts.model
        self.tokenizer = parts.tokenizer
        self.device = parts.device
        self.eos_token_ids = parts.eos_token_ids
        self.vocab_size: int = self.model.model.embed_tokens.num_embeddings
        self.input_processor = InputProcessor(self.tokenizer, self.vocab_size, config)
        self.block_manager = BlockManager(
            config.num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.max_model_len,
            self.eos_token_ids,
        )
        self.runner = ModelRunner(parts, config)
        self.sequences: dict[int, Sequence] = {}  # every sequence not yet collected, by seq_id
        self.requests: dict[int, list[Sequence]] = {}  # request_id -> its n sequences
        self.step_hooks: list[StepHook] = []
        self.to_abort: dict[int, int] = {}  # request_id -> the step the abort was requested before
        self.num_steps = 0
        self.added: list[Sequence] = []  # requests added since the last watched step
        self.new_hook = False  # a hook added since the last step: show it every waiting request

    # ---- requests -------------------------------------------------------------------------
    def add_request(
        self, prompt: str | list[int], params: SamplingParams | BeamSearchParams | None = None
    ) -> int:
        """Returns the request id. n > 1 fans out into n sequences that share the prompt's
        blocks through the prefix cache (vLLM v1: child i samples with seed + i). A beam search
        starts as one sequence, forked into beams after its first token."""
        beam = params if isinstance(params, BeamSearchParams) else None
        token_ids, params = self.input_processor.check_request(prompt, params)
        text = prompt if isinstance(prompt, str) else ""
        seqs = [Sequence(list(token_ids), child_params(params, i), text) for i in range(params.n)]
        if beam:
            seqs[0].group = BeamGroup(beam, [seqs[0]])
        self.requests[seqs[0].seq_id] = seqs
        for seq in seqs:
            seq.request_id = seqs[0].seq_id
            self.sequences[seq.seq_id] = seq
            self.scheduler.add(seq)
            if self.step_hooks:
                self.added.append(seq)
        return seqs[0].seq_id

    def abort(self, request_id: int) -> None:
        """Finishes the request (reason 'abort') at the start of the next step."""
        if any(not s.is_finished for s in self.requests.get(request_id, [])):
            self.to_abort.setdefault(request_id, self.num_steps)

    def drop(self, request_id: int) -> None:
        """Finishes the request at once (reason 'abort') and forgets it: cleanup outside a step."""
        self.to_abort.pop(request_id, None)
        for seq in self.requests.pop(request_id, []):
            self.sequences.pop(seq.seq_id, None)
            if not seq.is_finished:
                seq.num_scheduled_tokens = 0
                self.scheduler.finish(seq, FinishReason.ABORT)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def add_step_hook(self, fn: StepHook) -> None:
        self.step_hooks.append(fn)
        self.new_hook = True

    def remove_step_hook(self, fn: StepHook) -> None:
        if fn in self.step_hooks:
            self.step_hooks.remove(fn)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One step: schedule -> run the model -> postprocess -> publish to the step hooks.

        Returns the sequences that gained a token."""
        if not self.scheduler.has_unfinished():
            return []
        watch = self.watch() if self.step_hooks else NO_WATCH
        out = self.schedule()
        samples = self.run(out, watch)
        appended = self.postprocess(out, samples)
        # before the hooks: a hook that raises cannot make the next step reuse the number
        self.num_steps += 1
        watch.publish(out, self.block_manager)
        return appended

    def schedule(self) -> SchedulerOutput:
        """Apply the aborts asked for since the last step, then choose this step's batch."""
        aborted = self.apply_aborts()
        out = self.scheduler.schedule()
        for seq, requested in aborted:
            out.add_event(
                EventKind.FINISHED, seq, reason=FinishReason.ABORT.value, requested_step=requested
            )
        return out

    def run(self, out: SchedulerOutput, watch: StepWatch) -> list[Sampled | None]:
        """Each scheduled sequence's sampled token; None where its forward or sampling failed."""
        self.runner.copy_blocks(out.blocks_to_copy)  # copy-on-write, before any K/V is written
        if not out.seqs:
            return []
        inputs = prepare_inputs(out.seqs, self.config.block_size)
        watch.saw_inputs(out.seqs, inputs)
        try:
            token_ids = self.run_isolating_faults(out.seqs, inputs)
        except BaseException:  # e.g. Ctrl-C mid-forward: the step did not happen
            self.undo_step(out.seqs)
            raise
        watch.saw_tokens()
        return token_ids

    def postprocess(self, out: SchedulerOutput, samples: list[Sampled | None]) -> list[Sequence]:
        """Finish the sequences whose run failed, commit the others' tokens (and the logprobs
        they asked for), check stop strings.

        Returns the sequences that gained a token."""
        for seq, sampled in zip(out.seqs, samples):
            if sampled is None:
                self.fail(seq, out)
        ran = [(s, x) for s, x in zip(out.seqs, samples) if x is not None and not s.is_finished]
        succeeded = SchedulerOutput(seqs=[s for s, _ in ran], events=out.events)  # out's events
        appended = self.scheduler.postprocess(succeeded, [x.token_id for _, x in ran])
        self.keep_logprobs(ran)
        self.check_stop_strings(appended, out)
        for group in dict.fromkeys(s.group for s in appended if s.group):
            self.advance_beams(group, out)
        return appended

    def keep_logprobs(self, ran: list[tuple[Sequence, Sampled]]) -> None:
        """The logprobs each sequence asked for: a sampled entry is there only for a kept token."""
        for seq, sampled in ran:
            for index, entry in (sampled.prompt_logprobs or {}).items():
                if index == len(seq.prompt_logprobs):  # not already kept before a preemption
                    seq.prompt_logprobs.append(entry)
            if sampled.logprobs is not None:
                seq.logprobs.append(sampled.logprobs)
                seq.cumulative_logprob += sampled.logprobs[sampled.token_id].logprob

    def advance_beams(self, group: BeamGroup, out: SchedulerOutput) -> None:
        """Rank the beams' candidates (beam_search.py): the best live on, a beam chosen again is
        forked (its blocks shared), one never chosen is pruned (its blocks freed)."""
        chosen = group.candidates(self.eos_token_ids)
        # max_tokens reached: the chosen are final hypotheses, they need no KV
        if any(b.finish_reason == FinishReason.LENGTH for b in group.live):
            length = FinishReason.LENGTH
            group.completed += [hypothesis(beam, token, cum, length) for cum, beam, token in chosen]
            group.live.clear()
            return
        live: list[Sequence] = []
        for cum, beam, token in chosen:
            seq = self.fork(beam, out) if beam in live else beam
            seq.token_ids[-1] = token
            seq.cumulative_logprob = cum
            live.append(seq)
        for beam in group.live:
            if beam not in live and not beam.is_finished:  # (one whose step failed is finished)
                self.scheduler.finish(beam, FinishReason.PRUNED, out)
        group.live[:] = live

    def fork(self, beam: Sequence, out: SchedulerOutput) -> Sequence:
        child = beam.fork()
        self.block_manager.fork(beam, child)
        self.sequences[child.seq_id] = child
        self.requests[child.request_id].append(child)
        # beside its parent: a unit's beams stay side by side in running, so a victim taken from
        # its end is never one that was scheduled before it in the same step
        self.scheduler.running.insert(self.scheduler.running.index(beam) + 1, child)
        out.add_event(EventKind.FORKED, child, parent=beam.seq_id, blocks=list(child.block_table))
        return child

    def run_isolating_faults(
        self, seqs: list[Sequence], inputs: StepInputs
    ) -> list[Sampled | None]:
        """Each sequence's sampled token, None where its forward or sampling failed."""
        try:
            return list(self.runner.run(seqs, inputs))
        except Exception:
            # Find the culprit: run again one sequence at a time (same K/V, same slots).
            unwritten: set[int] = set()  # blocks a failed sequence was to write in this step
            return [self.run_alone(seq, unwritten) for seq in seqs]

    def run_alone(self, seq: Sequence, unwritten: set[int]) -> Sampled | None:
        bs = self.config.block_size
        try:
            if not unwritten.isdisjoint(seq.block_table[: seq.num_cached_tokens // bs]):
                raise RuntimeError("its prefix hit is on blocks that failed in this step")
            return self.runner.run([seq], prepare_inputs([seq], bs))[0]
        except Exception as e:
            seq.error = first_line(e)
            unwritten.update(seq.block_table[seq.num_cached_tokens // bs :])
            return None

    def undo_step(self, seqs: list[Sequence]) -> None:
        """Forget the blocks the step was to compute; whoever hit them in this step waits again."""
        unwritten = set()
        for seq in seqs:
            seq.num_scheduled_tokens = 0
            unwritten.update(self.block_manager.forget_uncomputed(seq))
        bs = self.config.block_size
        for seq in reversed(seqs):
            if not unwritten.isdisjoint(seq.block_table[: seq.num_cached_tokens // bs]):
                self.scheduler.preempt(seq, SchedulerOutput(), needed_by=seq)

    def fail(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Finish a request whose step failed and free its blocks; the engine goes on without it."""
        seq.num_scheduled_tokens = 0
        seq.is_prefilling = False
        self.block_manager.forget_uncomputed(seq)
        self.scheduler.finish(seq, FinishReason.ERROR)
        out.add_event(EventKind.FINISHED, seq, reason=FinishReason.ERROR.value, error=seq.error)

    def watch(self) -> StepWatch:
        """A new hook is shown every waiting request once; after that only the requests added
        since."""
        unseen = self.scheduler.waiting if self.new_hook else self.added
        seqs = [*self.scheduler.running, *(s for s in unseen if not s.is_finished)]
        self.new_hook = False
        self.added = []
        waiting = self.scheduler.waiting
        # Only the head a step can admit from, not the whole queue (it can be long).
        can_admit = self.config.max_num_seqs + len(self.to_abort)
        head = tuple(s.seq_id for s in itertools.islice(waiting, can_admit))
        queues = QueueOrder(tuple(s.seq_id for s in self.scheduler.running), head, len(waiting))
        status_before = {s.seq_id: s.status.value for s in seqs}
        return StepWatch(self.num_steps, self.sequences, self.step_hooks, queues, status_before)

    def apply_aborts(self) -> list[tuple[Sequence, int]]:
        """Aborts take effect inside a step, so the step record shows the RUNNING -> FINISHED edge.

        Returns each aborted sequence with the step its abort was requested in."""
        aborted = []
        for request_id, requested_step in self.to_abort.items():
            for seq in self.requests.get(request_id, []):
                if not seq.is_finished:
                    self.scheduler.finish(seq, FinishReason.ABORT)
                    aborted.append((seq, requested_step))
        self.to_abort.clear()
        return aborted

    def check_stop_strings(self, appended: list[Sequence], out: SchedulerOutput) -> None:
        for seq in appended:
            too_early = seq.num_completion_tokens < seq.params.min_tokens
            if not seq.params.stop or seq.is_finished or too_early:
                continue
            if stop_string_in_tail(seq, self.tokenizer):
                self.scheduler.finish(seq, FinishReason.STOP, out)

    # ---- results --------------------------------------------------------------------------
    def collect(self, request_id: int) -> RequestOutput:
        """The finished request's output; it is then forgotten."""
        seqs = self.requests.get(request_id)
        if seqs is None:
            raise ValueError(
                f"no request {request_id!r} to collect: it was never added or was already collected"
            )
        for seq in seqs:
            if not seq.is_finished:
                raise ValueError(
                    f"request {request_id} is still {seq.status.value}: "
                    "step() until it finishes, or abort() it first"
                )
        del self.requests[request_id]
        for seq in seqs:
            del self.sequences[seq.seq_id]
        group = seqs[0].group
        # a beam search's best hypotheses; its sequences if it has none (every beam failed)
        return output_of((group.best(self.eos_token_ids) if group else []) or seqs, self.tokenizer)


def child_params(params: SamplingParams, i: int) -> SamplingParams:
    """Sample i of n: n = 1, and seed + i when seeded (vLLM v1's rule)."""
    if params.n == 1:
        return params
    seed = None if params.seed is None else params.seed + i
    return dataclasses.replace(params, n=1, seed=seed)
