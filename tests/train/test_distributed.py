"""Data-parallel training over torch.distributed (gloo, two local processes): a
minibatch split across two ranks trains the model exactly as one process training on
the whole minibatch (plain gradient, max-change and momentum on), both ranks end
with the same model, the logged objective is the whole minibatch's; with
reduce="mean" two ranks on the same minibatch equal one process on it."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

_CONFIG = "\n".join([
    "input-node name=input dim=5",
    "component name=a1 type=AffineComponent input-dim=10 output-dim=12 learning-rate=0.2 "
    "max-change=0.3",
    "component-node name=a1 component=a1 input=Append(Offset(input, -1), input)",
    "component name=r1 type=RectifiedLinearComponent dim=12",
    "component-node name=r1 component=r1 input=a1",
    "component name=a2 type=AffineComponent input-dim=12 output-dim=4 learning-rate=0.2",
    "component-node name=a2 component=a2 input=r1",
    "component name=sm type=LogSoftmaxComponent dim=4",
    "component-node name=sm component=sm input=a2",
    "output-node name=output input=sm objective=linear"])
_FLAGS = {"momentum": 0.5, "max-param-change": 0.4, "store-component-stats": False}


def _setup():
    from pynnet3 import Nnet
    from pynnet3.io.egs import NnetExample, NnetIo

    nnet = Nnet.from_config(_CONFIG, seed=3)
    rng = np.random.default_rng(7)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((4, 5))
                                           .astype(np.float32)),
                        NnetIo.from_labels("output", 4, 0, rng.integers(0, 4, 3))])
           for _ in range(16)]
    return nnet, egs


def _step(trainer, nnet, egs):
    from pynnet3.io.egs_merge import merge_examples
    from pynnet3.train.examples import example_minibatch

    mb = example_minibatch(nnet, merge_examples(egs))
    stats = trainer.train_step(mb.request, inputs=mb.inputs, supervision=mb.supervision,
                               orthonormal_constraint_applied_to=[])
    return stats.objective, stats.weight, stats.global_scale


def _params(nnet) -> dict:
    return {f"{n}/{k}": p.copy() for n, c in nnet.components.items()
            for k, p in c.params().items()}


def _worker(rank, world, port, folder, reduce):
    from datetime import timedelta

    import torch.distributed as dist

    from pynnet3.train import TrainerOptions
    from pynnet3.train.distributed import DistributedTrainer, average_component_stats, shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    try:
        nnet, egs = _setup()
        if rank == 1:  # the trainer starts from rank 0's parameters
            for p in nnet.components["a2"].params().values():
                p += 1.0
        trainer = DistributedTrainer(nnet, TrainerOptions.from_flags(_FLAGS), reduce=reduce)
        objs = []
        for step in range(2):
            batch = egs[8 * step:8 * step + 8]
            part = batch[4 * rank:4 * rank + 4] if reduce == "sum" else batch
            objs.append(_step(trainer, nnet, part))
        relu = nnet.components["r1"]  # rank-local statistics, then averaged
        relu.value_sum = np.full(12, 1.0 + rank)
        relu.count = 10.0 * (1 + rank)
        average_component_stats(nnet)
        np.savez(f"{folder}/rank{rank}.npz", objs=np.array(objs), value_sum=relu.value_sum,
                 count=relu.count, shard=list(shard(range(7), rank, world)), **_params(nnet))
    finally:
        dist.destroy_process_group()


def _run_two_ranks(tmp_path, reduce: str) -> list[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_worker, args=(2, port, str(tmp_path), reduce), nprocs=2, join=False)
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the two training processes did not finish in 180 s")
    return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]


def _single(reduce: str) -> tuple[dict, np.ndarray]:
    from pynnet3.train import Trainer, TrainerOptions

    nnet, egs = _setup()
    trainer = Trainer(nnet, TrainerOptions.from_flags(_FLAGS))
    objs = [_step(trainer, nnet, egs[8 * s:8 * s + 8]) for s in range(2)]
    return _params(nnet), np.array(objs)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_two_ranks_equal_one_process(tmp_path, reduce):
    ranks = _run_two_ranks(tmp_path, reduce)
    expected, objs = _single(reduce)
    assert objs[:, 2].min() < 1.0  # the global max-change was active: it is tested too
    for key, value in expected.items():
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key])  # ranks in sync
        np.testing.assert_allclose(ranks[0][key], value, rtol=2e-5, atol=2e-6)
    start, _ = _setup()
    assert max(np.abs(expected[k] - p).max() for k, p in _params(start).items()) > 1e-2
    for r in range(2):
        np.testing.assert_array_equal(ranks[r]["value_sum"], np.full(12, 1.5))
        assert float(ranks[r]["count"]) == 15.0
    assert list(ranks[0]["shard"]) == [0, 2, 4, 6] and list(ranks[1]["shard"]) == [1, 3, 5]
    # The logged objective and weight are the whole minibatch's (summed over ranks).
    np.testing.assert_allclose(ranks[0]["objs"][:, :2] / (2 if reduce == "mean" else 1),
                               objs[:, :2], rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nccl needs a CUDA GPU")
def test_nccl_single_rank_reduces_on_the_gpu(tmp_path):
    """One rank over nccl: the collectives' tensors go to the GPU and come back."""
    import torch.distributed as dist

    from pynnet3.train.distributed import all_reduce_arrays

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        a, b = np.arange(5, dtype=np.float32), np.ones(3)
        all_reduce_arrays([a, b], average=True)
        np.testing.assert_array_equal(a, np.arange(5))
        np.testing.assert_array_equal(b, 1.0)
    finally:
        dist.destroy_process_group()


def test_results_land_in_arrays_of_any_layout(monkeypatch):
    """The reduced values are written into each array itself, a column-major one
    (the network optimizer's layout step stores weights so) included: one gloo rank
    whose all_reduce is made to double the buffer, as two equal ranks would sum."""
    import torch.distributed as dist

    from pynnet3.train.distributed import all_reduce_arrays

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        real = dist.all_reduce

        def doubled(t, *args, **kw):
            out = real(t, *args, **kw)
            t.mul_(2)
            return out

        monkeypatch.setattr(dist, "all_reduce", doubled)
        f = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
        c = np.arange(5, dtype=np.float32)
        all_reduce_arrays([f, c])
        np.testing.assert_array_equal(f, 2 * np.arange(12).reshape(3, 4))
        np.testing.assert_array_equal(c, 2 * np.arange(5))
        assert f.flags.f_contiguous
    finally:
        dist.destroy_process_group()
