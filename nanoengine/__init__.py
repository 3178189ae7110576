"""nanoengine: a compact, vLLM-style paged-KV inference engine you can read and watch.

LLM, LLMEngine and RequestOutput load the engine, and with it torch (about 2 s), when first used:
importing a light module such as nanoengine.sequence (the replay does) does not pay for it."""

import importlib
from typing import TYPE_CHECKING

from nanoengine.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from nanoengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanoengine.engine import LLMEngine
    from nanoengine.llm import LLM
    from nanoengine.outputs import CompletionOutput, RequestOutput

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "CompletionOutput",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "__version__",
]
LAZY = {
    "LLM": "nanoengine.llm",
    "LLMEngine": "nanoengine.engine",
    "CompletionOutput": "nanoengine.outputs",
    "RequestOutput": "nanoengine.outputs",
}


def __getattr__(name: str) -> object:
    if name not in LAZY:
        raise AttributeError(f"module 'nanoengine' has no attribute {name!r}")
    return getattr(importlib.import_module(LAZY[name]), name)
