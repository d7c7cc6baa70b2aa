"""Shortcut compilation on Kaldi's reference networks and on random networks.

* Generated cases whose request has N > 2 identical sequences: the cached
  (shortcut) computation reproduces Kaldi's arrays, and has the size of our full
  compilation (Kaldi's own shortcut and optimized computations are the same size
  in every case, see stats.json).
* The realistic networks at the request shapes of scaling.json (N = 3): results
  and sizes equal to the full compilation.
* Random networks (pynnet3.testing) with a request made regular: results equal
  the unoptimized full compilation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler, mini_request, request_layouts
from tests.cache.common import assert_same_results, check, random_data, run_on_copy
from tests.cache.test_shortcut import SIZE_KEYS
from tests.reference import HAVE_REFERENCE, REF, needs_reference, ref_params

TOL = {"output": 1e-4, "input_deriv": 1e-3, "grad": 1e-3}


def _identical_sequences(request: dict) -> tuple[int, int]:
    """(first n, number of sequences) when every input and output of a request.json
    holds the same consecutive n values, and within each of them every sequence has
    the same (t, x) rows in the same order; (0, 0) otherwise. Worked out from the
    JSON alone, independently of pynnet3's layout code."""
    seen = None
    for spec in request["inputs"] + request["outputs"]:
        rows: dict[int, list] = {}
        for n, t, x in spec["indexes"]:
            rows.setdefault(n, []).append((t, x))
        ns = sorted(rows)
        if ns != list(range(ns[0], ns[0] + len(ns))) or seen not in (None, ns):
            return 0, 0
        if any(rows[n] != rows[ns[0]] for n in ns):
            return 0, 0
        seen = ns
    return seen[0], len(seen)


def _generated_cases() -> list:
    """Generated cases with more than two identical sequences: the shortcut's domain."""
    out = []
    for case in sorted((REF / "generated").glob("case_*")):
        _, num_n = _identical_sequences(json.loads((case / "request.json").read_text()))
        if num_n > 2:
            out.append(case)
    return out


# Counted in generated/case_*/request.json (40 cases): 23 have 3 or 4 identical
# sequences; the others have 1 or 2.
NUM_SHORTCUT_CASES = 23
GENERATED = _generated_cases() if HAVE_REFERENCE else []


@needs_reference
def test_generated_shortcut_cases_are_the_expected_ones():
    """The cases above are all there, and pynnet3's mini request exists for exactly them."""
    assert len(GENERATED) == NUM_SHORTCUT_CASES
    for case in sorted((REF / "generated").glob("case_*")):
        req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
        assert (mini_request(req, request_layouts(req)) is not None) == (case in GENERATED), \
            case.name


def _rel(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-6))


@pytest.mark.parametrize("case", ref_params(GENERATED, "generated shortcut cases"),
                         ids=lambda c: c.name)
def test_generated_case_via_shortcut(case):
    """Unoptimized shortcut computation vs Kaldi's arrays (an independent reference);
    optimized shortcut vs our optimized full compilation (same results and size:
    the optimizer's own correctness is tested elsewhere)."""
    nnet = pynnet3.read_nnet(case / "model.txt")
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items()
              if k.startswith("output_deriv:")}
    cc = CachingCompiler(nnet, optimize=False, check=True)
    comp = cc.compile(req)
    # A network reading absolute n (BackpropTruncation's zeroing depends on n, README)
    # is expanded only from n = 0: expansion numbers the sequences 0 .. N-1.
    reads_n = "<BackpropTruncationComponent>" in (case / "model.txt").read_text()
    n0, _ = _identical_sequences(json.loads((case / "request.json").read_text()))
    expanded = not reads_n or n0 == 0
    assert cc.info()["shortcut"] == int(expanded), cc.info()
    res = pynnet3.run(nnet.copy(), comp, inputs, derivs)
    failures = []
    for key, ref in arrays.items():
        kind, _, name = key.partition(":")
        if kind == "output":
            ours = res.outputs.get(name)
        elif kind == "input_deriv":
            ours = res.input_derivs.get(name)
        elif kind == "grad":
            comp_name, _, param = name.partition(":")
            ours = res.gradients.get(comp_name, {}).get(param)
        else:
            continue
        err = float("inf") if ours is None else _rel(ours, ref)
        if not err <= TOL[kind]:
            failures.append(f"{key}: rel error {err:.3g}")
    assert not failures, failures

    cc = CachingCompiler(nnet, check=True)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == int(expanded), cc.info()
    full = pynnet3.compile(nnet, req)
    st, st_full = comp.stats(), full.stats()
    assert {k: st[k] for k in SIZE_KEYS} == {k: st_full[k] for k in SIZE_KEYS}
    assert_same_results(pynnet3.run(nnet.copy(), comp, inputs, derivs),
                        pynnet3.run(nnet.copy(), full, inputs, derivs), 1e-6, case.name)


