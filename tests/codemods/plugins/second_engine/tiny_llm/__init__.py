"""A second inference engine that grew from a copy of SGLang's and kept its words for its own API."""

from tiny_llm.llm import LLM

__all__ = ["LLM"]
