"""llama.cpp's side of the bench: the F32 GGUF written from a quantized one, and (where
llama-cpp-python is installed) the single stream and the batch driven through it."""

from __future__ import annotations

import numpy as np
import pytest

from tracer.bench.llama_cpp import weight_bytes, write_f32_gguf


def write_q4_1_gguf(path) -> np.ndarray:
    """A small GGUF with metadata, a Q4_1 matrix and an F32 norm; returns the matrix as stored."""
    import gguf

    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((8, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_block_count(1)
    writer.add_token_list(["<s>", "a", "b"])
    quantized = gguf.quants.quantize(matrix, gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.ffn_up.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.quants.dequantize(quantized, gguf.GGMLQuantizationType.Q4_1)


def test_the_f32_gguf_holds_the_dequantized_weights_and_the_metadata(tmp_path):
    import gguf

    source, target = tmp_path / "m.Q4_1.gguf", tmp_path / "m.F32.gguf"
    stored = write_q4_1_gguf(source)
    assert write_f32_gguf(source, target) == target
    reader = gguf.GGUFReader(target)
    tensors = {t.name: t for t in reader.tensors}
    up = tensors["blk.0.ffn_up.weight"]
    assert up.tensor_type == gguf.GGMLQuantizationType.F32
    np.testing.assert_array_equal(np.asarray(up.data).reshape(8, 64), stored)  # bit for bit
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    assert reader.fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "b"]
    assert reader.fields["llama.block_count"].contents() == 1
    assert weight_bytes(target) == 8 * 64 * 4  # the matrix; the norm is not read as a weight
    assert weight_bytes(source) < 8 * 64  # 4.5 bits a weight: 20 bytes a block of 32


@pytest.mark.real_model
def test_llama_cpp_f32_gives_nanoengine_greedy_tokens():
    pytest.importorskip("llama_cpp")
    from tracer.bench.llama_cpp import gguf_files, llama_batch, llama_single
    from tracer.bench.single import BATCHED, single_request
    from tracer.bench.workload import build_workload

    f32 = gguf_files()["F32"]
    request = single_request(49152)
    from nanoengine import LLM, SamplingParams

    llm = LLM("default", num_threads=1)
    params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True)
    (ours,) = llm.generate([list(request.prompt_token_ids)], params)
    assert llama_single(f32, request, 1)[0].tokens == ours.token_ids
    batch = build_workload(BATCHED, 49152)[:4]
    _, outputs = llama_batch(f32, batch, 1)
    theirs = llm.generate([list(r.prompt_token_ids) for r in batch], params)
    assert sum(o == t.token_ids for o, t in zip(outputs, theirs)) >= 3  # a near tie may flip one


@pytest.mark.real_model
def test_llama_batch_keeps_llama_cpps_notes_off_stderr(capfd):
    """The low-level API's loading and sizing notes (dozens of lines a context) stay out of the bench's
    output, and the binding's logger is left as it was."""
    pytest.importorskip("llama_cpp")
    import logging

    from tracer.bench.llama_cpp import gguf_files, llama_batch
    from tracer.bench.workload import BenchRequest

    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.NOTSET)  # the binding then prints every note
    try:
        requests = [BenchRequest(prompt_token_ids=tuple(range(100, 108 + i)), max_tokens=2) for i in range(3)]
        _, outputs = llama_batch(gguf_files()["F32"], requests, 1)
        assert [len(o) for o in outputs] == [2, 2, 2]
        assert capfd.readouterr().err == ""
        assert logger.level == logging.NOTSET
    finally:
        logger.setLevel(level)
