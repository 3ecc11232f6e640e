"""DDP on CPU (gloo, 2 processes): gradient accumulation, a coordinated Ctrl-C and NaN stop.

Both tests start two training processes on tiny configs; they are the slowest here.
"""

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from vision_tfm.config import apply_overrides, parse_cli_overrides
from vision_tfm.io import load_checkpoint
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import load_config
from vision_tfm.train import Trainer
from vision_tfm.train.launch import run_cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = [
    "model.name=vit_mnist",
    "model.kwargs={embed_dim: 16, depth: 1, num_heads: 2, patch_size: 7}",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _GradCheckTask(ClassificationTask):
    """Records each micro-batch and, from a DDP comm hook, the gradients each rank sends."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.batches, self.sent = [], {}

    def loss(self, model, batch, device):
        if not self.batches:  # model is the DDP wrapper
            names = {p: n for n, p in model.module.named_parameters()}

            def hook(state, bucket):
                got = self.sent.setdefault(len(self.batches), {})
                for p, g in zip(bucket.parameters(), bucket.gradients()):
                    got[names[p]] = (p.detach().clone(), g.clone())  # weights, local grad
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, hook)
        self.batches.append(batch)
        return super().loss(model, batch, device)

    def evaluate(self, model, loader, device):
        return {"top1": 0.0}  # not under test here; skips 2000 validation images


def _accumulate_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank)
    )
    os.environ["WORLD_SIZE"] = "2"
    torch.set_num_threads(1)
    over = {
        "model.name": "vit_mnist",
        "model.kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
        "data.train_subset": 96,  # 48 per rank: 3 batches of 16, accumulated as 2 + 1
        "data.batch_size": 16,
        "optim.accum_steps": 2,
        "sched.epochs": 1,
        "run.tensorboard": False,
        "run.plots": False,
        "run.out_dir": out,
    }
    cfg = apply_overrides(ClsConfig(), over)
    task = _GradCheckTask(cfg)
    trainer = Trainer(cfg, task)
    trainer.fit()
    # gradients went out once per update (no_sync before), the trailing micro-batch included
    assert sorted(task.sent) == [2, 3] and trainer.state.num_updates == 2, sorted(task.sent)
    ref_model = copy.deepcopy(trainer.model).train()
    params = dict(ref_model.named_parameters())
    start = 0
    for end, sent in sorted(task.sent.items()):
        assert set(sent) == set(params)
        for n, (w, _) in sent.items():
            params[n].data.copy_(w)
        x = torch.cat([b[0] for b in task.batches[start:end]])
        y = torch.cat([b[1] for b in task.batches[start:end]])
        ref_model.zero_grad()
        ClassificationTask.loss(task, ref_model, (x, y), torch.device("cpu"))[0].backward()
        for n, (_, g) in sent.items():  # accumulated = the whole group's batch at once
            torch.testing.assert_close(g, params[n].grad, rtol=1e-4, atol=1e-6, msg=n)
        start = end


def test_accumulation_syncs_once_per_update_and_matches_whole_batch_gradients(tmp_path):
    mp.spawn(_accumulate_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)


def test_ctrl_c_under_torchrun_stops_both_ranks_with_a_resumable_checkpoint(tmp_path):
    """SIGINT to torchrun (as Ctrl-C in its terminal): it forwards it to both ranks, which
    agree on a step, write last.pt from rank 0 and exit; torchrun would SIGKILL them at 30 s."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        str(ROOT / "train_cls.py"),
        *MODEL,
        "data.train_subset=4096",  # 256 steps per rank and epoch: the stop comes mid-epoch
        "data.batch_size=8",
        "sched.epochs=50",
        "run.log_interval=1",
        "run.tensorboard=false",
        "run.plots=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "out.txt").open("w")
    p = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("runs/cls/*/steps.csv")):  # training has started
            assert p.poll() is None and time.monotonic() < deadline, (
                tmp_path / "out.txt"
            ).read_text()
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGINT)
        t0 = time.monotonic()
        p.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "out.txt").read_text()
    assert took < 30, out[-3000:]
    assert "checkpoint written" in out, out[-3000:]
    (run_dir,) = tmp_path.glob("runs/cls/*")
    state = load_checkpoint(run_dir / "last.pt", resume=True)["state"]
    assert state["epoch"] == 0 and state["step_in_epoch"] > 0 and state["world_size"] == 2
    assert state["loss_count"] == 2 * state["step_in_epoch"]  # both ranks' losses kept


class _NanOnRank1Task(ClassificationTask):
    """Rank 1's loss turns NaN on the first micro-batch of epoch 2's second update."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = 0

    def loss(self, model, batch, device):
        loss, n = super().loss(model, batch, device)
        self.calls += 1
        if torch.distributed.get_rank() == 1 and self.calls == 4 + 3:  # 4 per epoch
            loss = loss * float("nan")
        return loss, n

    def evaluate(self, model, loader, device):
        return {"top1": 0.0}


def _nan_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    sys.stderr = open(Path(out) / f"err{rank}.txt", "w", buffering=1)  # noqa: SIM115
    over = {
        "data.train_subset": 64,  # 32 per rank: 4 batches of 8, 2 updates of 2
        "data.batch_size": 8,
        "optim.accum_steps": 2,
        "sched.epochs": 2,
        "run.tensorboard": False,
        "run.plots": False,
        "run.out_dir": out,
    }
    cfg = load_config(ClsConfig(), None, {**parse_cli_overrides(MODEL), **over})
    run_cli(lambda: Trainer(cfg, _NanOnRank1Task(cfg)).fit())


def test_a_nan_loss_on_one_rank_stops_both_with_one_line_and_no_nan_checkpoint(tmp_path):
    """Rank 1 alone sees NaN, on a micro-batch inside no_sync; both ranks must stop at that
    update (not block in the next all-reduce), exit 3 with one line, and keep epoch 1's
    last.pt."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_nan_worker, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 1))
    alive = [p.is_alive() for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    errs = [(tmp_path / f"err{r}.txt").read_text() for r in (0, 1)]
    assert alive == [False, False], errs
    assert [p.exitcode for p in procs] == [3, 3], errs
    lines = []
    for err in errs:
        (line,) = [x for x in err.splitlines() if x.strip()]  # one line, no traceback
        assert "epoch 2" in line, err
        lines.append(line)
    lines = [line.replace(str(tmp_path), "") for line in lines]  # its name holds both words
    assert "nan" in lines[1] and "rank" in lines[0]  # the failing value; the rank that saw it
    (last,) = tmp_path.glob("*/last.pt")
    ck = load_checkpoint(last, resume=True)
    assert ck["state"]["epoch"] == 1 and ck["state"]["num_updates"] == 2
    assert all(torch.isfinite(v).all() for v in ck["model"].values())
