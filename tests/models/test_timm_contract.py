"""timm's generic model tests (timm/tests/test_models.py), adapted to every registered name.

Every name runs at a tiny width and a small input (``conftest.tiny_overrides`` plus a small
``img_size``); ``torch.jit.script`` is not covered. What timm checks and is run here: forward
and backward reaching every parameter, ``pretrained_cfg`` contents, ``reset_classifier``,
``forward_features`` / ``forward_head(pre_logits=True)`` widths, ``forward_intermediates`` with
timm's signature and return, ``prune_intermediate_layers``, ``features_only``, a plain
``torch.fx.symbolic_trace``, torchvision's ``create_feature_extractor`` (with and without
timm's tracer kwargs), ``torch.compile(fullgraph=True)`` and gradient checkpointing; plus layer
decay through ``group_matcher``.
"""

import pytest
import timm
import torch
from conftest import raises_naming, tiny_overrides
from timm.layers import get_notrace_functions, get_notrace_modules
from timm.models._features import FeatureGetterNet
from timm.optim import create_optimizer_v2
from torchvision.models.feature_extraction import create_feature_extractor

import vision_tfm as vt
from vision_tfm.errors import InputError
from vision_tfm.layers import Block
from vision_tfm.models.registry import get_model_entry
from vision_tfm.tasks.config import OptimConfig
from vision_tfm.train import build_optimizer

ALL = vt.list_models()
CLASSIFIERS = [n for n in ALL if not get_model_entry(n).cls.output_maps]
SMALL_SIZE = {"vit": 32, "swin": 56}  # full-size names: small inputs keep the suite fast
TRACER = {"leaf_modules": get_notrace_modules(), "autowrap_functions": get_notrace_functions()}


pytestmark = pytest.mark.usefixtures("one_thread")


def small(name: str, **kw) -> torch.nn.Module:
    cfg = get_model_entry(name).cfg
    over = tiny_overrides(name)
    if cfg.img_size > 64:
        over["img_size"] = SMALL_SIZE.get(name.split("_")[0], 64)
    torch.manual_seed(0)
    return vt.create_model(name, **{**over, **kw})


def batch(m: torch.nn.Module, b: int = 2) -> torch.Tensor:
    return torch.randn(b, *m.pretrained_cfg["input_size"])


# --- pretrained_cfg, heads, features --------------------------------------------------------


def test_pretrained_cfg_of_the_shipped_recipes():
    want = {
        "vit_mnist": ((1, 28, 28), 10),
        "hybrid_mnist": ((1, 28, 28), 10),
        "swin_mnist": ((1, 32, 32), 10),
        "grasp_hybrid_t": ((4, 224, 224), 0),
        "vit_small_patch16_224": ((3, 224, 224), 1000),
    }
    for name, (size, classes) in want.items():
        m = vt.create_model(name)
        cfg = timm.data.resolve_data_config(model=m)  # what timm-based scripts read
        assert cfg["input_size"] == size, name
        assert len(cfg["mean"]) == len(cfg["std"]) == size[0], name
        assert m.pretrained_cfg["num_classes"] == classes, name
    assert timm.data.resolve_data_config(model=vt.create_model("vit_mnist"))["mean"] == (0.1307,)
    m = vt.create_model("vit_test", pretrained_cfg_overlay={"mean": (0.5,) * 3, "crop_pct": 1.0})
    assert m.default_cfg["mean"] == (0.5,) * 3 and m.pretrained_cfg["crop_pct"] == 1.0


@pytest.mark.parametrize("name", ALL)
def test_default_cfg_names_and_head_contract(name):
    m = small(name).eval()
    cfg, sd = m.default_cfg, m.state_dict()
    assert m.num_features > 0 and m.head_hidden_size > 0
    assert sd[cfg["first_conv"] + ".weight"].shape[1] == cfg["input_size"][0] == m.in_chans
    if cfg["num_classes"]:
        assert sd[cfg["classifier"] + ".weight"].shape[0] == cfg["num_classes"]
        assert m.get_classifier() is m.get_submodule(cfg["classifier"])
    x = batch(m)
    with torch.no_grad():
        feats = m.forward_features(x)
        feat_axis = {"NCHW": 1, "NHWC": -1, "NLC": -1}[m.output_fmt]
        assert feats.shape[feat_axis] == m.num_features
        if cfg["pool_size"] is not None:  # spatial features at the configured size
            hw = feats.shape[2:] if m.output_fmt == "NCHW" else feats.shape[1:3]
            assert tuple(hw) == cfg["pool_size"]
        if m.output_maps:
            return  # dense maps: no classifier to reset
        assert m.forward_head(feats, pre_logits=True).shape == (2, m.head_hidden_size)
        m.reset_classifier(5)
        assert m(x).shape == (2, 5) and m.num_classes == 5
        m.reset_classifier(0)
        assert m(x).shape == (2, m.head_hidden_size)
        m.reset_classifier(0, "")  # no pooling either: the unpooled features
        assert m(x).shape == feats.shape
        headless = small(name, num_classes=0).eval()
        assert headless(x).shape == (2, headless.num_features)


