"""DataLoader lifetime: what a run must release before the interpreter exits."""

from __future__ import annotations

from torch.utils.data import DataLoader


def close_loader(loader: DataLoader | None) -> None:
    """Shut down a loader's persistent workers now. Our workers ignore SIGTERM
    (``train.sampling``), and at interpreter exit torch leaves its workers to
    ``multiprocessing``, which ends them with SIGTERM and waits: a loader still alive then
    would hang the finished run forever."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None
