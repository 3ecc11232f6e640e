"""The inference fast path changes speed, not results."""

import copy
import gc

import pytest
import torch
from conftest import input_size
from torch._dynamo.utils import counters

import vision_tfm as vt
from vision_tfm import optimize
from vision_tfm.accel import OneDnnLinear
from vision_tfm.layers import LayerScale
from vision_tfm.models import swin_windows
from vision_tfm.models.swin import SwinBlock


def _warm_bn(m, x):
    m.train()
    with torch.no_grad():  # give BatchNorm non-trivial running statistics to fold
        for _ in range(3):
            m(x * 2 + 0.5)
    return m.eval()


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("vit_test", {"init_values": 0.1}),
        ("swin_test", {}),
        ("hybrid_test", {}),
        ("grasp_hybrid_t", {"embed_dim": 32, "num_heads": 2}),
    ],
)
def test_optimize_for_inference_parity(name, kw):
    torch.manual_seed(0)
    m = vt.create_model(name, **kw)
    c, h, w = input_size(m)
    x = torch.randn(2, c, h, w)
    _warm_bn(m, x)
    with torch.no_grad():
        ref = m(x)
    torch.manual_seed(1)
    other = torch.randn(1, c, h + 8, w + 16)
    with torch.no_grad():
        ref_other = m(other)  # another size: exercises the per-size caches
    fast = vt.optimize_for_inference(m)
    assert not any(isinstance(mod, torch.nn.BatchNorm2d) for mod in fast.modules())
    assert not any(isinstance(mod, LayerScale) for mod in fast.modules())
    with torch.no_grad():
        out, out_other = fast(x), fast(other)
        again = fast(x)  # second call hits the caches

    def flat(o):
        return torch.cat([v.flatten() for v in o.values()]) if isinstance(o, dict) else o

    for a, b in ((out, ref), (again, ref), (out_other, ref_other)):
        torch.testing.assert_close(flat(a), flat(b), atol=1e-5, rtol=1e-5)


def _swin_and_reference(**kw):
    """A tiny Swin, an input, and its eager fp32 output before any optimisation."""
    torch.manual_seed(0)
    m = vt.create_model("swin_test", **kw).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return m, x, m(x)


def test_optimize_bf16_weights_stay_close():
    m, x, ref = _swin_and_reference()
    with torch.no_grad():
        fast = vt.optimize_for_inference(m, dtype=torch.bfloat16)
        out = fast(x.bfloat16()).float()
    assert fast.patch_embed.proj.weight.dtype == torch.bfloat16
    assert (out - ref).abs().max().item() < 0.1
    # the frozen bias is a (non-saved) buffer, so .to() moves and casts it with the weights
    attn = fast.layers[0].blocks[0].attn
    assert attn.frozen_bias.dtype == torch.bfloat16 and "frozen_bias" not in str(fast.state_dict())
    with torch.no_grad():
        back = fast.to(torch.float32)(x)
    assert attn.frozen_bias.dtype == torch.float32
    assert (back - ref).abs().max().item() < 0.05


@pytest.mark.parametrize("onednn", [False, True])
def test_optimize_compiled_is_frozen_and_matches_eager(monkeypatch, onednn):
    """The compiled path really freezes: Inductor packs the GEMM weights, which it does only
    for graph constants (``options={"freezing": True}`` alone left them graph inputs), with
    the BLAS or, where it measured faster, oneDNN; outputs stay the eager ones."""
    monkeypatch.setattr(optimize, "onednn_linear_pays", lambda: onednn)
    counters.clear()
    m, x, ref = _swin_and_reference(depths=(2, 2), num_heads=(1, 2))  # shift and merge: enough
    fast = vt.optimize_for_inference(m, compile=True)
    assert fast._orig_mod is m and fast.num_classes == m.num_classes
    swapped = [q for q in m.modules() if isinstance(q, OneDnnLinear)]
    assert all(q.frozen_graph for q in swapped) and bool(swapped) == onednn
    # the graph runs on packed weights, held outside the state dict; a copy drops them
    assert all(q.packed.layout == torch._mkldnn for q in swapped)
    assert not any(k.endswith("packed") for k in m.state_dict())
    assert not any("packed" in q._buffers for q in copy.deepcopy(m).modules())
    with torch._inductor.config.patch(force_disable_caches=True):  # a cache hit packs nothing
        out = fast(x)  # grad mode on: the wrapper runs without autograd
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert not out.requires_grad and not torch._inductor.config.freezing
    packed = "reshape_linear_reshape" if onednn else "linear_weight_pack"
    assert counters["inductor"][f"mkldnn_{packed}_matcher_count"] > 0, dict(counters["inductor"])


def test_compiled_swin_holds_shift_bias_as_constants():
    """Under torch.compile a frozen shifted block's bias + mask is a graph constant, made at
    trace time: rebuilt in the graph, the mask's roll and comparisons ran inside every
    softmax kernel (the README's compiled section has the figures)."""
    m, x, ref = _swin_and_reference()
    fast = vt.optimize_for_inference(m)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref, atol=1e-5, rtol=1e-5)  # fills the eager caches
    # blocks whose window is smaller than the map: the others need no shift there
    shifted = [b for b in fast.modules() if isinstance(b, SwinBlock) and len(b._bias_cache)]
    found = torch._dynamo.explain(fast)(x)
    assert found.graph_break_count == 0
    consts = {
        n.target: getattr(g, n.target)
        for g in found.graphs
        for n in g.graph.nodes
        if n.op == "get_attr" and n.target.startswith("swin_shift_bias_")
    }
    assert len(consts) == len(shifted) > 0
    for b in shifted:
        (eager,) = b._bias_cache._entries.values()  # bias + mask of the one size run
        torch.testing.assert_close(consts[f"swin_shift_bias_{b.block_id}"], eager, rtol=0, atol=0)
    # a copy (EMA, pickling) is another constant: one name twice in a graph breaks AOTAutograd
    twin = copy.deepcopy(shifted[0])
    twin_id = twin.block_id
    assert twin_id != shifted[0].block_id and twin_id in swin_windows._CONSTANT_BIASES
    del twin
    gc.collect()
    assert twin_id not in swin_windows._CONSTANT_BIASES  # its function goes with the block


@pytest.mark.parametrize("name", ["vit_test", "swin_test", "hybrid_test", "grasp_hybrid_t"])
def test_models_compile_to_one_graph(name):
    """A graph break splits torch.compile's work and, per block, exhausts its recompile limit."""
    m = vt.create_model(name)
    x = torch.randn(2, *input_size(m))
    found = torch._dynamo.explain(m)(x)
    assert found.graph_break_count == 0, [b.reason for b in found.break_reasons]