@pytest.mark.parametrize("name", ALL)
def test_forward_intermediates_follows_timm(name):
    m = small(name).eval()
    x = batch(m)
    n = len(m.feature_info)
    with torch.no_grad():
        final, maps = m.forward_intermediates(x)
        torch.testing.assert_close(final, m.forward_features(x))
        assert len(maps) == n
        H, W = x.shape[-2:]
        for fmap, info in zip(maps, m.feature_info):
            r = info["reduction"]
            assert fmap.shape == (2, info["num_chs"], -(-H // r), -(-W // r)), info
        only = m.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
        early = m.forward_intermediates(x, indices=2, stop_early=True, intermediates_only=True)
        for got, want in zip(only + early, [maps[0], maps[-1], *maps[-2:]], strict=True):
            torch.testing.assert_close(got, want)
        pruned = small(name).eval()
        kept = pruned.prune_intermediate_layers([0], prune_head=False)
        assert kept == [0]
        got = pruned.forward_intermediates(x, [0], intermediates_only=True)
        torch.testing.assert_close(got[0], maps[0])
        assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in m.parameters())


def test_vit_intermediates_formats_norm_and_prefix_tokens():
    m = small("vit_test").eval()
    x = batch(m)
    with torch.no_grad():
        nchw = m.forward_intermediates(x, [1], intermediates_only=True)[0]  # (B, D, 4, 4)
        ((tokens, prefix),) = m.forward_intermediates(
            x, [1], norm=True, output_fmt="NLC", return_prefix_tokens=True, intermediates_only=True
        )
        full = m.forward_features(x)  # the last block, normed
    assert (
        nchw.shape == (2, 32, 4, 4) and tokens.shape == (2, 16, 32) and prefix.shape == (2, 1, 32)
    )
    torch.testing.assert_close(torch.cat([prefix, tokens], 1), full)
    swin = small("swin_test").eval()
    with torch.no_grad():
        (nhwc,) = swin.forward_intermediates(x, [2], output_fmt="NHWC", intermediates_only=True)
        (nchw,) = swin.forward_intermediates(x, [2], intermediates_only=True)
    torch.testing.assert_close(nhwc.permute(0, 3, 1, 2), nchw)
    with raises_naming(InputError, "output_fmt", "NLC"):
        swin.forward_intermediates(x, output_fmt="NLC")


@pytest.mark.parametrize("name", ["vit_test", "swin_test", "hybrid_test", "grasp_hybrid_t"])
def test_features_only_is_timms_feature_net(name):
    m = small(name).eval()
    x = batch(m)
    n = len(m.feature_info)
    idx = (0, n - 1)
    fe = small(name, features_only=True, out_indices=idx).eval()  # same seed: same weights
    assert isinstance(fe, FeatureGetterNet)
    assert fe.feature_info.channels() == [m.feature_info[i]["num_chs"] for i in idx]
    assert fe.feature_info.reduction() == [m.feature_info[i]["reduction"] for i in idx]
    with torch.no_grad():
        got = fe(x)
        want = m.forward_intermediates(x, list(idx), intermediates_only=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_features_only_drops_into_torchvision_faster_rcnn():
    from collections import OrderedDict

    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import FeaturePyramidNetwork

    fe = small("swin_test", features_only=True, out_indices=(1, 2, 3))

    class Body(torch.nn.Module):  # what detection code around a timm features_only model does
        def __init__(self) -> None:
            super().__init__()
            self.body, self.out_channels = fe, 16
            self.fpn = FeaturePyramidNetwork(fe.feature_info.channels(), self.out_channels)

        def forward(self, x):
            return self.fpn(OrderedDict((str(i), f) for i, f in enumerate(self.body(x))))

    sizes = tuple((4 * r,) for r in fe.feature_info.reduction())
    det = FasterRCNN(
        Body(),
        2,
        min_size=64,
        max_size=64,
        rpn_anchor_generator=AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes)),
    )
    target = {"boxes": torch.tensor([[4.0, 4, 40, 40]]), "labels": torch.tensor([1])}
    losses = det([torch.rand(3, 64, 64)], [target])
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())
    assert fe.model.patch_embed.proj.weight.grad is not None


