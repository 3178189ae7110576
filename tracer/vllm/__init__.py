"""vLLM v1 beside nanoengine: record vLLM's own scheduler in nanoengine's trace format (docs/vllm.md)."""
