"""Layer templates of the random network generator (:mod:`.random_nets`).

Each template appends the config lines of one layer to a
:class:`~.builder.NetBuilder` and makes its result available to later layers:
feed-forward stacks, TDNN, time-height convolution, statistics pooling,
attention, distribute over x, and recurrences (RNN through a dim-range node, a
later node or itself; Failover to a constant start; LSTM and GRU nonlinearities;
an LSTM from simple components).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .builder import NetBuilder, _node

# -- layer templates -------------------------------------------------------------------------

def layer_ff(b: NetBuilder) -> None:
    """Affine-like transform of a random descriptor, then simple components (or
    the TDNN recipe's ReLU + BatchNorm, whose ReLU output memory compression
    shrinks to its sign)."""
    desc, d = b.desc()
    name, o = b.affine(desc, d, b.dim())
    if b.chance(0.3):
        name, o = b.comp_node(f"type=RectifiedLinearComponent dim={o}", name, "relu")
        after = b.choose((f"type=BatchNormComponent dim={o}",
                          f"type=BatchNormComponent dim={o} test-mode=true",
                          f"type=NoOpComponent dim={o}", f"type=SigmoidComponent dim={o}"))
        b.avail.append(b.comp_node(after, name, "bn"))
    else:
        b.avail.append(b.chain(name, o))


def layer_tdnn(b: NetBuilder) -> None:
    """TdnnComponent with several time offsets (non-simple)."""
    src, d = b.pick() if b.chance(0.6) else b.desc(2)
    offsets = sorted(b.rng.choice(np.arange(-3, 4), size=b.randint(1, 3), replace=False))
    extra = " use-bias=false" if b.chance(0.3) else ""
    name, o = b.comp_node(f"type=TdnnComponent input-dim={d} output-dim={b.dim()} "
                          f"time-offsets={','.join(map(str, offsets))}{extra}", src, "tdnn")
    b.avail.append(b.chain(name, o, 0, 1))


def layer_thconv(b: NetBuilder) -> None:
    """Affine to (filters x height), then TimeHeightConvolution."""
    f_in, h_in = b.randint(1, 2), b.randint(3, 5)
    desc, d = b.desc(2)
    pre, pre_dim = b.affine(desc, d, f_in * h_in)
    if pre_dim != f_in * h_in:  # block/repeat counts may round the affine's output dim
        f_in, h_in = 1, pre_dim

    def make() -> str:
        hoff = sorted(b.rng.choice([-1, 0, 1], size=b.randint(1, 3), replace=False).tolist())
        toff = sorted(b.rng.choice([-1, 0, 1], size=b.randint(1, 3), replace=False).tolist())
        req = sorted(b.rng.choice(toff, size=b.randint(1, len(toff)), replace=False).tolist())
        return (f"type=TimeHeightConvolutionComponent num-filters-in={f_in} "
                f"num-filters-out={b.randint(1, 3)} height-in={h_in} "
                f"height-out={b.randint(1, h_in)} height-offsets={','.join(map(str, hoff))} "
                f"time-offsets={','.join(map(str, toff))} "
                f"required-time-offsets={','.join(map(str, req))} use-natural-gradient=false")

    name, _, o = b.try_component(make, "conv")
    b.lines.append(_node(name, pre))
    b.avail.append(b.chain(name, o, 0, 1))


def layer_stats(b: NetBuilder) -> None:
    """x-vector style StatisticsExtraction + StatisticsPooling, read through Round."""
    src, d = b.pick()
    if d > 8:
        src, d = b.affine(src, d, b.dim(2, 6))
    p = b.randint(1, 2)
    var = b.chance(0.6)
    ext, _, ed = b.component(f"type=StatisticsExtractionComponent input-dim={d} input-period=1 "
                             f"output-period={p} include-variance={str(var).lower()}", "ext")
    b.lines.append(_node(ext, src))
    left, right = p * b.randint(0, 2), p * b.randint(0, 2)
    if left + right == 0:
        right = p
    stddev = var and b.chance(0.6)
    pool, _, pd = b.component(
        f"type=StatisticsPoolingComponent input-dim={ed} input-period={p} left-context={left} "
        f"right-context={right} num-log-count-features={b.randint(0, 1)} "
        f"output-stddevs={str(stddev).lower()}", "pool")
    b.lines.append(_node(pool, ext))
    other, od = b.pick()
    desc = f"Append({other}, Round({pool}, {p}))" if p > 1 else f"Append({other}, {pool})"
    name, o = b.affine(desc, od + pd, b.dim())
    b.avail.append((name, o))


def layer_attention(b: NetBuilder) -> None:
    """RestrictedAttentionComponent (non-simple, with time stride)."""
    left, right = b.randint(0, 2), b.randint(0, 2)
    if left + right == 0:
        left = 1
    args = (f"type=RestrictedAttentionComponent num-heads={b.randint(1, 2)} "
            f"key-dim={b.randint(1, 3)} value-dim={b.randint(1, 3)} "
            f"time-stride={b.randint(1, 2)} num-left-inputs={left} num-right-inputs={right} "
            f"num-left-inputs-required={b.randint(0, left)} "
            f"num-right-inputs-required={b.randint(0, right)} "
            f"output-context={str(b.chance(0.5)).lower()}")
    name, din, dout = b.component(args, "attention")
    desc, d = b.desc(2)
    pre, _ = b.comp_node(f"type=AffineComponent input-dim={d} output-dim={din}", desc, "affine")
    b.lines.append(_node(name, pre))
    b.avail.append((name, dout))


def layer_distribute(b: NetBuilder) -> None:
    """DistributeComponent spreads blocks over x; the consumer gathers them back with
    Offset(.., 0, j) / ReplaceIndex(.., x, j)."""
    o, nb = b.randint(1, 4), b.randint(2, 3)
    desc, d = b.desc(2)
    pre, _ = b.comp_node(f"type=AffineComponent input-dim={d} output-dim={o * nb}", desc,
                         "affine")
    dist, _ = b.comp_node(f"type=DistributeComponent input-dim={o * nb} output-dim={o}", pre,
                          "dist")
    terms = [dist] + [f"Offset({dist}, 0, {j})" if b.chance(0.5) else
                      f"ReplaceIndex({dist}, x, {j})" for j in range(1, nb)]
    name, out = b.affine("Append(" + ", ".join(terms) + ")", o * nb, b.dim())
    b.avail.append((name, out))


def _rec_offset(b: NetBuilder) -> int:
    """Recurrence delay: mostly backwards in time, sometimes forwards (BLSTM-like)."""
    k = b.randint(1, 2)
    return -k if b.chance(0.8) else k


def layer_rnn(b: NetBuilder) -> None:
    """r(t) = f(A [x; r(t-k)]): the loop goes through a dim-range node, a later
    node, or the affine node itself."""
    k = _rec_offset(b)
    desc, d = b.desc(2)
    r, o = b.randint(1, 4), b.dim(3, 10)
    r = min(r, o - 1)
    how = b.randint(0, 2)
    a_name = b.fresh("rnn")
    h_name = b.fresh("rnnh")
    if how == 0:
        rec, rd = b.fresh("dr"), r
    elif how == 1:
        rec, rd = h_name, o
    else:
        rec, rd = a_name, o
    b.lines.append(f"component name={a_name} type=AffineComponent input-dim={d + rd} "
                   f"output-dim={o}")
    b.lines.append(f"component-node name={a_name} component={a_name} "
                   f"input=Append({desc}, IfDefined(Offset({rec}, {k})))")
    nl = b.choose(("TanhComponent", "SigmoidComponent"))
    b.lines.append(f"component name={h_name} type={nl} dim={o}")
    b.lines.append(_node(h_name, a_name))
    if how == 0:
        b.lines.append(f"dim-range-node name={rec} input-node={h_name} dim-offset=0 dim={r}")
        b.features.add("dim-range")
    b.features.add("recurrence")
    b.max_frames = min(b.max_frames, 12)
    if how == 0 and b.chance(0.5):
        b.avail.append((b.dim_range(h_name, r, o - r), o - r))
    else:
        b.avail.append((h_name, o))


def layer_failover_rnn(b: NetBuilder) -> None:
    """c(t) = sigmoid(A [x; Failover(c(t-k), c0)]) with a ConstantComponent start."""
    k = _rec_offset(b)
    o = b.dim(2, 6)
    c0 = b.fresh("c0_")
    b.lines.append(f"component name={c0} type=ConstantComponent output-dim={o} "
                   "output-stddev=1.0")
    same = [n for n, dd in b.avail if dd == o]
    src = c0 if not same or b.chance(0.5) else same[0]  # Kaldi's recipes read itself
    b.lines.append(f"component-node name={c0} component={c0} input={src}")
    desc, d = b.desc(2)
    a, c = b.fresh("fa"), b.fresh("fc")
    b.lines.append(f"component name={a} type=AffineComponent input-dim={d + o} output-dim={o}")
    b.lines.append(f"component-node name={a} component={a} "
                   f"input=Append({desc}, Failover(Offset({c}, {k}), {c0}))")
    b.lines.append(f"component name={c} type=SigmoidComponent dim={o}")
    b.lines.append(_node(c, a))
    b.features.add("recurrence")
    b.max_frames = min(b.max_frames, 12)
    b.avail.append((c, o))


def layer_lstm(b: NetBuilder) -> None:
    """Kaldi's LSTM layer with LstmNonlinearityComponent; c and m are dim-ranges."""
    k = _rec_offset(b)
    cell = b.randint(1, 4)
    desc, d = b.desc(2)
    g, lstm = b.fresh("lstmW"), b.fresh("lstm")
    c, m = b.fresh("lstmc"), b.fresh("lstmm")
    b.lines += [
        f"component name={g} type=NaturalGradientAffineComponent input-dim={d + cell} "
        f"output-dim={4 * cell}",
        _node(g, f"Append({desc}, IfDefined(Offset({m}, {k})))"),
        f"component name={lstm} type=LstmNonlinearityComponent cell-dim={cell}",
        _node(lstm, f"Append({g}, IfDefined(Offset({c}, {k})))"),
        f"dim-range-node name={c} input-node={lstm} dim-offset=0 dim={cell}",
        f"dim-range-node name={m} input-node={lstm} dim-offset={cell} dim={cell}",
    ]
    b.features |= {"recurrence", "dim-range", "LstmNonlinearityComponent"}
    b.max_frames = min(b.max_frames, 10)
    b.avail.append((m, cell))


