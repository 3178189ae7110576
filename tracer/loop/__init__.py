"""A live engine loop: one thread owns an LLMEngine and steps it while requests arrive over time."""
