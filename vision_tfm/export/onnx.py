"""ONNX export through ``torch.onnx.export(dynamo=True)`` and its parity check.

``torch.export`` decides a Python branch on the input size once, at the trace size, so the
models take their size-dependent steps unconditionally when sizes are symbolic
(``layers.symbolic``) and one dynamic-H/W graph serves every size. Every export is still
checked against PyTorch on real val images at several sizes, so a graph specialised by
mistake fails instead of shipping.

The fused attention op (SDPA) exports only with 4-D ``(B, heads, N, d)`` inputs: layers that
attend over windows (Swin) take the explicit path for the export (:func:`export_attention`).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError, VisionTfmError
from ..files import user_mode
from ..layers.attention import Attention
from .source import INPUT_NAME, ExportSource, Runner, max_abs_diff

DEFAULT_OPSET = 18
ATTENTION_OPSET = 23  # SDPA -> the ONNX Attention op from here on
MAX_OPSET = 25  # the newest opset onnxruntime 1.32 runs
DYNAMIC_AXES = ("batch", "hw")
SINGLE_FILE_LIMIT = 2_000_000_000
"""Bytes of weights up to which a model is written as one self-contained ``.onnx`` file.

Protobuf caps a serialised model at 2 GiB (2,147,483,648 bytes); the graph itself needs some
of that room. Larger models keep their weights in ``<name>.onnx.data`` beside the graph, and
``model.json`` lists both files."""
ATTENTION_MODES = ("auto", "fused", "explicit")
ORT_SESSION_CONFIG = {
    "session.intra_op.allow_spinning": "1",  # within a run: no wake-up latency per op
    "session.force_spinning_stop": "1",  # after it: idle workers park, the cores are free
    # a trained model's peaked softmax and saturated activations underflow to denormals,
    # which x86 computes in microcode: a trained grasp model ran several times slower without
    # it (the log: docs/results/export.md).
    # It applies to the pool's threads; the calling thread flushes in `denormals_flushed`.
    "session.set_denormal_as_zero": "1",
}


def _keeps_denormals() -> bool:
    """Whether this thread computes denormals (IEEE) rather than flushing them to zero."""
    return bool(np.float32(1e-40) * np.float32(1.0) != 0)


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Flush denormals on the calling thread inside the block, and give the thread back in
    the state it came in. onnxruntime flushes on the thread that creates a session with
    ``set_denormal_as_zero`` and leaves it so: that would change every later float
    computation of the caller's process (numpy's, torch's), not just the model's."""
    restore = _keeps_denormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if restore:
            torch.set_flush_denormal(False)


class ParityError(VisionTfmError, ValueError):
    """ONNX Runtime and PyTorch disagree by more than the tolerance."""


def parse_dynamic(spec: str) -> frozenset[str]:
    """``"batch,hw"`` -> ``{"batch", "hw"}``; ``"none"`` or ``""`` -> fixed shapes."""
    axes = {a.strip() for a in spec.split(",") if a.strip()} - {"none"}
    unknown = sorted(axes - set(DYNAMIC_AXES))
    if unknown:
        raise ConfigError(f"--dynamic: unknown axes {unknown}; use batch, hw, batch,hw or none")
    return frozenset(axes)


def check_opset(opset: int) -> None:
    """The torch.export-based exporter starts at opset 18; onnxruntime stops at ``MAX_OPSET``."""
    if not DEFAULT_OPSET <= opset <= MAX_OPSET:
        raise ConfigError(
            f"unsupported opset {opset}: the exporter and onnxruntime support "
            f"{DEFAULT_OPSET}..{MAX_OPSET} (SDPA becomes the Attention op at >= {ATTENTION_OPSET})"
        )


