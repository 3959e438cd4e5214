"""The storages a piece of torch code creates and keeps alive, op by op: what a memory model
of a training step is checked against (the planner's peak is the step's live tensors at its
peak moment, not the process's resident set, which the allocator's caching blurs)."""

from __future__ import annotations

import gc
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensors(TorchDispatchMode):
    """Bytes of the strided storages created inside the mode and still alive; their peak.

    A storage any tensor held when the mode was entered (parameters, optimizer state, the
    task's inputs) is not counted when an op returns a view of it or writes into it; one that
    an op's kernel made out of sight (gloo's copy of a reduce-scatter's input) is, when a
    view of it comes out. ``snapshot=True`` also keeps, at the peak moment, each live
    storage's bytes, the op that first returned it and its shape (``at_peak``): which
    tensors a model must count there."""

    def __init__(self, snapshot: bool = False) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0
        self.snapshot = snapshot
        self.origin: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.at_peak: list[tuple[int, str, tuple[int, ...]]] = []
        self.existing: set[int] = set()

    def __enter__(self) -> LiveTensors:
        with warnings.catch_warnings():  # isinstance on torch's deprecated module objects
            warnings.simplefilter("ignore")
            held = {o.untyped_storage() for o in gc.get_objects()
                    if isinstance(o, torch.Tensor) and o.layout == torch.strided}
        # one freed during the step gives its address back: a storage made there later is new
        for st in held:
            self.existing.add(st.data_ptr())
            weakref.finalize(st, self.existing.discard, st.data_ptr())
        return super().__enter__()

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
        self.origin.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                st = t.untyped_storage()
                key = st.data_ptr()
                if st.nbytes() and key not in self.live and key not in self.existing:
                    self.live[key] = st.nbytes()
                    self.now += st.nbytes()
                    if self.snapshot:
                        self.origin[key] = (str(func), tuple(t.shape))
                    weakref.finalize(st, self._freed, key)
        if self.now > self.peak:
            self.peak = self.now
            if self.snapshot:
                self.at_peak = sorted(((self.live[k], *self.origin[k]) for k in self.live),
                                      reverse=True)
        return out
