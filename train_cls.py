"""Train an image classifier (ViT, Swin or the hybrid) on the shared engine.

python train_cls.py --model vit                      # embedded MNIST, no download
python train_cls.py --model swin --epochs 30 --data ~/datasets/flowers
python train_cls.py --config configs/cls/vit_s16_imagenet.yaml optim.lr=1e-3
torchrun --nproc_per_node=2 train_cls.py --model vit
python train_cls.py --resume runs/cls/vit_mnist-20261201-101500/last.pt
python train_cls.py --finetune runs/cls/vit_mnist-20261201-101500/best.pt --data ~/digits
"""

from pathlib import Path

from vision_tfm.data import infer_dataset_kind
from vision_tfm.errors import ConfigError
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.train import Trainer
from vision_tfm.train.launch import base_parser, finetune_overrides, resolve_config, run_cli

CONFIGS = Path(__file__).resolve().parent / "configs" / "cls"


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
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
    cfg = resolve_config(ClsConfig(), args, CONFIGS, "_mnist", extra, task=ClassificationTask)
    Trainer(cfg, ClassificationTask(cfg), resume=args.resume).fit(eval_only=args.eval_only)


if __name__ == "__main__":
    run_cli(main)
