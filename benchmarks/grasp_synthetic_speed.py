"""CPU time per generated grasp view, on one core: the render, and a dataset item.

Each measurement runs in a fresh child process pinned to one thread (OpenCV and torch), and
reports CPU time (what a loader worker spends) beside wall time (what a shared box adds).
``--other PATH`` times another checkout's generator too (a ``git worktree`` of an earlier
commit), interleaved with this one repeat by repeat, so both see the same load:

    git worktree add /tmp/before <commit>
    python benchmarks/grasp_synthetic_speed.py --other /tmp/before --repeats 4

A dataset item is what training pays per uncached view: the render, the loader's 300 px
centre crop, hole filling, the area resize to the model's input and the map encoding.

``--models`` also times each model's training step on one thread (batch 8 at 160 px, forward,
the grasp loss, backward and AdamW), so the table says whether a loader worker, at the
item rate, keeps one training thread fed: pre-training streams views through
``data.num_workers`` and is never data-bound while the item rate is the higher one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import cv2, torch
cv2.setNumThreads(1); torch.set_num_threads(1)
from vision_tfm.data.grasp.synthetic import SceneSettings, SyntheticGrasp, generate_view
n, first = int(sys.argv[1]), 1000
settings = SceneSettings()
generate_view(0, settings)  # first call: imports, noise banks
t, w = time.process_time(), time.perf_counter()
for i in range(first, first + n):
    generate_view(i, settings)
render = ((time.process_time() - t) / n * 1e3, (time.perf_counter() - w) / n * 1e3)
ds = SyntheticGrasp(range(first, first + n), settings, output_size=160)
t, w = time.process_time(), time.perf_counter()
for i in range(len(ds)):
    ds[i]
item = ((time.process_time() - t) / n * 1e3, (time.perf_counter() - w) / n * 1e3)
print(json.dumps({"render": render, "item": item}))
"""


STEP = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from vision_tfm.models import create_model
from vision_tfm.data.grasp.synthetic import SceneSettings, SyntheticGrasp
from vision_tfm.tasks.grasp import GraspConfig, GraspTask
name, steps = sys.argv[1], int(sys.argv[2])
cfg = GraspConfig()
task = GraspTask(cfg)
model = create_model(name, in_chans=4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
items = [SyntheticGrasp(range(8), SceneSettings(), output_size=160)[i] for i in range(8)]
x = torch.stack([torch.as_tensor(i[0]) for i in items])
maps = {k: torch.stack([torch.as_tensor(i[1][k]) for i in items]) for k in items[0][1]}
def step():
    loss, _ = task.loss(model, (x, maps, None), torch.device("cpu"))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
step()
t, w = time.process_time(), time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"img_s": 8 * steps / (time.perf_counter() - w),
                  "cpu_img_s": 8 * steps / (time.process_time() - t)}))
"""


def step_rate(name: str, steps: int) -> dict[str, float]:
    """Images per second of one training thread on ``name`` (this checkout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", STEP, name, str(steps)],
        capture_output=True, text=True, env=env, cwd="/", check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(checkout: Path, views: int) -> dict[str, tuple[float, float]]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(views)],
        capture_output=True, text=True, env=env, cwd="/", check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--views", type=int, default=50, help="views per measurement")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    p.add_argument("--other", type=Path, help="another checkout to time beside this one")
    p.add_argument("--models", default="", help="comma-separated models to time a step of")
    p.add_argument("--steps", type=int, default=10, help="training steps per model")
    a = p.parse_args()
    trees = {"this": ROOT, **({"other": a.other.resolve()} if a.other else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(a.repeats):
        for name, tree in trees.items():
            runs[name].append(measure(tree, a.views))
    print(f"load average {os.getloadavg()[0]:.1f}; median of {a.repeats} repeats, {a.views} views")
    print("\n| checkout | render CPU | render wall | item CPU | item wall |\n|---|---|---|---|---|")
    for name, rs in runs.items():
        cells = [
            f"{statistics.median(r[k][j] for r in rs):.1f} ms"
            for k in ("render", "item")
            for j in (0, 1)
        ]
        print(f"| {name} ({trees[name]}) | " + " | ".join(cells) + " |")
    item = 1e3 / statistics.median(r["item"][0] for r in runs["this"])
    for name in filter(None, a.models.split(",")):
        rate = step_rate(name, a.steps)
        print(
            f"{name}: training step {rate['img_s']:.1f} img/s on one thread "
            f"({rate['cpu_img_s']:.1f} per CPU second); one worker makes {item:.1f} views "
            f"per CPU second: {item / rate['cpu_img_s']:.2f}x the step's need"
        )
    if "other" in runs:
        ratio = [o["render"][0] / t["render"][0] for t, o in zip(runs["this"], runs["other"])]
        print(f"\nrender CPU, other / this, per repeat: {', '.join(f'{r:.2f}' for r in ratio)}")


if __name__ == "__main__":
    main()
