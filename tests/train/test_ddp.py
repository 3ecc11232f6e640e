"""DDP on CPU (gloo, 2 processes): gradient accumulation and a coordinated Ctrl-C.

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

from vision_tfm.config import apply_overrides
from vision_tfm.train import ClassificationTask, ClsConfig, Trainer
from vision_tfm.train.checkpoint import load_checkpoint

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
