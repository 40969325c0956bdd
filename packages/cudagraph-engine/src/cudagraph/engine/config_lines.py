"""What ``cudagraph.config.resolve`` says to a command-line user: its log lines, and its warnings as log lines.

Python callers of ``resolve`` get its warnings as warnings (``LegacyFlagWarning``, ``OverriddenSettingWarning``:
categories they can filter or turn into errors). A command line prints them as the log lines it prints everything
else as, under ``cudagraph.config`` and in the command's log format, without the source line Python's warning display
adds. ``held_config_lines`` also holds them back until the command's input checks pass, so an input error is the only
line on stderr. Nothing here changes what ``resolve`` decides.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

CONFIG_LOGGER = "cudagraph.config"
"""The logger ``resolve`` and its rules log under (a prefix of their modules' loggers)."""


class HeldLines:
    """Log records held back from stderr, in the order they were made; ``release`` emits them."""

    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []

    def release(self) -> None:
        """Emit every held record through its own logger (and so the command's handlers and format), once."""
        records, self.records = self.records, []
        for record in records:
            logging.getLogger(record.name).handle(record)


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_config_lines() -> Iterator[HeldLines]:
    """Hold what ``cudagraph.config`` logs inside the block, and the warnings raised there (each as one WARNING
    record under ``cudagraph.config``, its message only), until ``release()``. Records dropped by the loggers' levels
    (``-q``) are never made; a block that raises holds nothing."""
    held = HeldLines()
    logger = logging.getLogger(CONFIG_LOGGER)
    collect = _Collect(held.records)
    propagate = logger.propagate
    logger.addHandler(collect)
    logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield held
    finally:
        logger.removeHandler(collect)
        logger.propagate = propagate
    if logger.isEnabledFor(logging.WARNING):
        for warning in caught:
            record = logger.makeRecord(
                CONFIG_LOGGER, logging.WARNING, warning.filename, warning.lineno, str(warning.message), (), None
            )
            held.records.append(record)
