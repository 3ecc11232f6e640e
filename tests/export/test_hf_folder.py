"""A trained run as a Hugging Face / timm folder: written beside ``best.pt`` by training and by
``vtfm export --format hf``, scored by plain timm (a child process that never imports
vision_tfm) with timm's own data config and transforms, on the embedded digits."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import raises_naming
from safetensors.torch import load_file

import vision_tfm as vt
from vision_tfm.cli import main as vtfm
from vision_tfm.config import apply_overrides
from vision_tfm.data.mnist import load_mnist
from vision_tfm.errors import OutputExistsError
from vision_tfm.export.folder import export_folder
from vision_tfm.io import load_checkpoint
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = {
    "model.name": "vit_mnist",
    "model.kwargs": {"embed_dim": 32, "depth": 1, "num_heads": 2},
    "data.train_subset": 512,
    "data.batch_size": 64,
    "sched.epochs": 1,
    "sched.warmup_epochs": 0,
    "run.tensorboard": False,
    "run.plots": False,
    "run.log_interval": 1000,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = apply_overrides(ClsConfig(), {**RUN, "run.out_dir": str(out)})
    torch.manual_seed(0)
    trainer = Trainer(cfg, ClassificationTask(cfg))
    metrics = trainer.fit()
    return trainer.run_dir, metrics


def test_training_writes_the_shipped_weights_as_safetensors_beside_best(trained):
    run_dir, _ = trained
    weights = load_file(run_dir / "model.safetensors")
    ckpt = load_checkpoint(run_dir / "best.pt")
    assert weights.keys() == ckpt["model"].keys()
    assert all(torch.equal(weights[k], v) for k, v in ckpt["model"].items())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["pretrained_cfg"]["label_names"] == [str(i) for i in range(10)]
    run = vt.create_model(f"local-dir:{run_dir}", pretrained=True)  # no unpickling
    assert run.pretrained_cfg["mean"] == (0.1307,)


def test_exported_folder_scores_in_plain_timm_as_we_do(trained, tmp_path):
    run_dir, metrics = trained
    out = tmp_path / "hf"
    vtfm(["export", "--format", "hf", "--checkpoint", str(run_dir / "best.pt"), "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    images, labels = load_mnist("val")
    np.save(tmp_path / "images.npy", images)
    np.save(tmp_path / "labels.npy", labels)
    code = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np, timm, torch
        from PIL import Image
        from timm.data import create_transform, resolve_data_config
        model = timm.create_model("local-dir:{out}", pretrained=True).eval()
        tf = create_transform(**resolve_data_config(model=model))
        images, labels = np.load("images.npy"), np.load("labels.npy")
        x = torch.stack([tf(Image.fromarray(a, mode="L")) for a in images])
        with torch.no_grad():
            hits = int((model(x).argmax(1).numpy() == labels).sum())
        assert "vision_tfm" not in sys.modules
        print(json.dumps([type(model).__module__, hits, len(labels)]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    module, hits, n = json.loads(done.stdout.strip().splitlines()[-1])
    assert module == "timm.models.vision_transformer"
    assert n == 2000 and hits / n == pytest.approx(metrics["top1"], abs=1e-9)
    with raises_naming(OutputExistsError, "model.safetensors"):  # nothing is replaced
        export_folder(run_dir / "best.pt", out)
