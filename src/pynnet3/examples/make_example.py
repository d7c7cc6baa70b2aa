"""How the bundled example data were made (run from the repository root:
``python src/pynnet3/examples/make_example.py``; tests/examples checks that the
bundled files are what this makes).

- ``feats.ark``: 6 utterances ``spk1-utt1`` .. ``spk1-utt6`` of 40-dim features
  (1520 frames; standard normal, like mean- and variance-normalized MFCCs), stored as
  Kaldi's compressed matrices (``CM``, kSpeechFeature), as most feature archives are.
- ``ivectors.ark``: one 100-dim iVector per utterance (float vectors).
- ``tdnnf.raw``: the network of ``tdnnf.config`` (``pynnet3 init``, seed 0) with its
  BatchNorm statistics accumulated over ``feats.ark`` (one training-mode pass with
  ``store_component_stats``), as a trained model carries them; a network straight
  from its config has none, and in test mode Kaldi (and pynnet3) would invent random
  ones. Kaldi binary format.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

LENGTHS = (312, 187, 250, 401, 96, 274)
SEED = 2016


def make_features() -> tuple[dict, dict]:
    """(features, iVectors) by utterance, before compression."""
    rng = np.random.default_rng(SEED)
    feats = {f"spk1-utt{i + 1}": rng.standard_normal((n, 40)).astype(np.float32)
             for i, n in enumerate(LENGTHS)}
    ivectors = {k: (0.5 * rng.standard_normal(100)).astype(np.float32) for k in feats}
    return feats, ivectors


def make_model(config: str, feats: dict, ivectors: dict):
    """The config's network (seed 0) with BatchNorm stats from ``feats``."""
    import pynnet3

    nnet = pynnet3.Nnet.from_config(config, seed=0)
    left, right = nnet.context()
    for key, f in feats.items():
        request = pynnet3.ComputationRequest.from_frames(
            range(-left, len(f) + right), range(len(f)), ivector=True)
        request.store_component_stats = True
        rows = np.clip(np.arange(-left, len(f) + right), 0, len(f) - 1)
        pynnet3.run(nnet, pynnet3.compile(nnet, request),
                    {"input": f[rows], "ivector": ivectors[key][None, :]})
    return nnet


def write_example(folder: Path) -> None:
    """Write feats.ark, ivectors.ark and tdnnf.raw into ``folder`` (the model's stats
    come from the features as read back, i.e. after compression)."""
    import kaldiio

    feats, ivectors = make_features()
    kaldiio.save_ark(str(folder / "feats.ark"), feats, compression_method=2)
    kaldiio.save_ark(str(folder / "ivectors.ark"), ivectors)
    stored = dict(kaldiio.load_ark(str(folder / "feats.ark")))
    config = (Path(__file__).parent / "tdnnf.config").read_text()
    make_model(config, stored, ivectors).write(folder / "tdnnf.raw", binary=True)


if __name__ == "__main__":
    write_example(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
