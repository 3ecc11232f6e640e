"""Detection backbones: declared shapes, classifier parity, freezing, detectors."""

import math

import pytest
import timm
import torch
import torchvision
from conftest import raises_naming

import vision_tfm as vt

SWIN = "swin_tiny_patch4_window7_224"
VIT = "vit_small_patch16_224"
TINY = {  # registered full-size names shrunk to test size; strides stay 4..32
    SWIN: {"embed_dim": 16, "depths": (2, 2, 2, 2), "num_heads": (1, 1, 2, 2)},
    VIT: {"embed_dim": 32, "depth": 4, "num_heads": 2},
}
FAST_RCNN_KW = {  # fewer proposals and sampled RoIs keep a CPU step well under 0.1 s
    "rpn_pre_nms_top_n_train": 200,
    "rpn_post_nms_top_n_train": 50,
    "rpn_pre_nms_top_n_test": 200,
    "rpn_post_nms_top_n_test": 50,
    "rpn_batch_size_per_image": 64,
    "box_batch_size_per_image": 32,
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _backbone(name, **kw):
    torch.manual_seed(0)
    return vt.create_backbone(name, **{"out_channels": 32, **TINY[name], **kw})


@pytest.mark.parametrize("fpn", [False, True])
@pytest.mark.parametrize("name", [SWIN, VIT])
def test_maps_match_declared_channels_and_strides(name, fpn):
    bb = _backbone(name, fpn=fpn).eval()
    n_out = 5 if fpn else 4  # FPN adds Faster R-CNN's "pool" level
    assert bb.strides == [4, 8, 16, 32, 64][:n_out]
    channels = [bb.out_channels] * n_out if fpn else bb.out_channels
    assert isinstance(bb.out_channels, int) == fpn
    if not fpn:
        assert bb.out_channels == ([16, 32, 64, 128] if name == SWIN else [32] * 4)
    for h, w in [(224, 224), (256, 320), (608, 800)]:
        with torch.no_grad():
            out = bb(torch.randn(1, 3, h, w))
        assert list(out) == bb.names
        got = [tuple(m.shape[1:]) for m in out.values()]
        want = [(c, math.ceil(h / s), math.ceil(w / s)) for c, s in zip(channels, bb.strides)]
        assert got == want, (h, w)


def test_selected_levels_and_odd_size():
    bb = _backbone(VIT, out_indices=(1, 3)).eval()
    assert bb.strides == [8, 32] and bb.out_channels == [32, 32]
    with torch.no_grad():
        out = bb(torch.randn(1, 3, 100, 130))  # not a multiple of the patch: maps are ceil(H/s)
    assert [tuple(m.shape[-2:]) for m in out.values()] == [(13, 17), (4, 5)]


def test_swin_out_norm_normalises_each_position():
    with torch.no_grad():
        out = _backbone(SWIN, out_norm=True).eval()(torch.randn(1, 3, 64, 64))
    for m in out.values():
        assert m.mean(1).abs().max() < 1e-4 and (m.var(1, unbiased=False) - 1).abs().max() < 1e-2


def test_swin_stage_maps_equal_timm_intermediates():
    torch.manual_seed(0)
    ref = timm.create_model(SWIN, **TINY[SWIN]).eval()
    x = torch.randn(1, 3, 224, 224)
    for indices in [(0, 1, 2, 3), (1, 3)]:
        bb = vt.create_backbone(SWIN, indices, pretrained=ref.state_dict(), **TINY[SWIN]).eval()
        with torch.no_grad():
            want = ref.forward_intermediates(x, list(indices), intermediates_only=True)
            got = list(bb(x).values())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert (g - w).abs().max().item() <= 1e-5


def test_swin_stage_maps_equal_torchvision_at_padded_size():
    torch.manual_seed(0)
    ref = torchvision.models.swin_transformer.SwinTransformer(
        [4, 4], 16, [2, 2, 2, 2], [1, 1, 2, 2], [7, 7]
    ).eval()
    bb = vt.create_backbone(SWIN, pretrained=ref.state_dict(), **TINY[SWIN]).eval()
    x = torch.randn(1, 3, 256, 320)  # 64x80 -> ... -> 8x10: every stage pads to the window
    with torch.no_grad():
        got = list(bb(x).values())
        y, want = x, []
        for i, layer in enumerate(ref.features):  # odd entries end a stage (NHWC)
            y = layer(y)
            if i % 2:
                want.append(y.permute(0, 3, 1, 2))
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max().item() <= 1e-5


def test_vit_pretrained_loads_at_another_grid():
    torch.manual_seed(0)
    ref = timm.create_model(VIT, **TINY[VIT])
    bb = vt.create_backbone(VIT, pretrained=ref.state_dict(), img_size=320, **TINY[VIT])
    vit = bb.body.model
    assert vit.pos_embed.shape == (1, 1 + 20 * 20, 32)  # resampled from 14x14 to 20x20
    assert torch.equal(vit.blocks[3].mlp.fc2.weight, ref.blocks[3].mlp.fc2.weight)


@pytest.mark.parametrize(
    ("name", "frozen_prefixes"),
    [
        (SWIN, ("patch_embed.", "layers.0.", "layers.1.")),
        (VIT, ("patch_embed.", "pos_embed", "cls_token", "blocks.0.", "blocks.1.")),
    ],
)
def test_frozen_stages_get_no_grad_and_stay_unchanged(name, frozen_prefixes):
    bb = _backbone(name, fpn=True, frozen_stages=2, drop_path_rate=0.1)
    params = dict(bb.named_parameters())
    is_frozen = {n: n.startswith(tuple(f"body.model.{f}" for f in frozen_prefixes)) for n in params}
    assert sum(is_frozen.values()) > 0
    assert all(params[n].requires_grad != f for n, f in is_frozen.items())
    before = {n: p.detach().clone() for n, p in params.items()}
    bb.train()
    modes = {
        (is_frozen[f"{n}.weight"], m.training)
        for n, m in bb.named_modules()
        if f"{n}.weight" in params
    }
    assert modes == {(True, False), (False, True)}  # frozen parts stay in eval mode
    opt = torch.optim.AdamW(bb.parameters(), lr=0.1, weight_decay=0.1)  # decay would move them
    sum(m.square().mean() for m in bb(torch.randn(2, 3, 64, 96)).values()).backward()
    opt.step()
    for n, p in params.items():
        changed = not torch.equal(p, before[n])
        assert (p.grad is None and not changed) if is_frozen[n] else p.grad is not None, n


def _toy_set():
    """Two dark images with bright rectangles (one class), of two shapes."""
    g = torch.Generator().manual_seed(0)
    boxes = [
        torch.tensor([[20.0, 30, 80, 90], [90, 20, 120, 60]]),
        torch.tensor([[10.0, 60, 70, 140]]),
    ]
    images = []
    for (h, w), bxs in zip([(128, 160), (160, 128)], boxes):
        img = torch.rand(3, h, w, generator=g) * 0.2
        for x0, y0, x1, y1 in bxs.long().tolist():
            img[:, y0:y1, x0:x1] = 1.0
        images.append(img)
    targets = [{"boxes": b, "labels": torch.ones(len(b), dtype=torch.long)} for b in boxes]
    return images, targets


@pytest.mark.parametrize("name", [SWIN, VIT])
@pytest.mark.parametrize("kind", ["fasterrcnn", "retinanet"])
def test_detector_trains_and_predicts_at_two_sizes(kind, name):
    torch.manual_seed(0)
    det = vt.detection.build_detector(
        kind,
        name,
        num_classes=2,
        min_size=128,
        max_size=160,
        out_channels=32,
        backbone_kw=TINY[name],
        **(FAST_RCNN_KW if kind == "fasterrcnn" else {}),
    )
    images, targets = _toy_set()
    opt = torch.optim.AdamW([p for p in det.parameters() if p.requires_grad], lr=3e-4)
    det.train()
    losses = []
    for _ in range(30):
        loss = sum(det(images, targets).values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert last < 0.75 * first, losses
    det.eval()
    for min_size in (128, 96):
        det.transform.min_size = (min_size,)
        with torch.no_grad():
            out = det(images)
        assert len(out) == 2
        for o in out:
            assert set(o) == {"boxes", "labels", "scores"}
            assert o["boxes"].shape == (len(o["scores"]), 4) and len(o["labels"]) == len(
                o["scores"]
            )


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: vt.create_backbone(SWIN, (0, 4)), ("out_indices", (0, 4))),  # 4 out of range
        (lambda: vt.create_backbone(VIT, (-1,)), ("out_indices",)),
        (lambda: vt.create_backbone(SWIN, (2, 1)), ("out_indices", (2, 1))),  # not increasing
        (lambda: vt.create_backbone("swin_tiny_patch4", (0,)), ("swin_tiny_patch4", SWIN)),
        (lambda: vt.create_backbone("hybrid_test"), ("hybrid_test",)),  # no backbone
        (lambda: vt.create_backbone(SWIN, frozen_stages=5), ("frozen_stages", 5)),
        (lambda: vt.create_backbone(VIT, patch_size=12, img_size=96, **TINY[VIT]), (12,)),
        (lambda: vt.detection.build_detector("yolo", VIT, 2), ("yolo",)),
        (lambda: vt.detection.build_detector("fasterrcnn", VIT, num_classes=0), ("num_classes", 0)),
        (lambda: vt.detection.build_detector("retinanet", VIT, 1), ("num_classes", 1)),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, names):
    with raises_naming(ValueError, *names):
        call()
