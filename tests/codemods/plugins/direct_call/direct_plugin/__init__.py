"""A serving plugin that builds SGLang's decode graph runner itself and guards host work during capture."""
