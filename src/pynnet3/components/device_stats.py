"""Statistics a GPU run adds to without waiting for the GPU.

Components keep their statistics as NumPy float64 arrays and Python floats (what
Kaldi's files hold, what averaging and ``info`` read). Adding the sum of a GPU
array to one of them would make the host wait for the device on every command
that stores statistics. Instead, :func:`add` keeps such sums on the device
(float64 tensors, one per statistic) and the attribute folds them into the NumPy
value when it is read (:func:`stats_attribute`): a wait happens only when someone
looks. :func:`on_device` gives a statistic's current total (host value plus what
is pending) as an array of a given array's kind, so that math reading it (Kaldi's
self-repair) runs on the device too.

Invariant: the value of statistic ``name`` is ``obj._<name>`` (the stored host
value) plus ``obj._pending_stats[name]`` (device sums not folded in yet, if any).
NumPy arrays and CPU tensors never leave anything pending.
"""

from __future__ import annotations

import numpy as np

from .xp import namespace


def stats_attribute(name: str) -> property:
    """A class attribute for statistic ``name`` stored in ``_<name>``: reading it
    folds pending device sums in; assigning it replaces the value (and drops them)."""
    store = "_" + name

    def get(self):
        pend = self.__dict__.get("_pending_stats")
        if pend and name in pend:
            total = pend.pop(name)
            value = self.__dict__[store]
            host = total.detach().cpu().numpy()  # (the wait, when someone looks)
            if isinstance(value, np.ndarray):
                value += host
            else:
                self.__dict__[store] = value + float(host)
        return self.__dict__[store]

    def set(self, value):
        pend = self.__dict__.get("_pending_stats")
        if pend:
            pend.pop(name, None)
        self.__dict__[store] = value

    return property(get, set, doc=f"Statistic {name!r} (see components/device_stats.py).")


def _defer(value) -> bool:
    """Whether a sum stays on its device (a tensor off the CPU)."""
    return not isinstance(value, (np.ndarray, np.generic)) and value.device.type != "cpu"


def add(obj, name: str, value, in_place: bool = True) -> None:
    """``obj.<name> += value`` (a sum of the backend's arrays: a 1-D array for an
    array statistic, a 0-d one or a NumPy scalar for a number), without reading a
    GPU value. ``in_place=False``: a host array statistic gets a new array
    (``obj.<name> = obj.<name> + value``) rather than being added to."""
    if _defer(value):
        import torch

        pend = obj.__dict__.setdefault("_pending_stats", {})
        v = value.detach().to(torch.float64)
        pend[name] = v if name not in pend else pend[name] + v
        return
    host = value if isinstance(value, (np.ndarray, np.generic)) else \
        value.detach().numpy()
    current = getattr(obj, name)
    if not isinstance(current, np.ndarray):
        setattr(obj, name, current + float(host))
    elif in_place:
        current += host
    else:
        setattr(obj, name, current + host)


def on_device(obj, name: str, like):
    """Statistic ``name``'s current total as an array of ``like``'s kind and device
    (float64), without folding: the host value uploaded plus pending device sums."""
    xp = namespace(like)
    value = obj.__dict__["_" + name]
    if xp.is_numpy:
        return value
    total = xp.asarray(value, like=like, dtype=xp.float64)
    pend = obj.__dict__.get("_pending_stats")
    if pend and name in pend:
        total = total + pend[name]
    return total


def flush(obj) -> None:
    """Fold every pending sum into its host value (waits for the device once)."""
    for name in list(obj.__dict__.get("_pending_stats") or ()):
        getattr(obj, name)


__all__ = ["stats_attribute", "add", "on_device", "flush"]
