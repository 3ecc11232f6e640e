"""SmoothQuant channel balancing (Xiao et al. 2023) on an ONNX graph, before dynamic int8.

Dynamic int8 quantises each MatMul's input with one scale per tensor, at run time. A
LayerNorm output whose channels differ widely in range (a few outlier channels are the rule
in trained Transformers) loses its small channels to the large ones' step. SmoothQuant moves
that range into the weights, which are quantised per output channel and offline: input
channel ``j`` is divided by ``s_j = max|x_j|^a / max|W_j,:|^(1-a)``, folded into the
LayerNorm's scale and bias, and row ``j`` of every weight the norm feeds is multiplied by
``s_j``. The fp32 function is unchanged up to rounding.

It works on the graph, not the module tree, so it serves every family: a norm is balanced
when everything its output reaches, through ops that keep the channel axis (Swin's window
partition, roll and padding), is the activation input of a MatMul with a constant 2-D
weight. A norm that also feeds a residual, an output or anything else is left as it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import DataError, ExportError

SMOOTH_ALPHA = 0.5  # the paper's default migration strength


@dataclass
class _Norm:
    """One LayerNormalization node, the tensors carrying its channels, and the MatMuls fed."""

    node: onnx.NodeProto
    carried: set[str] = field(default_factory=set)
    matmuls: list[onnx.NodeProto] = field(default_factory=list)


class _Graph:
    """Lookups over one graph: consumers, constants, static shapes, initializer use counts."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.graph = g
        self.inits = {t.name: t for t in g.initializer}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        self.uses: dict[str, int] = defaultdict(int)
        for n in g.node:
            for i in n.input:
                self.consumers[i].append(n)
                self.uses[i] += 1
        self.constants = {
            n.output[0]: numpy_helper.to_array(n.attribute[0].t)
            for n in g.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
        }
        self.outputs = {o.name for o in g.output}
        self.producers = {o: n for n in g.node for o in n.output}
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self.shapes: dict[str, list[int | None]] = {}
        for v in (*inferred.value_info, *inferred.input, *inferred.output):
            dims = v.type.tensor_type.shape.dim
            self.shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]

    def const(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        return self.constants.get(name)

    def entries(self, name: str) -> list[float | None] | None:
        """A 1-D int tensor's values where known: a constant, or (as dynamic-size padding is
        built) a Concat of one-element pieces of which only some are constant."""
        a = self.const(name)
        if a is not None:
            return [float(v) for v in a.ravel()]
        node = self.producers.get(name)
        if node is None or node.op_type != "Concat":
            return None
        out: list[float | None] = []
        for i in node.input:
            piece = self.const(i)
            if piece is not None:
                out += [float(v) for v in piece.ravel()]
            elif self.shapes.get(i) == [1]:
                out.append(None)
            else:
                return None
        return out

    def rescale(self, node: onnx.NodeProto, i: int, factor: np.ndarray) -> None:
        """Multiply ``node``'s constant input ``i`` by ``factor``, in a copy of its own if
        other nodes share it (the exporter merges equal constants, such as fresh norms)."""
        name = node.input[i]
        a = numpy_helper.to_array(self.inits[name])
        new = numpy_helper.from_array((a * factor).astype(a.dtype), name)
        if self.uses[name] > 1:
            self.uses[name] -= 1
            new.name = node.input[i] = f"{name}.smoothed{len(self.inits)}"
            self.graph.initializer.append(new)
            self.inits[new.name] = self.graph.initializer[-1]
            self.uses[new.name] = 1
        else:
            self.inits[name].CopyFrom(new)

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def last_dim(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return shape[-1] if shape else None


def _keeps_channels(g: _Graph, n: onnx.NodeProto, src: str, channels: int) -> bool:
    """Whether ``n`` moves or copies whole channel vectors of ``src`` (its last axis) without
    mixing or rescaling them, so a per-channel scale on ``src`` passes straight through."""
    data = n.input if n.op_type == "Concat" else n.input[:1]  # the others are shapes, axes
    if src not in data or any(o in g.outputs for o in n.output):
        return False
    rank = g.rank(src)
    if rank is None:
        return False

    def off_last(axes: Iterable[int]) -> bool:
        return all(int(a) % rank != rank - 1 for a in axes)

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    op = n.op_type
    if op == "Identity":
        return True
    if op == "Reshape":  # row-major: an unchanged last dim keeps each channel vector intact
        return g.last_dim(src) == channels and g.last_dim(n.output[0]) == channels
    if op == "Transpose":
        perm = attrs.get("perm")
        return perm is not None and perm[-1] == rank - 1
    if op in ("Concat", "Split", "Gather"):
        return off_last([attrs.get("axis", 0)])
    if op == "Slice":
        axes = g.const(n.input[3]) if len(n.input) > 3 and n.input[3] else None
        if axes is None:  # default axes: 0 .. len(starts) - 1
            starts = g.const(n.input[1])
            return starts is not None and len(starts) < rank
        return off_last(axes.tolist())
    if op == "Pad":  # zero padding stays zero under any scale
        pads = g.entries(n.input[1]) if len(n.input) > 1 else None
        value = g.const(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        axes = g.const(n.input[3]) if len(n.input) > 3 and n.input[3] else None
        if attrs.get("mode", b"constant") not in (b"constant", "constant") or pads is None:
            return False
        if value is not None and np.any(value != 0):
            return False
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        k = len(axes)
        return all(pads[i] == 0 and pads[i + k] == 0 for i, a in enumerate(axes) if a == rank - 1)
    return False


def _trace(g: _Graph, node: onnx.NodeProto) -> _Norm | None:
    """The norm's reach, or None when it is not balanceable (see the module docstring)."""
    scale = node.input[1] if len(node.input) > 1 else ""
    bias = node.input[2] if len(node.input) > 2 else ""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("axis", -1) != -1 and attrs.get("axis") != (g.rank(node.input[0]) or 0) - 1:
        return None  # normalises over more than the channel axis
    if not (scale in g.inits and bias in g.inits):
        return None
    if len(node.output) > 1 and any(g.uses[o] or o in g.outputs for o in node.output[1:]):
        return None  # mean / inv-std outputs are used
    channels = g.inits[scale].dims[0] if len(g.inits[scale].dims) == 1 else 0
    if not channels:
        return None
    norm = _Norm(node, carried={node.output[0]})
    todo = [node.output[0]]
    if node.output[0] in g.outputs:
        return None
    while todo:
        t = todo.pop()
        for c in g.consumers[t]:
            if c.op_type == "MatMul":
                w = c.input[1]
                if c.input[0] != t or w not in g.inits:
                    return None
                if list(g.inits[w].dims)[:1] != [channels] or len(g.inits[w].dims) != 2:
                    return None
                if c not in norm.matmuls:
                    norm.matmuls.append(c)
            elif _keeps_channels(g, c, t, channels):
                for o in c.output:
                    if o not in norm.carried:
                        norm.carried.add(o)
                        todo.append(o)
            else:
                return None
    # a Concat may only join tensors that all carry this norm's (scaled) channels
    for t in norm.carried:
        for c in g.consumers[t]:
            if c.op_type == "Concat" and not set(c.input) <= norm.carried:
                return None
    return norm if norm.matmuls else None


def _session(model: onnx.ModelProto) -> Any:
    """An onnxruntime session that runs the graph as written (no fusions hide a norm)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _balanceable(g: _Graph) -> list[_Norm]:
    traced = (_trace(g, n) for n in g.graph.node if n.op_type == "LayerNormalization")
    return [n for n in traced if n is not None]


def balanceable_norms(model: onnx.ModelProto) -> list[str]:
    """Output names of the LayerNormalization nodes :func:`smooth_onnx` would balance."""
    return [n.node.output[0] for n in _balanceable(_Graph(model))]


@dataclass
class ChannelRanges:
    """Per-channel ``max|x|`` of each balanceable norm's output over the calibration feeds,
    with one feed and its fp32 outputs for the self-check. Measured once, folded at any alpha.
    """

    amax: dict[str, np.ndarray]
    feed: dict[str, np.ndarray]
    reference: list[np.ndarray]


def channel_ranges(model: onnx.ModelProto, calib: Iterable[dict[str, np.ndarray]]) -> ChannelRanges:
    """Run ``model`` on every calibration feed and record what :func:`smooth_onnx` needs.

    Args:
        model: An fp32 graph (weights inside it, not in external data).
        calib: Input feeds (as an onnxruntime session takes them).
    """
    names = balanceable_norms(model)
    outputs = [o.name for o in model.graph.output]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in names)
    amax: dict[str, np.ndarray] = {}
    first: tuple[dict[str, np.ndarray], list[np.ndarray]] | None = None
    sess = _session(probe)
    for feed in calib:
        ref = sess.run(outputs + names, feed)
        first = first or (feed, ref[: len(outputs)])
        for t, x in zip(names, ref[len(outputs) :], strict=True):
            a = np.abs(x).reshape(-1, x.shape[-1]).max(0)
            amax[t] = np.maximum(amax[t], a) if t in amax else a
    if first is None:
        raise DataError("SmoothQuant needs at least one calibration batch")
    return ChannelRanges(amax, *first)


def smooth_onnx(
    model: onnx.ModelProto,
    calib: Iterable[dict[str, np.ndarray]] | ChannelRanges,
    alpha: float = SMOOTH_ALPHA,
) -> int:
    """Balance every balanceable norm of ``model`` in place; returns how many.

    Args:
        model: An fp32 graph (weights inside it, not in external data).
        calib: Input feeds (as an onnxruntime session takes them), or their
            :func:`channel_ranges` measured on this same graph.
        alpha: How much of the activation range moves into the weights (0: none, 1: all).
    """
    g = _Graph(model)
    norms = _balanceable(g)
    if not norms:
        return 0
    ranges = calib if isinstance(calib, ChannelRanges) else channel_ranges(model, calib)
    for norm in norms:
        w_max = np.max([np.abs(g.const(m.input[1])).max(1) for m in norm.matmuls], axis=0)
        x_max = ranges.amax[norm.node.output[0]]
        s = np.maximum(x_max, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)
        for i in (1, 2):  # the norm's scale and bias
            g.rescale(norm.node, i, 1 / s)
        for m in norm.matmuls:
            g.rescale(m, 1, s[:, None])
    # the balancing is exact algebra: a graph walk that let a mixing op through would show here
    outputs = [o.name for o in model.graph.output]
    after = _session(model).run(outputs, ranges.feed)
    for name, a, b in zip(outputs, ranges.reference, after, strict=True):
        drift = float(np.abs(a - b).max())
        if drift > 1e-3 * (1 + float(np.abs(a).max())):
            raise ExportError(f"SmoothQuant changed fp32 output {name!r} by {drift:.2e}")
    return len(norms)
