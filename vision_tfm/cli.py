"""``vtfm``: predict, attention maps (and, as they land, grasp, export, benchmark)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

__all__ = ["main"]


def _load_cls(ckpt_path: str, ema: bool):
    from .train.checkpoint import load_checkpoint
    from .train.classification import eval_data_config, restore_cls_model

    ckpt = load_checkpoint(ckpt_path)
    model, cfg = restore_cls_model(ckpt, use_ema=ema)
    return model, ckpt["meta"], eval_data_config(cfg, ckpt["meta"])


def cmd_predict(args: argparse.Namespace) -> None:
    """Print the top-5 classes of one image."""
    from .data import build_eval_transform, load_image

    model, meta, dcfg = _load_cls(args.checkpoint, args.ema)
    img = load_image(args.image, 1 if meta["in_chans"] == 1 else 3)
    x = build_eval_transform(dcfg)(img)[None]
    with torch.no_grad():
        prob = model(x).float().softmax(-1)[0]
    k = min(args.topk, prob.numel())
    top = prob.topk(k)
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        print(f"{meta['class_names'][i]:>20s}  {p:.4f}")


def cmd_attention(args: argparse.Namespace) -> None:
    """Write an attention-rollout heat map over the image."""
    from .data import build_eval_transform, load_image
    from .viz import attention_rollout, save_heatmap_overlay

    model, meta, dcfg = _load_cls(args.checkpoint, args.ema)
    img = load_image(args.image, 1 if meta["in_chans"] == 1 else 3)
    x = build_eval_transform(dcfg)(img)[None]
    heat = attention_rollout(model, x, discard_ratio=args.discard_ratio)[0]
    out = Path(args.out or Path(args.image).with_suffix("").name + "_attention.png")
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    save_heatmap_overlay(img, heat, out)
    print(f"wrote {out}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vtfm", description="vision_tfm command line")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("predict", help="top-k classes of an image")
    pr.add_argument("image")
    pr.add_argument("--checkpoint", required=True)
    pr.add_argument("--topk", type=int, default=5)
    pr.add_argument("--ema", action="store_true", help="use the EMA weights if present")
    pr.set_defaults(fn=cmd_predict)
    at = sub.add_parser("attention", help="ViT attention-rollout heat map as a PNG")
    at.add_argument("image")
    at.add_argument("--checkpoint", required=True)
    at.add_argument("--out", help="PNG path (default: <image>_attention.png)")
    at.add_argument("--discard-ratio", type=float, default=0.0)
    at.add_argument("--overwrite", action="store_true")
    at.add_argument("--ema", action="store_true")
    at.set_defaults(fn=cmd_attention)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
