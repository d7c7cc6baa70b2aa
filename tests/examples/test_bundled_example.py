"""The bundled example data (src/pynnet3/examples): small, and exactly what
make_example.py makes -- the features and iVectors bit for bit, the model's
parameters those of tdnnf.config at seed 0 and its BatchNorm statistics those
accumulated over the bundled features."""

from __future__ import annotations

import importlib.util
from importlib import resources

import kaldiio
import numpy as np

import pynnet3

EXAMPLES = resources.files("pynnet3").joinpath("examples")


def _maker():
    spec = importlib.util.spec_from_file_location("make_example",
                                                  str(EXAMPLES.joinpath("make_example.py")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_feature_archive_is_small_and_compressed():
    data = EXAMPLES.joinpath("feats.ark").read_bytes()
    assert len(data) < 200_000
    assert data.count(b"\0BCM ") == 6  # Kaldi's compressed matrices


def test_the_bundled_files_are_what_make_example_makes(tmp_path):
    maker = _maker()
    maker.write_example(tmp_path)
    for name in ("feats.ark", "ivectors.ark"):
        assert (tmp_path / name).read_bytes() == EXAMPLES.joinpath(name).read_bytes(), name
    feats = dict(kaldiio.load_ark(str(EXAMPLES.joinpath("feats.ark"))))
    raw, _ = maker.make_features()
    assert [len(f) for f in feats.values()] == list(maker.LENGTHS)
    for key, f in feats.items():  # CM: 8 bits per value over the column's range
        assert np.abs(f - raw[key]).max() < 0.05

    bundled = pynnet3.read_nnet(EXAMPLES.joinpath("tdnnf.raw"))
    fresh = pynnet3.read_nnet(tmp_path / "tdnnf.raw")
    config = pynnet3.Nnet.from_config(EXAMPLES.joinpath("tdnnf.config").read_text(), seed=0)
    assert list(bundled.components) == list(config.components)
    for name, comp in bundled.components.items():
        for pname, value in comp.params().items():
            np.testing.assert_array_equal(value, config.components[name].params()[pname])
        if comp.type_name == "BatchNormComponent":
            assert comp.count > 0 and comp.count == fresh.components[name].count
            np.testing.assert_allclose(comp.stats_sum, fresh.components[name].stats_sum,
                                       rtol=1e-4, atol=1e-3)
