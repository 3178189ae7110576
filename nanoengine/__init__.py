"""nanoengine: a compact, vLLM-style paged-KV inference engine you can read and watch.

LLM, LLMEngine and RequestOutput load the engine, and with it torch (about 2 s), when first used:
importing a light module such as nanoengine.sequence (the replay does) does not pay for it."""

from typing import TYPE_CHECKING

from nanoengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanoengine.engine import LLM, LLMEngine, RequestOutput

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'nanoengine' has no attribute {name!r}")
    from nanoengine import engine

    return getattr(engine, name)
