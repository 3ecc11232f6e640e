"""``vtfm``: predict, attention maps, grasps, ONNX / timm-folder export and the format
benchmark. Each command group is a module (:mod:`.predict`, :mod:`.deploy`); this one builds
the parser and turns every error into one line and an exit code."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings

from ..errors import error_line, exit_code, warning_line
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
    prev, fmt = None, warnings.formatwarning
    if threading.current_thread() is threading.main_thread():  # signals only work there
        prev = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    warnings.formatwarning = warning_line  # one line each, as the errors
    try:
        args.fn(args)
    except Exception as e:  # ours; a library's, on bad input or a full disk; a bug re-raised
        code = exit_code(e)
        if code is None:
            raise
        print(error_line(e), file=sys.stderr)
        sys.exit(code)
    finally:
        warnings.formatwarning = fmt
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