@contextmanager
def export_attention(model: nn.Module, example: torch.Tensor, mode: str = "auto") -> Iterator[str]:
    """Pick each attention layer's path for export, restoring the flags afterwards.

    ``auto`` probes one forward pass: layers fed ``(B, N, C)`` tokens keep the fused op,
    layers fed windows (more leading dims) take the explicit path. Yields ``"fused"``,
    ``"explicit"``, ``"mixed"`` or ``"none"`` for the metadata.
    """
    if mode not in ATTENTION_MODES:
        raise ConfigError(f"attention mode {mode!r} is unknown; expected one of {ATTENTION_MODES}")
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    prev = [m.fused for m in layers]
    if mode == "auto":
        ndim: dict[nn.Module, int] = {}

        def probe(mod: nn.Module, args: tuple) -> None:
            ndim.setdefault(mod, args[0].ndim)

        hooks = [m.register_forward_pre_hook(probe) for m in layers]
        try:
            with torch.inference_mode():
                model(example)
        finally:
            for h in hooks:
                h.remove()
        for m in layers:
            m.fused = ndim.get(m, 3) == 3  # (B, N, C) tokens -> 4-D q/k/v
    else:
        for m in layers:
            m.fused = mode == "fused"
    try:
        yield _path_label(layers)
    finally:
        for m, flag in zip(layers, prev):
            m.fused = flag


def _path_label(layers: list[Attention]) -> str:
    fused = {m.fused for m in layers}
    if len(fused) != 1:
        return "mixed" if fused else "none"
    return "fused" if fused.pop() else "explicit"


def export_onnx(
    model: nn.Module,
    example: torch.Tensor,
    path: str | Path,
    *,
    output_names: Sequence[str],
    dynamic: frozenset[str] = frozenset({"batch"}),
    opset: int = DEFAULT_OPSET,
    single_file_limit: int | None = None,
) -> None:
    """Export ``model`` traced at ``example`` to ``path``: one file when its weights take at
    most ``single_file_limit`` bytes (default :data:`SINGLE_FILE_LIMIT`), else the graph plus
    ``path.data`` (the weights).

    Raises:
        ValueError: The exporter failed; the message keeps its first line and root cause.
    """
    from torch.export import Dim  # ``opset`` is checked where it enters (check_opset)

    dims: dict[int, Any] = {0: Dim.DYNAMIC} if "batch" in dynamic else {}
    if "hw" in dynamic:
        dims.update({2: Dim.DYNAMIC, 3: Dim.DYNAMIC})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                model,
                (example,),
                None,
                dynamo=True,
                input_names=[INPUT_NAME],
                dynamic_shapes=(dims,) if dims else None,
                opset_version=opset,
                custom_translation_table=_translations(opset),
                verbose=False,
            )
    except Exception as e:
        raise InputError(f"torch.onnx.export failed: {one_line(e)}") from None
    graph = prog.model.graph
    shape = graph.inputs[0].shape
    axis_names = {0: "batch", 2: "height", 3: "width"}
    prog.rename_axes({shape[i]: axis_names[i] for i in dims})
    _name_outputs(graph, output_names)
    inits = graph.initializers.values()
    weights = sum(v.const_value.nbytes for v in inits if v.const_value is not None)
    limit = SINGLE_FILE_LIMIT if single_file_limit is None else single_file_limit
    prog.save(str(path), external_data=weights > limit)