def _scaling_request(nnet, net: str, shape: str, n_seqs: int):
    train = shape == "train"
    frames = 20 if train else 150
    left, right = nnet.context()

    def rows(t0, t1):
        n, t = np.meshgrid(np.arange(n_seqs), np.arange(t0, t1), indexing="ij")
        return np.stack([n.ravel(), t.ravel(), np.zeros(n.size, dtype=np.int64)], axis=1)

    if net == "xvector":
        ins = [pynnet3.IoSpecification("input", rows(0, frames + 7))]
        out = rows(0, 1)
    else:
        ins = [pynnet3.IoSpecification("input", rows(-left, frames + right))]
        out = rows(0, frames)
    if "ivector" in nnet.input_names():
        ins.append(pynnet3.IoSpecification("ivector", rows(0, 1)))
    outs = [pynnet3.IoSpecification(name, out.copy(), train) for name in nnet.output_names()]
    return pynnet3.ComputationRequest(ins, outs, train, False)


REALISTIC = [(net, shape) for net in ("tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn", "xvector")
             for shape in ("train",)] + [("tdnn_relu_bn", "decode")]


@needs_reference
@pytest.mark.parametrize("net,shape", REALISTIC)
def test_realistic_network_via_shortcut(net, shape):
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    req = _scaling_request(nnet, net, shape, 3)
    cc = CachingCompiler(nnet)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == 1
    check(comp, nnet, "expanded realistic")
    full = pynnet3.compile(nnet, req)
    st, st_full = comp.stats(), full.stats()
    assert {k: st[k] for k in SIZE_KEYS} == {k: st_full[k] for k in SIZE_KEYS}
    inputs, derivs = random_data(nnet, req, dtype=np.float32)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs, np.float32),
                        run_on_copy(nnet, full, inputs, derivs, np.float32), 1e-5, net)


def _regularize(case, n_seqs: int, order: str):
    """The case's request made regular: the rows of one sequence (one that every
    output has), repeated for ``n_seqs`` sequences."""
    req = case.request
    specs = req.inputs + req.outputs
    common = set.intersection(*[set(s.indexes[:, 0].tolist()) for s in specs])
    if not common:
        return None
    n_keep = min(common)
    made = []
    for s in specs:
        one = s.indexes[s.indexes[:, 0] == n_keep]
        one = one[np.lexsort((one[:, 2], one[:, 1]))]
        idx = np.concatenate([one + np.array([n - n_keep, 0, 0]) for n in range(n_seqs)])
        if order == "t":
            idx = idx[np.lexsort((idx[:, 0], idx[:, 2], idx[:, 1]))]
        made.append(pynnet3.IoSpecification(s.name, idx, s.has_deriv))
    k = len(req.inputs)
    return pynnet3.ComputationRequest(made[:k], made[k:], req.need_model_derivative,
                                      req.store_component_stats)


@pytest.mark.parametrize("seed", range(30))
def test_random_network_via_shortcut(seed):
    """Unoptimized: shortcut vs full compilation. Optimized: shortcut vs the full
    compilation with the same options (results and size), so that a bug of an
    optimization pass shows up in the optimizer's tests, not here."""
    from pynnet3.testing import case_for_seed

    case = case_for_seed(seed)
    nnet = case.build_nnet()
    for p in (c for c in nnet.components.values()):
        for key, val in list(vars(p).items()):
            if isinstance(val, np.ndarray) and val.dtype == np.float32:
                setattr(p, key, val.astype(np.float64))
    req = _regularize(case, 4, "t" if seed % 2 else "n")
    if req is None:
        pytest.skip("no sequence common to every input and output")
    inputs, derivs = random_data(nnet, req, seed=seed)
    for optimize in (False, True):
        try:
            full = pynnet3.compile(nnet, req, optimize=optimize)
        except pynnet3.errors.ComputeError:
            pytest.skip("the regularized request is not computable")
        cc = CachingCompiler(nnet, optimize=optimize, check=True)
        comp = cc.compile(req)
        info = cc.info()
        assert info["shortcut"] + info["shortcut_fallbacks"] == 1
        if not optimize:
            assert info["shortcut"] == 1  # the compiler's own output always expands
        assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                            run_on_copy(nnet, full, inputs, derivs), 1e-8,
                            f"seed {seed} optimize={optimize}")
        if info["shortcut"]:
            st, st_full = comp.stats(), full.stats()
            assert {k: st[k] for k in SIZE_KEYS} == {k: st_full[k] for k in SIZE_KEYS}
