"""What ``train_cls.py`` and ``train_grasp.py`` share: CLI parsing into a resolved config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..config import ConfigError, apply_overrides, parse_cli_overrides, safe_yaml
from ..errors import one_line_errors
from ..files import read_text
from ..io import load_checkpoint
from ..tasks import TASKS, Task
from ..tasks.config import load_config
from ..version import __version__
from .stops import Interrupted, NonFiniteLossError

T = TypeVar("T")


CONFIG_REFERENCE = "docs/config.md"
"""Every config key with its type, default and valid values (``python -m
vision_tfm.tasks.reference`` writes it from the dataclasses)."""


def base_parser(
    description: str, recipes: Path | None = None, suffix: str = ""
) -> argparse.ArgumentParser:
    """Flags common to every training script; parse with ``parse_intermixed_args`` so
    ``key.sub=value`` overrides may come anywhere, before or after the flags. ``--help``
    lists the YAML recipes in ``recipes`` (``--model NAME`` picks ``NAME<suffix>.yaml``)."""
    listed = ""
    if recipes is not None and recipes.is_dir():
        files = sorted(recipes.glob("*.yaml"))
        short = [f.stem.removesuffix(suffix) for f in files if suffix and f.stem.endswith(suffix)]
        other = [f.name for f in files if not (suffix and f.stem.endswith(suffix))]
        listed = f"Recipes: --model {' | '.join(short)}" if short else ""
        if other:
            listed += f"{'; ' if listed else ''}--config {recipes.parent.name}/{recipes.name}/"
            listed += f"{{{','.join(other)}}}"
        listed += ". "
    p = argparse.ArgumentParser(
        description=description,
        epilog=f"{listed}Every config key, with its type and default: {CONFIG_REFERENCE} in "
        "the repository.",
    )
    p.add_argument("--version", action="version", version=f"vision_tfm {__version__}")
    p.add_argument("--config", help="YAML file listing what differs from the defaults")
    p.add_argument("--model", help="a short recipe name (see configs/) or a registered model")
    p.add_argument("--epochs", type=int, help="shortcut for sched.epochs")
    p.add_argument("--data", help="dataset root")
    p.add_argument(
        "--resume",
        help="continue from a last.pt/best.pt checkpoint, or 'auto': the newest unfinished run "
        "of this config in run.out_dir (a new run when there is none)",
    )
    p.add_argument("--eval-only", action="store_true", help="evaluate --resume and exit")
    p.add_argument("--out-dir", help="parent of the run directory (run.out_dir)")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. optim.lr=1e-3")
    return p


def resolve_config(
    default: T,
    args: argparse.Namespace,
    config_dir: Path,
    recipe_suffix: str,
    extra: dict[str, Any] | None = None,
    *,
    task: type[Task],
) -> T:
    """Defaults <- (checkpoint config | recipe YAML | --config) <- flags <- overrides.

    ``--model vit`` picks ``<config_dir>/vit<recipe_suffix>.yaml`` when it exists;
    any other name is taken as a registered model. ``task`` is what the calling script
    trains; a checkpoint of another task is refused. ``--resume auto`` resolves as a new run
    with ``run.resume=auto`` (the trainer looks for the run to continue), and clears
    ``args.resume``, which callers pass on as the checkpoint.
    """
    if args.eval_only and (not args.resume or args.resume == "auto"):
        raise ConfigError("--eval-only needs --resume CHECKPOINT (it would score random weights)")
    over: dict[str, Any] = dict(extra or {})  # a script's own settings; the flags below win
    if args.resume == "auto":
        args.resume = None
        over["run.resume"] = "auto"
    if args.resume and args.config:
        raise ConfigError(
            "--config cannot be combined with --resume: a resumed run keeps its checkpoint's "
            "config (change single keys with key=value)"
        )
    cfg_path = args.config
    if args.model:
        recipe = config_dir / f"{args.model}{recipe_suffix}.yaml"
        if recipe.is_file() and not args.config and not args.resume:
            cfg_path = str(recipe)
        elif not recipe.is_file():
            over["model.name"] = args.model
    if args.epochs is not None:
        over["sched.epochs"] = args.epochs
    if args.out_dir:
        over["run.out_dir"] = args.out_dir
    over.update(parse_cli_overrides(args.overrides))
    if args.resume:
        if "run.out_dir" in over:
            raise ConfigError(
                "--out-dir (run.out_dir) cannot be combined with --resume: the run continues "
                "in its checkpoint's run dir, or in a new one beside it"
            )
        over.setdefault("run.stop_after", 0)  # a per-invocation limit, not part of the recipe
        over.setdefault("run.resume", "")  # this launch names its checkpoint
        ckpt = load_checkpoint(args.resume)
        other = TASKS.get(ckpt["meta"].get("task"))
        if other is not None and other is not task:
            raise ConfigError(
                f"{args.resume} is a {other.title} checkpoint; use {other.script} "
                f"(this script trains {task.title} models)"
            )
        try:
            base = apply_overrides(default, ckpt["config"])
        except ConfigError as e:
            raise ConfigError(f"{args.resume}: the checkpoint's config: {e}") from None
        # another model.name is refused by the Trainer, which checks every resume
        if args.model and "model.name" not in over:  # a recipe alias: check it names this model
            name = (safe_yaml(read_text(recipe)) or {}).get("model", {}).get("name")
            if name and name != base.model.name:
                raise ConfigError(
                    f"{args.resume} holds a {base.model.name!r} checkpoint, but --model "
                    f"{args.model} is the {name!r} recipe"
                )
        return load_config(base, None, over)
    return load_config(default, cfg_path, over)


def finetune_overrides(checkpoint: str, recipe: Path) -> dict[str, Any]:
    """The overrides ``--finetune CKPT`` stands for: the checkpoint's architecture and its
    shipped weights as the starting point (the head is rebuilt for the new data's classes),
    then the fine-tuning recipe's settings."""
    ckpt = load_checkpoint(checkpoint)
    model = ckpt["config"].get("model", {}) if isinstance(ckpt["config"], dict) else {}
    over: dict[str, Any] = {"model.pretrained": str(checkpoint)}
    if model.get("name"):
        over["model.name"] = model["name"]
    if model.get("kwargs"):
        over["model.kwargs"] = dict(model["kwargs"])
    data = safe_yaml(read_text(recipe)) or {}
    for section, values in data.items():
        over.update({f"{section}.{k}": v for k, v in (values or {}).items()})
    return over


def run_cli(main: Callable[[], Any]) -> None:
    """Run a script's main; expected failures print one line and exit non-zero: 2 for bad
    input, 1 for a failed write (:func:`~vision_tfm.errors.exit_code`), 3 for a run whose
    loss went non-finite, 128 + the signal's number for a stop
    signal (after its checkpoint): 130 for Ctrl-C, 143 for SIGTERM."""
    with one_line_errors():
        try:
            main()
        except Interrupted as e:
            sys.exit(128 + e.signum)
        except NonFiniteLossError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(3)
