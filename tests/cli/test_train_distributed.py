"""pynnet3 train --distributed=true on two local ranks (gloo, 127.0.0.1): rank r trains
on minibatches r, r+2, ... and the model rank 0 writes equals a single-process run on
the ranks' minibatches merged pairwise (plain gradient, momentum and max-change on);
a rank with a minibatch more than the other leaves it untrained."""

from __future__ import annotations

import os
import re
import socket
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

_CONFIG = "\n".join([
    "input-node name=input dim=4",
    "component name=a1 type=AffineComponent input-dim=8 output-dim=6 learning-rate=0.1 "
    "max-change=0.2",
    "component-node name=a1 component=a1 input=Append(Offset(input, -1), input)",
    "component name=r1 type=RectifiedLinearComponent dim=6",
    "component-node name=r1 component=r1 input=a1",
    "component name=a2 type=AffineComponent input-dim=6 output-dim=3 learning-rate=0.1",
    "component-node name=a2 component=a2 input=r1",
    "component name=sm type=LogSoftmaxComponent dim=3",
    "component-node name=sm component=sm input=a2",
    "output-node name=output input=sm objective=linear"])
_FLAGS = ["--use-gpu=no", "--momentum=0.5", "--max-param-change=0.3",
          "--store-component-stats=false", "--print-interval=1", "--binary=false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from pynnet3 import Nnet
    from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo
    from pynnet3.io.egs_merge import merge_examples

    folder = tmp_path_factory.mktemp("dist")
    Nnet.from_config(_CONFIG, seed=5).write(folder / "in.txt", binary=False)
    rng = np.random.default_rng(11)
    egs = [NnetExample([NnetIo.from_matrix("input", -1, rng.standard_normal((5, 4))
                                           .astype(np.float32)),
                        NnetIo.from_labels("output", 3, 0, rng.integers(0, 3, 4))])
           for _ in range(36)]
    # by8: 4 minibatches + one extra for rank 0 (ranks: 0 2 4 | 1 3); pairs: (0,1), (2,3)
    with ExampleWriter(f"ark:{folder / 'by8.ark'}") as w:
        for k in range(4):
            w.write(f"mb{k}", merge_examples(egs[4 * k:4 * k + 4]))
        w.write("mb4", merge_examples(egs[16:20]))
    with ExampleWriter(f"ark:{folder / 'pairs.ark'}") as w:
        for k in range(2):
            w.write(f"pair{k}", merge_examples(egs[8 * k:8 * k + 8]))
    return folder


def _rank(rank, world, port, folder):
    import contextlib
    import io

    from pynnet3.cli.main import main

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", *_FLAGS, "--distributed=true", "--distributed-timeout=60",
                     f"{folder}/in.txt", f"ark:{folder}/by8.ark", f"{folder}/out{rank}.txt"])
    with open(f"{folder}/log{rank}.txt", "w") as f:
        f.write(f"exit {code}\n" + err.getvalue())


def test_two_ranks_equal_one_process_on_merged_pairs(data, tmp_path, capsys):
    import torch.multiprocessing as mp

    from pynnet3.cli.files import read_model
    from pynnet3.cli.main import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_rank, args=(2, port, str(data)), nprocs=2, join=False)
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the two training ranks did not finish in 180 s")
    log0, log1 = ((data / f"log{r}.txt").read_text() for r in range(2))
    assert log0.startswith("exit 0") and log1.startswith("exit 0"), (log0, log1)
    assert (data / "out0.txt").exists() and not (data / "out1.txt").exists()
    assert "1 minibatch(es) left untrained" in log0 and "Overall average" in log0
    assert "Overall average" not in log1  # rank 0 speaks for all

    single = tmp_path / "single.txt"
    assert main(["train", *_FLAGS, str(data / "in.txt"), f"ark:{data / 'pairs.ark'}",
                 str(single)]) == 0
    err = capsys.readouterr().err
    number = r"Overall average objective function for 'output' is (\S+) over (\S+) frames"
    assert re.search(number, log0).groups() == re.search(number, err).groups()
    assert "max-change active" in err  # the max-change paths are exercised
    ours, expected = read_model(str(data / "out0.txt")), read_model(str(single))
    for name, comp in expected.components.items():
        for key, p in comp.params().items():
            np.testing.assert_allclose(ours.components[name].params()[key], p,
                                       rtol=1e-5, atol=1e-6)


def test_distributed_needs_the_environment(data, tmp_path, capsys, monkeypatch):
    from pynnet3.cli.main import main

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert main(["train", "--distributed=true", str(data / "in.txt"),
                 f"ark:{data / 'by8.ark'}", str(tmp_path / "o.txt")]) == 1
    assert "torchrun" in capsys.readouterr().err
