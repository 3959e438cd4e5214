"""Mixed precision helpers: which dtype autocast computes in here, and leaving it for a sum.

Why: half-precision runs (``dtype = "bfloat16"``) compute GEMMs under autocast, but sparse
products must sum in float32 (CPU sparse kernels have no half types, and a high-degree row
summed in bfloat16 loses its small terms), and autocast would cast their float32 operands
back to bfloat16. Device types autocast does not know (the test suite's declared device)
count as autocast off instead of raising.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes GEMMs in on ``device`` now, or None when it is off."""
    if device.type not in AUTOCAST_DEVICES or not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """Autocast off on ``device`` for the block (a no-op when it is off already)."""
    if autocast_dtype(device) is None:
        yield
        return
    with torch.autocast(device.type, enabled=False):
        yield
