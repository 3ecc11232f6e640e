"""The planned attention swap changes kernels, not results, parameters or keys."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from conftest import input_size

import vision_tfm as vt
from vision_tfm.accel import (
    PlannedAttention,
    prepare_for_training,
    scaled_scores,
    use_planned_attention,
)
from vision_tfm.accel import attention as planned_attention
from vision_tfm.layers import Attention
from vision_tfm.layers.attention import attention_core
from vision_tfm.models.swin import WindowAttention

# fake_cpu's (capability, native bf16, AMX) of each CPU kind the plan tells apart. A fake
# reaches the plan only: the kernels run are this CPU's, as oneDNN's bf16 Linear is guarded by
# torch's own device check (accel.onednn_bf16_runs), which no test fakes.
CPUS = {"amx": ("AVX512", True, True), "dot-only": ("AVX512", True, False), "avx2": ("AVX2", False)}


def attention_layers(model: torch.nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
def test_swap_keeps_modules_parameters_and_keys(name):
    model = vt.create_model(name)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    keys = list(model.state_dict())
    before = {id(m): type(m) for m in attention_layers(model)}
    n = use_planned_attention(model)
    assert n == len(before) > 0
    assert use_planned_attention(model) == 0  # already planned
    for m in attention_layers(model):
        assert isinstance(m, PlannedAttention) and isinstance(m, before[id(m)])
    assert all(p is params[k] for k, p in model.named_parameters())
    assert all(b is buffers[k] for k, b in model.named_buffers())
    assert list(model.state_dict()) == keys
    if name == "swin_test":  # Swin's own methods survive: the twin is a subclass of its class
        attn = attention_layers(model)[0]
        assert isinstance(attn, WindowAttention) and type(attn).__name__.startswith("Planned")
        assert attn.rel_bias().shape[0] == attn.num_heads


def test_linear_attention_is_left_alone():
    model = vt.create_model("vit_test", attn_type="linear")
    assert use_planned_attention(model) == 0
    assert not any(isinstance(m, PlannedAttention) for m in model.modules())


@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
def test_planned_layers_copy_and_pickle_as_planned(name):
    torch.manual_seed(0)
    model = prepare_for_training(vt.create_model(name)).eval()
    x = torch.randn(2, *input_size(model))
    with torch.no_grad():
        want = model(x)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        planned = [m for m in attention_layers(twin) if isinstance(m, PlannedAttention)]
        assert len(planned) == len(attention_layers(model))
        assert [type(m) for m in attention_layers(twin)] == [
            type(m) for m in attention_layers(model)
        ]
        with torch.no_grad():
            torch.testing.assert_close(twin(x), want, rtol=0, atol=0)


def explicit_calls(monkeypatch) -> list[int]:
    """Counts the planned explicit path's calls (one entry a call)."""
    calls: list[int] = []
    explicit = planned_attention.planned_explicit_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return explicit(*args, **kwargs)

    monkeypatch.setattr(planned_attention, "planned_explicit_attention", spy)
    return calls


def _outputs_and_grads(model, x, bf16: bool) -> list[torch.Tensor]:
    torch.manual_seed(1)  # the same drop-path draws in both runs
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        out = model(x)
    out.float().square().mean().backward()
    grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
    return [out.detach().float(), *grads]


@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
def test_training_swap_gives_the_plain_cores_outputs_and_gradients(
    fake_cpu, monkeypatch, name, bf16, cpu
):
    """Training on every CPU kind: the planned path (explicit for Swin windows and for
    native bf16) computes what the plain core (SDPA) does."""
    fake_cpu(*CPUS[cpu])
    calls = explicit_calls(monkeypatch)
    torch.manual_seed(0)
    plain = vt.create_model(name).train()
    planned = prepare_for_training(copy.deepcopy(plain))
    x = torch.randn(2, *input_size(plain))
    tol = {"atol": 3e-2, "rtol": 3e-2} if bf16 else {"atol": 1e-5, "rtol": 1e-4}
    want = _outputs_and_grads(plain, x, bf16)
    assert not calls  # the plain model never asks the plan
    got = _outputs_and_grads(planned, x, bf16)
    native = CPUS[cpu][1]
    assert bool(calls) == ((name == "swin_test" and not (bf16 and not native)) or (bf16 and native))
    for a, b in zip(got, want):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, atol=tol["atol"] * scale, rtol=tol["rtol"])


