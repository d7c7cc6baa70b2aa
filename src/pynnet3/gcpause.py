"""Pausing Python's cyclic garbage collector while compiling or optimizing.

Compiling allocates many small objects (steps, commands, submatrices, access
records) and makes no cycles worth collecting, while each collection those
allocations trigger walks the whole heap (the network, every cached
computation). Pauses nest and may overlap across threads: the collector is
turned back on when the last pause ends, and only if it was on when the first
began (a caller's own ``gc.disable()`` is left alone).

The ``pynnet3`` console script also pauses it for a command's start-up
(:func:`pause_start_up` .. :func:`start_up_done`): loading the modules (NumPy's
and ours) and reading and preparing a model make many objects that live as long
as the process, and no garbage cycles; the collections they trigger cost ~6 ms of
a ``compute`` start (a few percent of nnet3-compute's whole run over 12k frames).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (see the module doc)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


_start_up_paused = False


def pause_start_up() -> None:
    """Turn the collector off for a command's start-up (the console script's first
    step; a library caller never pauses it this way). Left alone when it is off."""
    global _start_up_paused
    if gc.isenabled() and not _start_up_paused:
        gc.disable()
        _start_up_paused = True


def start_up_done() -> None:
    """End the start-up pause of :func:`pause_start_up`, if one is on: what start-up
    made (modules, the network) moves to the collector's permanent generation
    (``gc.freeze``: later collections do not walk it again; the few hundred objects
    of start-up's own garbage cycles, measured at a compute start, stay with it)
    and the collector is turned back on. Otherwise nothing (a library caller's
    process is left alone)."""
    global _start_up_paused
    if _start_up_paused:
        _start_up_paused = False
        gc.freeze()
        gc.enable()
