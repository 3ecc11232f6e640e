"""Interop with timm both ways: our names in timm's registry and tools, and the Hugging Face /
timm model folder (``config.json`` + ``model.safetensors``) out of and back into both.

Where the folder must load in plain timm, a child process that never imports vision_tfm
does the loading, so nothing of ours can help it.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import pytest
import timm
import torch
from conftest import raises_naming
from timm.data import create_transform, resolve_data_config
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.fx import symbolic_trace

import vision_tfm as vt
from vision_tfm.errors import (
    CheckpointError,
    ConfigError,
    MissingFileError,
    OutputExistsError,
    VisionTfmError,
)
from vision_tfm.models import hf
from vision_tfm.models.timm_plugin import TIMM_PREFIX, timm_name

pytestmark = pytest.mark.usefixtures("one_thread")


def randomised(name: str, **kw) -> torch.nn.Module:
    """A model whose every tensor is non-trivial (a zero bias would hide a dropped key)."""
    torch.manual_seed(0)
    m = vt.create_model(name, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * (0.02 if p.ndim > 1 else 0.1))
    return m


def outputs(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return torch.cat(list(out.values()), 1) if isinstance(out, dict) else out


def plain_timm(script: str, tmp_path: Path) -> dict:
    """Run ``script`` (which sets ``result``) in a child that imports timm, never vision_tfm."""
    code = textwrap.dedent(script) + textwrap.dedent(
        """
        import json, sys
        assert "vision_tfm" not in sys.modules, "the child imported vision_tfm"
        print(json.dumps(result))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- our names in timm's registry ---------------------------------------------------------


def test_every_name_is_registered_in_timm_without_shadowing_timms_own():
    for name in vt.list_models():
        assert timm.is_model(timm_name(name))
        if "_224" not in name:  # the full-size names are slow to build here
            m = timm.create_model(timm_name(name))
            assert type(m).__module__.startswith("vision_tfm.") and m.model_name == name
    assert timm.list_models("*grasp*") == ["grasp_hybrid_s", "grasp_hybrid_t"]
    assert timm_name("vit_small_patch16_224") == TIMM_PREFIX + "vit_small_patch16_224"
    tiny = {"depth": 1, "img_size": 32}
    theirs = timm.create_model("vit_small_patch16_224", **tiny)  # still timm's own class
    ours = timm.create_model(TIMM_PREFIX + "vit_small_patch16_224", **tiny)
    assert type(theirs).__module__ == "timm.models.vision_transformer"
    assert type(ours).__module__ == "vision_tfm.models.vit"
    assert timm.models.get_pretrained_cfg("vit_mnist").input_size == (1, 28, 28)


def test_timm_builds_our_model_with_timms_arguments():
    m = timm.create_model("vit_mnist", num_classes=3, drop_rate=0.0, drop_path_rate=0.1)
    assert (m.num_classes, m.cfg.drop_path_rate, m.model_name) == (3, 0.1, "vit_mnist")
    g = timm.create_model("grasp_hybrid_t", drop_rate=0.0, in_chans=4)  # a field it lacks, at 0
    assert g.in_chans == 4
    with raises_naming(ConfigError, "grasp_hybrid_t", "drop_block_rate"):
        timm.create_model("grasp_hybrid_t", drop_block_rate=0.2)
    fe = timm.create_model("swin_test", features_only=True)
    assert fe.feature_info.reduction() == [2, 4, 8, 16]


def test_timm_pretrained_path_overlay_loads_a_local_file(tmp_path):
    """train.py --pretrained --pretrained-path FILE: timm overlays file= and num_classes=-1."""
    src = randomised("vit_test")
    torch.save(src.state_dict(), tmp_path / "w.pth")
    overlay = {"file": str(tmp_path / "w.pth"), "num_classes": -1}
    m = timm.create_model("vit_test", pretrained=True, pretrained_cfg_overlay=overlay).eval()
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(outputs(m, x), outputs(src, x))
    assert m.pretrained_cfg["num_classes"] == 1000


