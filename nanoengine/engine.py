"""The engine loop: add requests, then step() until done. Each step is schedule -> run -> postprocess."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nanoengine.block_manager import BlockManager, blocks_needed
from nanoengine.config import EngineConfig
from nanoengine.loader import load_model
from nanoengine.model import CausalLM, ModelConfig, head_dim_of
from nanoengine.model_runner import ModelRunner, prepare_inputs
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerOutput
from nanoengine.sequence import FinishReason, Sequence
from nanoengine.step_record import NO_WATCH, StepHook, StepWatch


@dataclass(slots=True)
class RequestOutput:
    seq_id: int
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None


class LLMEngine:
    def __init__(self, model: str = "default", **options: Any):
        self.config = config = EngineConfig.from_kwargs(model=model, **options)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = getattr(torch, config.dtype or ("bfloat16" if self.device.type == "cuda" else "float32"))
        loaded = load_model(config.model)
        self.model_name, self.tokenizer, hf_config = loaded.name, loaded.tokenizer, loaded.config
        config.max_model_len = max_model_len = min(config.max_model_len or 4096, hf_config.max_position_embeddings)
        config.num_kv_blocks = num_kv_blocks = config.num_kv_blocks or kv_blocks_that_fit(config, hf_config, dtype)
        self.model = build_model(hf_config, loaded.state_dict, max_model_len, self.device, dtype)
        self.eos_token_ids = eos_ids(hf_config, self.tokenizer)
        self.block_manager = BlockManager(num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            max_model_len,
            self.eos_token_ids,
        )
        self.runner = ModelRunner(
            self.model, num_kv_blocks, config.block_size, self.device, dtype, config.attention_backend
        )
        self.sequences: dict[int, Sequence] = {}  # every request not yet collected
        self.step_hooks: list[StepHook] = []
        self.to_abort: dict[int, int] = {}  # seq_id -> the step the abort was requested before
        self.num_steps = 0

    # ---- requests -------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.config.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            prompt = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        token_ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=False)
        return token_ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        params = params or SamplingParams()
        if (isinstance(prompt, str) and not prompt.strip()) or (not isinstance(prompt, str) and not prompt):
            raise ValueError("empty prompt: give at least one token of text")
        token_ids = self.encode_prompt(prompt)
        limit = self.scheduler.max_model_len
        if len(token_ids) >= limit:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but max_model_len is {limit}: shorten it or raise max_model_len"
            )
        worst = min(len(token_ids) + params.max_tokens, limit)
        need = blocks_needed(worst, self.config.block_size)
        if need > self.block_manager.num_blocks:
            raise ValueError(
                f"a request of {len(token_ids)} prompt + {params.max_tokens} new tokens needs "
                f"{need} KV blocks but the pool has {self.config.num_kv_blocks}: raise "
                f"num_kv_blocks or lower max_tokens"
            )
        seq = Sequence(token_ids, params, prompt if isinstance(prompt, str) else "")
        self.sequences[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq.seq_id

    def abort(self, seq_id: int) -> None:
        """Finishes the request (reason 'abort') at the start of the next step."""
        if seq_id in self.sequences and not self.sequences[seq_id].is_finished:
            self.to_abort.setdefault(seq_id, self.num_steps)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def add_step_hook(self, fn: StepHook) -> None:
        self.step_hooks.append(fn)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One step: schedule -> flatten the batch -> run the model -> postprocess -> hooks.
        Returns the sequences that gained a token."""
        live = self.scheduler.running + list(self.scheduler.waiting)
        if not live:
            return []
        num_running = len(self.scheduler.running)
        watch = StepWatch(self.num_steps, live, self.step_hooks, num_running) if self.step_hooks else NO_WATCH
        aborted = self.apply_aborts()
        out = self.scheduler.schedule()
        out.events.extend(
            ("finished", s.seq_id, {"reason": "abort", "requested_step": requested}) for s, requested in aborted
        )
        model_time, appended, inputs = 0.0, [], None
        if out.seqs:
            inputs = prepare_inputs(out.seqs, self.config.block_size)
            watch.saw_schedule(out.seqs)
            t0 = time.perf_counter()
            token_ids = self.runner.run(out.seqs, inputs)
            model_time = time.perf_counter() - t0
            appended = self.scheduler.postprocess(out, token_ids)
            self.check_stop_strings(appended, out)
        self.num_steps += 1
        watch.publish(model_time, out, inputs, self.block_manager)
        return appended

    def apply_aborts(self) -> list[tuple[Sequence, int]]:
        """Aborts take effect inside a step, so the step record shows the RUNNING -> FINISHED edge.
        Returns each aborted sequence with the step its abort was requested in."""
        aborted = [(s, n) for i, n in self.to_abort.items() if (s := self.sequences.get(i)) and not s.is_finished]
        self.to_abort.clear()
        for seq, _ in aborted:
            self.scheduler.finish(seq, FinishReason.ABORT)
        return aborted

    def check_stop_strings(self, appended: list[Sequence], out: SchedulerOutput) -> None:
        for seq in appended:
            if seq.params.stop and not seq.is_finished:
                tail = self.tokenizer.decode(seq.completion_token_ids[-16:])
                if any(s in tail for s in seq.params.stop):
                    self.scheduler.finish(seq, FinishReason.STOP, out)

    # ---- results --------------------------------------------------------------------------
    def output(self, seq: Sequence) -> RequestOutput:
        text = self.tokenizer.decode(seq.completion_token_ids, skip_special_tokens=True)
        for s in seq.params.stop:
            if s in text:
                text = text[: text.index(s)]
        reason = seq.finish_reason.value if seq.finish_reason else None
        return RequestOutput(
            seq.seq_id, seq.prompt, seq.token_ids[: seq.num_prompt_tokens], seq.completion_token_ids, text, reason
        )

    def collect(self, seq_id: int) -> RequestOutput:
        return self.output(self.sequences.pop(seq_id))


