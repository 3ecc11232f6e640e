"""What the trainer writes into a checkpoint and reads back from one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..config import config_to_dict
from ..distributed import is_main
from ..errors import CheckpointError
from ..io import atomic_save
from ..models.convert import check_finite
from ..models.hf import folder_unsupported, write_folder
from ..version import __version__
from .resume import LoopState, restore_schedule
from .stops import NonFiniteLossError, non_finite


class Checkpoints:
    """The trainer's checkpoint side: ``last.pt`` / ``best.pt`` hold the weights, EMA,
    optimiser, schedule, scaler, loop position, history, config and meta; nothing else is
    needed to continue bit for bit (every random draw derives from the seed and position).
    Beside ``best.pt``, ``config.json`` + ``model.safetensors`` hold its shipped weights in
    the Hugging Face / timm folder format."""

    run_dir: Path
    state: LoopState
    _said_no_folder: bool = False  # the run was told why best.pt has no model folder

    @staticmethod
    def say(msg: str) -> None:
        """Print on rank 0, the one process that logs."""
        if is_main():
            print(msg, flush=True)

    def _restore(self, ck: dict[str, Any], eval_only: bool) -> None:
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        n = ck["state"]["num_updates"]  # evaluating another folder resizes the epoch: quietly
        restore_schedule(self.scheduler, ck["scheduler"], n, None if eval_only else self.say)
        if self.ema is not None and ck.get("ema") is not None:
            self.ema.load_state_dict(ck["ema"])
        self.scaler.load_state_dict(ck["scaler"])
        self.state = LoopState.restored(ck["state"])
        self.history = list(ck.get("history", []))

    def _checkpoint(self) -> dict[str, Any]:
        parts = ("model", "optimizer", "scheduler", "scaler")
        return {
            **{k: getattr(self, k).state_dict() for k in parts},
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "state": dataclasses.asdict(self.state),
            "config": config_to_dict(self.cfg),
            "meta": self.meta,
            "history": self.history,
            "version": __version__,
        }

    def _save(self, best: bool) -> None:
        # a finite loss does not prove finite weights (a huge step, a bad lr). Every rank
        # checks its own copy: DDP keeps them equal, so all ranks stop here together.
        try:
            check_finite(self.model.state_dict(), "the trained weights")
        except CheckpointError as e:
            raise self._non_finite(f"{e} after epoch {self.state.epoch}") from None
        if not is_main():
            return
        ck = self._checkpoint()
        atomic_save(ck, self.run_dir / "last.pt")
        if best:
            atomic_save(ck, self.run_dir / "best.pt")
            # the shipped weights again, as a model folder: deployment never unpickles, and
            # the run dir loads as create_model("local-dir:RUN_DIR", pretrained=True)
            self._write_folder(self.shipped_model)

    def _write_folder(self, model: Any) -> None:
        why = folder_unsupported(model)
        if why is None:
            hub = self.task.hub_cfg(self.meta, model.in_chans)
            write_folder(model, self.run_dir, pretrained_cfg=hub, overwrite=True)
        elif not self._said_no_folder:  # once a run, not once an epoch
            self._said_no_folder = True
            self.say(f"no model folder beside best.pt: {why}; best.pt holds the weights")

    def _non_finite(self, what: str) -> NonFiniteLossError:
        return non_finite(what, self.run_dir / "last.pt" if is_main() else None)
