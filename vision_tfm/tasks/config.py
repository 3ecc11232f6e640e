"""The config sections every task shares: typed dataclasses are the single source of truth.

A YAML file in ``configs/`` lists only what differs from these defaults; CLI ``key.sub=value``
overrides come last. Unknown keys and wrong types fail in one line naming the key (see
:func:`vision_tfm.config.apply_overrides`). The resolved config is saved in every run dir.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from ..config import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    Checked,
    ConfigError,
    Range,
    apply_overrides,
    config_to_dict,
    safe_yaml,
    shorten,
)
from ..errors import MissingFileError
from ..files import read_text
from ..io import atomic_write_text

T = TypeVar("T")


@dataclass
class ModelConfig:
    """Which registered model to build and how to change it.

    Attributes:
        name: A registered name (``vt.list_models()``).
        kwargs: Overrides of the family's config dataclass (``depth``, ``drop_path_rate``...).
        pretrained: Weights to start from: ``true`` (timm's default published weights for
            the name, via the Hugging Face cache), a timm tag (``augreg_in21k_ft_in1k``), or
            a checkpoint file (timm / torchvision / official Swin / a vision_tfm run).
        grad_checkpointing: Recompute block activations in backward (less memory, more time).
    """

    name: str = "vit_mnist"
    kwargs: dict[str, Any] = field(default_factory=dict)
    pretrained: bool | str = ""
    grad_checkpointing: bool = False

    def weights(self) -> tuple[bool | str, str | None]:
        """``pretrained`` as ``create_model``'s (pretrained, checkpoint_path) pair (the rule
        is ``models.hub.weights_source``'s, which ``create_backbone`` follows too)."""
        from ..models.hub import weights_source

        return weights_source(self.pretrained)

    def create(self, pretrained: bool = True, **defaults: Any) -> Any:
        """The model: ``defaults`` (from the data), then ``kwargs``, weights, checkpointing.

        ``pretrained=False`` skips the starting weights: a resumed run restores its own, and
        must not need their file, or the network, again.
        """
        from ..models import create_model

        pretrained, path = self.weights() if pretrained else (False, None)
        model = create_model(
            self.name, pretrained=pretrained, checkpoint_path=path, **{**defaults, **self.kwargs}
        )
        if self.grad_checkpointing:
            model.set_grad_checkpointing()
        return model