def _translations(opset: int) -> dict[Any, Any]:
    """Exporter overrides: GELU below opset 20 (which has a ``Gelu`` op) in the order ORT fuses.

    The exporter writes erf-GELU as ``x * (0.5 * (1 + erf(x / sqrt 2)))``, which onnxruntime's
    Gelu fusion does not match, leaving 5 element-wise nodes per MLP in fp32 and int8 graphs
    alike; ``(0.5 * x) * (1 + erf(x / sqrt 2))`` is the same function in standard ops and
    fuses. The tanh form is written out as the FastGelu fusion expects.
    """
    if opset >= 20:
        return {}
    from onnxscript import opset18 as op

    def gelu(x: Any, approximate: str = "none") -> Any:
        def c(v: float) -> Any:
            return op.CastLike(v, x)

        if approximate == "tanh":
            inner = op.Mul(
                c(math.sqrt(2 / math.pi)), op.Add(x, op.Mul(c(0.044715), op.Pow(x, c(3.0))))
            )
            return op.Mul(op.Mul(x, c(0.5)), op.Add(c(1.0), op.Tanh(inner)))
        erf = op.Erf(op.Div(x, c(math.sqrt(2.0))))
        return op.Mul(op.Mul(x, c(0.5)), op.Add(erf, c(1.0)))

    return {torch.ops.aten.gelu.default: gelu}


def one_line(e: BaseException, limit: int = 300) -> str:
    """Type and first line of the innermost cause (the exporter wraps the useful one deeply)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:limit]


def _name_outputs(graph: Any, names: Sequence[str]) -> None:
    """Give the graph outputs their public names, renaming internal values that hold them.

    ``output_names=`` in the exporter does not check for clashes: a model computing ``cos``
    internally would get two values named ``cos``, which ONNX rejects.
    """
    if len(graph.outputs) != len(names):
        raise InputError(f"the model has {len(graph.outputs)} outputs, expected {list(names)}")
    taken = {v.name: v for v in graph.inputs}
    taken.update(graph.initializers)
    taken.update((v.name, v) for node in graph for v in node.outputs)
    for value, name in zip(graph.outputs, names):
        other = taken.get(name)
        if other is not None and other is not value:
            other.name = f"{name}_internal_{id(other):x}"
        value.name = name


def model_files(path: str | Path) -> list[Path]:
    """An ONNX file plus its external-data file, where there is one: what must ship together."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return [path, data] if data.exists() else [path]


