"""Golden tests: nanoengine's greedy tokens equal Hugging Face transformers' greedy generate."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from nanoengine import LLM, SamplingParams

NUM_NEW = 32


def hf_greedy(hf_model, prompt_ids: list[int], num_new: int = NUM_NEW) -> list[int]:
    ids = torch.tensor([prompt_ids])
    hf_model.generation_config.eos_token_id = None  # like ignore_eos: never stop early
    out = hf_model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_new, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.real_model
def test_smollm2_batch_matches_hf():
    from nanoengine.loading.checkpoint import ensure_default_model

    prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "hi",
        "Explain how a paged KV cache works in an inference engine, step by step, with an example.",
        "List three colours.",
        "What is 2+2?",
        "Tell me a story about a dragon who learned to code in Python and became famous for it.",
        "Translate 'good morning' to Spanish.",
        "Why is the sky blue? Answer in one sentence.",
    ]
    # A small block size and token budget so the batch mixes chunked prefill and decodes.
    llm = LLM("default", block_size=8, max_num_batched_tokens=96)
    outs = llm.generate(prompts, SamplingParams(max_tokens=NUM_NEW, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32).eval()
    lengths = {len(o.prompt_token_ids) for o in outs}
    assert len(lengths) >= 6, "prompts should have different lengths"
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, out.prompt_token_ids), prompt
    assert "Paris" in outs[0].text


FAMILIES = {
    "llama": lambda **kw: LlamaConfig(**kw),
    "qwen2": lambda **kw: Qwen2Config(**kw),
    "qwen3": lambda **kw: Qwen3Config(head_dim=32, **kw),
}


def save_tiny_checkpoint(family: str, folder, max_position_embeddings: int = 512):
    """A random tiny model of the family, saved with save_pretrained; returns the HF model."""
    # A large init range spreads the logits, so float noise cannot flip a greedy choice.
    config = FAMILIES[family](
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.3,
        tie_word_embeddings=family == "qwen3",
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(folder)
    return hf


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_checkpoints_match_hf(family, tmp_path):
    hf = save_tiny_checkpoint(family, tmp_path)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 5, 17, 40)]
    llm = LLM(str(tmp_path), block_size=4, max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(max_tokens=NUM_NEW, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, prompt), f"{family}, prompt of {len(prompt)} tokens"


def test_a_prefix_hit_on_blocks_computed_in_the_same_step_matches_hf(tmp_path):
    """B and C hit A's blocks in the step A computes them: their greedy tokens are still HF's."""
    hf = save_tiny_checkpoint("llama", tmp_path)
    shared = torch.randint(3, 300, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    prompts = [shared + [5], shared + [6, 7], shared]
    llm = LLM(str(tmp_path), block_size=4, max_num_batched_tokens=64)
    steps = []
    llm.engine.add_step_hook(steps.append)
    outs = llm.generate(prompts, SamplingParams(max_tokens=NUM_NEW, ignore_eos=True))
    assert [s.num_scheduled_tokens for s in steps[0].seqs] == [18, 3, 1]  # 16 tokens hit, twice
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf, prompt), f"prompt of {len(prompt)} tokens"
