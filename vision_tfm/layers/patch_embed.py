"""Image -> token grid, plus the input checks every model runs first."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from .sizes import pad_to_multiple

torch.fx.wrap("pad_to_multiple")  # fx: it branches on the input size


def check_image(
    x: torch.Tensor, in_chans: int, min_size: int, model: str, dtype: torch.dtype | None = None
) -> None:
    """Fail early, in one line, on inputs that would otherwise die deep inside a reshape.

    ``dtype`` is the model's weight dtype: outside autocast a float input of another dtype
    would fail in the first conv with torch's message, which blames the bias.
    A ``torch.fx.Proxy`` (symbolic tracing) is let through: it has no values to check.
    """
    if isinstance(x, torch.fx.Proxy):
        return
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{model}: expected a torch.Tensor image batch, got {type(x).__name__}")
    if x.ndim != 4:
        raise InputError(
            f"{model}: expected a 4-D image batch (B, C, H, W), got a {x.ndim}-D tensor of "
            f"shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise InputError(
            f"{model}: expected a floating-point image tensor, got {x.dtype} "
            "(convert with x.float() and normalise first)"
        )
    # only a mismatch pays for the autocast query (which autocast makes legitimate)
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise InputError(
            f"{model}: input dtype {x.dtype} does not match the model's weight dtype {dtype} "
            f"(cast with x.to({dtype}))"
        )
    if x.shape[1] != in_chans:
        raise InputError(
            f"{model}: expected {in_chans} input channels, got {x.shape[1]} "
            f"(input shape {tuple(x.shape)})"
        )
    h, w = x.shape[-2:]
    if h < min_size or w < min_size:
        raise InputError(
            f"{model}: image {h}x{w} is smaller than the minimum {min_size}x{min_size} "
            "(one patch, or one window of patches)"
        )


class PatchEmbed(nn.Module):
    """Non-overlapping conv patchify that takes any input size.

    Inputs that are not a multiple of the patch are zero-padded on the bottom/right (as the
    official Swin and torchvision do) rather than cropped, so no pixel is silently dropped.
    Output is channels-last ``(B, H/p, W/p, D)``; ViT flattens it, Swin keeps the grid.
    """

    def __init__(
        self,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        norm_layer: type[nn.Module] | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def grid_size(self, h: int, w: int) -> tuple[int, int]:
        """Token grid for an ``h x w`` image (after padding up to whole patches)."""
        p = self.patch_size
        return (h + p - 1) // p, (w + p - 1) // p  # ceil; ONNX integer Div truncates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(pad_to_multiple(x, self.patch_size)).permute(0, 2, 3, 1)  # (B, H/p, W/p, D)
        return self.norm(x)
