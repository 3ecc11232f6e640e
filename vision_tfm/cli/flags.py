"""Flags more than one ``vtfm`` command takes."""

from __future__ import annotations

import argparse


def add_ema(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use the EMA (or, with --no-ema, the raw) weights; default: what the run shipped",
    )
