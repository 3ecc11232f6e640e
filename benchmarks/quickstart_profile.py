"""Where one epoch of the quick start goes, and what each use of the second core buys.

    python benchmarks/quickstart_profile.py                  # configs/cls/vit_mnist.yaml
    python benchmarks/quickstart_profile.py --config configs/cls/swin_mnist.yaml

Builds the recipe's model and data exactly as ``train_cls.py`` does, then times, per epoch:

- the data: one training item as the engine draws it (seeded, augmented, to a tensor), a
  validation item, and collation into batches;
- the model step (forward, backward, clipping, AdamW) at 1 and 2 intra-op threads, with the
  per-parameter AdamW loop and the fused kernel the engine uses;
- the evaluation forward over the validation set at 1 and 2 threads.

Variants take turns in rounds (order flipped each round) and each keeps its best round, so a
noisy spell hits both sides of a comparison alike. Seconds are scaled to the recipe's epoch
(its train and val sizes, its batch size). The footer names the CPU.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from torch.utils.data import default_collate

from vision_tfm.export.flops import cpu_description
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import load_config
from vision_tfm.train.sampling import SeededItems as _SeededItems

ROOT = Path(__file__).resolve().parents[1]


def best_of(fns: dict[str, Callable[[], None]], rounds: int, threads: dict[str, int]) -> dict:
    """Best-round seconds per call of each function, taking turns."""
    best = {k: float("inf") for k in fns}
    names = list(fns)
    for k in names:  # warm-up
        torch.set_num_threads(threads.get(k, 1))
        fns[k]()
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            torch.set_num_threads(threads.get(k, 1))
            t = time.perf_counter()
            fns[k]()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "cls" / "vit_mnist.yaml"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="model steps per timed round")
    args = p.parse_args()
    cfg = load_config(ClsConfig(), args.config, {})
    task = ClassificationTask(cfg)
    model, train_ds, val_ds, _ = task.build(pretrained=False)
    bs, n_train, n_val = cfg.data.batch_size, len(train_ds), len(val_ds)
    items = _SeededItems(train_ds, cfg.run.seed)
    n_items = 256
    batch = default_collate([items[(0, i)] for i in range(bs)])
    x, y = batch
    opts = {
        "loop": create_optimizer_v2(model, opt="adamw", lr=1e-4, foreach=False),
        "fused": create_optimizer_v2(model, opt="adamw", lr=1e-4, fused=True),
    }

    def steps(opt: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            model.train()
            for _ in range(args.steps):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad or 1e9)
                opt.step()

        return run

    val_x = torch.cat([x] * max(1, 256 // bs))

    def evaluate() -> None:
        model.eval()
        with torch.no_grad():
            model(val_x)

    data = best_of(
        {
            "train items": lambda: [items[(1, i)] for i in range(n_items)],
            "val items": lambda: [val_ds[i] for i in range(n_items)],
            "collate": lambda: default_collate([items[(0, i)] for i in range(bs)]),
        },
        args.rounds,
        {},
    )
    model_t = best_of(
        {f"{o} t{t}": steps(opts[o]) for t in (1, 2) for o in opts},
        args.rounds,
        {f"{o} t{t}": t for t in (1, 2) for o in opts},
    )
    eval_t = best_of(
        {"eval t1": evaluate, "eval t2": evaluate}, args.rounds, {"eval t1": 1, "eval t2": 2}
    )
    per_step = {k: v / args.steps for k, v in model_t.items()}
    n_steps = n_train // bs
    collate_s = data["collate"] - bs * data["train items"] / n_items
    rows = [
        ("train items (augment + seed)", data["train items"] / n_items * n_train),
        ("collation", max(collate_s, 0.0) * n_steps),
        ("val items", data["val items"] / n_items * n_val),
        *((f"model step, AdamW {k}", v * n_steps) for k, v in per_step.items()),
        *(
            (k.replace("eval", "evaluation forward,"), v / len(val_x) * n_val)
            for k, v in eval_t.items()
        ),
    ]
    print(f"{Path(args.config).name}: {n_train} train / {n_val} val, batch {bs}\n")
    print("| part | seconds per epoch |")
    print("|---|---|")
    for name, sec in rows:
        print(f"| {name} | {sec:.2f} |")
    print(f"\nCPU: {cpu_description()}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
