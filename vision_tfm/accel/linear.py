"""Linear layers through oneDNN where this CPU's BLAS leaves its vector units idle.

torch's fp32 ``addmm`` on x86 calls MKL. On AMD CPUs MKL runs its AVX2 kernels even where
the CPU has AVX-512, while oneDNN, also in every x86 torch build, picks its kernels by the
CPU's flags. Whether it pays is measured, not inferred from a vendor string:
:func:`onednn_linear_speedup` times both libraries on one ViT-S-sized GEMM, once per process,
and ``optimize_for_inference`` swaps Linear layers where oneDNN ran faster. On an Intel CPU,
where MKL runs AVX-512, the two tie and either pick costs nothing. A whole model gains about
what the probe reads, on AMD CPUs with full-width AVX-512 units and with 256-bit ones alike;
``benchmarks/bench_vs_timm.py`` re-measures it (its footer prints the probe and the pick),
and docs/results/speed.md has the figures, one table per CPU kind.

bf16 Linear layers already run oneDNN's GEMM through ``addmm`` where bf16 is native, but
``addmm`` first writes the broadcast bias over the whole output; oneDNN's own Linear op adds
it in the GEMM's epilogue, and can apply the MLP's GELU there too (:func:`fuse_mlp_gelu`),
which saves two passes over the widest activation of a block. In eager inference the weight
is kept in oneDNN's blocked layout (:meth:`OneDnnLinear.packed_weight`) instead of being
reordered on every call.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.mlp import Mlp
from .cpu import cpu_native_bf16, onednn_bf16_runs

PROBE_ROUNDS = 9


def _onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: str | None = None
):
    # 2-D in and out: Inductor's reshape-linear-reshape pass asserts on a 3-D/4-D view
    # oneDNN names nn.GELU's approximate forms alike: "none" (erf) and "tanh"
    attr, algorithm = ("none", "") if gelu is None else ("gelu", gelu)
    y = torch.ops.mkldnn._linear_pointwise(
        x.reshape(-1, x.shape[-1]), weight, bias, attr, [], algorithm
    )
    return y.view(*x.shape[:-1], y.shape[-1])


@functools.cache
def onednn_linear_speedup(m: int = 256, k: int = 384, n: int = 1536) -> float:
    """How many times faster oneDNN runs an fp32 ``(m, k) x (k, n)`` Linear than torch's BLAS
    here, at the current thread count, with its weight packed as :class:`OneDnnLinear` runs
    it; 0 without oneDNN. The two alternate, so a machine that slows down mid-probe slows
    both, and each keeps its best call."""
    if not torch.backends.mkldnn.is_available():
        return 0.0
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    with torch.inference_mode():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns = {"blas": lambda: F.linear(x, w, b), "onednn": lambda: _onednn_linear(x, packed, b)}
        best = dict.fromkeys(fns, float("inf"))
        for fn in fns.values():  # warm-up: oneDNN builds its kernel on the first call
            fn()
        for r in range(PROBE_ROUNDS):
            for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                t = time.perf_counter()
                fns[name]()
                best[name] = min(best[name], time.perf_counter() - t)
    return best["blas"] / best["onednn"]


def onednn_linear_pays() -> bool:
    """oneDNN's fp32 Linear measured faster than the BLAS here. No margin: the probe's noise
    can flip the pick only where the two libraries all but tie, so a wrong pick costs at
    most that difference, while a margin would keep a CPU on the slower one."""
    return onednn_linear_speedup() > 1.0


def _bf16_kernel() -> bool:
    """bf16 through oneDNN's Linear: where bf16 is native (the plan's fact) and torch's own
    device check lets the kernel run (never faked, so a test that fakes a CPU kind falls
    back to ``F.linear`` on a CPU without it)."""
    return cpu_native_bf16() and onednn_bf16_runs()


class OneDnnLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters and state-dict keys) whose CPU inference runs
    oneDNN's Linear op, in fp32 and, where bf16 is native, in bf16; with autograd, other
    dtypes or devices, and while tracing or exporting it is ``F.linear``. ``gelu`` (an
    ``nn.GELU`` approximate form, set by :func:`fuse_mlp_gelu`) applies a GELU after it.

    Under ``torch.compile`` it emits the oneDNN op only when ``frozen_graph`` is set, i.e. the
    graph is compiled with freezing (``optimize_for_inference(compile=True)``): Inductor
    lowers the op only with its weight a graph constant, and left to itself it gives fp32
    GEMMs to the BLAS again. Inductor does not pack a weight handed to this op, and the
    packing op cannot be traced, so :meth:`hold_packed` keeps the packed weight as a buffer,
    which freezing makes a constant.
    """

    frozen_graph: bool = False
    gelu: str | None = None
    pack: bool = True  # eager calls run on :meth:`packed_weight`
    # (the weight it was packed from, its version, packed); holding the source keeps its
    # storage alive, so a new weight can never reuse the address the check compares
    _packed: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def packed_weight(self, rows: int) -> torch.Tensor:
        """The weight in oneDNN's blocked layout, which eager calls would otherwise reorder
        into on every call: packed once, for the rows of the first call (oneDNN's layout
        choice; any row count runs on it), and again whenever the weight changes (a
        ``load_state_dict``, ``.to()``, an in-place edit). It costs a second copy of the
        weight, outside the state dict."""
        w = self.weight
        cached = self._packed
        if (
            cached is None
            or cached[0].data_ptr() != w.data_ptr()
            or cached[0].dtype != w.dtype
            or cached[0].shape != w.shape
            or cached[1] != w._version
        ):
            with torch.no_grad():
                src = w.detach()
                cached = (src, w._version, torch.ops.mkldnn._reorder_linear_weight(src, rows))
            self._packed = cached
        return cached[2]

    def hold_packed(self, rows: int = 256) -> None:
        """Keep the packed weight as the buffer ``packed`` (outside the state dict) for a
        frozen compiled graph to take as a constant. Any row count runs on it, and one packed
        for a few hundred rows ran larger ones as fast as their own did (the speed log in
        ``docs/results/speed.md``). Like the rest of a frozen model, it does not follow later
        changes to the weight."""
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), rows)
        self.register_buffer("packed", packed, persistent=False)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_packed", None)  # a cache: rebuilt on the next call, never pickled or copied
        if "packed" in self._buffers:  # oneDNN's opaque layout pickles and copies not at all
            state["_buffers"] = {k: v for k, v in self._buffers.items() if k != "packed"}
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()
        graph = torch.jit.is_tracing() or (compiling and not self.frozen_graph)
        if (
            graph
            or x.requires_grad
            or self.weight.requires_grad
            or x.device.type != "cpu"
            or x.dtype != self.weight.dtype
            or not (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _bf16_kernel()))
        ):
            y = F.linear(x, self.weight, self.bias)
            return y if self.gelu is None else F.gelu(y, approximate=self.gelu)
        if compiling:  # a frozen graph: the buffer hold_packed made, else the plain weight
            w = self._buffers.get("packed", self.weight)
        elif self.pack:
            w = self.packed_weight(max(1, x.shape[:-1].numel()))
        else:
            w = self.weight
        return _onednn_linear(x, w, self.bias, self.gelu)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> OneDnnLinear:
        """The same layer, sharing ``linear``'s parameters."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, "meta")
        new.weight, new.bias = linear.weight, linear.bias
        return new.train(linear.training)


def use_onednn_linears(model: nn.Module, frozen_graph: bool = False, pack: bool = True) -> int:
    """Swap every plain ``nn.Linear`` of ``model`` for :class:`OneDnnLinear` (in place);
    returns how many were swapped. ``frozen_graph``: the model will only run compiled with
    freezing (see :class:`OneDnnLinear`). ``pack``: calls run on a packed copy of the weight
    (eager: :meth:`OneDnnLinear.packed_weight`; frozen graph: :meth:`~OneDnnLinear.hold_packed`)."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                child = OneDnnLinear.from_linear(child)
                child.frozen_graph, child.pack = frozen_graph, pack
                if frozen_graph and pack:
                    child.hold_packed()
                setattr(parent, name, child)
                swapped += 1
    return swapped


def fuse_mlp_gelu(model: nn.Module) -> int:
    """Move the GELU of every MLP whose ``fc1`` is a :class:`OneDnnLinear` into that layer
    (in place; the MLP's ``act`` becomes ``nn.Identity``, no state-dict key changes); returns
    how many moved. For eager inference: a compiled graph fuses the GELU by itself."""
    fused = 0
    for m in model.modules():
        if isinstance(m, Mlp) and isinstance(m.fc1, OneDnnLinear) and type(m.act) is nn.GELU:
            m.fc1.gelu, m.act = m.act.approximate, nn.Identity()
            fused += 1
    return fused