def layer_gru(b: NetBuilder) -> None:
    """GruNonlinearityComponent fed its own state s(t-k) (a dim-range of its output).
    Its z and r inputs are gates: a Sigmoid makes them so (as Kaldi's recipes do),
    otherwise the state grows without bound."""
    k = _rec_offset(b)
    cell = b.randint(1, 4)
    desc, d = b.desc(2)
    wzr, zr, wh = b.fresh("gruWzr"), b.fresh("gruzr"), b.fresh("gruWh")
    gru, s = b.fresh("gru"), b.fresh("grus")
    xs = f"Append({desc}, IfDefined(Offset({s}, {k})))"
    b.lines += [
        f"component name={wzr} type=AffineComponent input-dim={d + cell} output-dim={2 * cell}",
        _node(wzr, xs),
        f"component name={zr} type=SigmoidComponent dim={2 * cell}",
        _node(zr, wzr),
        f"component name={wh} type=AffineComponent input-dim={d + cell} output-dim={cell}",
        _node(wh, xs),
        f"component name={gru} type=GruNonlinearityComponent cell-dim={cell}",
        _node(gru, f"Append({zr}, {wh}, IfDefined(Offset({s}, {k})))"),
        f"dim-range-node name={s} input-node={gru} dim-offset={cell} dim={cell}",
    ]
    b.features |= {"recurrence", "dim-range", "GruNonlinearityComponent"}
    b.max_frames = min(b.max_frames, 10)
    b.avail.append((s, cell))