def test_timm_training_pieces_drive_a_registered_model():
    """What timm's train.py does with a model, on ours: data config, transforms, optimizer,
    scheduler and a few steps that lower the loss on a fixed batch."""
    torch.manual_seed(0)
    model = timm.create_model("vit_mnist", num_classes=4, embed_dim=32, depth=1, num_heads=2)
    data_cfg = resolve_data_config(model=model)
    assert data_cfg["input_size"] == (1, 28, 28)
    assert data_cfg["mean"] == (0.1307,) and data_cfg["crop_pct"] == 1.0
    train_tf = create_transform(**data_cfg, is_training=True)
    eval_tf = create_transform(**data_cfg)
    from PIL import Image

    img = Image.fromarray((torch.rand(28, 28) * 255).byte().numpy(), mode="L")
    assert train_tf(img).shape == eval_tf(img).shape == (1, 28, 28)
    opt = create_optimizer_v2(model, "adamw", lr=3e-3, weight_decay=0.05)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(model.pos_embed) not in decayed  # our no_weight_decay() reached timm
    sched, _ = create_scheduler_v2(opt, "cosine", num_epochs=2, warmup_epochs=0)
    x = torch.stack([eval_tf(img)] * 8) + torch.randn(8, 1, 28, 28) * 0.1
    y = torch.arange(8) % 4
    losses = []
    for _ in range(6):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sched.step(1)
    assert losses[-1] < losses[0]


# --- timm's semantics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "timm_arch", "kw"),
    [
        ("vit_test", "vit_small_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 4}),
        ("swin_test", "swin_tiny_patch4_window7_224", {}),
    ],
)
def test_features_only_defaults_and_cfg_follow_timm(name, timm_arch, kw):
    ours = vt.create_model(name, features_only=True, **kw)
    cfg = vt.create_model(name, **kw).cfg
    shape = {k: getattr(cfg, k) for k in ("img_size", "patch_size", "embed_dim", "num_heads")}
    if name.startswith("vit"):
        theirs = timm.create_model(timm_arch, features_only=True, depth=cfg.depth, **shape)
    else:
        shape.update(depths=cfg.depths, window_size=cfg.window_size)
        theirs = timm.create_model(timm_arch, features_only=True, **shape)
    assert len(ours.feature_info) == len(theirs.feature_info)  # ViT: the last 3 blocks
    assert ours.feature_info.reduction() == theirs.feature_info.reduction()
    assert resolve_data_config(model=ours)["input_size"] == (3, cfg.img_size, cfg.img_size)
    assert ours.pretrained_cfg["architecture"] == name
    if name.startswith("vit"):  # fewer blocks than timm's default three: all of them
        assert len(vt.create_model(name, features_only=True, depth=2).feature_info) == 2


def test_grasp_models_trace_with_torch_fx_and_timms_tracer():
    from timm.layers import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor

    tracer = {"leaf_modules": get_notrace_modules(), "autowrap_functions": get_notrace_functions()}
    m = randomised("grasp_hybrid_t", img_size=64)
    x = torch.randn(1, 4, 64, 80)
    torch.testing.assert_close(outputs(symbolic_trace(m), x), outputs(m, x))
    fx = create_feature_extractor(m.train(), {"trunk.stem": "stem"}, tracer_kwargs=tracer)
    assert fx(x)["stem"].shape[0] == 1


# --- the model folder ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """ViT-S and Swin-T at full size, vit_mnist, and two configs only vision_tfm builds."""
    root = tmp_path_factory.mktemp("folders")
    out = {}
    for name, kw in [
        ("vit_small_patch16_224", {}),
        ("swin_tiny_patch4_window7_224", {}),
        ("vit_mnist", {}),
        ("vit_test_avg_rope", {}),
        ("grasp_hybrid_t", {"img_size": 64}),
    ]:
        m = randomised(name, **kw)
        m.save_pretrained(root / name)
        out[name] = (m, root / name)
    return out


