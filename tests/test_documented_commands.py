"""Every command the README shows, and every example script, runs to its last line.

Each README command is run as written, on files the tests make, with what makes it take
seconds appended or substituted (tiny models, a few images, one epoch); the table below says
what each reduced form changes. A README command missing from the table fails
:func:`test_every_readme_command_has_a_reduced_form`, so a command added to the README is
either run here or says why it cannot be (a timm source checkout, a cluster, this suite).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TIMEOUT = 300

VIT_TINY = "model.kwargs={embed_dim: 16, depth: 1, num_heads: 2, patch_size: 7}"
CLS_FAST = [VIT_TINY, "data.train_subset=128", "data.batch_size=64", "run.tensorboard=false"]
SMALL_DATA = ["sched.epochs=1", "data.batch_size=8", "data.num_workers=1", "run.tensorboard=false"]
GRASP_TINY = [
    "model.kwargs={stem_chs: [8, 8], stem_depths: [0, 1], embed_dim: 16, depth: 1, num_heads: 2}",
    "data.output_size=32",
    "data.batch_size=2",
    "sched.epochs=1",
    "run.tensorboard=false",
    "run.plots=false",
]
RUN_CLS = "runs/cls/vit_mnist-20261201-101500"  # the README's run dir names
RUN_GLOB = "runs/cls/vit_mnist-..."


@dataclass
class Reduced:
    """How a README command runs here: ``subs`` replace text in it (placeholders become the
    files the tests made), ``extra`` is appended, and the run must print ``last`` (a regex) as
    its last stdout line and leave ``files`` (globs, relative to the work folder)."""

    subs: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    last: str = ""
    files: list[str] = field(default_factory=list)


def _cls_run(*files: str, last: str = r"val top1: 0\.\d+") -> Reduced:
    return Reduced(extra=CLS_FAST, last=last, files=list(files))


# the README's commands, in the README's order: a reduced form, or why it does not run here
COMMANDS: dict[str, Reduced | str] = {
    'pip install -e ".[dev]"': "the install itself: .ci/run runs it on a clean clone",
    "pytest -q": "this suite",
    "ruff check .": ".ci/run runs it",
    "python train_cls.py --model vit": _cls_run("runs/cls/vit_mnist-*/best.pt"),
    "python train_cls.py --model vit_small_patch16_224 --data ~/datasets/flowers": Reduced(
        subs={"~/datasets/flowers": "flowers"},  # the recipe's timm weights from a file
        extra=["model.pretrained=vit_small_patch16_224.pth", "data.img_size=32", *SMALL_DATA],
        last=r"val top1: [01]\.\d+",
        files=["runs/cls/vit_small_patch16_224-flowers-*/model.safetensors"],
    ),
    "python train_cls.py --config configs/cls/vit_s16_imagenet.yaml --data /data/imagenet "
    "data.batch_size=128": Reduced(
        subs={"/data/imagenet": "imagenet", "data.batch_size=128": "data.batch_size=8"},
        extra=["model.kwargs.depth=1", "data.img_size=32", "sched.warmup_epochs=0", *SMALL_DATA],
        last=r"val top1: [01]\.\d+",
        files=["runs/cls/vit_small_patch16_224-imagenet-*/best.pt"],
    ),
    "torchrun --nproc_per_node=2 train_cls.py --model vit": Reduced(
        # a free port: other runs on this machine may hold torchrun's default one
        subs={"--nproc_per_node=2": "--nproc_per_node=2 --master_port={port}"},
        extra=CLS_FAST,
        last=r"val top1: 0\.\d+",
    ),
    f"python train_cls.py --resume {RUN_CLS}/last.pt": Reduced(
        last=r"val top1: 0\.\d+", files=["runs/cls/vit_mnist-*/best.pt"]
    ),
    f"python train_cls.py --eval-only --resume {RUN_GLOB}/best.pt": Reduced(
        last=r"val top1: 0\.\d+"
    ),
    "timeout -s TERM 1h python train_cls.py --model vit --resume auto": _cls_run(),
    "python train_cls.py --model vit --resume auto &": "a line of the SLURM script; the "
    "timeout line above runs the same command, and tests/train/test_preempt.py the requeue "
    "exit code 143",
    "trap 'kill -TERM $!; wait $!; [ $? = 143 ] && scontrol requeue $SLURM_JOB_ID' TERM; "
    "wait $!": "SLURM's scontrol; the exit code it reads is tested in tests/train/test_preempt.py",
    "python train_cls.py --model vit_small_patch16_224 --data ~/datasets/flowers --epochs 30 "
    "data.img_size=224 model.pretrained=true optim.layer_decay=0.75 optim.lr=5e-4": Reduced(
        subs={
            "~/datasets/flowers": "flowers",
            "--epochs 30": "--epochs 1",
            "data.img_size=224": "data.img_size=32",
            "model.pretrained=true": "model.pretrained=vit_small_patch16_224.pth",  # no download
        },
        extra=SMALL_DATA[1:],
        last=r"val top1: [01]\.\d+",
    ),
    "python train_cls.py --model swin_tiny_patch4_window7_224 --data ~/datasets/flowers "
    "data.img_size=224 model.pretrained=swin_tiny_patch4_window7_224.pth": Reduced(
        subs={"~/datasets/flowers": "flowers", "data.img_size=224": "data.img_size=64"},
        extra=SMALL_DATA,
        last=r"val top1: [01]\.\d+",
    ),
    f"python train_cls.py --finetune {RUN_GLOB}/best.pt --data ~/datasets/digits": Reduced(
        subs={"~/datasets/digits": "digits"},
        extra=["sched.epochs=2", "data.batch_size=8", "run.tensorboard=false"],
        last=r"val top1: [01]\.\d+",
    ),
    "python train.py --device-modules vision_tfm --model vit_mnist --data-dir digits "
    "--train-split train --val-split val --in-chans 1 --num-classes 10 --device cpu": "timm's "
    "train.py from a timm source checkout, not in the package; tests/models/test_timm_interop.py "
    "drives the same model through timm's create_model, optimizer, scheduler and transforms",
    'python -c "import runpy, sys, vision_tfm; sys.argv = sys.argv[1:]; runpy.run_path('
    "sys.argv[0], run_name='__main__')\" validate.py --model vit_mnist --in-chans 1 "
    "--num-classes 10 --data-dir digits --split val --checkpoint "
    "output/train/<run>/model_best.pth.tar --device cpu": "timm's validate.py from a timm "
    "source checkout; tests/export/test_hf_folder.py scores our folder with timm's data config",
    f"vtfm export --format hf --checkpoint {RUN_GLOB}/best.pt --out vit-digits": Reduced(
        last=r'load it: timm\.create_model\("local-dir:vit-digits", pretrained=True\)',
        files=["vit-digits/config.json", "vit-digits/model.safetensors"],
    ),
    "python train_grasp.py": Reduced(
        extra=[*GRASP_TINY, "data.root=synthetic:12"], last=r"grasp acc .*: [01]\.\d+"
    ),
    "python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_s": Reduced(
        subs={"../shared/data/cornell": "cornell"},
        extra=GRASP_TINY,
        last=r"grasp acc .*: [01]\.\d+",
        files=["runs/grasp/*/best.pt"],
    ),
    "python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t --folds 5": Reduced(
        subs={"../shared/data/cornell": "cornell", "--folds 5": "--folds 3"},
        extra=GRASP_TINY,
        last=r"grasp acc \(image-wise 3-fold, top-1\): [01]\.\d+ ± [01]\.\d+",
    ),
    "python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t "
    "data.split=object": Reduced(
        subs={"../shared/data/cornell": "cornell"},
        extra=GRASP_TINY,
        last=r"grasp acc .*: [01]\.\d+",
    ),
    "python train_grasp.py --data /data/jacquard --dataset jacquard --input rgbd": Reduced(
        subs={"/data/jacquard": "jacquard"},
        extra=[*GRASP_TINY, "data.train_frac=0.5", "data.batch_size=1"],
        last=r"grasp acc .*: [01]\.\d+",
    ),
    "vtfm grasp pcd0100r.png --depth pcd0100d.tiff --checkpoint runs/grasp/.../best.pt": Reduced(
        subs={
            "pcd0100r.png": "cornell/01/pcd0100r.png",
            "pcd0100d.tiff": "cornell/01/pcd0100d.tiff",
        },
    ),
    f"vtfm export --checkpoint {RUN_GLOB}/best.pt --dynamic batch,hw": Reduced(
        files=["runs/cls/vit_mnist-*/model.onnx", "runs/cls/vit_mnist-*/model.json"]
    ),
    "vtfm export --checkpoint CKPT --int8 static --calib-data ../shared/data/mnist": Reduced(
        subs={"CKPT": f"{RUN_GLOB}/best.pt", "../shared/data/mnist": "mnist"},
        extra=["--calib-size", "32", "--overwrite"],
    ),
    "vtfm export --checkpoint CKPT --int8 openvino": Reduced(
        subs={"CKPT": f"{RUN_GLOB}/best.pt"}, extra=["--calib-size", "32", "--overwrite"]
    ),
    "vtfm benchmark --checkpoint CKPT --formats torch,onnx,onnx-int8-dynamic,openvino-int8 "
    "--threads 2": Reduced(
        subs={"CKPT": f"{RUN_GLOB}/best.pt"},
        extra=["--quick", "--no-memory", "--val-images", "16", "--calib-size", "16"],
        files=["runs/cls/vit_mnist-*/benchmark/benchmark.md"],
    ),
    "vtfm benchmark --model vit_small_patch16_224 --img-size 224 --data photos/": Reduced(
        subs={"--img-size 224": "--img-size 32"},
        extra=["--quick", "--no-memory", "--formats", "torch,onnx", "--out", "bench"],
        files=["bench/benchmark.md"],
    ),
    f"python examples/onnx_client.py {RUN_GLOB}/model.onnx digit.png --topk 3": Reduced(
        last=r"\s*\d+\s+[01]\.\d{4}"
    ),
    "python benchmarks/bench_vs_timm.py --models vit,swin --precisions fp32,bf16 --batches 1,16 "
    "--threads 2 --modes infer,train --rounds 4 --check": Reduced(
        # --check fails a slow case: a timing, which no test asserts
        subs={
            "--models vit,swin": "--models vit",
            "--precisions fp32,bf16": "--precisions fp32",
            "--batches 1,16": "--batches 1",
            "--threads 2": "--threads 1",
            "--modes infer,train": "--modes infer",
            "--rounds 4 --check": "--quick",
        },
    ),
    "python train_cls.py --model vit model.kwargs.attn_type=linear "
    "model.kwargs.feature_map=favor": _cls_run(),
}

# the README's commands that need an earlier one's files, in the order they run here (one
# training feeds both the resume and the export commands: each chain costs a training)
CHAINS = {
    "classification": [
        "python train_cls.py --model vit",
        f"python train_cls.py --resume {RUN_CLS}/last.pt",
        f"python train_cls.py --eval-only --resume {RUN_GLOB}/best.pt",
        f"vtfm export --format hf --checkpoint {RUN_GLOB}/best.pt --out vit-digits",
        f"vtfm export --checkpoint {RUN_GLOB}/best.pt --dynamic batch,hw",
        f"python examples/onnx_client.py {RUN_GLOB}/model.onnx digit.png --topk 3",
        "vtfm export --checkpoint CKPT --int8 static --calib-data ../shared/data/mnist",
        "vtfm export --checkpoint CKPT --int8 openvino",
        "vtfm benchmark --checkpoint CKPT --formats torch,onnx,onnx-int8-dynamic,openvino-int8 "
        "--threads 2",
        # last: each starts a run dir of its own, which the globs above would then find
        f"python train_cls.py --finetune {RUN_GLOB}/best.pt --data ~/datasets/digits",
        "timeout -s TERM 1h python train_cls.py --model vit --resume auto",
    ],
    "grasp": [
        "python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_s",
        "vtfm grasp pcd0100r.png --depth pcd0100d.tiff --checkpoint runs/grasp/.../best.pt",
        "python train_grasp.py --data ../shared/data/cornell --model grasp_hybrid_t "
        "data.split=object",
        "python train_grasp.py --data /data/jacquard --dataset jacquard --input rgbd",
    ],
}
CHAINED = {c for chain in CHAINS.values() for c in chain}


def readme_commands(text: str | None = None) -> list[str]:
    """The shell commands of the README's ``bash`` blocks: continuation lines joined,
    comments dropped, ``A && B`` split in two."""
    text = (ROOT / "README.md").read_text() if text is None else text
    commands, block, joined = [], False, ""
    for line in text.splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            block = fence == "```bash"
            continue
        if not block or fence.startswith("#"):
            continue
        joined += re.sub(r"\s+#\s.*$", "", fence)
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip() + " "
            continue
        commands += [c.strip() for c in _split_and(joined)]
        joined = ""
    return commands


def _split_and(line: str) -> list[str]:
    """``A && B`` as ``[A, B]``, leaving a quoted ``&&`` alone."""
    parts = line.split(" && ")
    out = [parts[0]]
    for part in parts[1:]:
        if out[-1].count("'") % 2:  # inside a quoted string: rejoin
            out[-1] += " && " + part
        else:
            out.append(part)
    return out


def test_every_readme_command_has_a_reduced_form() -> None:
    shown = readme_commands()
    missing = [c for c in shown if c not in COMMANDS]
    assert not missing, f"README commands with no reduced form in this file: {missing}"
    stale = [c for c in COMMANDS if c not in shown]
    assert not stale, f"reduced forms of commands the README no longer shows: {stale}"
    assert all(c in COMMANDS for c in CHAINED)


def test_readme_parser_joins_continuations_and_drops_comments() -> None:
    text = "x\n```bash\na --b \\\n    c   # note\n# only a comment\nd && e\n```\n```\nf\n```\n"
    assert readme_commands(text) == ["a --b c", "d", "e"]
    assert readme_commands("```bash\ntrap 'a && b' T\n```\n") == ["trap 'a && b' T"]


# --- the files the commands read ------------------------------------------------------------


def _images(folder: Path, classes: dict[str, int], size: int, seed: int, gray: bool = False):
    rng = np.random.default_rng(seed)
    for k, (name, n) in enumerate(classes.items()):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            base = rng.integers(0, 256, (size, size, 3)) // 4 + 48 * k  # classes differ in tone
            arr = base.astype(np.uint8)
            im = Image.fromarray(arr[..., 0] if gray else arr)
            im.save(folder / name / f"{name}{i}.png")


def _mnist_idx(folder: Path) -> None:
    """The embedded val digits as MNIST's own idx files (what ../shared/data/mnist holds)."""
    from vision_tfm.data import load_mnist

    x, y = load_mnist("val")
    x, y = x[:64], y[:64]
    folder.mkdir()
    head = np.array([2051, len(x), 28, 28], ">i4").tobytes()
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(head + x.tobytes()))
    head = np.array([2049, len(y)], ">i4").tobytes()
    labels = np.asarray(y, np.uint8).tobytes()
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(head + labels))


