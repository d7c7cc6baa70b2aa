"""Examples-archive throughput: write, read (binary), merge (nnet3-merge-egs) and turn
merged minibatches into training inputs, on synthetic TDNN-style examples (46 x 40
features, half of them compressed, 20 one-hot labels of a 3000-pdf output).

    .venv/bin/python benchmarks/egs.py [--num-egs 4096] [--minibatch-size 128]

Prints one line per stage: seconds and examples (or minibatches) per second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pynnet3 import Nnet
from pynnet3.io.egs import NnetExample, NnetIo, examples_bytes, parse_examples
from pynnet3.io.egs_merge import ExampleMerger
from pynnet3.train.examples import example_minibatch


def _examples(num: int, rng) -> list[tuple[str, NnetExample]]:
    out = []
    for i in range(num):
        io = NnetIo.from_matrix("input", -16, rng.standard_normal((46, 40)).astype(np.float32))
        eg = NnetExample([io, NnetIo.from_labels("output", 3000, 0,
                                                 rng.integers(0, 3000, 20))])
        out.append((f"eg{i:06d}", eg.compress() if i % 2 else eg))
    return out


def _line(stage: str, seconds: float, count: int, unit: str) -> None:
    print(f"{stage:<28} {seconds:8.3f} s  {count / seconds:10.0f} {unit}/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-egs", type=int, default=4096)
    ap.add_argument("--minibatch-size", type=int, default=128)
    args = ap.parse_args()
    egs = _examples(args.num_egs, np.random.default_rng(0))

    t = time.perf_counter()
    data = examples_bytes(egs)
    _line(f"write ({len(data) / 1e6:.0f} MB)", time.perf_counter() - t, len(egs), "egs")

    t = time.perf_counter()
    back = [eg for _, eg in parse_examples(data)]
    _line("read", time.perf_counter() - t, len(back), "egs")

    t = time.perf_counter()
    merged = list(ExampleMerger(str(args.minibatch_size)).merge_all(back))
    _line(f"merge ({args.minibatch_size} per minibatch)", time.perf_counter() - t,
          len(back), "egs")

    t = time.perf_counter()
    merged_bytes = examples_bytes(merged)
    again = [eg for _, eg in parse_examples(merged_bytes)]
    _line("write + read merged", time.perf_counter() - t, len(again), "minibatches")

    config = "\n".join([
        "input-node name=input dim=40",
        "component name=a type=NaturalGradientAffineComponent input-dim=40 output-dim=3000",
        "component-node name=a component=a input=input",
        "output-node name=output input=a"])
    nnet = Nnet.from_config(config, seed=0)
    t = time.perf_counter()
    for eg in again:
        example_minibatch(nnet, eg)
    _line("request + inputs + dense sup.", time.perf_counter() - t, len(again), "minibatches")


if __name__ == "__main__":
    main()
