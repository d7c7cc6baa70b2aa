"""Data-parallel training over ``torch.distributed`` (gloo on CPUs, nccl on GPUs).

:class:`DistributedTrainer` is a :class:`~pynnet3.train.Trainer` whose model change
is combined across the ranks of a process group before it is applied: each rank
runs forward and backward on its own part of the data and adds
``learning_rate * gradient`` to the trainer's delta as usual; the *increments* of
the delta are then all-reduced, so every rank applies the same update (L2,
per-component and global max-change, momentum) to the same model and the models
stay identical. The objective totals are all-reduced too, so the log lines speak
for the whole minibatch.

``reduce="sum"`` (default): the ranks hold the parts of one minibatch; Kaldi's
objective and gradient are sums over frames, so the summed increment is the
gradient of the whole minibatch and a step equals one single-process step on it
(exactly, up to float rounding, for plain-gradient components without BatchNorm).
``reduce="mean"``: each rank holds a whole minibatch and the step uses their
average gradient (Kaldi's model averaging, done every step).

What stays rank-local, as in Kaldi's parallel jobs: natural-gradient
preconditioners (each rank preconditions its own gradient, so with natural
gradient a step is not exactly the single-process one), BatchNorm and nonlinearity
statistics (combine them at the end with :func:`average_component_stats`, or
average models with ``pynnet3 average``), BatchNorm's minibatch statistics in
training mode (computed over each rank's part), and the L2 term's minibatch size.

:func:`shard` gives rank ``r`` every ``world``-th item of an example stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import ConfigError
from .trainer import Trainer


def _dist():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise ConfigError("data-parallel training needs torch (pip install "
                          "'pynnet3[torch]')") from e
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialized: call "
                          "torch.distributed.init_process_group first")
    return torch, dist


def all_reduce_arrays(arrays: list[np.ndarray], group=None, average: bool = False) -> None:
    """Sum (or average) float32/float64 numpy arrays over the ranks, in place, in one
    flat buffer per dtype (one collective call each)."""
    torch, dist = _dist()
    world = dist.get_world_size(group)
    device = _device(torch, dist, group)
    for dtype in sorted({a.dtype for a in arrays}, key=str):
        same = [a for a in arrays if a.dtype == dtype]
        if not same:
            continue
        flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in same])).to(device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        values = flat.cpu().numpy()
        if average:
            values = (values / world).astype(dtype)
        offset = 0
        for a in same:
            # (into ``a`` itself, whatever its layout: reshape(-1) of a column-major
            # array is a copy, and a write to it would be lost)
            a[...] = values[offset:offset + a.size].reshape(a.shape)
            offset += a.size


def _device(torch, dist, group):
    """Where the collectives' tensors live: nccl needs this rank's GPU, gloo the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class DistributedTrainer(Trainer):
    """A Trainer whose per-step model change is all-reduced across the process group
    (see the module doc). Construct it on every rank with the same network and
    options, then call :meth:`train_step` on every rank the same number of times."""

    def __init__(self, nnet, options=None, *, group=None, reduce: str = "sum", **kwargs):
        if reduce not in ("sum", "mean"):
            raise ConfigError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        if not callable(getattr(Trainer, "_forward_backward", None)):
            raise ConfigError("this Trainer has no _forward_backward step to reduce after")
        _dist()
        super().__init__(nnet, options, **kwargs)
        self.group = group
        self.reduce = reduce
        self.broadcast_parameters()

    def broadcast_parameters(self, src: int = 0) -> None:
        """Make every rank's parameters equal to rank ``src``'s."""
        torch, dist = _dist()
        device = _device(torch, dist, self.group)
        for _, comp in sorted(self.nnet.components.items()):
            for _, p in sorted(comp.params().items()):
                t = torch.from_numpy(np.ascontiguousarray(p)).to(device)
                dist.broadcast(t, src=src, group=self.group)
                p[...] = t.cpu().numpy()

    def _forward_backward(self, computation, inputs: dict, supervision: dict) -> dict:
        before = {name: {k: a.copy() for k, a in d.items()} for name, d in self.delta.items()}
        outputs = super()._forward_backward(computation, inputs, supervision)
        increments, names = [], []
        for name in sorted(self.delta):
            for key in sorted(self.delta[name]):
                prior = before.get(name, {}).get(key)
                inc = self.delta[name][key] - prior if prior is not None \
                    else self.delta[name][key].copy()
                increments.append(inc)
                names.append((name, key, prior))
        all_reduce_arrays(increments, self.group, average=self.reduce == "mean")
        for inc, (name, key, prior) in zip(increments, names, strict=True):
            self.delta[name][key][...] = inc if prior is None else prior + inc
        totals = np.array([[o.objective, o.weight] for _, o in sorted(outputs.items())],
                          dtype=np.float64).reshape(-1)
        all_reduce_arrays([totals], self.group)
        for i, (_, o) in enumerate(sorted(outputs.items())):
            o.objective, o.weight = float(totals[2 * i]), float(totals[2 * i + 1])
        return outputs


def average_component_stats(nnet, group=None) -> None:
    """Average every component's statistics over the ranks, in place (what
    ``pynnet3 average`` does to them; parameters are left alone): each rank's
    network becomes the average of the ranks' statistics."""
    from .average import add_component, scale_component

    _, dist = _dist()
    world = dist.get_world_size(group)
    import copy

    for comp in nnet.components.values():
        saved = {k: p.copy() for k, p in comp.params().items()}
        gathered = [None] * world
        dist.all_gather_object(gathered, copy.deepcopy(comp), group=group)
        scale_component(comp, 0.0)
        for other in gathered:
            add_component(comp, 1.0 / world, other)
        for k, p in comp.params().items():
            p[...] = saved[k]


def shard(items: Iterable, rank: int, world_size: int) -> Iterator:
    """Items ``rank, rank + world_size, ...`` of ``items`` (each rank's share of an
    example stream, as Kaldi's jobs each read their own archive)."""
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in [0, {world_size})")
    return itertools.islice(items, rank, None, world_size)


__all__ = ["DistributedTrainer", "all_reduce_arrays", "average_component_stats", "shard"]
