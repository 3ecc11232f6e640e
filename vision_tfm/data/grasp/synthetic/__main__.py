"""``python -m vision_tfm.data.grasp.synthetic OUT --views 4``: generated views as Cornell
files (``pcdXXXXr.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from .dataset import save_cornell
from .render import generate_labelled
from .scene import SceneSettings


def main(argv: Sequence[str] | None = None) -> None:
    """Write generated views as Cornell files (``pcd0000r.png`` ...) into a folder."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("out", help="folder to write into")
    p.add_argument("--views", type=int, default=4, help="how many views")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument("--first", type=int, default=0, help="index of the first view")
    args = p.parse_args(argv)
    cfg = replace(SceneSettings(), seed=args.seed)
    for i in range(args.first, args.first + args.views):
        print(save_cornell(generate_labelled(i, cfg), args.out, i))


if __name__ == "__main__":
    main()