def file_records(path: str | Path) -> list[dict[str, Any]]:
    """``model.json``'s ``files``: name, size and sha256 of every file the model needs, so a
    copy can be checked where it lands."""
    records = []
    for p in model_files(path):
        with open(p, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        records.append({"name": p.name, "bytes": p.stat().st_size, "sha256": digest})
    return records


def graph_signature(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The graph's ``inputs`` and ``outputs`` as ``model.json`` states them: name, shape (a
    name for a dynamic axis) and dtype, read from the file a runtime will load."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "shape": shape, "dtype": tensor_dtype_to_np_dtype(t.elem_type).name}

    inits = {i.name for i in graph.initializer}
    return {
        "inputs": [describe(v) for v in graph.input if v.name not in inits],
        "outputs": [describe(v) for v in graph.output],
    }


def size_mb(path: str | Path) -> float:
    """Size in MB (10^6 bytes) of the model with its external data."""
    return sum(p.stat().st_size for p in model_files(path)) / 1e6


def ort_session(path: str | Path, threads: int = 0) -> Any:
    """A CPU onnxruntime session on ``threads`` intra-op threads (0 = onnxruntime's choice).

    Workers spin between the ops of a run (a wake-up per small op dominates batch-1 latency)
    and stop when it returns, leaving the cores to the caller; they flush denormals to zero
    (:data:`ORT_SESSION_CONFIG`), and so does the caller's thread in :func:`ort_runner`'s
    runs. Creating the session leaves the caller's floating-point state as it was.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for key, value in ORT_SESSION_CONFIG.items():
        so.add_session_config_entry(key, value)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 4  # fatal only: run errors are raised as exceptions anyway
    with denormals_flushed():
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_runner(session: Any) -> Runner:
    """Wrap a session as a :data:`~vision_tfm.export.source.Runner`; the calling thread's
    share of each run flushes denormals as the pool's threads do."""
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        feed = {name: x.detach().float().contiguous().numpy()}
        with denormals_flushed():
            out = session.run(None, feed)
        return [torch.from_numpy(o) for o in out]

    return run


# --- parity -----------------------------------------------------------------------------------


@dataclass
class ParityCheck:
    """One input shape: the max abs difference, or the error onnxruntime raised."""

    shape: tuple[int, ...]
    max_abs_diff: float
    error: str = ""

    def label(self) -> str:
        return "x".join(map(str, self.shape))

    def ok(self, atol: float) -> bool:
        return not self.error and self.max_abs_diff <= atol


@dataclass
class ParityReport:
    """Parity of an exported model with PyTorch over several real inputs."""

    atol: float
    checks: list[ParityCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok(self.atol) for c in self.checks)

    @property
    def worst(self) -> float:
        return max((c.max_abs_diff for c in self.checks), default=math.inf)

    def summary(self) -> str:
        """One line: the verdict, the worst difference and by how much it missed."""
        shapes = ", ".join(c.label() for c in self.checks)
        if self.ok:
            return f"parity ok: max abs diff {self.worst:.2e} <= {self.atol:.0e} at {shapes}"
        parts = []
        bad = [c for c in self.checks if not c.error and not c.max_abs_diff <= self.atol]
        if bad:
            w = max(bad, key=lambda c: c.max_abs_diff)
            parts.append(
                f"max abs diff {w.max_abs_diff:.2e} > {self.atol:.0e} at {w.label()} "
                f"(over by {w.max_abs_diff - self.atol:.2e}; failing: "
                f"{', '.join(c.label() for c in bad)})"
            )
        crashed = [c for c in self.checks if c.error]
        if crashed:
            shapes = ", ".join(c.label() for c in crashed)
            parts.append(f"onnxruntime failed at {shapes}: {crashed[0].error[:160]}")
        return "parity failed: " + "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: a check that did not run has ``max_abs_diff`` None, not infinity."""
        checks = [asdict(c) for c in self.checks]
        for c in checks:
            if not math.isfinite(c["max_abs_diff"]):
                c["max_abs_diff"] = None
        return {"ok": self.ok, "atol": self.atol, "checks": checks}


def resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinearly resize normalised images (real content at a new size, not noise)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


def parity_inputs(
    source: ExportSource, size: tuple[int, int], dynamic: frozenset[str], n: int = 16
) -> list[torch.Tensor]:
    """Real val images at every check size: a batch of ``n`` and of 1 if the batch is dynamic,
    else single images. The first input's leading images are the export's trace example.
    """
    x = source.batches("val", n, limit=n)[0][0]
    if "batch" in dynamic:
        x = x.repeat(math.ceil(2 / len(x)), 1, 1, 1)  # >= 2: a batch of 1 would be specialised
        batches = [x, x[:1]]
    else:
        batches = [x[i : i + 1] for i in range(min(len(x), 4))]
    H, W = size  # dynamic H/W is checked at the base, a wider and an odd taller size too
    sizes = [(H, W), (H, W + W // 2), (H + H // 2 + 1, W + 1)] if "hw" in dynamic else [size]
    return [resize(b, s) for s in sizes for b in batches]


def check_parity(
    session: Any, reference: Runner, inputs: Sequence[torch.Tensor], atol: float = 1e-4
) -> ParityReport:
    """Compare an onnxruntime session with a reference runner on every input."""
    report = ParityReport(atol)
    run = ort_runner(session)
    for x in inputs:
        ref = reference(x)
        try:
            out = run(x)
        except Exception as e:  # onnxruntime raises its own types
            report.checks.append(ParityCheck(tuple(x.shape), math.inf, one_line(e)))
            continue
        report.checks.append(ParityCheck(tuple(x.shape), max_abs_diff(out, ref)))
    return report


@contextmanager
def staging_dir(parent: Path) -> Iterator[Path]:
    """A temp folder beside the outputs: files are built there, then renamed into place."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".vtfm-export-"))
    tmp.chmod(user_mode(0o777))  # mkdtemp's 0700 would follow a folder renamed into place
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