def _timm_weights(work: Path) -> None:
    """Seeded timm weights under the file names the README loads (nothing downloads)."""
    import timm
    import torch

    for name in ("vit_small_patch16_224", "swin_tiny_patch4_window7_224"):
        torch.manual_seed(0)
        torch.save(timm.create_model(name).state_dict(), work / f"{name}.pth")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    import shutil

    from vision_tfm.data import load_mnist

    work = tmp_path_factory.mktemp("readme")
    _images(work / "flowers", {"daisy": 10, "rose": 10}, 40, 0)
    for split, n in (("train", 8), ("val", 4)):
        _images(work / "imagenet" / split, {"n01": n, "n02": n}, 40, 1 + n)
    x, y = load_mnist("val")
    for d in range(10):  # digits/{train,val}/<class>/, as the README lays it out
        for i, img in enumerate(x[y == d][:6]):
            folder = work / "digits" / ("train" if i < 4 else "val") / str(d)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(folder / f"{i}.png")
    Image.fromarray(x[0]).save(work / "digit.png")
    _images(work / "photos", {"all": 4}, 48, 9)
    _mnist_idx(work / "mnist")
    shutil.copytree(FIXTURES / "cornell", work / "cornell")
    shutil.copytree(FIXTURES / "jacquard", work / "jacquard")
    for f in list((work / "jacquard").glob("*/0_*")):  # a second view, for a train/val split
        shutil.copy(f, f.with_name("1" + f.name[1:]))
    _timm_weights(work)
    return work


