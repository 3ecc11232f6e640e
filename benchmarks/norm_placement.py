"""Pre-LN vs Post-LN vs ResiDual: loss curves and per-layer gradient norms at initialisation.

The 2017 Transformer figure puts LayerNorm after the residual add (Post-LN); GPT-2, ViT and
timm put it before the sublayer (Pre-LN). Xiong et al. (2020) report that at initialisation
Post-LN gradients near the output are large, which is why it needs learning-rate warmup, and
that Pre-LN gradients stay flat across layers. That is the paper's claim, in its setting
(Xavier init, a translation Transformer); this script's own figures are what it shows here,
and so far they have not shown it: read the printed table and the plots, not this docstring.

    python benchmarks/norm_placement.py                      # ~6 runs, ~10 min on 2 CPU cores
    python benchmarks/norm_placement.py --epochs 1 --depth 6 # quicker look

Writes ``<out>/norm_placement_loss.png``, ``<out>/norm_placement_grads.png`` and a table.
All runs share data, seed, budget and lr; only norm placement and warmup differ.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import vision_tfm as vt
from vision_tfm.config import apply_overrides
from vision_tfm.data import AugConfig, DataConfig, build_cls_datasets
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.train import Trainer

PLACEMENTS = ("pre", "post", "residual")


def model_kwargs(args: argparse.Namespace, place: str) -> dict:
    return {
        "embed_dim": args.width,
        "depth": args.depth,
        "num_heads": args.width // 32,
        "patch_size": 7,
        "mlp_ratio": 2.0,
        "norm_place": place,
    }


def grad_norms_at_init(args: argparse.Namespace, place: str) -> list[float]:
    """Gradient norm of each block's MLP output weight (Xiong et al.'s W^FFN) on one batch."""
    torch.manual_seed(args.seed)
    data = build_cls_datasets(DataConfig(), AugConfig(kind="none"))
    x, y = next(iter(torch.utils.data.DataLoader(data.val, batch_size=256)))
    m = vt.create_model("vit_mnist", **model_kwargs(args, place))
    F.cross_entropy(m(x), y).backward()
    return [blk.mlp.fc2.weight.grad.norm().item() for blk in m.blocks]


def train(args: argparse.Namespace, place: str, warmup: float, out: Path) -> dict:
    cfg = apply_overrides(
        ClsConfig(),
        {
            "model.name": "vit_mnist",
            "model.kwargs": model_kwargs(args, place),
            "optim.lr": args.lr,
            "optim.clip_grad": 0.0,
            "sched.epochs": args.epochs,
            "sched.warmup_epochs": warmup,
            "run.seed": args.seed,
            "run.out_dir": str(out),
            "run.log_interval": 5,
            "run.plots": False,
            "run.tensorboard": False,
            "data.batch_size": 128,
        },
    )
    trainer = Trainer(cfg, ClassificationTask(cfg))
    metrics = trainer.fit()
    with open(trainer.run_dir / "steps.csv") as f:
        steps = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]
    return {"steps": steps, "top1": metrics["top1"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args()
    torch.set_num_threads(1)  # small models: one thread is faster and robust to a busy machine
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    grads = {pl: grad_norms_at_init(args, pl) for pl in PLACEMENTS}
    fig, ax = plt.subplots(figsize=(6, 4))
    for pl, g in grads.items():
        ax.plot(range(1, len(g) + 1), g, marker="o", label=f"{pl}-LN")
    ax.set(
        xlabel="layer",
        ylabel="||grad W_fc2|| at init",
        yscale="log",
        title=f"gradient norms at initialisation ({args.depth} blocks)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "norm_placement_grads.png", dpi=100)
    plt.close(fig)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pl in PLACEMENTS:
            for warm in (0.0, 1.0):
                results[(pl, warm)] = train(args, pl, warm, Path(tmp))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (pl, warm), r in results.items():
        s, loss = zip(*r["steps"])
        ax.plot(
            s,
            loss,
            label=f"{pl}-LN, warmup {'1 epoch' if warm else 'none'}",
            ls="-" if warm else "--",
        )
    ax.set(
        xlabel="step",
        ylabel="train loss",
        yscale="log",
        title=f"ViT {args.depth}x{args.width} on embedded MNIST, lr {args.lr}",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "norm_placement_loss.png", dpi=100)
    plt.close(fig)

    print("\n| placement | grad norm layer 1 | grad norm last layer | last/first |")
    print("|---|---|---|---|")
    for pl, g in grads.items():
        print(f"| {pl} | {g[0]:.3e} | {g[-1]:.3e} | {g[-1] / g[0]:.2f} |")
    print("\n| placement | warmup | final train loss | val top-1 |")
    print("|---|---|---|---|")
    for (pl, warm), r in results.items():
        print(
            f"| {pl} | {'1 epoch' if warm else 'none'} | {r['steps'][-1][1]:.4f} | "
            f"{r['top1']:.4f} |"
        )
    print(f"\nwrote {out / 'norm_placement_loss.png'} and {out / 'norm_placement_grads.png'}")


if __name__ == "__main__":
    main()
