"""The engine loop: add requests, then step() until done.

Each step is schedule -> run -> postprocess -> publish (to the step hooks)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nanoengine.block_manager import BlockManager, blocks_needed
from nanoengine.config import EngineConfig, idle_cores
from nanoengine.loader import load_model
from nanoengine.model import STACKED, CausalLM, ModelConfig, head_dim_of, pack_for_onednn
from nanoengine.model_runner import ModelRunner, StepInputs, prepare_inputs
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import EventKind, FinishReason, Sequence
from nanoengine.step_record import NO_WATCH, QueueOrder, StepHook, StepWatch
from nanoengine.tiny import init_tiny_weights
from nanoengine.validation import first_line, is_int, short_repr


@dataclass(slots=True)
class RequestOutput:
    seq_id: int
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str = ""  # why it failed, when finish_reason is 'error'


class LLMEngine:
    """Add requests, then step() while has_unfinished(); collect() each finished request.

    Sets torch's thread count, which is process-wide (torch has no per-engine setting), to
    num_threads, or when that is None to the cores other processes leave idle: on a busy
    machine more threads than idle cores make every step many times slower."""

    def __init__(self, model: str = "default", **options: Any):
        self.config = config = EngineConfig.from_kwargs(model=model, **options)
        # process-wide: see the class docstring
        torch.set_num_threads(config.num_threads or idle_cores())
        device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        dtype = getattr(torch, config.dtype or ("bfloat16" if "cuda" in device else "float32"))
        loaded = load_model(config.model)
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        hf_config = loaded.config
        # The knobs left None are decided now, from the model and the machine.
        max_model_len = min(config.max_model_len or 4096, hf_config.max_position_embeddings)
        config.max_model_len = max_model_len
        num_kv_blocks = config.num_kv_blocks or kv_blocks_that_fit(config, hf_config, dtype)
        config.num_kv_blocks = num_kv_blocks
        check_kv_fits(num_kv_blocks, bytes_per_block(config, hf_config, dtype), self.device)
        self.model = build_model(hf_config, loaded.state_dict, max_model_len, self.device, dtype)
        pack_for_onednn(self.model)
        self.vocab_size: int = self.model.model.embed_tokens.num_embeddings
        self.eos_token_ids = eos_ids(hf_config, self.tokenizer)
        block_size = config.block_size
        self.block_manager = BlockManager(num_kv_blocks, block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            max_model_len,
            self.eos_token_ids,
        )
        self.runner = ModelRunner(self.model, config, self.device, dtype)
        self.sequences: dict[int, Sequence] = {}  # every request not yet collected
        self.step_hooks: list[StepHook] = []
        self.to_abort: dict[int, int] = {}  # seq_id -> the step the abort was requested before
        self.num_steps = 0
        self.added: list[Sequence] = []  # requests added since the last watched step
        self.new_hook = False  # a hook added since the last step: show it every waiting request

    # ---- requests -------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids; a ValueError (one line) for anything the model cannot run."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt: give at least one token of text")
            if self.config.use_chat_template and getattr(self.tokenizer, "chat_template", None):
                chat = [{"role": "user", "content": prompt}]
                prompt = self.tokenizer.apply_chat_template(
                    chat, tokenize=False, add_generation_prompt=True
                )
            token_ids: list[Any] = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        elif isinstance(prompt, (list, tuple, range)):
            token_ids = list(prompt)
        else:
            kind = type(prompt).__name__
            raise ValueError(f"a prompt is a string or a list of token ids, got {kind}")
        if not token_ids:
            raise ValueError("empty prompt: give at least one token")
        for i, t in enumerate(token_ids):
            if not is_int(t) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompt token {i} is {short_repr(t)}: "
                    f"token ids are integers in [0, {self.vocab_size})"
                )
        return [int(t) for t in token_ids]

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: its fields may have been changed since it was made
        token_ids = self.encode_prompt(prompt)
        limit = self.scheduler.max_model_len
        if len(token_ids) >= limit:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but max_model_len is {limit}: "
                "shorten it or raise max_model_len"
            )
        worst = min(len(token_ids) + params.max_tokens, limit)
        need = blocks_needed(worst, self.config.block_size)
        if need > self.block_manager.num_kv_blocks:
            raise ValueError(
                f"a request of {len(token_ids)} prompt + {params.max_tokens} new tokens needs "
                f"{need} KV blocks but the pool has {self.config.num_kv_blocks}: "
                "raise num_kv_blocks or lower max_tokens"
            )
        seq = Sequence(token_ids, params, prompt if isinstance(prompt, str) else "")
        self.sequences[seq.seq_id] = seq
        self.scheduler.add(seq)
        if self.step_hooks:
            self.added.append(seq)
        return seq.seq_id

    def abort(self, seq_id: int) -> None:
        """Finishes the request (reason 'abort') at the start of the next step."""
        if seq_id in self.sequences and not self.sequences[seq_id].is_finished:
            self.to_abort.setdefault(seq_id, self.num_steps)

    def drop(self, seq_id: int) -> None:
        """Finishes the request at once (reason 'abort') and forgets it: cleanup outside a step."""
        seq = self.sequences.pop(seq_id, None)
        self.to_abort.pop(seq_id, None)
        if seq is not None and not seq.is_finished:
            seq.num_scheduled_tokens = 0
            self.scheduler.finish(seq, FinishReason.ABORT)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def add_step_hook(self, fn: StepHook) -> None:
        self.step_hooks.append(fn)
        self.new_hook = True

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One step: schedule -> run the model -> postprocess -> publish to the step hooks.

        Returns the sequences that gained a token."""
        if not self.scheduler.has_unfinished():
            return []
        watch = self.watch() if self.step_hooks else NO_WATCH
        out = self.schedule()
        token_ids = self.run(out, watch)
        appended = self.postprocess(out, token_ids)
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

    def run(self, out: SchedulerOutput, watch: StepWatch) -> list[int | None]:
        """Each scheduled sequence's sampled token; None where its forward or sampling failed."""
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

    def postprocess(self, out: SchedulerOutput, token_ids: list[int | None]) -> list[Sequence]:
        """Finish the sequences whose run failed, commit the others' tokens, check stop strings.

        Returns the sequences that gained a token."""
        for seq, token_id in zip(out.seqs, token_ids):
            if token_id is None:
                self.fail(seq, out)
        succeeded = SchedulerOutput([s for s in out.seqs if not s.is_finished], out.events)
        appended = self.scheduler.postprocess(succeeded, [t for t in token_ids if t is not None])
        self.check_stop_strings(appended, out)
        return appended

    def run_isolating_faults(self, seqs: list[Sequence], inputs: StepInputs) -> list[int | None]:
        """Each sequence's sampled token, None where its forward or sampling failed."""
        try:
            return list(self.runner.run(seqs, inputs))
        except Exception:
            # Find the culprit: run again one sequence at a time (same K/V, same slots).
            unwritten: set[int] = set()  # blocks a failed sequence was to write in this step
            return [self.run_alone(seq, unwritten) for seq in seqs]

    def run_alone(self, seq: Sequence, unwritten: set[int]) -> int | None:
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
        seq.prefill_chunk = 0
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
        for seq_id, requested_step in self.to_abort.items():
            seq = self.sequences.get(seq_id)
            if seq is not None and not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ABORT)
                aborted.append((seq, requested_step))
        self.to_abort.clear()
        return aborted

    def check_stop_strings(self, appended: list[Sequence], out: SchedulerOutput) -> None:
        for seq in appended:
            if seq.params.stop and not seq.is_finished and self.stop_string_in_tail(seq):
                self.scheduler.finish(seq, FinishReason.STOP, out)

    def stop_string_in_tail(self, seq: Sequence) -> bool:
        """Does the newest text hold a stop string? Decodes just enough last tokens for the longest
        one plus 4 characters (the first may be cut mid-character): from 1 token per character,
        doubling up to 4 (bytes), so the cost depends on the stop strings, not the completion."""
        need = max(len(s) for s in seq.params.stop) + 4
        limit = min(4 * need, seq.num_completion_tokens)
        n = min(need, limit)
        while True:
            tail = self.tokenizer.decode(seq.token_ids[-n:], skip_special_tokens=True)
            if len(tail) >= need or n >= limit:
                return any(s in tail for s in seq.params.stop)
            n = min(2 * n, limit)

    # ---- results --------------------------------------------------------------------------
    def output(self, seq: Sequence) -> RequestOutput:
        text = self.tokenizer.decode(seq.completion_token_ids, skip_special_tokens=True)
        for s in seq.params.stop:
            if s in text:  # cut at the first stop string
                text = text[: text.index(s)]
        reason = seq.finish_reason.value if seq.finish_reason else None
        prompt_ids = seq.token_ids[: seq.num_prompt_tokens]
        return RequestOutput(
            seq.seq_id, seq.prompt, prompt_ids, seq.completion_token_ids, text, reason, seq.error
        )

    def collect(self, seq_id: int) -> RequestOutput:
        """The finished request's output; it is then forgotten."""
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise ValueError(
                f"no request {seq_id!r} to collect: it was never added or was already collected"
            )
        if not seq.is_finished:
            raise ValueError(
                f"request {seq_id} is still {seq.status.value}: "
                "step() until it finishes, or abort() it first"
            )
        return self.output(self.sequences.pop(seq_id))


