"""timm's model contract, once for every family, and the plug-in points a family declares.

A family subclasses :class:`VisionModel`, overrides the plug-in attributes that differ and
registers its sizes with ``register_model``: the rest of the package reads those attributes
and never names its class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from ..config import ConfigError
from ..constants import IMAGENET_MEAN, IMAGENET_STD, MNIST_MEAN, MNIST_STD
from ..errors import InputError


def check_output_fmt(output_fmt: str, allowed: tuple[str, ...], owner: str) -> None:
    """One-line error for a layout the family cannot give."""
    if output_fmt not in allowed:
        raise InputError(f"{owner}: output_fmt must be one of {allowed}, got {output_fmt!r}")


class VisionModel(nn.Module):
    """Base of every family: timm's model API where it is the same for all of them.

    Plug-in points (class attributes a family overrides):
        output_maps: Names of the dense maps ``forward`` returns as a dict, in the order of
            ``forward_maps``' channels; empty for a model that returns logits.
        checkpoint_family: Which foreign layouts ``load_pretrained`` accepts (``"vit"``,
            ``"swin"``: the suffix of ``convert.detect_source``); ``None``: own keys only.
        backbone_kind: How ``create_backbone`` reads its features: ``"stages"`` (hierarchical
            maps as they are), ``"simple_pyramid"`` (ViTDet's pyramid from one plain map), or
            ``None`` (no detection backbone).
        first_conv, classifier: Module names for ``pretrained_cfg`` (timm's fields).
        global_pools: Accepted ``global_pool`` values; ``""`` returns unpooled features.
        default_out_indices: ``features_only``'s levels when none are asked for, as timm's
            for the same architecture (an int: the last n; None: every level).

    Every family has timm's ``forward_intermediates(x, indices, norm, stop_early, output_fmt,
    intermediates_only)``: ``indices`` are ``feature_info`` levels (negative allowed) or an int
    for the last n, ``norm`` applies the final norm, ``stop_early`` skips the levels after the
    last one taken (always when only the maps are returned); it returns the list of maps, or
    ``(forward_features(x), maps)``. ``prune_intermediate_layers`` drops what follows the last.
    """

    output_maps: ClassVar[tuple[str, ...]] = ()
    checkpoint_family: ClassVar[str | None] = None
    backbone_kind: ClassVar[str | None] = None
    first_conv: ClassVar[str] = "patch_embed.proj"
    classifier: ClassVar[str] = "head"
    global_pools: ClassVar[tuple[str, ...]] = ("avg", "")
    default_out_indices: ClassVar[int | tuple[int, ...] | None] = None
    output_fmt: str = "NCHW"  # layout of forward_features
    grad_checkpointing: bool = False

    cfg: Any
    num_features: int
    feature_info: list[dict[str, Any]]

    # --- timm's attributes ---------------------------------------------------------------

    @property
    def head_hidden_size(self) -> int:
        """Width of ``forward_head(pre_logits=True)`` (no pre-logits layer: num_features)."""
        return self.num_features

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg``: what ``timm.data.resolve_data_config`` reads.

        Built from the config, then overlaid with the matched timm weights' cfg (mean, std,
        crop) and ``pretrained_cfg_overlay`` given to ``create_model``.
        """
        size = self.cfg.img_size
        mean, std = self.norm_stats()
        out = {
            "architecture": getattr(self, "model_name", type(self).__name__),
            "input_size": (self.in_chans, size, size),
            "fixed_input_size": False,
            "num_classes": getattr(self, "num_classes", 0),
            "mean": mean,
            "std": std,
            "crop_pct": 1.0 if size < 64 else 0.9,
            "crop_mode": "center",
            "interpolation": "bicubic",
            "pool_size": self.pool_size(),
            "first_conv": self.first_conv,
            "classifier": self.classifier,
        }
        return {**out, **getattr(self, "_cfg_overlay", {})}

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name for :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    def norm_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Normalisation mean and std the data pipeline uses for this many channels."""
        if self.in_chans == 1:  # the one-channel data the package ships
            return MNIST_MEAN, MNIST_STD
        extra = self.in_chans - 3
        if extra < 0:
            return (0.5,) * self.in_chans, (0.5,) * self.in_chans
        return (
            IMAGENET_MEAN + (0.0,) * extra,
            IMAGENET_STD + (1.0,) * extra,
        )

    def pool_size(self) -> tuple[int, int] | None:
        """Spatial size of ``forward_features`` at ``img_size`` (None for token sequences)."""
        r = self.feature_info[-1]["reduction"]
        n = -(-self.cfg.img_size // r)
        return (n, n)

    # --- timm's methods ------------------------------------------------------------------

    def get_classifier(self) -> nn.Module:
        """The final classification layer (``nn.Identity`` without a head)."""
        return self.get_submodule(self.classifier)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward instead of storing them (less memory)."""
        for m in self.modules():  # the model and the parts that loop over blocks
            if hasattr(m, "grad_checkpointing"):
                m.grad_checkpointing = enable

    def save_pretrained(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``config.json`` + ``model.safetensors``: the folder timm and the Hugging Face
        hub read (``create_model("local-dir:DIR", pretrained=True)``; see ``models.hf``)."""
        from .hf import save_pretrained

        return save_pretrained(self, directory, overwrite=overwrite)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload :meth:`save_pretrained`'s folder to the hub (``models.hf.push_to_hub``)."""
        from .hf import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)

    def no_weight_decay(self) -> set[str]:
        """Parameter names weight decay would only shrink towards a meaningless zero."""
        return set()

    def _check_pool(self, global_pool: str) -> None:
        if global_pool not in self.global_pools:
            raise ConfigError(
                f"{type(self).__name__}: global_pool must be one of {self.global_pools}, "
                f"got {global_pool!r}"
            )


class LinearHeadModel(VisionModel):
    """A family whose classifier is one ``head`` Linear on ``embed_dim`` pooled features."""

    embed_dim: int
    global_pool: str

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Swap the head for fine-tuning on another label set (and the pooling, if given)."""
        if global_pool is not None:
            self._check_pool(global_pool)
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes else nn.Identity()
