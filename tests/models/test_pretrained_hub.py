"""``pretrained=True`` / a tag / ``checkpoint_path=`` from a local Hugging Face cache, offline.

The cache is built here from a randomly initialised (shrunk) timm model in the hub's layout
(``models--timm--<name>.<tag>/refs/main`` -> ``snapshots/<commit>/model.safetensors``), and the
hub is switched offline: nothing downloads.
"""

import importlib.util
import sys
from pathlib import Path

import huggingface_hub
import pytest
import timm
import torch
from conftest import raises_naming
from safetensors.torch import save_file

import vision_tfm as vt
from vision_tfm.errors import CheckpointError, ConfigError, MissingFileError
from vision_tfm.tasks.config import ModelConfig

NAME, TAG = "vit_tiny_patch16_224", "augreg_in21k_ft_in1k"
SHRINK = {"depth": 2}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An offline hub whose cache is ``tmp_path`` (empty until ``add`` puts a model in)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))

    def add(name: str, tag: str, model: torch.nn.Module) -> None:
        repo = tmp_path / f"models--timm--{name}.{tag}"
        commit = "0" * 40
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(sd, snap / "model.safetensors")

    return add


def _timm_ref(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(NAME, **SHRINK, **kw).eval()


def test_pretrained_true_and_tag_match_timm_logits(offline_cache):
    ref = _timm_ref()
    offline_cache(NAME, TAG, ref)  # the tag timm resolves by default for this name
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want = ref(x)
        for m in (
            vt.create_model(NAME, pretrained=True, **SHRINK),
            vt.create_model(NAME, pretrained=TAG, **SHRINK),
            vt.create_model(f"{NAME}.{TAG}", pretrained=True, **SHRINK),
        ):
            assert (m.eval()(x) - want).abs().max().item() <= 1e-5
    assert m.pretrained_cfg["mean"] == (0.5, 0.5, 0.5)  # the weights' normalisation, from timm
    assert m.pretrained_cfg["hf_hub_id"] == f"timm/{NAME}.{TAG}"


def test_a_tag_alone_picks_the_config_and_downloads_nothing(offline_cache, monkeypatch):
    """timm's rule: ``name.tag`` selects the weights' cfg; only ``pretrained=True`` loads."""
    import vision_tfm.models.hub as hub

    def no_download(*a, **k):
        raise AssertionError("a tag without pretrained=True must not fetch weights")

    monkeypatch.setattr(hub, "published_weights", no_download)
    m = vt.create_model(f"{NAME}.augreg_in21k", **SHRINK)  # not in the cache: nothing fetched
    ref = timm.create_model(f"{NAME}.augreg_in21k", **SHRINK)
    assert m.num_classes == ref.num_classes == 21843  # the tag's head, as timm builds it
    assert m.pretrained_cfg["mean"] == ref.pretrained_cfg["mean"] == (0.5, 0.5, 0.5)
    assert vt.create_model(f"{NAME}.augreg_in21k", num_classes=5, **SHRINK).num_classes == 5
    with raises_naming(ConfigError, "unknown pretrained tag", "no_such_tag"):
        vt.create_model(f"{NAME}.no_such_tag")


def test_pretrained_adapts_channels_head_and_grid_as_timm_does(offline_cache):
    offline_cache(NAME, TAG, _timm_ref())
    x = torch.randn(1, 1, 224, 224)
    ref = timm.create_model(NAME, pretrained=True, in_chans=1, num_classes=0, **SHRINK).eval()
    ours = vt.create_model(NAME, pretrained=True, in_chans=1, num_classes=0, **SHRINK)
    with torch.no_grad():
        assert (ours.eval()(x) - ref(x)).abs().max().item() <= 1e-5  # summed RGB filters
    with pytest.warns(UserWarning, match=r"\bhead\.weight\b"):  # the tensor left at init
        m = vt.create_model(NAME, pretrained=True, num_classes=7, img_size=160, **SHRINK)
    assert m.pos_embed.shape == (1, 1 + 10 * 10, 192)  # resampled from 14 x 14


def test_offline_without_cache_is_one_line_naming_repo_cache_and_alternative(
    offline_cache, tmp_path
):
    with raises_naming(MissingFileError, f"timm/{NAME}.{TAG}", tmp_path, "checkpoint_path"):
        vt.create_model(NAME, pretrained=True, **SHRINK)  # also a FileNotFoundError


def test_corrupt_cached_weights_are_a_checkpoint_error_naming_repo_and_cache(
    offline_cache, tmp_path
):
    offline_cache(NAME, TAG, _timm_ref())
    (weights,) = tmp_path.rglob("model.safetensors")
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")  # a truncated header
    with raises_naming(CheckpointError, f"timm/{NAME}.{TAG}", tmp_path, "checkpoint_path"):
        vt.create_model(NAME, pretrained=True, **SHRINK)


def test_no_published_weights_or_unknown_tag():
    with raises_naming(ConfigError, "vit_mnist", "checkpoint_path"):
        vt.create_model("vit_mnist", pretrained=True)
    with raises_naming(ConfigError, "no_such_tag", "augreg_in21k_ft_in1k"):  # the real tags
        vt.create_model(NAME, pretrained="no_such_tag", **SHRINK)


def test_checkpoint_path_and_train_config_forms(tmp_path):
    ref = _timm_ref()
    path = tmp_path / "w.pth"
    torch.save(ref.state_dict(), path)
    x = torch.randn(1, 3, 224, 224)
    m = ModelConfig(name=NAME, kwargs=SHRINK, pretrained=str(path)).create()
    with torch.no_grad():
        assert (m.eval()(x) - ref(x)).abs().max().item() <= 1e-5
    assert ModelConfig(pretrained=True).weights() == (True, None)
    assert ModelConfig(pretrained=TAG).weights() == (TAG, None)
    assert ModelConfig(pretrained="runs/a/best.pt").weights() == (False, "runs/a/best.pt")
    assert ModelConfig().weights() == (False, None)
    own = vt.create_model("hybrid_test")  # a family with no foreign layout loads its own keys
    torch.save({"model": own.state_dict()}, tmp_path / "own.pt")
    again = vt.create_model("hybrid_test", checkpoint_path=tmp_path / "own.pt")
    assert all(
        torch.equal(a, b) for a, b in zip(own.state_dict().values(), again.state_dict().values())
    )


def test_detection_backbone_and_example_take_pretrained_as_create_model(
    offline_cache, tmp_path, monkeypatch
):
    """True, a tag, a file or a state dict reach ``create_backbone`` through one rule."""
    ref = _timm_ref()
    offline_cache(NAME, TAG, ref)
    path = tmp_path / "w.pth"
    torch.save(ref.state_dict(), path)
    want = ref.blocks[1].attn.qkv.weight
    for weights in (True, TAG, str(path), path, ref.state_dict()):
        bb = vt.create_backbone(NAME, (2, 3), pretrained=weights, **SHRINK)
        assert torch.equal(bb.body.model.blocks[1].attn.qkv.weight, want), weights
    example = Path(__file__).resolve().parents[2] / "examples" / "finetune_detector.py"
    spec = importlib.util.spec_from_file_location("finetune_detector", example)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look themselves up
    spec.loader.exec_module(mod)
    cfg = mod.DetConfig(model=ModelConfig(name=NAME, kwargs=SHRINK, pretrained=True))
    detector = mod.DetectionTask(cfg, [], [], ["a"]).build()[0]
    assert torch.equal(detector.backbone.body.model.blocks[1].attn.qkv.weight, want)
