"""A speculative-decoding plugin for SGLang: the draft model's graph runner."""
