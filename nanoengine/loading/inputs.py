"""What a request brings in, checked and tokenized before the engine sees it (vLLM's input
processor): the prompt through the chat template into token ids, and the limits a request must
fit (max_model_len, the KV pool). Outside the inference core: the scheduler only ever sees token
ids that passed here."""

from __future__ import annotations

from typing import Any

from nanoengine.beam_search import BeamSearchParams
from nanoengine.block_manager import blocks_needed
from nanoengine.config import EngineConfig
from nanoengine.loading.validation import check_text, is_int, short_repr
from nanoengine.sampling_params import SamplingParams


class InputProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, config: EngineConfig):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.config = config

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids; a ValueError (one line) for anything the model cannot run."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt: give at least one token of text")
            check_text(prompt, "the prompt")
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
        self.check_token_ids(token_ids, "prompt token")
        return [int(t) for t in token_ids]

    def check_token_ids(self, token_ids: list[Any], what: str) -> None:
        for i, t in enumerate(token_ids):
            if not is_int(t) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"{what} {i} is {short_repr(t)}: "
                    f"token ids are integers in [0, {self.vocab_size})"
                )

    def check_request(
        self, prompt: str | list[int], params: SamplingParams | BeamSearchParams | None = None
    ) -> tuple[list[int], SamplingParams]:
        """The one place a request is validated: its token ids and the params its sequences run
        with (a beam search's: its beams'), or a one-line ValueError saying what was wrong and
        what to do."""
        num_seqs = 1  # the sequences it may hold blocks for at once
        if isinstance(params, BeamSearchParams):
            num_seqs = params.beam_width
            params = params.sampling_params()
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: its fields may have been changed since it was made
        self.check_token_ids(params.stop_token_ids, "stop_token_ids entry")
        self.check_token_ids(list(params.logit_bias), "logit_bias entry")
        # a beam search's beams are all scheduled in one step
        if num_seqs > min(self.config.max_num_seqs, self.config.max_num_batched_tokens):
            raise ValueError(
                f"a beam search of {num_seqs} beams needs max_num_seqs and max_num_batched_tokens "
                f">= {num_seqs}: raise them or lower beam_width"
            )
        token_ids = self.encode_prompt(prompt)
        limit = self.config.max_model_len
        assert limit is not None and self.config.num_kv_blocks is not None
        if len(token_ids) >= limit:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but max_model_len is {limit}: "
                "shorten it or raise max_model_len"
            )
        worst = min(len(token_ids) + params.max_tokens, limit)
        need = num_seqs * blocks_needed(worst, self.config.block_size)
        if need > self.config.num_kv_blocks:
            beams = f" in each of {num_seqs} beams" if num_seqs > 1 else ""
            raise ValueError(
                f"a request of {len(token_ids)} prompt + {params.max_tokens} new tokens{beams} "
                f"needs {need} KV blocks but the pool has {self.config.num_kv_blocks}: "
                f"raise num_kv_blocks or lower max_tokens{' or beam_width' if beams else ''}"
            )
        return token_ids, params
