"""``vtfm``: predict, attention maps, grasps, ONNX / timm-folder export and the format
benchmark. Each command group is a module (:mod:`.predict`, :mod:`.deploy`); this one builds
the parser and turns every error into one line and an exit code."""

from __future__ import annotations

import argparse
import signal
import threading

from ..errors import one_line_errors
from ..version import __version__
from . import deploy, predict

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vtfm",
        description="vision_tfm command line",
        epilog="Training: train_cls.py and train_grasp.py (--help); every config key, with its "
        "type and default: docs/config.md in the repository.",
    )
    p.add_argument("--version", action="version", version=f"vision_tfm {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    predict.add_commands(sub)
    deploy.add_commands(sub)
    return p


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """``kill`` (SIGTERM) would end the process on the spot; raising instead lets the
    staging folders and temp files of an export or benchmark be cleaned up on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    prev = None
    if threading.current_thread() is threading.main_thread():  # signals only work there
        prev = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with one_line_errors():
            args.fn(args)
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
