"""oneDNN fp32 Linear: a speed swap that changes no result, key or gradient."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import input_size
from torch import nn

import vision_tfm as vt
from vision_tfm import optimize
from vision_tfm.accel import cpu_native_bf16, linear
from vision_tfm.accel.linear import OneDnnLinear, onednn_linear_speedup, use_onednn_linears

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


@pytest.mark.parametrize("pays", [True, False])
@pytest.mark.parametrize("name", ["vit_test", "swin_test", "hybrid_test"])
def test_optimize_swaps_linears_only_where_onednn_measured_faster(monkeypatch, name, pays):
    torch.manual_seed(0)
    model = vt.create_model(name).eval()
    ref = copy.deepcopy(model)
    x = torch.randn(2, *input_size(model))
    with torch.no_grad():
        want = ref(x)
    with monkeypatch.context() as m:  # the keys optimize_for_inference leaves without a swap
        m.setattr(optimize, "onednn_linear_pays", lambda: False)
        keys = list(vt.optimize_for_inference(ref).state_dict())
    monkeypatch.setattr(optimize, "onednn_linear_pays", lambda: pays)
    fast = vt.optimize_for_inference(model)
    swapped = [m for m in fast.modules() if isinstance(m, OneDnnLinear)]
    plain = [m for m in fast.modules() if type(m) is nn.Linear]
    assert (len(swapped) > 0 and not plain) if pays else (not swapped and plain)
    assert list(fast.state_dict()) == keys
    with torch.no_grad():
        got = fast(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_onednn_linear_shares_parameters_falls_back_under_autograd_and_runs_bf16():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    fast = OneDnnLinear.from_linear(lin)
    assert fast.weight is lin.weight and fast.bias is lin.bias
    x = torch.randn(3, 5, 24)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), lin(x), atol=1e-5, rtol=1e-5)
    xg = x.clone().requires_grad_()
    fast(xg).square().sum().backward()  # autograd: F.linear, so gradients flow
    (ref_grad,) = torch.autograd.grad(
        F.linear(x.requires_grad_(), lin.weight, lin.bias).square().sum(), x
    )
    torch.testing.assert_close(xg.grad, ref_grad)
    with torch.no_grad():  # oneDNN's op where bf16 is native, F.linear elsewhere
        want = lin(x.detach())  # before the cast: the two layers share their parameters
        out = fast.to(torch.bfloat16)(x.detach().bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == (3, 5, 40)
    torch.testing.assert_close(out.float(), want, atol=5e-2, rtol=5e-2)


def test_swap_counts_every_plain_linear_and_the_probe_reads_a_ratio():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Sequential(nn.Linear(8, 2)))
    assert use_onednn_linears(model) == 2
    assert use_onednn_linears(model) == 0  # already swapped
    assert onednn_linear_speedup(m=16, k=32, n=64) > 0


@pytest.mark.parametrize(
    ("speedup", "pays"), [(0.0, False), (0.97, False), (1.0, False), (1.04, True)]
)
def test_onednn_is_picked_whenever_the_probe_measured_it_faster(monkeypatch, speedup, pays):
    # no margin: a CPU where oneDNN is a few percent faster (AVX-512 on 256-bit units) gets it
    monkeypatch.setattr(linear, "onednn_linear_speedup", lambda: speedup)
    assert linear.onednn_linear_pays() is pays


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_gelu_matches_linear_then_gelu_and_keeps_it_under_autograd(approximate, dtype):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    fast = OneDnnLinear.from_linear(copy.deepcopy(lin)).to(dtype)
    fast.gelu = approximate
    x = torch.randn(3, 5, 24)
    want = F.gelu(lin(x), approximate=approximate)
    with torch.no_grad():
        got = fast(x.to(dtype)).float()
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(got, want, **tol)
    if dtype == torch.float32:  # autograd runs F.linear and still applies the GELU
        torch.testing.assert_close(fast(x.requires_grad_()), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_inference_swaps_linears_and_fuses_gelu_only_where_bf16_is_native(monkeypatch, native):
    if native and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 kernels on this CPU")
    torch.manual_seed(0)
    model = vt.create_model("vit_test").eval()
    x = torch.randn(2, *input_size(model))
    with monkeypatch.context() as m:  # the reference: addmm, then nn.GELU
        m.setattr(optimize, "cpu_native_bf16", lambda: False)
        ref = vt.optimize_for_inference(copy.deepcopy(model), dtype=torch.bfloat16)
    assert not any(isinstance(m, OneDnnLinear) for m in ref.modules())
    keys = list(ref.state_dict())
    monkeypatch.setattr(optimize, "cpu_native_bf16", lambda: native)
    monkeypatch.setattr(linear, "cpu_native_bf16", lambda: native)
    fast = vt.optimize_for_inference(model, dtype=torch.bfloat16)
    assert list(fast.state_dict()) == keys
    mlps = [m for m in fast.modules() if isinstance(m, vt.layers.Mlp)]
    fused = [m for m in mlps if isinstance(m.fc1, OneDnnLinear) and m.fc1.gelu == "none"]
    assert len(fused) == (len(mlps) if native else 0) and mlps
    assert all(isinstance(m.act, nn.Identity) for m in fused)
    with torch.no_grad():
        want, got = ref(x.bfloat16()).float(), fast(x.bfloat16()).float()
    torch.testing.assert_close(got, want, atol=5e-2 * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_is_reused_and_follows_every_change_to_the_weight(dtype):
    if dtype == torch.bfloat16 and not cpu_native_bf16():
        pytest.skip("bf16 runs F.linear where it is emulated: nothing is packed")
    torch.manual_seed(0)
    lin = nn.Linear(24, 40).to(dtype).requires_grad_(False)
    fast = OneDnnLinear.from_linear(copy.deepcopy(lin))
    x = torch.randn(3, 5, 24).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), lin(x), **tol)
        packed = fast._packed[2]
        fast(x[:1])  # another row count runs on the same packed weight
        assert fast._packed[2] is packed and packed.layout == torch._mkldnn
        assert fast(x[:0]).shape == (0, 5, 40)
    new = {k: torch.randn_like(v) for k, v in lin.state_dict().items()}
    lin.load_state_dict(new)
    fast.load_state_dict(new)  # copies into the weight in place: the pack is stale
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), lin(x), **tol)
        assert fast._packed[2] is not packed
        packed = fast._packed[2]
    fast.weight.data = torch.randn_like(fast.weight)  # what Module.to() does to a parameter
    with torch.inference_mode():
        want = F.linear(x, fast.weight, fast.bias)
        torch.testing.assert_close(fast(x), want, **tol)
        assert fast._packed[2] is not packed
    assert list(fast.state_dict()) == ["weight", "bias"]
    twin = copy.deepcopy(fast)  # the cache is not copied, and the copy packs its own
    assert twin._packed is None
    with torch.inference_mode():
        torch.testing.assert_close(twin(x), want, **tol)


def test_optimize_without_packing_keeps_one_copy_of_each_weight(monkeypatch):
    monkeypatch.setattr(optimize, "onednn_linear_pays", lambda: True)
    torch.manual_seed(0)
    model = vt.create_model("vit_test").eval()
    x = torch.randn(2, *input_size(model))
    with torch.no_grad():
        want = model(x)
    packed = vt.optimize_for_inference(copy.deepcopy(model))
    single = vt.optimize_for_inference(model, pack_weights=False)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(single(x), want, atol=1e-5, rtol=1e-5)
    layers = [m for m in single.modules() if isinstance(m, OneDnnLinear)]
    assert layers and all(m._packed is None for m in layers)
    assert all(m._packed is not None for m in packed.modules() if isinstance(m, OneDnnLinear))