# --- running them ---------------------------------------------------------------------------


def argv(command: str, work: Path) -> list[str]:
    """The command's reduced argv, run from ``work``: our scripts by path, ``vtfm`` and
    ``torchrun`` through this Python, README placeholders as the files found there."""
    red = COMMANDS[command]
    assert isinstance(red, Reduced), command
    text = command.removesuffix(" &")
    for old, new in red.subs.items():
        assert old in text, (command, old)
        text = text.replace(old, new.replace("{port}", str(_free_port())))
    words = [*shlex.split(text), *red.extra]
    out: list[str] = []
    for w in words:
        if "..." in w or w.startswith(RUN_CLS):  # a run dir the README elides: the newest
            w = str(_newest(work, w.replace("...", "*").replace(RUN_CLS, "runs/cls/vit_mnist-*")))
        out.append(w)
    head = {"python": [sys.executable], "vtfm": [sys.executable, "-m", "vision_tfm.cli"]}
    head["torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    i = 4 if out[0] == "timeout" else 0  # timeout -s TERM 1h <command>
    out[i : i + 1] = head.get(out[i], [out[i]])
    # the repository's own files (scripts, configs/) as from its root, where the README runs
    return [str(ROOT / w) if _in_repo(w, work) else w for w in out]


def _in_repo(word: str, work: Path) -> bool:
    if word.startswith("-") or "=" in word or ("/" not in word and not word.endswith(".py")):
        return False
    return not (work / word).exists() and (ROOT / word).is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _newest(work: Path, pattern: str) -> Path:
    found = sorted(work.glob(pattern), key=lambda p: p.stat().st_mtime)
    assert found, f"no {pattern} under {work}: an earlier command should have written it"
    return found[-1].relative_to(work)


def run(command: str, work: Path, more: tuple[str, ...] = ()) -> str:
    """Run one README command reduced (``more`` appended); checks its exit code, last line
    and files."""
    red = COMMANDS[command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [*argv(command, work), *more],
        cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    tail = f"{command}\nstdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-6000:]}"
    assert done.returncode == 0, tail
    lines = done.stdout.strip().splitlines()
    if red.last:
        assert lines and re.fullmatch(red.last, lines[-1]), tail
    for pattern in red.files:
        assert list(work.glob(pattern)), f"{command}: wrote no {pattern}\n{tail}"
    return done.stdout


SINGLE = [c for c, r in COMMANDS.items() if isinstance(r, Reduced) and c not in CHAINED]


@pytest.mark.parametrize("command", SINGLE)
def test_readme_command(command: str, work: Path) -> None:
    folder = work / f"single{SINGLE.index(command)}"
    folder.mkdir()
    for entry in work.iterdir():
        if entry.is_file() or entry.name in {"flowers", "imagenet", "cornell", "photos"}:
            (folder / entry.name).symlink_to(entry)
    run(command, folder)


# the first run of the classification chain stops after one of two epochs, so that
# ``--resume last.pt`` has an epoch left to continue in place
FIRST_OF_CHAIN = {"classification": ("sched.epochs=2", "run.stop_after=1")}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_readme_chain(chain: str, work: Path) -> None:
    """Commands that read an earlier one's files, in order, in one folder."""
    folder = work / f"chain-{chain}"
    folder.mkdir()
    for entry in work.iterdir():
        if not entry.name.startswith(("single", "chain-")):
            (folder / entry.name).symlink_to(entry)
    first, *rest = CHAINS[chain]
    run(first, folder, FIRST_OF_CHAIN.get(chain, ()))
    for command in rest:
        run(command, folder)


# --- the examples ---------------------------------------------------------------------------

DETECTOR = [str(ROOT / "examples" / "finetune_detector.py"), "--scenes", "8", "4"]
DETECTOR += ["--min-size", "64", "--max-size", "64", "--batch-size", "2"]


def test_detector_example_ends_with_its_map_line_and_run_folder(tmp_path: Path) -> None:
    cmd = [sys.executable, *DETECTOR, "--steps", "2", "--out", "runs"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"val COCO mAP@\[\.5:\.95\]: [01]\.\d{4}, mAP@0\.5: [01]\.\d{4}", lines[-1])
    assert any(line.startswith("no model folder beside best.pt: a FasterRCNN") for line in lines)
    (run_dir,) = (tmp_path / "runs").iterdir()
    for name in ("best.pt", "last.pt", "config.yaml", "metrics.csv", "val_predictions.pt"):
        assert (run_dir / name).is_file(), name
    assert len(list((run_dir / "predictions").glob("*.png"))) == 4
    assert not (run_dir / "config.json").exists()  # no folder claiming to be a classifier


def test_detector_example_stopped_by_sigterm_leaves_a_resumable_checkpoint(tmp_path: Path):
    from vision_tfm.io import load_checkpoint

    cmd = [sys.executable, *DETECTOR, "--steps", "400", "--out", "runs"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in proc.stdout:  # training has begun once the run dir is named
            if line.startswith("run dir "):
                break
        time.sleep(3)  # into the first epoch, past the handlers' setup
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM" in out and "resume with --resume" in out, out
    (last,) = tmp_path.glob("runs/*/last.pt")
    ck = load_checkpoint(last)
    assert ck["state"]["num_updates"] >= 1 and ck["meta"]["task"] == "det"
    assert json.dumps(ck["config"]["det"])  # the example's own section went with it
