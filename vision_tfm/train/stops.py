"""How a run stops early: a stop signal after the update in flight, or a non-finite loss."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

from ..errors import VisionTfmError

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name)
)
"""Ctrl-C, and what job schedulers and containers send before they kill a process:
``timeout``, SLURM (``--signal``), Kubernetes and ``docker stop`` send SIGTERM; SIGUSR1 is
the usual choice for a warning ahead of a time limit. Windows has SIGINT only."""


class NonFiniteLossError(VisionTfmError, RuntimeError):
    """The loss became NaN or inf; the last good checkpoint is kept."""


def non_finite(what: str, last_pt: Path | None) -> NonFiniteLossError:
    """The one-line stop; ``last_pt`` is rank 0's checkpoint (None on the other ranks)."""
    if last_pt is None:
        kept = "rank 0 keeps the last good checkpoint"
    elif last_pt.exists():
        kept = f"last good checkpoint kept: {last_pt}"
    else:
        kept = "no checkpoint yet"
    return NonFiniteLossError(f"{what}; stopping ({kept})")


class Interrupted(VisionTfmError):  # noqa: N818  (a requested stop, not a failure)
    """A stop signal stopped the run after it wrote a resumable checkpoint; launchers exit
    with 128 + the signal's number, as a shell reports a process the signal ended (130 for
    Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = int(signum)


class StopSignals:
    """While entered, the first stop signal (:data:`STOP_SIGNALS`) only records itself in
    :attr:`received` (the loop finishes the update it is in, says so with :func:`stop_notice`
    and writes a checkpoint); a second one raises ``KeyboardInterrupt``.

    The handler prints nothing: it runs wherever the main thread happens to be, which may be
    inside a ``redirect_stdout`` (torchmetrics' COCO evaluation swallows its own prints that
    way) or inside a write to the same stream, where a print would be lost or fail."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._prev: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second signal: give up at once
            raise KeyboardInterrupt
        self.received = signal.Signals(signum)

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:  # on every rank
            self._prev[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, prev in self._prev.items():
            if prev is not None:
                signal.signal(sig, prev)
        self._prev.clear()


def stop_notice(sig: signal.Signals) -> str:
    """What the run says once every rank has agreed to stop on ``sig``."""
    return f"\n{sig.name}: finishing this update, then writing a resumable checkpoint"
