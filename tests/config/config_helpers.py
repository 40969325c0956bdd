"""Helpers of the cudagraph.config unit tests: a parser with the CUDA-graph flags, its help, recorded warnings."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from cudagraph.config import CudaGraphConfig, add_cli_args, resolve


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_cli_args(parser)
    return parser.parse_args(list(argv))


def help_text() -> str:
    """The ``--help`` text of a parser with the CUDA-graph flags, its white space folded to single spaces."""
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return " ".join(parser.format_help().split())


def resolve_argv(argv: Sequence[str], **kwargs: object) -> CudaGraphConfig:
    return resolve(parse(argv), **kwargs)


@contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