def test_features_only_serves_a_consumer_written_for_timms_feature_list_net():
    """smp / mmdet style: widths and strides read from feature_info, maps fused at input size."""
    from timm.models._features import FeatureListNet

    class Fuse(torch.nn.Module):
        def __init__(self, fe: torch.nn.Module) -> None:
            super().__init__()
            self.fe, self.strides = fe, fe.feature_info.reduction()
            self.lateral = torch.nn.ModuleList(
                torch.nn.Conv2d(c, 8, 1) for c in fe.feature_info.channels()
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = 0
            for f, lateral, s in zip(self.fe(x), self.lateral, self.strides, strict=True):
                assert f.shape[-2:] == (-(-x.shape[-2] // s), -(-x.shape[-1] // s))
                out = out + torch.nn.functional.interpolate(lateral(f), size=x.shape[-2:])
            return out

    ref = timm.create_model("resnet18", features_only=True, out_indices=(1, 2, 3))
    assert isinstance(ref, FeatureListNet)  # what the consumer was written against
    x = torch.randn(1, 3, 48, 40)
    for fe in (
        ref,
        small("swin_test", features_only=True, out_indices=(1, 2, 3)),
        small("vit_test", features_only=True, out_indices=(0, 1)),
        small("hybrid_test", features_only=True),
    ):
        info = fe.feature_info
        assert [d["num_chs"] for d in info.get_dicts()] == info.channels()
        with torch.no_grad():
            assert Fuse(fe.eval())(x).shape == (1, 8, 48, 40)


# --- tracing and compiling ------------------------------------------------------------------


def assert_same_outputs(got, want) -> None:
    if isinstance(want, dict):  # grasp maps
        assert got.keys() == want.keys()
        got, want = list(got.values()), list(want.values())
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ALL)
def test_fx_symbolic_trace_equals_eager(name):
    """A plain trace (no leaf modules given) runs at any input size, like the model itself."""
    m = small(name).eval()
    gm = torch.fx.symbolic_trace(m)
    x = batch(m)
    odd = torch.randn(1, m.in_chans, x.shape[-2] + 5, x.shape[-1] + 9)  # pads, resamples
    with torch.no_grad():
        for inp in (x, odd):
            assert_same_outputs(gm(inp), m(inp))


# module whose output is a feature map -> how forward_intermediates gives the same map
FX_NODES = {
    "vit_test": ("blocks.0", lambda t: t[:, 1:], {"output_fmt": "NLC"}),  # drop the class token
    "vit_test_avg_rope": ("blocks.0", lambda t: t, {"output_fmt": "NLC"}),
    "swin_test": ("layers.1", lambda t: t, {"output_fmt": "NHWC"}),
    "hybrid_test": ("trunk.stem.1", lambda t: t, {}),
}


@pytest.mark.parametrize(
    ("name", "tracer_kwargs"),
    [(name, None) for name in FX_NODES] + [("vit_test", TRACER)],  # and timm's fx test's kwargs
)
def test_fx_feature_extractor(name, tracer_kwargs):
    """torchvision's extractor, as is and with the kwargs timm's own fx test passes."""
    m = small(name).eval()
    x = batch(m)
    node, as_map, fmt = FX_NODES[name]
    index = [i["module"] for i in m.feature_info].index(node)
    head = m.pretrained_cfg["classifier"]
    fx = create_feature_extractor(m, {node: "feat", head: "logits"}, tracer_kwargs=tracer_kwargs)
    with torch.no_grad():
        out = fx(x)
        (want,) = m.forward_intermediates(x, [index], intermediates_only=True, **fmt)
        torch.testing.assert_close(out["logits"], m(x))
    torch.testing.assert_close(as_map(out["feat"]), want)


def test_compile_fullgraph_and_export_tiny_model():
    m = small("vit_test").eval()
    x = batch(m)
    compiled = torch.compile(m, fullgraph=True, backend="eager")  # no graph break anywhere
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
    ep = torch.export.export(small("swin_test").eval(), (x,))
    torch.testing.assert_close(ep.module()(x), small("swin_test").eval()(x))


# --- gradient checkpointing -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["vit_test", "vit_test_avg_rope", "swin_test", "hybrid_test", "grasp_hybrid_t"]
)
def test_grad_checkpointing_gives_identical_gradients(name):
    def grads(ckpt: bool) -> dict:
        m = small(name).train()
        m.set_grad_checkpointing(ckpt)
        calls = []
        blocks = [mod for mod in m.modules() if isinstance(mod, Block)]  # Transformer blocks
        hooks = [b.register_forward_pre_hook(lambda *_: calls.append(1)) for b in blocks]
        out = m(batch(m))
        loss = (
            sum(o.square().mean() for o in out.values())
            if isinstance(out, dict)
            else out.square().mean()
        )
        loss.backward()
        for h in hooks:
            h.remove()
        # checkpointed blocks run again in backward
        assert len(calls) == (2 if ckpt else 1) * len(blocks)
        return {n: p.grad for n, p in m.named_parameters()}

    plain, ckpt = grads(False), grads(True)
    for n, g in plain.items():
        assert g is not None and torch.equal(g, ckpt[n]), n


def test_grad_checkpointing_config_key(tmp_path):
    from vision_tfm.tasks.config import ModelConfig

    m = ModelConfig(name="vit_test", grad_checkpointing=True).create()
    assert m.grad_checkpointing


# --- layer decay ----------------------------------------------------------------------------


def _scales(model, opt) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr_scale"] for g in opt.param_groups for p in g["params"]}


def test_layer_decay_vit_follows_beit_and_timm():
    d, decay = 3, 0.65
    m = small("vit_test", depth=d)
    scales = _scales(m, build_optimizer(m, OptimConfig(layer_decay=decay), 1e-3))
    layer = {"cls_token": 0, "pos_embed": 0, "patch_embed.proj.weight": 0, "head.weight": d + 1}
    layer |= {f"blocks.{i}.mlp.fc1.weight": i + 1 for i in range(d)}
    for n, lid in layer.items():
        assert scales[n] == pytest.approx(decay ** (d + 1 - lid)), n
    ref = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=d, num_heads=2
    )
    assert scales == pytest.approx(_scales(ref, create_optimizer_v2(ref, layer_decay=decay)))


