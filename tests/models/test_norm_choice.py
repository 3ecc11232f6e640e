"""``norm_layer`` picks LayerNorm or RMSNorm in every family, and weights keep to their kind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vision_tfm as vt
from vision_tfm.errors import CheckpointError, ConfigError

FAMILIES = ["vit_test", "swin_test", "hybrid_test", "grasp_hybrid_t"]


def _build(name: str, norm: str) -> nn.Module:
    torch.manual_seed(0)
    kw = {"embed_dim": 16, "num_heads": 2} if name == "grasp_hybrid_t" else {}
    return vt.create_model(name, norm_layer=norm, **kw).eval()


def _norms(model: nn.Module) -> dict[type, int]:
    kinds = (nn.LayerNorm, nn.RMSNorm)
    counts: dict[type, int] = {}
    for m in model.modules():
        if isinstance(m, kinds):
            kind = nn.RMSNorm if isinstance(m, nn.RMSNorm) else nn.LayerNorm
            counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.mark.parametrize("name", FAMILIES)
def test_rmsnorm_replaces_every_token_norm_and_changes_the_output(name: str) -> None:
    ln, rms = _build(name, "layernorm"), _build(name, "rmsnorm")
    assert set(_norms(ln)) == {nn.LayerNorm} and set(_norms(rms)) == {nn.RMSNorm}
    assert _norms(ln)[nn.LayerNorm] == _norms(rms)[nn.RMSNorm]  # the same places
    if name.startswith("swin"):  # patch merging's norm is one of them
        assert all(isinstance(s.downsample.norm, nn.RMSNorm) for s in list(rms.layers)[1:])
    x = torch.randn(2, ln.in_chans, 32, 32)
    with torch.no_grad():
        a, b = ln(x), rms(x)
    a, b = (torch.cat([v.flatten(1) for v in o.values()], 1) if isinstance(o, dict) else o
            for o in (a, b))  # fmt: skip
    assert a.shape == b.shape and torch.isfinite(b).all()
    assert not torch.allclose(a, b, atol=1e-3)  # no mean subtraction: another function


@pytest.mark.parametrize("name", ["vit_test", "swin_test", "hybrid_test"])
def test_weights_of_the_other_norm_are_refused_in_one_line(name: str) -> None:
    ln, rms = _build(name, "layernorm"), _build(name, "rmsnorm")
    for weights, into, want in ((ln, rms, "layernorm"), (rms, ln, "rmsnorm")):
        with pytest.raises(CheckpointError) as e:
            vt.load_pretrained(into, weights.state_dict())
        msg = str(e.value)
        assert "\n" not in msg and f"norm_layer={want!r}" in msg


def test_an_unknown_norm_layer_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"norm_layer.*layernorm.*rmsnorm"):
        vt.create_model("swin_test", norm_layer="batchnorm")