@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
def test_optimize_swap_gives_the_plain_cores_outputs(fake_cpu, monkeypatch, name, dtype, cpu):
    """Inference on every CPU kind: ``optimize_for_inference`` swaps the planned core in
    (explicit bf16 with fp32 softmax where bf16 has dot-product units only), and its outputs
    are the plain model's at the same weights and dtype."""
    fake_cpu(*CPUS[cpu])
    calls = explicit_calls(monkeypatch)
    torch.manual_seed(0)
    plain = vt.create_model(name).eval()
    fast = vt.optimize_for_inference(copy.deepcopy(plain), dtype=dtype)
    assert all(isinstance(m, PlannedAttention) for m in attention_layers(fast))
    assert not any(isinstance(m, PlannedAttention) for m in attention_layers(plain))
    plain.to(dtype)
    x = torch.randn(2, *input_size(plain), dtype=dtype)
    with torch.inference_mode():
        got, want = fast(x).float(), plain(x).float()
    assert bool(calls) == (dtype == torch.bfloat16 and cpu == "dot-only")
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, atol=tol * max(1.0, want.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("cpu", list(CPUS))
def test_a_faked_cpu_never_runs_a_bf16_kernel_the_real_one_lacks(fake_cpu, monkeypatch, cpu):
    """The plan follows the faked CPU; oneDNN's bf16 Linear runs only where torch's own check
    says this CPU can (on an AVX2 machine the faked AMX / dot-product CPUs fall back to
    ``F.linear``), and its output is the plain layer's either way."""
    from vision_tfm.accel import linear as onednn
    from vision_tfm.accel import onednn_bf16_runs

    fake_cpu(*CPUS[cpu])
    kernel_calls: list[int] = []
    kernel = onednn._onednn_linear

    def spy(*args, **kwargs):
        kernel_calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(onednn, "_onednn_linear", spy)
    torch.manual_seed(0)
    plain = torch.nn.Linear(32, 48).to(torch.bfloat16).requires_grad_(False)
    fast = onednn.OneDnnLinear.from_linear(plain)
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        got, want = fast(x).float(), plain(x).float()
    assert bool(kernel_calls) == (CPUS[cpu][1] and onednn_bf16_runs())
    torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("swap", [False, True])
def test_fx_symbolic_trace_of_a_vit_with_and_without_the_swap(swap):
    torch.manual_seed(0)
    model = vt.create_model("vit_test").eval()
    if swap:
        use_planned_attention(model)
    gm = torch.fx.symbolic_trace(model)
    leaves = [n for n in gm.graph.nodes if n.target is attention_core]
    assert len(leaves) == len(attention_layers(model))  # the core is one leaf call per layer
    x = torch.randn(2, *input_size(model))
    odd = torch.randn(1, model.in_chans, x.shape[-2] + 5, x.shape[-1] + 9)
    with torch.no_grad():
        for inp in (x, odd):
            torch.testing.assert_close(gm(inp), model(inp))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):  # the plan runs at call time
        torch.testing.assert_close(gm(x), model(x))


def test_the_training_engine_prepares_its_model(tmp_path):
    from vision_tfm.config import apply_overrides
    from vision_tfm.tasks import ClassificationTask, ClsConfig
    from vision_tfm.train import Trainer

    cfg = apply_overrides(
        ClsConfig(),
        {
            "model.name": "vit_mnist",
            "model.kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
            "data.train_subset": 64,
            "data.batch_size": 64,
            "sched.epochs": 1,
            "ema.enabled": True,
            "run.tensorboard": False,
            "run.plots": False,
            "run.out_dir": str(tmp_path),
        },
    )
    trainer = Trainer(cfg, ClassificationTask(cfg))
    trainer.fit()
    for model in (trainer.model, trainer.ema):
        layers = attention_layers(model)
        assert layers and all(isinstance(m, PlannedAttention) for m in layers)


def test_scores_scale_inside_the_gemm_match_the_plain_product_and_its_gradients():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 7, 8, requires_grad=True)  # Swin-like extra leading dim
    k = torch.randn(2, 3, 4, 9, 8, requires_grad=True)
    got = scaled_scores(q, k, 0.3)
    want = (q * 0.3) @ k.transpose(-2, -1)
    assert got.shape == (2, 3, 4, 7, 9) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    g = torch.randn_like(want)
    grads = torch.autograd.grad(got, (q, k), g)
    for a, b in zip(grads, torch.autograd.grad(want, (q, k), g)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    view = torch.randn(2, 9, 3, 4, 8).permute(2, 0, 3, 1, 4)  # q, k as strided views of qkv
    torch.testing.assert_close(
        scaled_scores(view[0], view[1], 0.5), (view[0] * 0.5) @ view[1].transpose(-2, -1)
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 q under bf16 autocast
        got, want = scaled_scores(view[0], view[1], 0.5), (view[0] * 0.5) @ view[1].mT
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
