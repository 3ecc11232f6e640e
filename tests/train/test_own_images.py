"""Your own images in one command: a flat folder of classes trains with a held-out share."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml
from PIL import Image

from vision_tfm.data import load_mnist

ROOT = Path(__file__).resolve().parents[2]


def _digit_folder(root: Path, per_class: int = 20) -> Path:
    """Embedded digits 3 and 7 as PNG files in ``root/three/`` and ``root/seven/``."""
    images, labels = load_mnist("all")
    for digit, name in ((3, "three"), (7, "seven")):
        (root / name).mkdir(parents=True)
        for i, img in enumerate(images[labels == digit][:per_class]):
            Image.fromarray(img).save(root / name / f"{i}.png")
    return root


def test_flat_folder_trains_with_val_split(tmp_path):
    data = _digit_folder(tmp_path / "digits")
    r = subprocess.run(
        [
            sys.executable, str(ROOT / "train_cls.py"), "--model", "vit_test", "--data",
            str(data), "--epochs", "1", "data.batch_size=8", "data.num_workers=0",
            "run.threads=1", "run.tensorboard=false", "run.plots=false",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "runs" / "cls").iterdir()
    assert run_dir.name.startswith("vit_test-digits-")  # the model and the data folder
    log = r.stdout.splitlines()
    assert f"run dir {Path('runs/cls') / run_dir.name} | vit_test" in log[0]
    assert "36 train / 4 val" in log[0]  # 10% of each class's 20 held out
    assert "top1" in log[1] and "top5" not in r.stdout  # 2 classes: top-5 would be 1.0
    assert "top5" not in (run_dir / "metrics.csv").read_text().splitlines()[0]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["data"]["img_size"] == 32 and cfg["data"]["val_split"] == 0.1  # the model's size
    assert cfg["model"]["pretrained"] is False  # vit_test has no published weights
    rows = list(csv.DictReader((run_dir / "split.csv").open()))
    assert Counter((row["split"], row["class"]) for row in rows) == {
        ("train", "three"): 18, ("train", "seven"): 18, ("val", "three"): 2, ("val", "seven"): 2,
    }  # fmt: skip
    assert len({row["path"] for row in rows}) == 40
    assert all((data / row["path"]).is_file() for row in rows)
    assert all(row["path"].startswith(row["class"] + "/") for row in rows)
