"""weft's logging: one ``weft`` logger (``logging.getLogger("weft")``), silent unless the
application configures logging or asks for it with ``verbose=`` (``weft.plan``) / ``-v`` (the CLI).

    >>> import logging; logging.basicConfig(level=logging.INFO)   # the application's choice, or
    >>> weft.plan(step, cluster, verbose=True)                    # INFO for this call only (stderr)
    >>> weft.plan(step, cluster, verbose=2)                       # DEBUG: the planner's progress too

The library never prints: results are returned; messages go to this logger.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator, Union

logger = logging.getLogger("weft")
logger.addHandler(logging.NullHandler())

__all__ = ["logger", "verbosity", "level_of"]


def level_of(verbose: Union[bool, int, str, None]) -> int:
    """The logging level of a ``verbose`` argument: False / 0 / None -> WARNING, True / 1 -> INFO,
    2 or more -> DEBUG, or a level name ("INFO", "DEBUG", ...)."""
    if verbose is None or verbose is False:
        return logging.WARNING
    if verbose is True:
        return logging.INFO
    if isinstance(verbose, str):
        level = logging.getLevelName(verbose.upper())
        if not isinstance(level, int):
            raise ValueError(f"verbose: unknown logging level {verbose!r}")
        return level
    if isinstance(verbose, int):
        if verbose < 0:
            raise ValueError(f"verbose must be >= 0, got {verbose}")
        return logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    raise TypeError(f"verbose must be a bool, an int or a level name, got {type(verbose).__name__}")


@contextlib.contextmanager
def verbosity(verbose: Union[bool, int, str, None]) -> Iterator[logging.Logger]:
    """Within the block, the ``weft`` logger emits at ``level_of(verbose)`` and, when nothing else
    would show its records (no handler of its own besides the null one, none on the root logger),
    writes them to stderr. ``verbose`` False / 0 / None changes nothing."""
    level = level_of(verbose)
    if verbose is None or verbose is False or verbose == 0:
        yield logger
        return
    old_level = logger.level
    handler = None
    own = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    if not own and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("weft: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield logger
    finally:
        logger.setLevel(old_level)
        if handler is not None:
            logger.removeHandler(handler)
