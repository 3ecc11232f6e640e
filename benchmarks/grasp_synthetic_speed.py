"""CPU time per generated grasp view, on one core: the render, and a dataset item.

Each measurement runs in a fresh child process pinned to one thread (OpenCV and torch), and
reports CPU time (what a loader worker spends) beside wall time (what a shared box adds).
``--other PATH`` times another checkout's generator too (a ``git worktree`` of an earlier
commit), interleaved with this one repeat by repeat, so both see the same load:

    git worktree add /tmp/before <commit>
    python benchmarks/grasp_synthetic_speed.py --other /tmp/before --repeats 4

A dataset item is what training pays per uncached view: the render, the loader's 300 px
centre crop, hole filling, the area resize to the model's input and the map encoding.
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
    if "other" in runs:
        ratio = [o["render"][0] / t["render"][0] for t, o in zip(runs["this"], runs["other"])]
        print(f"\nrender CPU, other / this, per repeat: {', '.join(f'{r:.2f}' for r in ratio)}")


if __name__ == "__main__":
    main()
