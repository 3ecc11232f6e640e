"""Train an image classifier (ViT, Swin or the hybrid) on the shared engine.

python train_cls.py --model vit                      # embedded MNIST, no download
python train_cls.py --model vit_small_patch16_224 --data ~/datasets/flowers  # your own images
python train_cls.py --config configs/cls/vit_s16_imagenet.yaml optim.lr=1e-3
torchrun --nproc_per_node=2 train_cls.py --model vit
python train_cls.py --resume runs/cls/vit_mnist-20261201-101500/last.pt
python train_cls.py --finetune runs/cls/vit_mnist-20261201-101500/best.pt --data ~/digits
"""

import argparse
from pathlib import Path
from typing import Any

from vision_tfm.data import infer_dataset_kind
from vision_tfm.errors import ConfigError
from vision_tfm.models import get_model_entry
from vision_tfm.models.hub import timm_has
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.train import Trainer
from vision_tfm.train.launch import base_parser, finetune_overrides, resolve_config, run_cli

CONFIGS = Path(__file__).resolve().parent / "configs" / "cls"
FOLDER_RECIPE = CONFIGS / "vit_small_folder.yaml"
FOLDER_MODELS = {
    "vit": "vit_small_patch16_224",
    "swin": "swin_tiny_patch4_window7_224",
    "hybrid": "hybrid_small",
}
"""What a short recipe name (an MNIST recipe on its own) trains on a user's --data folder."""


def folder_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """Point ``--data DIR`` without ``--config`` at the recipe for small RGB datasets, with the
    model ``--model`` names at its own input size; returns the settings that go with it.

    A model timm publishes no weights for starts from scratch unless ``model.pretrained`` is
    set on the command line.
    """
    args.model = FOLDER_MODELS.get(args.model or "vit", args.model)
    args.config = str(FOLDER_RECIPE)
    over: dict[str, Any] = {}
    size = getattr(get_model_entry(args.model).cfg, "img_size", None)
    if size:
        over["data.img_size"] = size
    if not timm_has(args.model):  # timm publishes weights for this name
        over["model.pretrained"] = False
    return over


def main() -> None:
    p = base_parser(__doc__.splitlines()[0], CONFIGS, "_mnist")
    p.add_argument(
        "--finetune",
        metavar="CKPT",
        help="start from a trained checkpoint (a new head for this data's classes) with the "
        "ULMFiT recipe in configs/cls/finetune.yaml",
    )
    args = p.parse_intermixed_args()
    extra = {}
    if args.finetune:
        if args.resume not in (None, "auto"):  # auto: this fine-tune, relaunched
            raise ConfigError("--finetune starts a new run; --resume continues one: pick one")
        extra = finetune_overrides(args.finetune, CONFIGS / "finetune.yaml")
    if args.data:
        extra.update({"data.name": infer_dataset_kind(args.data), "data.root": args.data})
        if not (args.config or args.resume or args.finetune):
            extra.update(folder_recipe(args))
    cfg = resolve_config(ClsConfig(), args, CONFIGS, "_mnist", extra, task=ClassificationTask)
    Trainer(cfg, ClassificationTask(cfg), resume=args.resume).fit(eval_only=args.eval_only)


if __name__ == "__main__":
    run_cli(main)
