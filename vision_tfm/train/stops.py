"""How a run stops early: Ctrl-C after the update in flight, or a non-finite loss."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ..errors import VisionTfmError


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
    """Ctrl-C stopped the run after it wrote a resumable checkpoint; launchers exit 130."""


class CtrlC:
    """While entered, the first Ctrl-C only sets :attr:`requested` (the loop finishes the
    update it is in and writes a checkpoint); a second one raises ``KeyboardInterrupt``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.requested = False
        self._prev: object = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested = True
        self.say("\ninterrupt: finishing this update, then writing a resumable checkpoint")

    def __enter__(self) -> CtrlC:
        self._prev = signal.signal(signal.SIGINT, self._handle)  # on every rank
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