@dataclass
class OptimConfig(Checked):
    """AdamW (or any timm optimiser) with decoupled weight decay.

    Attributes:
        opt: timm optimiser name ("adamw", "sgd", "lamb"...).
        lr: Peak learning rate for ``lr_base_batch`` images per step (see below).
        lr_base_batch: If > 0, lr scales linearly with the global batch: ``lr * B / base``.
        weight_decay: Applied to weights only; norms, biases, position embeddings and
            tokens are exempt (timm's filter plus the model's ``no_weight_decay()``).
        betas: Adam betas.
        momentum: SGD momentum.
        clip_grad: Max global gradient norm; 0 = no clipping.
        accum_steps: Micro-batches accumulated per optimiser step.
        layer_decay: Layer-wise lr decay factor (BEiT/MAE fine-tuning); 0 = off. Each
            group of the model's ``group_matcher`` gets ``lr * decay ** (groups above it)``.
        discriminative: ULMFiT's discriminative fine-tuning (Howard & Ruder 2018): each group's
            rate is the one above it divided by this factor (the paper's 2.6); 0 = off. The
            same groups as ``layer_decay``, which it excludes.
        unfreeze: ULMFiT's gradual unfreezing: the head trains alone for this many epochs,
            then each group below it joins after as many more; 0 = everything trains from
            the start. A frozen group gets no gradient, no optimiser state and no decay.
    """

    opt: str = "adamw"
    lr: float = 1e-3
    lr_base_batch: int = 0
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9
    clip_grad: float = 0.0
    accum_steps: int = 1
    layer_decay: float = 0.0
    discriminative: float = 0.0
    unfreeze: int = 0

    SECTION: ClassVar[str] = "optim"
    RANGES: ClassVar[dict[str, Range]] = {
        "lr": POSITIVE,
        "lr_base_batch": NON_NEGATIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": Range(0, 1, hi_open=True),
        "momentum": Range(0, 1, hi_open=True),
        "clip_grad": NON_NEGATIVE,
        "accum_steps": AT_LEAST_ONE,
        "layer_decay": Range(0, 1, lo_open=True, zero=True),
        "discriminative": Range(1, None, zero=True),
        "unfreeze": NON_NEGATIVE,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_decay and self.discriminative:
            raise ConfigError(
                "optim.layer_decay and optim.discriminative are two forms of one thing; "
                f"set one (got {self.layer_decay} and {self.discriminative})"
            )
        from timm.optim import get_optimizer_info, list_optimizers

        try:  # timm parses "lookahead_<name>" the same way
            get_optimizer_info(self.opt.lower().split("_")[-1])
        except ValueError:
            close = difflib.get_close_matches(self.opt.lower(), list_optimizers(), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see list_optimizers()"
            raise ConfigError(f"optim.opt={self.opt!r} is not a timm optimizer; {hint}") from None


@dataclass
class SchedConfig(Checked):
    """The learning-rate schedule, stepped every optimiser update.

    Attributes:
        name: "cosine" (linear warmup, then cosine decay to ``min_lr``) or
            "slanted_triangular" (ULMFiT: a linear rise over ``cut_frac`` of the updates
            from ``lr / ratio`` to ``lr``, then a linear decay back; the warmup and
            ``min_lr`` settings do not apply to it).
        epochs: Epochs the schedule spans.
        warmup_epochs, warmup_lr, min_lr: The cosine schedule's.
        cut_frac, ratio: The slanted triangular schedule's (the paper's 0.1 and 32).
    """

    name: str = "cosine"
    epochs: int = 10
    warmup_epochs: float = 1.0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    cut_frac: float = 0.1
    ratio: float = 32.0

    SECTION: ClassVar[str] = "sched"
    RANGES: ClassVar[dict[str, Range]] = {
        "epochs": AT_LEAST_ONE,
        "warmup_epochs": NON_NEGATIVE,
        "warmup_lr": NON_NEGATIVE,
        "min_lr": NON_NEGATIVE,
        "cut_frac": Range(0, 1, lo_open=True, hi_open=True),
        "ratio": Range(1, None),
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"name": ("cosine", "slanted_triangular")}


@dataclass
class EmaConfig(Checked):
    """Exponential moving average of the weights (timm ``ModelEmaV3``).

    When enabled, the EMA is the model a run ships (as in timm's train script): its metric
    picks ``best.pt`` and is the figure printed at the end, and predict / export load its
    weights unless told otherwise. The raw model's metric is still logged beside it.

    Attributes:
        enabled: Keep the moving average (its metrics are logged as ``ema_*``).
        decay: Weight of the old average at each update.
        warmup: timm's warmup: the decay grows from 0 towards ``decay`` over the first
            updates, so early averages are not dominated by the initial weights.
    """

    enabled: bool = False
    decay: float = 0.9998
    warmup: bool = True

    SECTION: ClassVar[str] = "ema"
    RANGES: ClassVar[dict[str, Range]] = {"decay": Range(0, 1)}


@dataclass
class RunConfig(Checked):
    """Where and how a run executes.

    Attributes:
        out_dir: Parent of run directories (``<out_dir>/<model>-<timestamp>``).
        seed: Seeds everything; with the same seed a CPU run is bit-reproducible.
        precision: "fp32", or "amp": bf16 autocast on CPU, fp16 autocast + GradScaler on GPU,
            or "bf16": bf16 autocast on any device, or "auto": "amp" on GPU, "bf16" on a CPU
            with native bf16, "fp32" on one that would emulate it.
        device: "auto", "cpu" or "cuda".
        threads: torch intra-op threads; 0 = leave torch's default.
        log_interval: Steps between progress-bar / TensorBoard updates.
        tensorboard: Write TensorBoard event files.
        compile: ``torch.compile`` the model (compile time is reported).
        plots: Write loss/accuracy and confusion-matrix PNGs at the end.
        stop_after: Stop, resumably, after this many epochs in this invocation (0 = run to
            the end); for job time limits. The schedule still spans ``sched.epochs``.
        resume: "auto" continues the newest unfinished run of this same config in
            ``out_dir`` (``--resume auto``), or starts a new one when there is none, so a
            job scheduler can relaunch one command after a kill; "" always starts a new run.
            A checkpoint file is given with ``--resume PATH``.
    """

    out_dir: str = "runs/cls"
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    threads: int = 0
    log_interval: int = 20
    tensorboard: bool = True
    compile: bool = False
    plots: bool = True
    stop_after: int = 0
    resume: str = ""

    SECTION: ClassVar[str] = "run"
    RANGES: ClassVar[dict[str, Range]] = {
        "seed": Range(0, 2**32 - 1),
        "threads": NON_NEGATIVE,
        "log_interval": AT_LEAST_ONE,
        "stop_after": NON_NEGATIVE,
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "precision": ("fp32", "amp", "bf16", "auto"),
        "device": ("auto", "cpu", "cuda"),
        "resume": ("", "auto"),
    }


def load_config(default: T, path: str | os.PathLike | None, overrides: dict[str, Any]) -> T:
    """Defaults <- YAML file <- overrides, each checked against the dataclass fields."""
    cfg = default
    if path:
        p = Path(path)
        if not p.is_file():
            raise MissingFileError(f"config file not found: {p}")
        try:
            data = safe_yaml(read_text(p)) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({shorten(str(e).splitlines()[0])})") from None
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of config sections at the top level")
        try:
            cfg = apply_overrides(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}") from None
    return apply_overrides(cfg, overrides)


def save_config(cfg: Any, path: str | os.PathLike) -> None:
    """Write the fully resolved config as YAML (what actually ran, not what was asked),
    atomically: ``run.resume=auto`` reads it to find the run a relaunch continues."""
    atomic_write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), path)


def config_hash(cfg: Any) -> str:
    """Short stable hash of a resolved config, for export metadata and run bookkeeping."""
    return _hash(config_to_dict(cfg))


LAUNCH_KEYS = ("out_dir", "stop_after", "resume")
"""``run`` keys that may differ between the launches of one run: where to look for it, how
far this launch goes, and whether to continue it."""


def run_hash(config: Any) -> str:
    """The hash of what a run is, from its config (a dataclass, or the dict a run dir's
    ``config.yaml`` holds): every key but :data:`LAUNCH_KEYS`. ``run.resume=auto`` continues
    a run whose hash equals the new launch's."""
    d = config_to_dict(config) if not isinstance(config, dict) else config
    if isinstance(d.get("run"), dict):
        d = {**d, "run": {k: v for k, v in d["run"].items() if k not in LAUNCH_KEYS}}
    return _hash(d)


def _hash(d: dict[str, Any]) -> str:
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
