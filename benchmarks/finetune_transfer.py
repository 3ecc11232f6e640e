"""Does ULMFiT fine-tuning help a vision Transformer move to new digits? Measured, not assumed.

python benchmarks/finetune_transfer.py                       # about 25 min on 2 CPU cores
python benchmarks/finetune_transfer.py --pretrained runs/cls/vit_mnist-.../best.pt

Pre-trains the MNIST recipe (``configs/cls/vit_mnist.yaml``, or takes ``--pretrained``), then
trains on the UCI handwritten digits scikit-learn ships (``load_digits``: 1,797 images of
8x8, written as an ImageFolder tree and upsampled to 28x28 by the eval pipeline) with 10, 50
and all labels per class, 3 seeds each, in six ways: from scratch, plain full fine-tuning,
each ULMFiT part on its own (discriminative rates, slanted triangular schedule, gradual
unfreezing) and all three. Every run has the same epochs, batch, augmentation and peak
learning rate; accuracy is on one fixed held-out 30% of the digits, stratified, never trained
on or used to choose anything. Prints a Markdown table of mean ± std over the seeds and
writes it, with every run, to ``--out``.

Needs scikit-learn (``pip install scikit-learn``): a benchmark dependency, never a runtime one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import load_config
from vision_tfm.train import Trainer
from vision_tfm.train.launch import finetune_overrides

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "cls" / "vit_mnist.yaml"
FINETUNE = ROOT / "configs" / "cls" / "finetune.yaml"
MNIST_STATS = {"data.mean": [0.1307], "data.std": [0.3081]}

VARIANTS = {
    "scratch": None,  # no pre-training; the rest start from the MNIST checkpoint
    "full fine-tune": {},
    "discriminative": {"optim.discriminative": 2.6},
    "slanted triangular": {"sched.name": "slanted_triangular"},
    "gradual unfreezing": {"optim.unfreeze": 1},
    "ULMFiT (all three)": {
        "optim.discriminative": 2.6,
        "sched.name": "slanted_triangular",
        "optim.unfreeze": 1,
    },
}


def digits_split(seed: int = 0, held_out: float = 0.3) -> tuple[list, list]:
    """(pool, test) of ``(uint8 8x8 image, label)``: a stratified held-out part, fixed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("this benchmark needs scikit-learn: pip install scikit-learn")
    d = load_digits()
    images = np.round(d.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    rng = np.random.default_rng(seed)
    pool, test = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(d.target == c))
        n_test = round(len(idx) * held_out)
        test += [(images[i], c) for i in idx[:n_test]]
        pool += [(images[i], c) for i in idx[n_test:]]
    return pool, test


def write_tree(root: Path, train: list, val: list) -> Path:
    """An ImageFolder tree (``train/<class>``, ``val/<class>``) of PNG files."""
    for split, items in (("train", train), ("val", val)):
        for i, (img, c) in enumerate(items):
            folder = root / split / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img, mode="L").save(folder / f"{i:05d}.png")
    return root


def labelled(pool: list, per_class: int | None, seed: int) -> list:
    """``per_class`` labelled examples of each digit (None: all), drawn with ``seed``."""
    if per_class is None:
        return pool
    rng = np.random.default_rng(1000 + seed)
    out = []
    for c in range(10):
        items = [x for x in pool if x[1] == c]
        out += [items[i] for i in rng.permutation(len(items))[:per_class]]
    return out


def run(over: dict, out_dir: Path) -> float:
    cfg = load_config(ClsConfig(), RECIPE, {"run.out_dir": str(out_dir), **over})
    trainer = Trainer(cfg, ClassificationTask(cfg))
    return trainer.shipped_metrics(trainer.fit())["top1"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", help="an MNIST checkpoint; default: train the recipe first")
    p.add_argument("--labels", default="10,50,all", help="labels per class")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default="bench_out/finetune_transfer")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ckpt = args.pretrained
    if ckpt is None:
        cfg = load_config(ClsConfig(), RECIPE, {"run.out_dir": str(out / "pretrain")})
        trainer = Trainer(cfg, ClassificationTask(cfg))
        trainer.fit()
        ckpt = str(trainer.run_dir / "best.pt")
    base = finetune_overrides(ckpt, FINETUNE)
    start = {k: v for k, v in base.items() if k.startswith("model.")}  # weights, no recipe
    pool, test = digits_split()
    labels = [None if v == "all" else int(v) for v in args.labels.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = [v.strip() for v in args.variants.split(",")]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_class in labels:
            for seed in seeds:
                tree = write_tree(
                    Path(tmp) / f"{per_class}-{seed}", labelled(pool, per_class, seed), test
                )
                for variant in variants:
                    over = {
                        "data.name": "imagefolder",
                        "data.root": str(tree),
                        "data.in_chans": 1,
                        "data.batch_size": args.batch,
                        "data.num_workers": 0,
                        **MNIST_STATS,
                        "sched.epochs": args.epochs,
                        "run.seed": seed,
                        "run.plots": False,
                        "run.tensorboard": False,
                        **({} if VARIANTS[variant] is None else start),
                        **(VARIANTS[variant] or {}),
                    }
                    acc = run(over, out / "runs")
                    row = {"labels": per_class or "all", "seed": seed, "variant": variant}
                    runs.append({**row, "top1": acc})
                    print(json.dumps(runs[-1]), flush=True)
    table = ["| labels per class | " + " | ".join(variants) + " |",
             "|---|" + "---|" * len(variants)]  # fmt: skip
    for per_class in labels:
        cells = []
        for variant in variants:
            accs = [r["top1"] for r in runs if r["labels"] == (per_class or "all")
                    and r["variant"] == variant]  # fmt: skip
            sd = statistics.pstdev(accs) if len(accs) > 1 else 0.0
            cells.append(f"{statistics.mean(accs):.3f} ± {sd:.3f}")
        table.append(f"| {per_class or 'all'} | " + " | ".join(cells) + " |")
    minutes = (time.perf_counter() - t0) / 60
    text = "\n".join(table)
    print(f"\n{text}\n\n{len(seeds)} seeds, {len(test)} held-out digits; {minutes:.1f} min")
    (out / "table.md").write_text(text + "\n")
    (out / "runs.json").write_text(json.dumps({"minutes": minutes, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