class LLM:
    """The simple API: LLM(model=...).generate(prompts, params) -> outputs in input order."""

    def __init__(self, model: str = "default", **options: Any):
        self.engine = LLMEngine(model, **options)

    def generate(
        self, prompts: str | Iterable[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        while self.engine.has_unfinished():
            self.engine.step()
        return [self.engine.collect(i) for i in ids]


def kv_blocks_that_fit(config: EngineConfig, hf_config: ModelConfig, dtype: torch.dtype) -> int:
    """As many blocks as kv_cache_memory_gb holds, but no more than max_num_seqs full-length requests need."""
    per_block = 2 * hf_config.num_hidden_layers * config.block_size * hf_config.num_key_value_heads
    bytes_per_block = per_block * head_dim_of(hf_config) * dtype.itemsize
    by_memory = int(config.kv_cache_memory_gb * 2**30 // bytes_per_block)
    by_need = config.max_num_seqs * blocks_needed(config.max_model_len or 0, config.block_size)
    return max(1, min(by_memory, by_need))


def build_model(
    hf_config: ModelConfig,
    state_dict: dict[str, torch.Tensor] | None,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> CausalLM:
    if state_dict is None:
        torch.manual_seed(0)  # the tiny model: the same random weights every time
        model = CausalLM(hf_config, max_positions)
    else:
        with skip_random_init():
            model = CausalLM(hf_config, max_positions)
        missing, _ = model.load_state_dict(state_dict, strict=False, assign=True)
        if hf_config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
            missing = [k for k in missing if k != "lm_head.weight"]
        if missing:
            raise ValueError(f"checkpoint lacks weights: {', '.join(missing[:3])} ...")
    return model.to(device=device, dtype=dtype).eval()


@contextmanager
def skip_random_init() -> Iterator[None]:
    """The checkpoint overwrites every weight, so skip the random init (and the meta device,
    whose first use imports ~1.5 s of torch internals)."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved  # type: ignore[method-assign]


def eos_ids(hf_config: ModelConfig, tokenizer: Any) -> frozenset[int]:
    configured = hf_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
