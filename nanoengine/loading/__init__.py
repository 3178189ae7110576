"""Everything outside the inference core (and its line budget): what the engine needs before its
first step -- the checkpoint, the tokenizer, the model built on its device, the KV pool's size
(engine_parts.load_engine_parts) -- and what checks and tokenizes each request before the engine
sees it (inputs.InputProcessor, validation), as vLLM's input processor does.

Importing this package loads nothing: torch comes with engine_parts."""
