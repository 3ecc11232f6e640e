"""Every registered model, at tiny size: shapes, gradients, export, intermediates, errors."""

import dataclasses

import pytest
import torch
from conftest import input_size, raises_naming, tiny_overrides

import vision_tfm as vt
from vision_tfm.config import ConfigError
from vision_tfm.errors import InputError
from vision_tfm.layers import Rope, rope_2d, run_blocks, sincos_2d
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
    maps = m.forward_intermediates(x, intermediates_only=True)
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


def test_sincos_is_added_to_the_grid_tokens_and_changes_the_output():
    torch.manual_seed(0)
    m = vt.create_model("vit_test", pos_embed="sincos").eval()
    none = vt.create_model("vit_test", pos_embed="none").eval()
    none.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        grid = m.patch_embed(x)  # (B, gh, gw, D)
        _, gh, gw, D = grid.shape
        tokens = grid.flatten(1, 2) + sincos_2d(gh, gw, D)
        manual = torch.cat([m.cls_token.expand(2, -1, -1), tokens], 1)
        for blk in m.blocks:
            manual = blk(manual)
        torch.testing.assert_close(m(x), m.head(m.norm(manual)[:, 0]))
        assert (m(x) - none(x)).abs().max() > 1e-3


def test_rope_model_differs_from_no_positions_and_ignores_a_global_shift():
    """A RoPE ViT with the same weights as a position-free one gives other logits; its
    blocks see only offsets, so the rope of a grid shifted by whole tokens changes nothing."""
    torch.manual_seed(0)
    m = vt.create_model("vit_test_avg_rope").eval()
    with torch.no_grad():  # sharpen the near-uniform attention of the 0.02-std init
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(30)
    none = vt.create_model("vit_test_avg_rope", pos_embed="none").eval()
    none.load_state_dict(m.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert (m(x) - none(x)).abs().max() > 1e-3
        tokens, rope, (gh, gw) = m.embed(x)
        big = rope_2d(gh + 3, gw + 3, rope.sin.shape[-1], m.cfg.rope_theta)
        idx = ((torch.arange(gh)[:, None] + 3) * (gw + 3) + torch.arange(gw) + 3).reshape(-1)
        shifted = Rope(big[0][idx], big[1][idx], rope.num_prefix_tokens)
        a = run_blocks(m.blocks, tokens, m.norm, rope=rope)
        b = run_blocks(m.blocks, tokens, m.norm, rope=shifted)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(m.forward_head(a), m(x))


@pytest.mark.parametrize(
    "name, kw, size",
    [
        ("vit_tiny_patch16_224", {"depth": 2}, 64),
        ("swin_tiny_patch4_window7_224", {"depths": (2, 2), "num_heads": (3, 6)}, 56),
    ],
)
def test_train_mode_gradients_match_timm_on_the_same_weights(name, kw, size):
    import timm

    torch.manual_seed(0)
    kw = {**kw, "img_size": size, "num_classes": 5, "drop_path_rate": 0.0}  # timm Swin: 0.1
    ref = timm.create_model(name, **kw).train()
    ours = vt.load_pretrained(vt.create_model(name, **kw), ref.state_dict())
    ours.train()
    x, y = torch.randn(2, 3, size, size), torch.tensor([1, 3])
    for m in (ref, ours):
        torch.nn.functional.cross_entropy(m(x), y).backward()
    theirs = dict(ref.named_parameters())
    for k, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[k].grad, atol=1e-5, rtol=1e-4, msg=k)


def test_window_partition_reverse_identity():
    from vision_tfm.models.swin_windows import window_partition, window_reverse

    x = torch.randn(2, 14, 21, 5)
    w = window_partition(x, 7)
    assert w.shape == (2, 6, 49, 5)
    torch.testing.assert_close(w[0, 1], x[0, :7, 7:14].reshape(49, 5))
    assert torch.equal(window_reverse(w, 7, 14, 21), x)


def test_swin_mask_blocks_cross_region_attention():
    from vision_tfm.models.swin_windows import MASK_VALUE, shifted_window_mask

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
    with raises_naming(ConfigError, "vit_smal_patch16_224", "vit_small_patch16_224"):  # closest
        vt.create_model("vit_smal_patch16_224")
    with raises_naming(ConfigError, "embed_dims", "embed_dim"):  # the key, the closest one
        vt.create_model("vit_test", embed_dims=3)
    with raises_naming(ConfigError, "depth", "deep"):
        vt.create_model("vit_test", depth="deep")


