"""Weight interop: timm, torchvision and official-Swin state dicts give identical logits."""

import pickle
import re

import pytest
import timm
import torch
import torchvision
from conftest import raises_naming

import vision_tfm as vt
from vision_tfm.errors import CheckpointError


def _logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize(
    "name",
    [
        "vit_tiny_patch16_224",
        "vit_small_patch16_224",
        "vit_base_patch16_224",
        "swin_tiny_patch4_window7_224",
        "swin_small_patch4_window7_224",
    ],
)
def test_timm_parity(name):
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False).eval()
    ours = vt.load_pretrained(vt.create_model(name), ref.state_dict())
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    x = torch.randn(2, 3, 224, 224)
    assert (_logits(ours, x) - _logits(ref, x)).abs().max().item() <= 1e-5


def test_published_parameter_counts():
    assert (
        sum(p.numel() for p in vt.create_model("vit_small_patch16_224").parameters()) == 22_050_664
    )
    n = sum(p.numel() for p in vt.create_model("swin_tiny_patch4_window7_224").parameters())
    assert n == 28_288_354


def test_torchvision_swin_t_parity_including_padded_size():
    torch.manual_seed(0)
    ref = torchvision.models.swin_t().eval()
    ours = vt.load_pretrained(vt.create_model("swin_tiny_patch4_window7_224"), ref.state_dict())
    for shape in [(2, 3, 224, 224), (1, 3, 256, 320)]:  # 256x320 pads every stage
        x = torch.randn(shape)
        assert (_logits(ours, x) - _logits(ref, x)).abs().max().item() <= 1e-5


def test_torchvision_vit_b_16_parity():
    torch.manual_seed(0)
    ref = torchvision.models.vit_b_16().eval()
    ours = vt.load_pretrained(vt.create_model("vit_base_patch16_224"), ref.state_dict())
    x = torch.randn(1, 3, 224, 224)
    assert (_logits(ours, x) - _logits(ref, x)).abs().max().item() <= 1e-5


def _to_official_swin(sd):
    """Write a timm Swin state dict in the official Microsoft repo's layout."""
    out = {}
    for k, v in sd.items():
        m = re.match(r"layers\.(\d+)\.downsample\.(.*)", k)
        if m:
            k = f"layers.{int(m.group(1)) - 1}.downsample.{m.group(2)}"
        out[k.replace("head.fc.", "head.")] = v
    for k in list(out):  # the official repo persists these buffers
        if k.endswith("relative_position_bias_table"):
            out[k.replace("bias_table", "index")] = torch.zeros(49, 49, dtype=torch.long)
    out["layers.0.blocks.1.attn_mask"] = torch.zeros(64, 49, 49)
    return {"model": out}


def test_official_swin_layout_parity(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model("swin_tiny_patch4_window7_224").eval()
    ckpt = tmp_path / "swin_tiny_patch4_window7_224.pth"
    torch.save(_to_official_swin(ref.state_dict()), ckpt)
    ours = vt.load_pretrained(vt.create_model("swin_tiny_patch4_window7_224"), ckpt)
    x = torch.randn(1, 3, 224, 224)
    assert (_logits(ours, x) - _logits(ref, x)).abs().max().item() <= 1e-5


def test_pos_embed_resampled_when_image_size_differs():
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224").eval()
    ours = vt.load_pretrained(
        vt.create_model("vit_tiny_patch16_224", img_size=256), ref.state_dict()
    )
    assert ours.pos_embed.shape == (1, 1 + 16 * 16, 192)
    # at its own grid the resampled table reproduces timm running dynamically at 256
    dyn = timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True).eval()
    dyn.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 256, 256)
    assert (_logits(ours, x) - _logits(dyn, x)).abs().max().item() <= 1e-4


def test_head_of_other_class_count_is_left_at_init():
    ref = timm.create_model("vit_tiny_patch16_224").eval()
    m = vt.create_model("vit_tiny_patch16_224", num_classes=10)
    with pytest.warns(UserWarning, match=r"\bhead\.weight\b"):  # the tensor left at init
        vt.load_pretrained(m, ref.state_dict())
    torch.testing.assert_close(m.pos_embed, ref.pos_embed)


@pytest.mark.parametrize("name", ["vit_test", "swin_test"])
def test_head_is_dropped_for_a_feature_model_and_kept_at_init_when_missing(name):
    clf = vt.create_model(name, num_classes=10).eval()
    feat = vt.load_pretrained(vt.create_model(name, num_classes=0).eval(), clf.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(feat(x), clf.forward_head(clf.forward_features(x), True))
    fresh = vt.create_model(name, num_classes=10)
    head = next(k for k in fresh.state_dict() if k.startswith("head") and k.endswith("weight"))
    with pytest.warns(UserWarning, match=rf"\b{re.escape(head)}\b"):  # the checkpoint has none
        vt.load_pretrained(fresh, feat.state_dict())
    torch.testing.assert_close(fresh.state_dict()["norm.weight"], clf.state_dict()["norm.weight"])


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    vit_sd = vt.create_model("vit_test").state_dict()
    with raises_naming(CheckpointError, "vit", "SwinTransformer"):  # what it is, what it meets
        vt.load_pretrained(vt.create_model("swin_test"), vit_sd)
    other = vt.create_model("vit_test", depth=3).state_dict()
    with raises_naming(CheckpointError, "blocks.2.attn.qkv.weight"):  # a block the model lacks
        vt.load_pretrained(vt.create_model("vit_test"), other)
    wide = vt.create_model("vit_test", embed_dim=64).state_dict()
    with raises_naming(CheckpointError, 64, 32):  # the width saved, the model's
        vt.load_pretrained(vt.create_model("vit_test"), wide)
    with raises_naming(FileNotFoundError, tmp_path / "nope.pth"):
        vt.load_pretrained(vt.create_model("vit_test"), tmp_path / "nope.pth")
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with raises_naming(CheckpointError, junk):
        vt.load_pretrained(vt.create_model("vit_test"), junk)
    with raises_naming(CheckpointError, "foo.weight"):  # the keys it could not place
        vt.load_pretrained(vt.create_model("vit_test"), {"foo.weight": torch.zeros(1)})


def test_state_dict_of_another_size_is_refused_before_resampling():
    # vit_mnist has no class token: the 17-token table of vit_test used to fail to resample
    with raises_naming(CheckpointError, "pos_embed", (1, 17, 32), (1, 16, 128)):
        vt.load_pretrained(vt.create_model("vit_mnist"), vt.create_model("vit_test").state_dict())


def test_integer_values_for_a_float_parameter_are_refused():
    sd = vt.create_model("vit_test").state_dict()
    sd["blocks.0.attn.qkv.weight"] = sd["blocks.0.attn.qkv.weight"].long()
    with raises_naming(CheckpointError, "blocks.0.attn.qkv.weight", "torch.int64"):
        vt.load_pretrained(vt.create_model("vit_test"), sd)


@pytest.mark.parametrize(
    "write",
    [
        lambda p: p.write_bytes(b""),
        lambda p: p.write_text("hello\n"),
        lambda p: p.write_bytes(pickle.dumps({"a": 1}, protocol=4)),
        lambda p: torch.save(torch.nn.Linear(2, 2), p),  # a whole pickled module
    ],
    ids=["empty", "text", "plain_pickle", "module"],
)
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_unreadable_checkpoint_says_why_without_torch_advice(tmp_path, write):
    path = tmp_path / "w.pth"
    write(path)
    with raises_naming(CheckpointError, path) as e:
        vt.load_pretrained(vt.create_model("vit_test"), path)
    assert "weights_only" not in str(e.value)  # never advise the unsafe load
