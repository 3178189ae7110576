"""nanoengine: a compact, vLLM-style paged-KV inference engine you can read and watch."""

from nanoengine.engine import LLM, LLMEngine, RequestOutput
from nanoengine.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams", "__version__"]
