"""Train a grasp detector (grasp_hybrid_t/s) on generated scenes, Cornell or Jacquard.

python train_grasp.py                      # no data needed: 320 generated RGB-D scenes
python train_grasp.py --data synthetic:2000 --model grasp_hybrid_s
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_s
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_s --init PRETRAINED.pt
python train_grasp.py --data /data/jacquard --dataset jacquard --input rgbd
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t data.split=object
python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t --folds 5
python train_grasp.py --eval-only --resume runs/grasp/.../best.pt --data OTHER   # every view
"""

from pathlib import Path

from vision_tfm.data.grasp.synthetic import is_synthetic_root
from vision_tfm.errors import ConfigError
from vision_tfm.io import load_checkpoint
from vision_tfm.tasks import GraspConfig, GraspTask
from vision_tfm.tasks.grasp.task import dataset_of
from vision_tfm.train import Trainer, cross_validate
from vision_tfm.train.launch import base_parser, resolve_config, run_cli

CONFIGS = Path(__file__).resolve().parent / "configs" / "grasp"
DEFAULT = CONFIGS / "synthetic.yaml"  # the embedded default: no --data, no recipe


def _same_data(a: str, b: str) -> bool:
    if is_synthetic_root(a) or is_synthetic_root(b):
        return a.strip() == b.strip()
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=["cornell", "jacquard", "synthetic"], help="data.dataset")
    p.add_argument("--input", choices=["rgb", "depth", "rgbd"], help="data.input")
    p.add_argument(
        "--folds", type=int, help="k-fold cross-validation: one model per fold, then mean ± std"
    )
    p.add_argument(
        "--init", help="start from this grasp checkpoint's weights (e.g. pre-trained on "
        "generated scenes); a new run, unlike --resume"
    )  # fmt: skip
    args = p.parse_intermixed_args()
    if args.folds is not None and (args.resume or args.eval_only):
        raise ConfigError("--folds trains every fold from scratch: drop --resume / --eval-only")
    if args.init and args.resume:
        raise ConfigError("--init starts a new run from weights; --resume continues one: pick one")
    extra = {}
    if args.data:
        extra["data.root"] = args.data
        extra["data.dataset"] = args.dataset or dataset_of(args.data)
    elif not args.resume and not args.config:  # the embedded default: generated scenes
        if args.model:  # a recipe's settings on the default number of generated views
            extra.update({"data.root": "synthetic", "data.dataset": "synthetic"})
        else:
            args.config = str(DEFAULT)
    if args.dataset:
        extra["data.dataset"] = args.dataset
    if args.input:
        extra["data.input"] = args.input
    if args.init:
        extra["model.pretrained"] = args.init
    cfg = resolve_config(GraspConfig(), args, CONFIGS, "", extra, task=GraspTask)
    if args.eval_only:
        trained_on = load_checkpoint(args.resume)["config"].get("data", {}).get("root", "")
        if _same_data(cfg.data.root, trained_on or cfg.data.root):
            print(f"eval-only: the validation split of {cfg.data.root}, the data it trained on")
        else:
            print(f"eval-only: every view of {cfg.data.root} (it trained on {trained_on})")
            cfg.data.score_all = True
    if args.folds is not None:
        cross_validate(cfg, GraspTask, args.folds)
        return
    Trainer(cfg, GraspTask(cfg), resume=args.resume).fit(eval_only=args.eval_only)


if __name__ == "__main__":
    run_cli(main)
