"""Every registered model, at tiny size: shapes, gradients, export, intermediates, errors."""

import pytest
import torch
from conftest import input_size, tiny_overrides

import vision_tfm as vt
from vision_tfm.models.registry import get_model_entry

ALL = vt.list_models()


@pytest.mark.parametrize("name", ALL)
def test_forward_grad_and_intermediates(name, tiny_model):
    dense = not hasattr(get_model_entry(name).cfg, "num_classes")  # e.g. grasp maps
    m = tiny_model(name, **({} if dense else {"num_classes": 7})).train()
    x = torch.randn(2, *input_size(m))
    out = m(x)
    if dense:  # a dict of full-resolution (B, 1, H, W) maps
        for key, fmap in out.items():
            assert fmap.shape == (2, 1, *x.shape[-2:]) and torch.isfinite(fmap).all(), key
        sum(fmap.square().mean() for fmap in out.values()).backward()
    else:
        assert out.shape == (2, 7) and torch.isfinite(out).all()
        out.square().mean().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reached {pname}"
    m.eval()
    maps = m.forward_intermediates(x)
    assert len(maps) == len(m.feature_info)
    H, W = x.shape[-2:]
    for fmap, info in zip(maps, m.feature_info):
        r = info["reduction"]
        assert fmap.shape == (2, info["num_chs"], -(-H // r), -(-W // r)), info
    if not dense:  # pre_logits gives the pooled feature
        assert m.forward_head(m.forward_features(x), pre_logits=True).shape == (2, m.num_features)


@pytest.mark.parametrize("name", ALL)
def test_torch_export(name, tiny_model):
    m = tiny_model(name).eval()
    x = torch.randn(1, *input_size(m))
    ep = torch.export.export(m, (x,))
    torch.testing.assert_close(ep.module()(x), m(x), atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x), m(x))  # eager still fine after tracing (no fake caches)


@pytest.mark.parametrize(
    ("name", "sizes"),
    [
        ("vit_test", [(224, 224), (256, 256), (192, 320)]),
        ("swin_test", [(224, 224), (256, 256), (320, 224)]),
    ],
)
def test_any_input_size(name, sizes, tiny_model):
    m = tiny_model(name).eval()
    for h, w in sizes:
        assert m(torch.randn(1, m.in_chans, h, w)).shape == (1, m.num_classes)


def test_real_size_families_run_non_square():
    for name in ["vit_small_patch16_224", "swin_tiny_patch4_window7_224"]:
        m = vt.create_model(name, **tiny_overrides(name)).eval()
        assert m(torch.randn(1, 3, 192, 320)).shape == (1, 1000)


def test_vit_at_train_size_is_unchanged_by_resampling_path():
    torch.manual_seed(0)
    m = vt.create_model("vit_test").eval()
    x = torch.randn(2, 3, 32, 32)
    manual = m.patch_embed(x).flatten(1, 2)
    manual = torch.cat([m.cls_token.expand(2, -1, -1), manual], 1) + m.pos_embed
    for blk in m.blocks:
        manual = blk(manual)
    ref = m.head(m.norm(manual)[:, 0])
    torch.testing.assert_close(m(x), ref, atol=0, rtol=0)


@pytest.mark.parametrize("pos", ["sincos", "rope", "none"])
@pytest.mark.parametrize("norm_place", ["pre", "post", "residual"])
def test_vit_variants(pos, norm_place):
    m = vt.create_model("vit_test", pos_embed=pos, norm_place=norm_place, mlp_layer="swiglu")
    out = m(torch.randn(2, 3, 40, 24))
    assert out.shape == (2, 1000) and torch.isfinite(out).all()


def test_window_partition_reverse_identity():
    from vision_tfm.models.swin import window_partition, window_reverse

    x = torch.randn(2, 14, 21, 5)
    w = window_partition(x, 7)
    assert w.shape == (2, 6, 49, 5)
    torch.testing.assert_close(w[0, 1], x[0, :7, 7:14].reshape(49, 5))
    assert torch.equal(window_reverse(w, 7, 14, 21), x)


def test_swin_mask_blocks_cross_region_attention():
    from vision_tfm.models.swin import MASK_VALUE, shifted_window_mask

    mask = shifted_window_mask(14, 14, 7, (3, 3))
    assert mask.shape == (4, 1, 49, 49)
    assert (mask[0] == 0).all()  # top-left window holds a single region
    last = mask[3, 0]  # bottom-right window holds 4 regions
    assert last[0, 0] == 0 and last[0, 6] == MASK_VALUE  # (0,0) and (0,6) are split by the shift


def test_registry_and_overrides():
    assert "vit_small_patch16_224" in vt.list_models("vit_*")
    assert all(n.startswith("swin") for n in vt.list_models("swin*"))
    m = vt.create_model("vit_small_patch16_224", num_classes=10, depth=2)
    assert (
        m.head.out_features == 10 and len(m.blocks) == 2 and m.model_name == "vit_small_patch16_224"
    )
    with pytest.raises(
        ValueError, match=r"unknown model name 'vit_smal_patch16_224'; closest: vit_small"
    ):
        vt.create_model("vit_smal_patch16_224")
    with pytest.raises(
        ValueError, match=r"unknown config key 'embed_dims'; did you mean embed_dim"
    ):
        vt.create_model("vit_test", embed_dims=3)
    with pytest.raises(ValueError, match=r"config key 'depth': expected an integer"):
        vt.create_model("vit_test", depth="deep")


BAD_INPUTS = [
    (torch.randn(1, 1, 32, 32), r"expected 3 input channels, got 1"),
    (torch.randn(3, 32, 32), r"expected a 4-D image batch \(B, C, H, W\), got a 3-D tensor"),
    (torch.randn(1, 3, 3, 3), r"smaller than the minimum"),
    (
        torch.zeros(1, 3, 32, 32, dtype=torch.uint8),
        r"expected a floating-point image tensor, got torch.uint8",
    ),
]


@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
@pytest.mark.parametrize(("x", "msg"), BAD_INPUTS)
def test_bad_input_gives_one_line_error(name, x, msg):
    m = vt.create_model(name).eval()
    for fn in (m, m.forward_intermediates):
        with pytest.raises(ValueError, match=msg) as e:
            fn(x)
        assert "\n" not in str(e.value)


def test_bad_intermediate_indices():
    m = vt.create_model("swin_test")
    with pytest.raises(ValueError, match="stage index 4 is out of range"):
        m.forward_intermediates(torch.randn(1, 3, 32, 32), indices=(1, 4))