class LLM:
    """The simple API: LLM(model=...).generate(prompts, params) -> outputs in input order."""

    def __init__(self, model: str = "default", **options: Any):
        self.engine = LLMEngine(model, **options)

    def generate(
        self,
        prompts: str | Iterable[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        ids: list[int] = []
        try:
            for prompt, sp in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, sp))
            while self.engine.has_unfinished():
                self.engine.step()
        except BaseException:
            # Ctrl-C or an error: leave the engine empty, not holding half-done requests.
            for seq_id in ids:
                self.engine.drop(seq_id)
            raise
        return [self.engine.collect(i) for i in ids]


def bytes_per_block(config: EngineConfig, hf_config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of block_size tokens in every layer."""
    per_block = 2 * hf_config.num_hidden_layers * config.block_size * hf_config.num_key_value_heads
    return int(per_block * head_dim_of(hf_config) * dtype.itemsize)


def kv_blocks_that_fit(config: EngineConfig, hf_config: ModelConfig, dtype: torch.dtype) -> int:
    """As many blocks as kv_cache_memory_gb holds, but no more than max_num_seqs full-length
    requests need."""
    by_memory = int(config.kv_cache_memory_gb * 2**30 // bytes_per_block(config, hf_config, dtype))
    by_need = config.max_num_seqs * blocks_needed(config.max_model_len or 0, config.block_size)
    return max(1, min(by_memory, by_need))


def build_model(
    hf_config: ModelConfig,
    state_dict: dict[str, torch.Tensor] | None,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> CausalLM:
    with skip_random_init():
        model = CausalLM(hf_config, max_positions)
    if state_dict is None:
        init_tiny_weights(model)
    else:
        load_weights(model, state_dict)
    return model.to(device=device, dtype=dtype).eval()


def load_weights(model: CausalLM, state_dict: dict[str, torch.Tensor]) -> None:
    try:
        missing, _ = model.load_state_dict(stack_weights(state_dict), strict=False, assign=True)
    except KeyError as e:  # one part of a stacked weight (stack_weights)
        raise ValueError(f"checkpoint lacks weights: {e}; re-download the model") from None
    except RuntimeError as e:  # a weight whose shape config.json does not describe
        lines = [line.strip() for line in str(e).splitlines() if "size mismatch" in line]
        mismatch = lines[0] if lines else str(e)
        raise ValueError(
            f"the weights do not fit config.json: {mismatch[:200]}; re-download the model"
        ) from None
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing:
        raise ValueError(f"checkpoint lacks weights: {', '.join(missing[:3])} ...")


def stack_weights(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's separate q, k, v_proj (gate, up_proj) weights and biases, concatenated."""
    out = dict(state_dict)
    for fused, parts in STACKED.items():
        for name in [n for n in state_dict if f".{parts[0]}." in n]:
            names = [name.replace(parts[0], part) for part in parts]
            out[name.replace(parts[0], fused)] = torch.cat([out.pop(n) for n in names])
    return out


@contextmanager
def skip_random_init() -> Iterator[None]:
    """Leave the weights uninitialised: a checkpoint or init_tiny_weights fills them.

    Not the meta device: its first use is slow to import (docs/benchmarks.md)."""
    saved = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding)}
    for cls in saved:
        cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, init in saved.items():
            cls.reset_parameters = init  # type: ignore[method-assign]


def check_kv_fits(num_kv_blocks: int, bytes_per_block: int, device: torch.device) -> None:
    """Refuse a KV pool bigger than the free memory before allocating it (the OS would kill us)."""
    need = num_kv_blocks * bytes_per_block
    free = free_memory(device)
    if free is not None and need > free:
        raise ValueError(
            f"num_kv_blocks={num_kv_blocks} needs {need / 2**30:.1f} GiB of KV cache but only "
            f"{free / 2**30:.1f} GiB of {device.type} memory is free: lower num_kv_blocks "
            "(or leave it unset to size the pool by kv_cache_memory_gb)"
        )


def free_memory(device: torch.device) -> int | None:
    """Bytes free on the device now; None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def eos_ids(hf_config: ModelConfig, tokenizer: Any) -> frozenset[int]:
    """The config's EOS id or ids, and the tokenizer's."""
    configured = hf_config.eos_token_id
    ids = list(configured) if isinstance(configured, list) else [configured]
    ids.append(getattr(tokenizer, "eos_token_id", None))
    return frozenset(i for i in ids if i is not None)
