"""How the grasp figure grows with the number of training views: a learning curve over folds.

A recipe that fits its training views and misses new ones is either a recipe problem or a
data problem. The curve tells them apart: every fold of ``--folds`` keeps its validation
views and trains on ``n`` of its training views (``data.train_views``: a seeded subset that
grows by adding views), with the same number of steps for every ``n`` (``data.repeat`` scaled
up as views drop), so that only the number of distinct views changes along the curve.

    python benchmarks/grasp_learning_curve.py --data ../shared/data/cornell \\
        --model grasp_hybrid_t --views 7,14,28,56 --jobs 2 --out runs/curve

Each point is one ``train_grasp.py`` run (the model's YAML, ``run.threads=1``, plus any
``KEY=VALUE`` overrides given after the options), in ``--out/n<views>_fold<k>/``; a point
whose run finished is read, not trained again, so a stopped sweep resumes. ``--collect``
only reads. The table gives, per ``n``, the deployment-crop figure (the last line of each
run) fold by fold, the views right in total and ``mean ± std`` over folds.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from vision_tfm.data.grasp import find_cornell_views, find_jacquard_views, kfold_splits

ROOT = Path(__file__).resolve().parents[1]


def fold_sizes(data: str, dataset: str, folds: int, split: str, seed: int) -> list[tuple[int, int]]:
    """(training, validation) views per fold, as ``train_grasp.py`` cuts them."""
    views = find_cornell_views(data)[0] if dataset == "cornell" else find_jacquard_views(data)
    ids, groups = [v.view_id for v in views], [v.object_id for v in views]
    return [(len(s.train), len(s.val)) for s in kfold_splits(ids, folds, split, seed, groups)]


def recipe_repeat(model: str) -> int:
    """The YAML's ``data.repeat`` (passes over all training views per epoch)."""
    cfg = yaml.safe_load((ROOT / "configs" / "grasp" / f"{model}.yaml").read_text())
    return int((cfg.get("data") or {}).get("repeat", 1))


def finished(point: Path) -> dict | None:
    """The last row of a point's finished run (``metrics.csv`` reached ``sched.epochs``)."""
    for run in sorted(point.glob("*/metrics.csv")):
        cfg = yaml.safe_load((run.parent / "config.yaml").read_text())
        rows = list(csv.DictReader(run.open()))
        if rows and int(rows[-1]["epoch"]) == cfg["sched"]["epochs"]:
            return rows[-1]
    return None


def shipped(row: dict, key: str) -> float:
    """The figure the run's last line prints: the EMA weights' where the run keeps an EMA."""
    return float(row.get(f"ema_{key}") or row[key])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--dataset", default="cornell", choices=["cornell", "jacquard"])
    p.add_argument("--model", default="grasp_hybrid_t")
    p.add_argument("--views", default="7,14,28,56", help="training views per point")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--split", default="image", choices=["image", "object"])
    p.add_argument("--seed", type=int, default=0, help="run.seed: the folds and the subsets")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--out", type=Path, default=Path("runs/curve"))
    p.add_argument("--collect", action="store_true", help="read finished runs, train nothing")
    p.add_argument("--target", type=float, default=0.93, help="figure the trend line is read at")
    a, overrides = p.parse_known_args()
    views = [int(v) for v in a.views.split(",")]
    sizes = fold_sizes(a.data, a.dataset, a.folds, a.split, a.seed)
    fewest = min(n_train for n_train, _ in sizes)
    if min(views) < 1 or max(views) > fewest:
        raise SystemExit(f"--views must lie in [1, {fewest}] (the smallest fold's training views)")
    # a data.repeat override sets the all-views base; passed on as given, it would undo the
    # scaling below, since the last value of a key wins
    given = [o for o in overrides if o.startswith("data.repeat=")]
    overrides = [o for o in overrides if o not in given]
    repeat = int(given[-1].split("=", 1)[1]) if given else recipe_repeat(a.model)

    todo = []
    for n in views:
        for k, (full, _) in enumerate(sizes):
            point = a.out / f"n{n}_fold{k + 1}"
            if finished(point) is None and not a.collect:
                reps = max(1, round(repeat * full / n))  # the same steps per epoch for every n
                cmd = [
                    sys.executable, str(ROOT / "train_grasp.py"), "--data", a.data,
                    "--model", a.model, "--out-dir", str(point), f"data.dataset={a.dataset}",
                    f"data.split={a.split}", f"data.folds={a.folds}", f"data.fold={k}",
                    f"data.train_views={n}", f"data.repeat={reps}", f"run.seed={a.seed}",
                    "run.threads=1", *overrides,
                ]  # fmt: skip
                todo.append((point, cmd))
    running: list[tuple[subprocess.Popen, Path, float]] = []
    while todo or running:
        while todo and len(running) < a.jobs:
            point, cmd = todo.pop(0)
            point.mkdir(parents=True, exist_ok=True)
            log = (point / "train.log").open("w")
            print(f"start {point}", flush=True)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            running.append((proc, point, time.time()))
        time.sleep(2)
        for proc, point, t0 in list(running):
            if proc.poll() is not None:
                running.remove((proc, point, t0))
                ok = proc.returncode == 0
                status = "done" if ok else f"FAILED (exit {proc.returncode}, see train.log)"
                print(f"{status} {point} in {time.time() - t0:.0f} s", flush=True)

    print(f"\n{a.model}, {a.split}-wise, {a.folds} folds, deployment crop, last line of each run\n")
    head = " | ".join(f"fold {k + 1}" for k in range(a.folds))
    points = []  # (views, figure) of every finished run, for the trend
    print(f"| training views | {head} | views right | mean ± std |")
    print("|---" * (a.folds + 3) + "|")
    for n in views:
        accs = []
        for k in range(a.folds):
            row = finished(a.out / f"n{n}_fold{k + 1}")
            accs.append(None if row is None else shipped(row, "grasp_acc"))
        cells = " | ".join("-" if x is None else f"{x:.2f}" for x in accs)
        done = [(x, n_val) for x, (_, n_val) in zip(accs, sizes) if x is not None]
        if not done:
            print(f"| {n} | {cells} | | |")
            continue
        right = sum(round(x * n_val) for x, n_val in done)
        total = sum(n_val for _, n_val in done)
        acc = np.array([x for x, _ in done])
        points += [(n, x) for x in acc]
        print(f"| {n} | {cells} | {right} / {total} | {acc.mean():.2f} ± {acc.std():.2f} |")
    if len({n for n, _ in points}) >= 2:
        print(trend(points, a.target))


def trend(points: list[tuple[int, float]], target: float) -> str:
    """The least-squares line of the figure against log2(views), and where it meets ``target``.

    Learning curves flatten as views grow, so the line's crossing is a floor on the views
    the target needs, not an estimate of them.
    """
    n, acc = np.array(points, dtype=float).T
    slope, icept = np.polyfit(np.log2(n), acc, 1)
    line = f"\nper doubling of the training views: {slope:+.3f} (least squares over every run)"
    if slope <= 0:
        return line + f"; no growth, so no number of views is seen to reach {target:.2f}"
    doublings = (target - icept) / slope - np.log2(n.max())
    if doublings > 10:
        return line + f"; more than 1000x the views measured would not reach {target:.2f} on it"
    need = n.max() * 2**doublings
    return line + f"; the line reaches {target:.2f} at {need:.0f} training views (a floor)"


if __name__ == "__main__":
    main()