def test_vit_s_and_swin_t_round_trip_through_plain_timm(saved, tmp_path):
    """ours -> folder -> timm (no vision_tfm in the process) -> logits within 1e-5 of ours;
    the folder timm saves again (``save_for_hf``) -> ours, within 1e-5 too."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 224, 224)
    torch.save(x, tmp_path / "x.pt")
    names = ["vit_small_patch16_224", "swin_tiny_patch4_window7_224", "vit_mnist"]
    folders = {n: str(saved[n][1]) for n in names}
    got = plain_timm(
        f"""
        import timm, torch
        x = torch.load("x.pt")
        result = {{}}
        for name, folder in {folders!r}.items():
            m = timm.create_model("local-dir:" + folder, pretrained=True).eval()
            inp = x if m.pretrained_cfg["input_size"][0] == 3 else x[:, :1, :28, :28]
            with torch.no_grad():
                result[name] = [type(m).__module__, m(inp).tolist()]
            timm.models.save_for_hf(m, folder + "-timm", safe_serialization=True)  # timm's own
        """,
        tmp_path,
    )
    for name in names:
        ours, folder = saved[name]
        inp = x if ours.in_chans == 3 else x[:, :1, :28, :28]
        module, logits = got[name]
        assert module.startswith("timm.models.")
        assert (torch.tensor(logits) - outputs(ours, inp)).abs().max().item() <= 1e-5
        back = vt.create_model(f"local-dir:{folder}", pretrained=True).eval()
        assert type(back) is type(ours) and back.model_name == ours.model_name
        assert torch.equal(outputs(back, inp), outputs(ours, inp))
        again = vt.create_model(f"local-dir:{folder}-timm", pretrained=True).eval()  # timm -> ours
        assert type(again) is type(ours)
        assert (outputs(again, inp) - outputs(ours, inp)).abs().max().item() <= 1e-5


def test_folders_timm_cannot_build_name_our_registered_architecture(saved):
    for name in ("vit_test_avg_rope", "grasp_hybrid_t"):
        ours, folder = saved[name]
        config = json.loads((folder / "config.json").read_text())
        assert config["architecture"] == name
        assert config["vision_tfm"]["model_args"]["img_size"] == ours.cfg.img_size
        x = torch.randn(1, ours.in_chans, 64, 64)
        via_timm = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        torch.testing.assert_close(outputs(via_timm, x), outputs(ours, x), rtol=0, atol=0)
        untrained = vt.create_model(f"local-dir:{folder}")  # as timm: weights need pretrained
        assert not torch.equal(outputs(untrained.eval(), x), outputs(ours, x))


def test_folder_names_its_weights_config_and_keeps_what_exists(saved, tmp_path):
    ours, folder = saved["vit_mnist"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "vit_base_patch16_224"  # timm's own class builds it
    assert config["model_args"]["embed_dim"] == 128 and config["num_classes"] == 10
    assert config["pretrained_cfg"]["mean"] == [0.1307]
    with raises_naming(OutputExistsError, "model.safetensors"):
        ours.save_pretrained(folder)
    head = vt.create_model(f"local-dir:{folder}", pretrained=True, num_classes=3)
    assert head.num_classes == 3  # a new head, left at init (timm's rule)
    (tmp_path / "config.json").write_text("{not json")
    with raises_naming(CheckpointError, "config.json"):
        vt.create_model(f"local-dir:{tmp_path}")
    with raises_naming(MissingFileError, "nowhere"):
        vt.create_model(f"local-dir:{tmp_path / 'nowhere'}")


def test_plain_timm_folder_of_a_shared_name_loads_into_ours(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", depth=2, img_size=64).eval()
    timm.models.save_for_hf(ref, tmp_path, safe_serialization=True)
    ours = vt.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 3, 64, 64)
    assert (outputs(ours, x) - outputs(ref, x)).abs().max().item() <= 1e-5


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_hf_hub_names_load_from_the_cache_offline(saved, offline_hub):
    ours, folder = saved["grasp_hybrid_t"]
    repo = offline_hub / "models--someone--grasp"
    commit = "1" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (snap / f).write_bytes((folder / f).read_bytes())
    x = torch.randn(1, 4, 64, 64)
    for m in (
        vt.create_model("hf-hub:someone/grasp", pretrained=True),
        timm.create_model("hf-hub:someone/grasp", pretrained=True),
    ):
        assert torch.equal(outputs(m.eval(), x), outputs(ours, x))
    with raises_naming(MissingFileError, "someone/absent", offline_hub, "checkpoint_path"):
        vt.create_model("hf-hub:someone/absent", pretrained=True)


def test_push_to_hub_uploads_the_folder_through_the_hub_api(saved, monkeypatch):
    calls = {}

    class FakeApi:
        def __init__(self, token=None, **kw):
            calls["token"] = token

        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls["repo"] = (repo_id, private, exist_ok)
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def upload_folder(self, repo_id, folder_path, revision=None, commit_message=None):
            calls["files"] = sorted(p.name for p in Path(folder_path).iterdir())
            calls["config"] = json.loads((Path(folder_path) / "config.json").read_text())
            return type("CommitInfo", (), {"commit_url": f"https://hub/{repo_id}/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    ours, _ = saved["vit_mnist"]
    url = ours.push_to_hub("me/vit-digits", token="t", private=True)
    assert url == "https://hub/me/vit-digits/commit/1"
    assert calls["repo"] == ("me/vit-digits", True, True)
    assert calls["files"] == ["config.json", "model.safetensors"]
    assert calls["config"]["vision_tfm"]["model_name"] == "vit_mnist"


# --- offline and the error types ----------------------------------------------------------


def test_offline_pretrained_fails_at_once_without_retrying(tmp_path, monkeypatch):
    """Hub unreachable (a closed local port) and the file not cached: one line, and the
    download (which would retry for most of a minute) is never attempted."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")

    def no_download(*a, **k):
        raise AssertionError("an unreachable hub must not be retried")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    with raises_naming(MissingFileError, "vit_tiny_patch16_224", tmp_path, "checkpoint_path"):
        vt.create_model("vit_tiny_patch16_224", pretrained=True, depth=1)