@pytest.mark.parametrize(
    ("name", "kw", "key"),
    [
        ("vit_test", {"depth": -1}, "depth"),
        ("vit_test", {"num_classes": -3}, "num_classes"),
        ("vit_test", {"patch_size": 0}, "patch_size"),
        ("vit_test", {"num_heads": 0}, "num_heads"),
        ("vit_test", {"in_chans": 0}, "in_chans"),
        ("vit_test", {"embed_dim": 30, "num_heads": 4}, "embed_dim"),
        ("vit_test", {"mlp_ratio": 0.0}, "mlp_ratio"),
        ("vit_test", {"drop_rate": 1.0}, "drop_rate"),
        ("vit_test", {"attn_drop_rate": 1.5}, "attn_drop_rate"),
        ("vit_test", {"proj_drop_rate": -0.5}, "proj_drop_rate"),
        ("vit_test", {"drop_path_rate": -0.1}, "drop_path_rate"),
        ("vit_test", {"rope_theta": 0.0}, "rope_theta"),
        ("vit_test", {"init_values": -1e-5}, "init_values"),
        ("vit_test", {"favor_features": -1}, "favor_features"),
        ("vit_test", {"attn_type": "cosine"}, "attn_type"),
        ("vit_test", {"img_size": 4}, "img_size"),
        ("vit_test", {"img_size": 36}, "img_size"),
        ("vit_test_avg_rope", {"embed_dim": 36}, "embed_dim"),
        ("swin_test", {"embed_dim": 0}, "embed_dim"),
        ("swin_test", {"window_size": 0}, "window_size"),
        ("swin_test", {"depths": (2, -1, 2, 2)}, "depths"),
        ("swin_test", {"num_heads": (1, 2)}, "num_heads"),
        ("swin_test", {"num_heads": (1, 3, 2, 4)}, "num_heads"),
        ("swin_test", {"mlp_ratio": -1.0}, "mlp_ratio"),
        ("swin_test", {"drop_path_rate": 1.0}, "drop_path_rate"),
        ("swin_test", {"norm_place": "residual"}, "norm_place"),
        ("hybrid_test", {"stem_chs": (8, 0, 16)}, "stem_chs"),
        ("hybrid_test", {"stem_depths": (0, -1, 1)}, "stem_depths"),
        ("hybrid_test", {"attn_drop_rate": 1.0}, "attn_drop_rate"),
        ("grasp_hybrid_t", {"dec_depth": -1}, "dec_depth"),
    ],
)
def test_out_of_range_config_is_a_one_line_config_error_naming_model_and_field(name, kw, key):
    with raises_naming(ConfigError, name, key):
        vt.create_model(name, **kw)
    # the config dataclass checks itself, however it is built (the model is never reached)
    with raises_naming(ConfigError, key):
        dataclasses.replace(get_model_entry(name).cfg, **kw)


@pytest.mark.parametrize(
    ("name", "key", "value", "bad"),
    [
        ("vit_test", "depth", 2.5, 2.5),
        ("swin_test", "depths", (2, 2.0), 2.0),
        ("hybrid_test", "embed_dim", 64.0, 64.0),
    ],
)
def test_an_integer_field_refuses_a_float_even_when_built_directly(name, key, value, bad):
    with raises_naming(ConfigError, key, bad):
        dataclasses.replace(get_model_entry(name).cfg, **{key: value})


def test_no_head_is_a_valid_class_count():
    m = vt.create_model("vit_test", num_classes=0)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 32)


BAD_INPUTS = [  # the input, and what the error names: the numbers or dtypes that clash
    (torch.randn(1, 1, 32, 32), (3, 1)),  # channels expected, given
    (torch.randn(3, 32, 32), ("(3, 32, 32)",)),  # not 4-D
    (torch.randn(1, 3, 3, 3), ("3x3",)),  # below one patch
    (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), ("torch.uint8",)),
    (torch.randn(1, 3, 32, 32, dtype=torch.float64), ("torch.float64", "torch.float32")),
    (torch.randn(1, 3, 32, 32).half(), ("torch.float16", "torch.float32")),
]


@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
@pytest.mark.parametrize(("x", "names"), BAD_INPUTS)
def test_bad_input_gives_one_line_error(name, x, names):
    m = vt.create_model(name).eval()
    for fn in (m, m.forward_intermediates):
        with raises_naming(InputError, *names):
            fn(x)


def test_bad_intermediate_indices():
    m = vt.create_model("swin_test")
    with raises_naming(InputError, "stage", 4):
        m.forward_intermediates(torch.randn(1, 3, 32, 32), indices=(1, 4))


@pytest.mark.parametrize("name", ["vit_test", "swin_test", "hybrid_test"])
def test_weight_dtype_check_leaves_autocast_and_bf16_models_alone(name):
    m = vt.create_model(name).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(m(x)).all()  # fp32 input, fp32 weights, bf16 compute
    fast = vt.optimize_for_inference(m, dtype="bf16")  # a name works as well as a torch.dtype
    with torch.no_grad():
        assert fast(x.bfloat16()).dtype == torch.bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast(x)  # autocast casts the fp32 input itself (the benchmark's parity check)
        with raises_naming(InputError, "torch.float32", "torch.bfloat16"):  # input, weights
            fast(x)


@pytest.mark.parametrize(
    ("model", "kw", "err", "names"),
    [
        ("vit", {}, TypeError, ("model", "str")),
        (None, {"dtype": "bf17"}, ValueError, ("dtype", "bf17")),
        (None, {"dtype": torch.int8}, ValueError, ("dtype", "torch.int8")),
    ],
)
def test_optimize_for_inference_rejects_bad_arguments(model, kw, err, names):
    with raises_naming(err, *names):
        vt.optimize_for_inference(model or vt.create_model("vit_test"), **kw)


def test_swin_mask_caches_stay_bounded_over_many_input_sizes():
    """Masks (shared by all blocks) and frozen bias+mask sums (per block) are LRU-bounded."""
    from vision_tfm.models import swin_windows as swin
    from vision_tfm.models.swin import SwinBlock

    m = vt.create_model("swin_test", embed_dim=8, num_heads=(1, 1, 1, 1)).eval()
    blocks = [b for b in m.modules() if isinstance(b, SwinBlock)]
    for b in blocks:
        b.attn.freeze_bias()  # the inference fast path, which also caches bias + mask
    x0 = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = m(x0)
        for i in range(50):  # 50 distinct input sizes
            m(torch.randn(1, 3, 16 + 2 * (i % 10), 16 + 2 * (i // 10)))
            assert len(swin._MASKS) <= swin._MASKS.max_entries
            assert all(len(b._bias_cache) <= swin.BIAS_SIZES_CACHED for b in blocks)
        assert sum(len(b._bias_cache) for b in blocks) > 0  # the frozen path did cache
        assert torch.equal(m(x0), before)  # evicted entries are rebuilt alike
