"""The CNN+Transformer hybrid: budgets, token grid, grasp-map conventions, the shared trunk."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import raises_naming

import vision_tfm as vt
from vision_tfm.config import ConfigError
from vision_tfm.errors import InputError
from vision_tfm.grasp.maps import MAP_KEYS, activate_grasp_maps, split_maps
from vision_tfm.models.hybrid import (
    GraspHybrid,
    HybridClassifier,
    HybridConfig,
    HybridTrunk,
    HybridTrunkConfig,
)
from vision_tfm.tasks.grasp import GraspMaps

# the grasp family at test size: same stage count (reduction 8), narrow everything
TINY_GRASP = dict(stem_chs=(4, 8, 8, 16), embed_dim=16, num_heads=2)


def tiny_grasp(**kw) -> GraspHybrid:
    torch.manual_seed(0)
    return vt.create_model("grasp_hybrid_t", **{**TINY_GRASP, **kw})


@pytest.mark.parametrize(("name", "budget"), [("grasp_hybrid_t", 0.5e6), ("grasp_hybrid_s", 2e6)])
@pytest.mark.parametrize("in_chans", [1, 3, 4])
def test_grasp_parameter_budget(name, budget, in_chans):
    m = vt.create_model(name, in_chans=in_chans)
    assert sum(p.numel() for p in m.parameters()) <= budget


def test_224_input_gives_28x28_token_grid():
    m = vt.create_model("grasp_hybrid_t").eval()
    assert m.feature_info[-1] == {"module": "trunk.norm", "num_chs": 64, "reduction": 8}
    assert [i["reduction"] for i in m.feature_info] == [1, 2, 4, 8, 8]
    for info in m.feature_info:
        m.get_submodule(info["module"])  # every declared module exists
    with torch.no_grad():
        tokens = m.forward_intermediates(
            torch.randn(1, 4, 224, 224), indices=[-1], intermediates_only=True
        )[0]
    assert tokens.shape == (1, 64, 28, 28)


def test_mnist_config_works_on_a_7x7_grid():
    m = vt.create_model("hybrid_mnist").eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert m.forward_features(x).shape == (2, 96, 7, 7)
        assert m(x).shape == (2, 10)


@pytest.mark.parametrize("size", [(224, 224), (160, 224), (100, 130)])
def test_grasp_maps_full_resolution_and_ranges(size):
    m = tiny_grasp().eval()
    with torch.no_grad():
        logits = m(torch.randn(2, 4, *size) * 3)
    assert tuple(logits) == MAP_KEYS  # the order vision_tfm.grasp decodes
    out = activate_grasp_maps(logits)
    bounds = {"quality": (0, 1), "cos": (-1, 1), "sin": (-1, 1), "width": (0, 1)}
    for key, fmap in out.items():
        assert fmap.shape == (2, 1, *size) and torch.isfinite(fmap).all(), key
        assert bounds[key][0] <= fmap.min() <= fmap.max() <= bounds[key][1], key


def test_grasp_model_returns_logits_and_grasp_maps_activates_them():
    m = tiny_grasp().eval()
    with torch.no_grad():
        m.head.bias.copy_(torch.tensor([6.0, -6.0, 6.0, -6.0]))  # quality, cos, sin, width
        x = torch.randn(1, 4, 32, 32)
        logits, stacked = m(x), GraspMaps(m)(x)
        # a grasp model without forward_maps (a dict of logits only) is stacked the same way
        by_dict = GraspMaps(lambda v: m(v))(x)
    assert logits["quality"].min() > 1 and logits["cos"].max() < -1  # no activation inside
    assert stacked.shape == (1, 4, 32, 32)
    torch.testing.assert_close(by_dict, stacked, rtol=0, atol=0)
    maps = split_maps(stacked)  # one sigmoid chain: tanh as 2 sigmoid(2x) - 1
    for key, ref in activate_grasp_maps(logits).items():
        torch.testing.assert_close(maps[key], ref, rtol=0, atol=3e-7)
    torch.testing.assert_close(maps["cos"], logits["cos"].tanh(), rtol=0, atol=3e-7)
    torch.testing.assert_close(maps["width"], logits["width"].sigmoid(), rtol=0, atol=3e-7)


def test_odd_sizes_are_padded_then_cropped():
    # 100x130 runs as 104x136 with zeros at the bottom/right, then crops back
    m = tiny_grasp().eval()
    x = torch.randn(1, 4, 100, 130)
    with torch.no_grad():
        out = m(x)
        ref = m(F.pad(x, (0, 6, 0, 4)))
    for key in MAP_KEYS:
        torch.testing.assert_close(out[key], ref[key][..., :100, :130])


@pytest.mark.parametrize("in_chans", [1, 3, 4])
def test_grasp_in_chans(in_chans):
    m = tiny_grasp(in_chans=in_chans).eval()
    with torch.no_grad():
        assert m(torch.randn(1, in_chans, 64, 96))["width"].shape == (1, 1, 64, 96)


def test_trunk_is_shared_between_classifier_and_grasp_model():
    grasp = tiny_grasp().eval()
    trunk_cfg = {f.name: getattr(grasp.cfg, f.name) for f in dataclasses.fields(HybridTrunkConfig)}
    torch.manual_seed(1)
    cls = HybridClassifier(HybridConfig(**trunk_cfg, num_classes=10)).eval()
    assert type(grasp.trunk) is type(cls.trunk) is HybridTrunk
    assert grasp.trunk.state_dict().keys() == cls.trunk.state_dict().keys()
    grasp.trunk.load_state_dict(cls.trunk.state_dict())  # strict
    x = torch.randn(2, 4, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(grasp.forward_features(x), cls.forward_features(x))


def test_grasp_gradients_reach_every_parameter_at_odd_size():
    m = tiny_grasp().train()
    out = m(torch.randn(2, 4, 72, 100))
    sum(fmap.square().mean() for fmap in out.values()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reached {name}"


def test_grasp_torch_export_non_square_padded():
    m = tiny_grasp().eval()
    x = torch.randn(1, 4, 100, 130)
    ep = torch.export.export(m, (x,))
    torch.testing.assert_close(ep.module()(x), m(x), atol=1e-5, rtol=0)


def test_normed_intermediate_is_the_feature_map():
    m = vt.create_model("hybrid_test").eval()
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        torch.testing.assert_close(
            m.forward_intermediates(x, indices=1, norm=True, intermediates_only=True)[0],
            m.forward_features(x),
        )
        assert [
            t.shape[1] for t in m.forward_intermediates(x, (0, 2), intermediates_only=True)
        ] == [8, 16]


@pytest.mark.parametrize("pos", ["sincos", "rope", "none"])
@pytest.mark.parametrize("norm_place", ["pre", "post", "residual"])
def test_classifier_variants_any_size(pos, norm_place):
    m = vt.create_model("hybrid_test", pos_embed=pos, norm_place=norm_place).eval()
    with torch.no_grad():
        for h, w in [(32, 32), (40, 24), (33, 57)]:
            out = m(torch.randn(2, 3, h, w))
            assert out.shape == (2, 1000) and torch.isfinite(out).all()


def test_bad_config_is_rejected():
    with raises_naming(ConfigError, "stem_chs", "stem_depths"):  # lengths differ
        vt.create_model("hybrid_test", stem_depths=(0, 1))
    with raises_naming(ConfigError, "pos_embed", "learn"):
        vt.create_model("hybrid_test", pos_embed="learn")
    for kw, key in [
        ({"depth": -1}, "depth"),
        ({"num_heads": 0}, "num_heads"),
        ({"embed_dim": 30}, "embed_dim"),  # sin-cos needs a multiple of 4
        ({"stem_chs": (8, 0, 16)}, "stem_chs"),
        ({"num_classes": -1}, "num_classes"),
    ]:
        with raises_naming(ConfigError, "hybrid_test", key):
            vt.create_model("hybrid_test", **kw)
    with raises_naming(ConfigError, "dec_depth", -1):
        tiny_grasp(dec_depth=-1)


@pytest.mark.parametrize("make", [lambda: vt.create_model("hybrid_test"), tiny_grasp])
@pytest.mark.parametrize(
    ("shape", "dtype", "names"),  # -1: the model's channel count
    [
        ((1, 2, 32, 32), torch.float32, (-1, 2)),  # channels expected, given
        ((3, 32, 32), torch.float32, ("(3, 32, 32)",)),  # not 4-D
        ((1, -1, 3, 3), torch.float32, ("3x3",)),  # below one patch
        ((1, -1, 32, 32), torch.uint8, ("torch.uint8",)),
        ((1, -1, 32, 32), torch.float64, ("torch.float64", "torch.float32")),  # input, weights
    ],
)
def test_bad_input_gives_one_line_error(make, shape, dtype, names):
    m = make().eval()
    x = torch.zeros([m.in_chans if s == -1 else s for s in shape], dtype=dtype)
    for fn in (m, m.forward_features, m.forward_intermediates):
        with raises_naming(InputError, *(m.in_chans if n == -1 else n for n in names)):
            fn(x)