def layer_lstm_simple(b: NetBuilder) -> None:
    """An LSTM from simple components, as in Kaldi's test generator: gates from
    affines of [x; r(t-k)], cell c = c1 + c2 with ElementwiseProduct terms and a
    Failover to a constant at the start, projection r a dim-range."""
    k = _rec_offset(b)
    cell, rdim = b.randint(1, 4), b.randint(1, 3)
    desc, d = b.desc(2)
    n = {x: b.fresh(x) for x in ("c0_", "ix", "ic", "i", "fx", "f", "gx", "g", "ca", "cb", "h",
                                 "ox", "o", "m", "rp", "r")}
    cprev = f"Sum(Failover(Offset({n['ca']}, {k}), {n['c0_']}), IfDefined(Offset({n['cb']}, {k})))"
    xr = f"Append({desc}, IfDefined(Offset({n['r']}, {k})))"
    lines = [f"component name={n['c0_']} type=ConstantComponent output-dim={cell} "
             "output-stddev=1.0",
             f"component-node name={n['c0_']} component={n['c0_']} input={n['c0_']}"]

    def node(key: str, args: str, inp: str) -> None:
        lines.append(f"component name={n[key]} {args}")
        lines.append(_node(n[key], inp))

    aff = f"type=NaturalGradientAffineComponent input-dim={d + rdim} output-dim={cell}"
    node("ix", aff, xr)
    node("ic", f"type=PerElementScaleComponent dim={cell} param-stddev=0.5", cprev)
    node("i", f"type=SigmoidComponent dim={cell}", f"Sum({n['ix']}, {n['ic']})")
    node("fx", aff, xr)
    node("f", f"type=SigmoidComponent dim={cell}", n["fx"])
    node("gx", aff, xr)
    node("g", f"type=TanhComponent dim={cell}", n["gx"])
    prod = f"type=ElementwiseProductComponent input-dim={2 * cell} output-dim={cell}"
    node("ca", prod, f"Append({n['f']}, {cprev})")
    node("cb", prod, f"Append({n['i']}, {n['g']})")
    node("h", f"type=TanhComponent dim={cell}", f"Sum({n['ca']}, {n['cb']})")
    node("ox", aff, xr)
    node("o", f"type=SigmoidComponent dim={cell}", f"Sum({n['ox']}, Scale(0.5, {n['h']}))")
    node("m", prod, f"Append({n['o']}, {n['h']})")
    node("rp", f"type=AffineComponent input-dim={cell} output-dim={rdim + 2}", n["m"])
    lines.append(f"dim-range-node name={n['r']} input-node={n['rp']} dim-offset=0 dim={rdim}")
    b.lines += lines
    b.features |= {"recurrence", "dim-range"}
    b.max_frames = min(b.max_frames, 5)
    b.avail.append((n["rp"], rdim + 2))


LAYERS: dict[str, Callable[[NetBuilder], None]] = {
    "ff": layer_ff,
    "tdnn": layer_tdnn,
    "thconv": layer_thconv,
    "stats": layer_stats,
    "attention": layer_attention,
    "distribute": layer_distribute,
    "rnn": layer_rnn,
    "failover_rnn": layer_failover_rnn,
    "lstm": layer_lstm,
    "gru": layer_gru,
    "lstm_simple": layer_lstm_simple,
}

LAYER_WEIGHTS: dict[str, float] = {
    "ff": 4.0, "tdnn": 1.5, "thconv": 0.7, "stats": 0.7, "attention": 0.6,
    "distribute": 0.6, "rnn": 1.5, "failover_rnn": 0.8, "lstm": 0.8, "gru": 0.5,
    "lstm_simple": 0.5,
}
