"""Input sizes that may be symbolic: the one rule for size-dependent steps under a
dynamic-shape ``torch.export`` trace, and the padding every family needs.

Callers that ``torch.fx.symbolic_trace`` must see through register ``pad_to_multiple`` as a
leaf in their own module (``torch.fx.wrap`` patches the calling module's globals only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def symbolic(*sizes: int) -> bool:
    """Whether any size is symbolic (a dynamic-shape ``torch.export`` trace).

    Size-dependent steps then run unconditionally (padding by a possibly zero amount), so no
    Python branch on a traced size is baked into the graph; with concrete sizes they are
    skipped when they would do nothing.
    """
    return any(isinstance(s, torch.SymInt) for s in sizes)


def pad_to_multiple(x: torch.Tensor, multiple: int, channels_last: bool = False) -> torch.Tensor:
    """Zero-pad the bottom/right of an NCHW (or NHWC) batch up to whole ``multiple``s.

    Concrete sizes that already fit return ``x`` itself; symbolic ones always pad (possibly by
    zero). An fx leaf function in every module that calls it (``torch.fx.wrap``), since the
    branch reads the input size, which ``torch.fx.symbolic_trace`` does not know.
    """
    h, w = (x.shape[1], x.shape[2]) if channels_last else (x.shape[-2], x.shape[-1])
    hp = (h + multiple - 1) // multiple * multiple  # ceil; ONNX integer Div truncates
    wp = (w + multiple - 1) // multiple * multiple
    if not symbolic(h, w) and (hp, wp) == (h, w):
        return x
    return F.pad(x, (0, 0, 0, wp - w, 0, hp - h) if channels_last else (0, wp - w, 0, hp - h))
