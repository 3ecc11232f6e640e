"""Train a grasp detector (grasp_hybrid_t/s) on Cornell or Jacquard with the shared engine.

python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_s
python train_grasp.py --data /data/jacquard --dataset jacquard --input rgbd
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t data.split=object
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t --folds 5
"""

from pathlib import Path

from vision_tfm.errors import ConfigError
from vision_tfm.tasks import GraspConfig, GraspTask
from vision_tfm.train import Trainer, cross_validate
from vision_tfm.train.launch import base_parser, resolve_config, run_cli

CONFIGS = Path(__file__).resolve().parent / "configs" / "grasp"


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=["cornell", "jacquard"], help="data.dataset")
    p.add_argument("--input", choices=["rgb", "depth", "rgbd"], help="data.input")
    p.add_argument(
        "--folds", type=int, help="k-fold cross-validation: one model per fold, then mean ± std"
    )
    args = p.parse_intermixed_args()
    if args.folds is not None and (args.resume or args.eval_only):
        raise ConfigError("--folds trains every fold from scratch: drop --resume / --eval-only")
    extra = {}
    if args.data:
        extra["data.root"] = args.data
    if args.dataset:
        extra["data.dataset"] = args.dataset
    if args.input:
        extra["data.input"] = args.input
    cfg = resolve_config(GraspConfig(), args, CONFIGS, "", extra, task=GraspTask)
    if args.folds is not None:
        cross_validate(cfg, GraspTask, args.folds)
        return
    Trainer(cfg, GraspTask(cfg), resume=args.resume).fit(eval_only=args.eval_only)


if __name__ == "__main__":
    run_cli(main)
