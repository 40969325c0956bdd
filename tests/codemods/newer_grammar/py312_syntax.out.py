"""A plugin written for Python 3.12: PEP 695 aliases and type parameters, PEP 701 f-strings."""

from cudagraph.runner import DecodeCudaGraphRunner, get_batch_sizes_to_capture

type GraphRunner = DecodeCudaGraphRunner | None


class Registry[K]:
    def __init__(self) -> None:
        self.runners: dict[K, GraphRunner] = {}

    def describe(self, key: K) -> str:
        runner = self.runners[key]
        return f"{key}: {type(runner).__name__ if runner else "none"} ({", ".join(["graphed", "eager"])})"


def sizes[T](config: T) -> list[int]:
    return get_batch_sizes_to_capture(config)