def test_layer_decay_swin_by_stage_and_block():
    decay = 0.65
    m = small("swin_test")  # 4 stages of 2 blocks: 8 block layers + stem + head
    scales = _scales(m, create_optimizer_v2(m, layer_decay=decay))
    top = 9
    want = {"patch_embed.proj.weight": 0, "head.fc.weight": top}
    for s in range(4):
        for b in range(2):
            want[f"layers.{s}.blocks.{b}.mlp.fc1.weight"] = 2 * s + b + 1
        if s:  # a stage's patch merging goes with its first block
            want[f"layers.{s}.downsample.reduction.weight"] = 2 * s + 1
    for n, lid in want.items():
        assert scales[n] == pytest.approx(decay ** (top - lid)), n
    ref = timm.create_model(
        "swin_tiny_patch4_window7_224",
        **{
            k: v
            for k, v in small("swin_test").cfg.__dict__.items()
            if k in ("img_size", "patch_size", "embed_dim", "depths", "num_heads", "window_size")
        },
    )
    assert scales == pytest.approx(_scales(ref, create_optimizer_v2(ref, layer_decay=decay)))


@pytest.mark.parametrize("name", ["hybrid_test", "grasp_hybrid_t"])
def test_layer_decay_hybrid_groups_stem_blocks_head(name):
    m = small(name)
    scales = _scales(m, create_optimizer_v2(m, layer_decay=0.5))
    assert scales["trunk.stem.0.0.conv.weight"] == pytest.approx(0.5**3)
    assert scales["trunk.blocks.0.attn.qkv.weight"] == pytest.approx(0.5**2)
    assert scales["trunk.blocks.1.attn.qkv.weight"] == pytest.approx(0.5)
    assert scales["head.weight"] == 1.0
