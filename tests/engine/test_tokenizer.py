"""nanoengine reads a tokenizer folder with the `tokenizers` library (nanoengine/loading/tokenizer.py: Tokenizer),
not through transformers: the same ids, text and chat prompts as transformers' own tokenizer of the
folder, and no transformers import on the way to the first token."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nanoengine.loading.tokenizer import Tokenizer, load_tokenizer

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! 🙂"},
        {"role": "user", "content": "naïve café 東京"},
    ],
]
TEXTS = ["Hello", "  two  spaces\n\ttab", "naïve café 東京 🙂 don't 1234", "<|im_start|>user\nhi<|im_end|>", ""]


def assert_same_as_transformers(folder: Path, num_ids: int = 500) -> None:
    from transformers import AutoTokenizer

    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert isinstance(ours, Tokenizer)
    assert ours.eos_token_id == theirs.eos_token_id and ours.vocab_size == len(theirs)
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()  # the trace's digest
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    rng = random.Random(0)
    for _ in range(num_ids):
        ids = [rng.randrange(len(theirs)) for _ in range(rng.randrange(1, 20))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        for prompt in (True, False):
            expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt) == expected


def save_small_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "hello", "world", "café", "!", "[UNK]"]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=template
    )
    hf.save_pretrained(folder)


def test_a_small_saved_tokenizer_reads_as_transformers_reads_it(tmp_path):
    save_small_tokenizer(tmp_path)
    assert_same_as_transformers(tmp_path)
    assert load_tokenizer(tmp_path).encode("hello café world !") == [3, 5, 4, 6]


@pytest.mark.real_model
def test_the_default_models_tokenizer_reads_as_transformers_reads_it():
    from nanoengine.loading.checkpoint import ensure_default_model

    assert_same_as_transformers(ensure_default_model(), num_ids=3000)


@pytest.mark.real_model
def test_the_first_token_imports_no_transformers():
    code = (
        "import sys\nfrom nanoengine import LLM, SamplingParams\n"
        "LLM('default', num_threads=1).generate('Hello', SamplingParams(max_tokens=1))\n"
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "False"


def test_a_decode_stream_runs_on_its_backend(tmp_path):
    from tokenizers.decoders import DecodeStream

    save_small_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    stream = DecodeStream(skip_special_tokens=True)
    pieces = [stream.step(tokenizer.backend_tokenizer, t) for t in tokenizer.encode("hello world")]
    assert "".join(p for p in pieces if p) == tokenizer.decode(tokenizer.encode("hello world"))
    assert json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"] == "WordLevel"


def test_special_tokens_written_as_added_token_objects_are_read(tmp_path):
    save_small_tokenizer(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token"] = {"__type": "AddedToken", "content": "</s>", "special": True}  # older files
    config_file.write_text(json.dumps(config))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.eos_token_id == 2 and tokenizer.special_tokens["eos_token"] == "</s>"
    chat = [{"role": "user", "content": "hello"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False) == "<s>user: hello</s>\n"


def test_a_folder_whose_decode_tidies_spaces_keeps_transformers_tokenizer(tmp_path):
    save_small_tokenizer(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "clean_up_tokenization_spaces": True}))
    tokenizer = load_tokenizer(tmp_path)
    assert not isinstance(tokenizer, Tokenizer)
    assert tokenizer.decode([3, 6]) == "hello!"  # transformers' clean-up: "hello !" -> "hello!"