def test_bad_input_at_the_api_is_a_vision_tfm_error_and_the_builtin(tmp_path, offline_hub):
    cases = [
        (lambda: vt.create_model("vit_tiny_patch16_224", pretrained=True), FileNotFoundError),
        (lambda: vt.create_model("vit_test", checkpoint_path="missing.pth"), FileNotFoundError),
        (lambda: vt.create_model("vit_mnist", pretrained=True), ValueError),
        (lambda: vt.create_model("no_such_model"), ValueError),
        (lambda: vt.create_model("local-dir:"), ValueError),
        (lambda: vt.load_pretrained(vt.create_model("vit_test"), tmp_path / "x.pt"), OSError),
    ]
    for make, builtin in cases:
        with pytest.raises(VisionTfmError) as info:
            make()
        assert isinstance(info.value, builtin), type(info.value)
        assert "\n" not in str(info.value)
    (tmp_path / "bad.safetensors").write_bytes(b"junk")
    with raises_naming(CheckpointError, "bad.safetensors"):
        vt.create_model("vit_test", checkpoint_path=tmp_path / "bad.safetensors")


def test_safetensors_checkpoint_path_loads_like_a_torch_file(saved):
    ours, folder = saved["vit_mnist"]
    again = vt.create_model("vit_mnist", checkpoint_path=folder / "model.safetensors")
    x = torch.randn(1, 1, 28, 28)
    assert torch.equal(outputs(again.eval(), x), outputs(ours, x))


def test_write_folder_refuses_a_file_in_its_place(tmp_path):
    (tmp_path / "f").write_text("x")
    with raises_naming(OutputExistsError, tmp_path / "f"):
        hf.save_pretrained(vt.create_model("vit_test"), tmp_path / "f")
