"""Does pre-training on generated scenes help on real Cornell views? From scratch vs pre-trained.

For each model, on the same image-wise folds and seed as ``train_grasp.py --folds``:

1. **Pre-train** on ``--views`` generated views, once per generator candidate
   (``train_grasp.py --data synthetic:N data.synthetic={...}``).
2. **Choose the candidate on nested folds inside the training views only**: the training views
   of outer fold 1 are linked into a folder of their own and cut into ``--inner-folds`` folds;
   every candidate (and "scratch", no pre-training) is fine-tuned on each, and the most views
   right wins. No reporting fold's validation views are ever seen by the choice.
3. **Report** every outer fold trained from scratch and from the chosen pre-trained weights
   (``--init``), with the same recipe, seed and steps; and **zero-shot**: the pre-trained model
   scored on all the real views with no fine-tuning (``--eval-only --data``).

    python benchmarks/grasp_synthetic_pretrain.py --data ../shared/data/cornell \\
        --models grasp_hybrid_t,grasp_hybrid_s --jobs 2 --out runs/synpre

A reduced run (fewer epochs, one model, no choice) passes overrides to every run after the
options (pre-training keeps its own ``data.repeat=1`` and ``--pre-epochs``), e.g. ``--models
grasp_hybrid_t --candidates default --pre-epochs 6 --views 1000 sched.epochs=10``. Each run
lives in ``--out/<model>/<stage>/``; a finished run is read, not trained again, so a stopped
benchmark resumes; ``--collect`` only reads. The table gives the deployment-crop figure (each
run's last line): views right of all, and mean ± std over folds. ``--per-view`` then scores
each run's last weights view by view: which views pre-training turns, which both starts miss,
and how (``grasp_failures.py``'s kinds: wrong place, angle, opening, or overlap short).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from grasp_failures import failures, picture, score  # siblings: benchmarks/ is on sys.path
from grasp_learning_curve import finished

from vision_tfm.data.grasp import find_cornell_views, kfold_splits
from vision_tfm.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES: dict[str, dict] = {
    "default": {},  # the generator's defaults: 1-3 objects, every family, tilt 30-90 degrees
    "single": {"objects": [1, 1]},  # one object per view, as Cornell
    "cornell_cam": {"objects": [1, 1], "tilt": [35, 55], "distance": [0.9, 1.2]},
}


def shipped(row: dict) -> float:
    """The figure a run's last line prints (the EMA's, where the run keeps one)."""
    return float(row.get("ema_grasp_acc") or row["grasp_acc"])


def weights(run_dir: Path, name: str = "best.pt") -> Path | None:
    """A finished run's ``best.pt`` (what ``--init`` and zero-shot start from) or ``last.pt``
    (the weights behind its last line, its shipped EMA at the last epoch)."""
    found = sorted(run_dir.glob(f"*/{name}"))
    return found[-1] if found and finished(run_dir) else None


class Runner:
    """``train_grasp.py`` commands, ``jobs`` at a time, each logged beside its run."""

    def __init__(self, jobs: int, collect: bool) -> None:
        self.jobs, self.collect = jobs, collect
        self.todo: list[tuple[Path, list[str]]] = []

    def add(self, out: Path, args: list[str]) -> None:
        if finished(out) is None and not self.collect:
            self.todo.append((out, [sys.executable, str(ROOT / "train_grasp.py"), *args]))

    def run(self) -> None:
        running: list[tuple[subprocess.Popen, Path, float]] = []
        while self.todo or running:
            while self.todo and len(running) < self.jobs:
                out, cmd = self.todo.pop(0)
                out.mkdir(parents=True, exist_ok=True)
                (out / "command.txt").write_text(" ".join(cmd) + "\n")
                log = (out / "train.log").open("w")
                print(f"start {out}", flush=True)
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                running.append((proc, out, time.time()))
            time.sleep(2)
            for item in list(running):
                proc, out, t0 = item
                if proc.poll() is not None:
                    running.remove(item)
                    ok = "done" if proc.returncode == 0 else f"FAILED ({proc.returncode})"
                    print(f"{ok} {out} in {time.time() - t0:.0f} s", flush=True)


def zero_shot(ckpt: Path, data: str, out: Path, collect: bool) -> tuple[float, int] | None:
    """The pre-trained model on every real view, no fine-tuning: ``(accuracy, views)``."""
    record = out / "zero_shot.json"
    if not record.is_file() and not collect:
        cmd = [sys.executable, str(ROOT / "train_grasp.py"), "--eval-only", "--resume", str(ckpt)]
        r = subprocess.run([*cmd, "--data", data], capture_output=True, text=True)
        m = re.search(r"grasp acc \(all (\d+) views, top-1\): (\d\.\d+)", r.stdout)
        if m is None:
            print(f"zero-shot failed: {r.stderr.strip()[-300:]}", flush=True)
            return None
        atomic_write_text(json.dumps({"views": int(m[1]), "acc": float(m[2])}), record)
    if not record.is_file():
        return None
    z = json.loads(record.read_text())
    return z["acc"], z["views"]


def per_view(out: Path, data: str, folds: int, pre: Path | None) -> None:
    """Which real views each start gets right, and how the misses miss: scratch and
    pre-trained on each view's own outer fold, and zero-shot. Prints the views any start
    misses and a tally, and writes ``per_view.csv`` and ``per_view_misses.png`` (the views
    both starts miss, with the pre-trained model's top grasp) beside the runs."""
    rows: dict[str, dict] = {}
    pretrained = []  # the fine-tuned runs, for the picture of the views both starts miss
    for arm in ("scratch", "init"):
        for k in range(folds):
            ck = weights(out / f"{arm}_fold{k + 1}", "last.pt")
            if ck is None:
                continue
            scored = score(str(ck), data)
            if arm == "init":
                pretrained.append(scored)
            kinds = {f["view"]: f["kind"] for f in failures(scored)}
            for view, ok in zip(scored.views, scored.right):
                rows.setdefault(view, {"view": view, "fold": k + 1})[arm] = int(ok)
                rows[view][f"{arm}_miss"] = kinds.get(view, "")
    if pre is not None:
        scored = score(str(pre), data, all_views=True)
        kinds = {f["view"]: f["kind"] for f in failures(scored)}
        for view, ok in zip(scored.views, scored.right):
            rows.setdefault(view, {"view": view, "fold": 0})["zero_shot"] = int(ok)
            rows[view]["zero_shot_miss"] = kinds.get(view, "")
    table = sorted(rows.values(), key=lambda r: r["view"])
    keys = ["view", "fold", "scratch", "init", "zero_shot",
            "scratch_miss", "init_miss", "zero_shot_miss"]  # fmt: skip
    buf = io.StringIO()
    w = csv.DictWriter(buf, keys, restval="")
    w.writeheader()
    w.writerows(table)
    atomic_write_text(buf.getvalue(), out / "per_view.csv")  # whole or not at all
    mark = {1: "right", 0: "**miss**", None: "-"}
    print(f"\n{out.name}: the views a start misses (per_view.csv has all {len(table)})\n")
    print("| view | fold | scratch | pre-trained | zero-shot | how the pre-trained one misses |")
    print("|---|---|---|---|---|---|")
    for r in table:
        got = [r.get(a) for a in ("scratch", "init", "zero_shot")]
        if 0 in got:
            print(f"| {r['view']} | {r['fold']} | " + " | ".join(mark[g] for g in got)
                  + f" | {r.get('init_miss', '')} |")  # fmt: skip
    totals = {a: [r[a] for r in table if a in r] for a in ("scratch", "init", "zero_shot")}
    print("\nscored as deployed (fp32; each run's own line is under its run.precision): "
          + ", ".join(f"{a} {sum(v)} / {len(v)}" for a, v in totals.items() if v))  # fmt: skip
    both = [r for r in table if "init" in r and "scratch" in r]
    turned = sum(r["scratch"] == 0 and r["init"] == 1 for r in both)
    lost = sum(r["scratch"] == 1 and r["init"] == 0 for r in both)
    hard = [r for r in both if r["scratch"] == 0 and r["init"] == 0]
    kinds = Counter(r["init_miss"] for r in both if r["init"] == 0)
    picture(pretrained, [r["view"] for r in hard][:12], str(out / "per_view_misses.png"))
    print(f"pre-training turned {turned} views right and {lost} wrong; both starts miss "
          f"{len(hard)} ({_names([r['view'] for r in hard])}), of which zero-shot "
          f"gets {sum(r.get('zero_shot') == 1 for r in hard)}; the pre-trained misses: "
          + (", ".join(f"{k} {n}" for k, n in kinds.most_common()) or "none"))  # fmt: skip


def _names(views: list[str], most: int = 12) -> str:
    more = f" and {len(views) - most} more" if len(views) > most else ""
    return ", ".join(views[:most]) + more if views else "none"


def nested_folder(data: str, out: Path, folds: int, seed: int) -> tuple[Path, list[int]]:
    """Outer fold 1's training views, linked into a folder of their own; and each outer fold's
    validation size (for views right)."""
    views, _ = find_cornell_views(data)
    ids = [v.view_id for v in views]
    splits = kfold_splits(ids, folds, "image", seed)
    inner = out / "nested_views"
    inner.mkdir(parents=True, exist_ok=True)
    keep = set(splits[0].train)
    for v in views:
        if v.view_id in keep:
            for f in v.rgb_path.parent.glob(f"{v.view_id}*"):
                link = inner / f.name
                if not link.exists():
                    link.symlink_to(f.resolve())
    return inner, [len(s.val) for s in splits]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a Cornell folder (e.g. ../shared/data/cornell)")
    p.add_argument("--models", default="grasp_hybrid_t,grasp_hybrid_s")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="generator settings")
    p.add_argument("--views", type=int, default=2000, help="generated views to pre-train on")
    p.add_argument("--pre-epochs", type=int, default=10, help="pre-training epochs")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--inner-folds", type=int, default=2, help="nested folds for the choice")
    p.add_argument("--seed", type=int, default=0, help="run.seed: the folds, as --folds cuts")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--out", type=Path, default=Path("runs/synpre"))
    p.add_argument("--collect", action="store_true", help="read finished runs, train nothing")
    p.add_argument("--per-view", action="store_true", help="which views each start misses, and how")
    a, overrides = p.parse_known_args()
    models, cands = a.models.split(","), a.candidates.split(",")
    unknown = [c for c in cands if c not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown --candidates {unknown}; choose from {list(CANDIDATES)}")
    common = [f"run.seed={a.seed}", "run.threads=1", *overrides]
    inner, val_sizes = nested_folder(a.data, a.out, a.folds, a.seed)
    runner = Runner(a.jobs, a.collect)

    # 1. pre-training, one run per model and candidate
    for m in models:
        for c in cands:
            settings = json.dumps(CANDIDATES[c]).replace('"', "")
            runner.add(
                a.out / m / f"pre_{c}",
                ["--data", f"synthetic:{a.views}", "--model", m, "--out-dir",
                 str(a.out / m / f"pre_{c}"), *common, f"data.synthetic={settings}",
                 "data.repeat=1", f"sched.epochs={a.pre_epochs}"],
            )  # fmt: skip
    runner.run()

    # 2. the choice, on nested folds of outer fold 1's training views
    choice: dict[str, str] = {}
    for m in models:
        options = ["scratch", *cands] if len(cands) > 1 else cands
        for c in options if len(options) > 1 else []:
            init = [] if c == "scratch" else ["--init", str(weights(a.out / m / f"pre_{c}"))]
            for j in range(a.inner_folds):
                runner.add(
                    a.out / m / f"inner_{c}_{j + 1}",
                    ["--data", str(inner), "--model", m, *init, "--out-dir",
                     str(a.out / m / f"inner_{c}_{j + 1}"), f"data.folds={a.inner_folds}",
                     f"data.fold={j}", *common],
                )  # fmt: skip
    runner.run()
    for m in models:
        options = ["scratch", *cands] if len(cands) > 1 else cands
        if len(options) == 1:
            choice[m] = options[0]
            continue
        scores = {}
        for c in options:
            rows = [finished(a.out / m / f"inner_{c}_{j + 1}") for j in range(a.inner_folds)]
            scores[c] = np.mean([shipped(r) for r in rows]) if all(rows) else float("nan")
        print(f"{m} nested choice (mean over {a.inner_folds} inner folds): "
              + ", ".join(f"{c} {s:.2f}" for c, s in scores.items()))  # fmt: skip
        good = {c: s for c, s in scores.items() if s == s}
        choice[m] = max(good, key=good.get) if good else cands[0]

    # 3. the outer folds, from scratch and from the chosen pre-training; zero-shot
    for m in models:
        pre = "scratch" if choice[m] == "scratch" else f"pre_{choice[m]}"
        for k in range(a.folds):
            fold = [f"data.folds={a.folds}", f"data.fold={k}", *common]
            scratch = a.out / m / f"scratch_fold{k + 1}"
            runner.add(scratch, ["--data", a.data, "--model", m, "--out-dir", str(scratch), *fold])
            if pre != "scratch":
                runner.add(
                    a.out / m / f"init_fold{k + 1}",
                    ["--data", a.data, "--model", m, "--init", str(weights(a.out / m / pre)),
                     "--out-dir", str(a.out / m / f"init_fold{k + 1}"), *fold],
                )  # fmt: skip
    runner.run()

    print(f"\nimage-wise {a.folds}-fold, deployment crop, seed {a.seed}; extra overrides: "
          f"{' '.join(overrides) or 'none'}\n")  # fmt: skip
    head = " | ".join(f"fold {k + 1}" for k in range(a.folds))
    print(f"| model | start | {head} | views right | mean ± std | zero-shot |")
    print("|---" * (a.folds + 5) + "|")
    for m in models:
        pre = f"pre_{choice[m]}"
        arms = [("scratch", "scratch")]
        if choice[m] != "scratch":
            arms.append(("init", f"synthetic ({choice[m]})"))
        else:
            print(f"{m}: the nested folds chose no pre-training; scratch only")
        for arm, label in arms:
            accs = [finished(a.out / m / f"{arm}_fold{k + 1}") for k in range(a.folds)]
            accs = [None if r is None else shipped(r) for r in accs]
            cells = " | ".join("-" if x is None else f"{x:.2f}" for x in accs)
            done = [(x, n) for x, n in zip(accs, val_sizes) if x is not None]
            right = sum(round(x * n) for x, n in done)
            if not done:
                print(f"| {m} | {label} | {cells} | not run | | |")
                continue
            acc = np.array([x for x, _ in done])
            zs = ""
            if arm == "init" and (ck := weights(a.out / m / pre)):
                z = zero_shot(ck, a.data, a.out / m / pre, a.collect)
                zs = "-" if z is None else f"{z[0]:.2f} ({round(z[0] * z[1])} / {z[1]})"
            print(f"| {m} | {label} | {cells} | {right} / {sum(n for _, n in done)} "
                  f"| {acc.mean():.2f} ± {acc.std():.2f} | {zs} |")  # fmt: skip

    if a.per_view:
        for m in models:
            pre = None if choice[m] == "scratch" else weights(a.out / m / f"pre_{choice[m]}")
            per_view(a.out / m, a.data, a.folds, pre)


if __name__ == "__main__":
    main()
