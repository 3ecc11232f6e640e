"""Prediction over many files, as ``vtfm predict`` runs it: the files a command line names,
batches, and files that fail one at a time.

A folder of a thousand photos with one truncated JPEG should give 999 answers and one line
naming the bad file, not a traceback after an hour. Inputs that cannot be found at all (a
typo, an empty folder, a glob matching nothing) are refused before any model is loaded.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from ..data import build_eval_transform, load_image
from ..data.datasets import IMAGE_EXTENSIONS
from ..errors import ConfigError, DataError, MissingFileError, OutputExistsError, VisionTfmError
from ..io import atomic_write_text, check_writable_dir, load_checkpoint
from .classification import ClassificationTask, eval_data_config

T = TypeVar("T")


PICTURE_SUFFIXES = ("_attention.png", "_grasps.png")
"""What ``vtfm attention`` and ``vtfm grasp`` add to an image's stem for their pictures, which
a folder scan leaves out: they land beside the images by default, and a second run over the
folder must not score its own overlays."""


def is_image(path: Path) -> bool:
    """Whether a folder's file is one to read: an image extension (case-insensitive), and
    not one of our pictures (:data:`PICTURE_SUFFIXES`)."""
    return path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.endswith(PICTURE_SUFFIXES)


def expand_inputs(items: Sequence[str], keep: Callable[[Path], bool] = is_image) -> list[Path]:
    """Files, folders (every file ``keep`` accepts below it, sorted) and globs (``*``, ``?``,
    ``[...]``; ``**`` descends; the files ``keep`` accepts) to one list of files, in the order
    given, each once. A file named outright is kept whatever its name: it was asked for.

    Raises:
        MissingFileError: A name that is neither a file, a folder nor a glob that matches.
        DataError: A folder or glob with no file ``keep`` accepts.
    """
    found: dict[str, Path] = {}
    for item in items:
        path = Path(item)
        if path.is_file():
            paths = [path]
        elif path.is_dir():
            paths = sorted(p for p in path.rglob("*") if p.is_file() and keep(p))
            if not paths:
                exts = ", ".join(IMAGE_EXTENSIONS)
                raise DataError(f"{item}: folder holds no images to read ({exts})")
        elif glob.has_magic(item):  # quoted, or a shell that leaves globs alone
            paths = []
            for p in sorted(Path(m) for m in glob.glob(item, recursive=True)):
                if p.is_dir():
                    paths += sorted(q for q in p.rglob("*") if q.is_file() and keep(q))
                elif keep(p):
                    paths.append(p)
            if not paths:
                raise DataError(f"{item}: no image file matches")
        else:
            raise MissingFileError(f"image file not found: {item}")
        for p in paths:
            found.setdefault(os.path.normcase(os.path.abspath(p)), p)
    return list(found.values())


def check_table_path(output: str | None, overwrite: bool) -> Path | None:
    """``--output``: the .csv or .jsonl file a prediction table goes to, checked before any
    work (suffix, an existing file, a folder that cannot be written in)."""
    if output is None:
        return None
    out = Path(output)
    if out.suffix.lower() not in (".csv", ".jsonl"):
        raise ConfigError(f"--output must end in .csv or .jsonl, got {output}")
    if out.is_dir():
        raise ConfigError(f"--output: {out} is a folder; give a .csv or .jsonl file")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite to replace it")
    check_writable_dir(out.parent, "--output")
    return out


def write_table(
    out: Path, rows: Sequence[dict], header: Sequence[str], cells: Callable[[dict], list]
) -> None:
    """One JSON object per line (``.jsonl``), or a CSV with ``header`` and ``cells(row)`` per
    row; written whole, through a temp file renamed over the target."""
    if out.suffix.lower() == ".csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(cells(r) for r in rows)
        text = buf.getvalue()
    else:
        text = "".join(json.dumps(r) + "\n" for r in rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(text, out)


def finite_input(x: torch.Tensor, path: str | os.PathLike) -> torch.Tensor:
    """``x``, the preprocessed input of the file ``path``, when every value is finite.

    One NaN pixel (a depth map's inf next to a huge value, a checkpoint's std that underflows)
    makes that image's scores NaN without a word; refused here, the file is named and the
    batch goes on.
    """
    bad = int(x.numel() - torch.isfinite(x).sum())
    if bad:
        raise DataError(
            f"{path}: {bad} of {x.numel()} input values are NaN or inf after preprocessing"
        )
    return x


@dataclass
class Failed:
    """A file that could not be predicted, and why, in one line."""

    path: Path
    reason: str

    def line(self) -> str:
        """``skipped <path>: <reason>``, the path said once."""
        if str(self.path) in self.reason:
            return f"skipped: {self.reason}"
        return f"skipped {self.path}: {self.reason}"


def batched(
    paths: Sequence[Path], load: Callable[[Path], T], batch_size: int
) -> Iterator[tuple[list[Path], list[T], list[Failed]]]:
    """``load`` each path; yield batches of up to ``batch_size`` loaded items with their
    paths, and the files that failed since the previous batch (so they are reported in order).

    A file fails on a one-line error of ours (corrupt, truncated, wrong size) or of the
    system (unreadable); anything else is a bug and propagates.
    """
    names: list[Path] = []
    items: list[T] = []
    failed: list[Failed] = []
    for path in paths:
        try:
            items.append(load(path))
            names.append(path)
        except (VisionTfmError, OSError) as e:
            failed.append(Failed(path, str(e).strip().splitlines()[0] if str(e) else repr(e)))
        if len(items) == batch_size:
            yield names, items, failed
            names, items, failed = [], [], []
    if items or failed:
        yield names, items, failed


class Classifier:
    """A classification checkpoint with the preprocessing it is deployed with, loaded once.

    :meth:`preprocess` is the validation transform the run was scored with and ``vtfm
    export``'s ``model.json`` states (contract ``vision_tfm.cls.preprocess``): one path for
    predict, export parity and the deployed model.
    """

    def __init__(self, checkpoint: str | os.PathLike, use_ema: bool | None = None) -> None:
        ckpt = load_checkpoint(checkpoint)
        self.model, cfg = ClassificationTask.restore(ckpt, use_ema, str(checkpoint))
        self.meta: dict[str, Any] = ckpt["meta"]
        self.class_names: list[str] = list(self.meta["class_names"])
        self.in_chans = 1 if self.meta["in_chans"] == 1 else 3
        self.transform = build_eval_transform(eval_data_config(cfg, self.meta))

    def load(self, path: str | os.PathLike) -> np.ndarray:
        """The file as HWC uint8 with the model's channels (decode and channel conversion)."""
        return load_image(path, self.in_chans)

    def preprocess(self, path: str | os.PathLike) -> torch.Tensor:
        """The ``(C, H, W)`` float32 input of one file (refused if not finite)."""
        return finite_input(self.transform(self.load(path)), path)

    @torch.no_grad()
    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, classes)`` softmax probabilities of a preprocessed batch."""
        return self.model(x).float().softmax(-1)

    def top(self, x: torch.Tensor, k: int) -> list[list[tuple[str, float]]]:
        """The ``k`` most probable classes (capped at the class count) of each image, with
        their probabilities, most probable first."""
        top = self.probabilities(x).topk(min(k, len(self.class_names)), dim=-1)
        return [
            [(self.class_names[i], p) for p, i in zip(ps, idx)]
            for ps, idx in zip(top.values.tolist(), top.indices.tolist())
        ]
