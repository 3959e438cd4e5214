"""Which program walks which edges: the fused kernels' segments of a CSR pattern.

Rows (of the pattern, or of its transpose for the column backward) of degree at most ``split``
are *light*: one segment each, listed in order of falling degree, so a program's BLOCK_R rows
have about the same degree (a program loops to the largest degree among its rows: one hub
among 63 rows of degree 3 made 63 lanes idle for its whole walk). Longer rows — hubs, and
super nodes, whose column every row names — are *long*: cut into segments of ``split`` edges,
which separate programs walk in parallel into partial buffers that the merge kernels fold in
a fixed order (exact and deterministic: no float atomics).

Built on the device from the pattern with fixed-size tensor ops only — no host sync, so a
training step that meets a new pattern still never waits on the GPU. The launch sizes are
host bounds instead of counts: at most E / (split + 1) rows are long and they have at most
2E / split segments; unused slots hold row -1 and their programs do nothing. Cached per pattern
(and split) while the pattern lives, with the partial buffer the split launches write
(:meth:`Schedule.partials`: allocated once, not on every attention call; ~40 MB at E = 20M,
h·d' = 128).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from plexgt.ops.csr import CSRGraph

Tensor = torch.Tensor


@dataclass(frozen=True)
class Schedule:
    """Segments of one [n, m] pattern at one split length; index arrays in the pattern's
    compact index dtype (int32 where E fits).

    ``light_row, light_start, light_end`` [n]: every row by falling degree (-1 for a long
    row, which the light launch skips). ``long_row`` [L] the long rows (-1 past the last),
    ``long_ptr`` [L + 1] where each one's segments start. ``seg_row, seg_start, seg_end`` [W]:
    the long rows' segments (-1 for unused slots)."""

    split: int
    light_row: Tensor
    light_start: Tensor
    light_end: Tensor
    long_row: Tensor
    long_ptr: Tensor
    seg_row: Tensor
    seg_start: Tensor
    seg_end: Tensor
    work: dict = field(default_factory=dict, repr=False, compare=False)
    """The partial buffers by dtype (:meth:`partials`)."""

    def partials(self, elems: int, dtype: torch.dtype) -> Tensor:
        """A flat buffer of ``elems`` for the split launches' partials (W·h·(d' + 2) in
        forward, W·h·d' per gradient in backward), kept with the schedule and grown only
        when a wider h·d' asks for more: one allocation per pattern, not one per call. The
        launches that use it run in stream order and finish with it before they return."""
        buf = self.work.get(dtype)
        if buf is None or buf.numel() < elems:
            buf = torch.empty(elems, dtype=dtype, device=self.seg_row.device)
            self.work[dtype] = buf
        return buf[:elems]


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bounds(num_rows: int, num_edges: int, split: int) -> tuple[int, int]:
    """(L, W): at most L rows have more than ``split`` edges (each has split + 1 or more of
    the E), and they cut into at most W segments (ceil(d / split) <= d / split + 1 each)."""
    long_rows = min(num_rows, num_edges // (split + 1))
    return (long_rows, long_rows + num_edges // split) if long_rows else (0, 0)


def schedule(graph: CSRGraph, split: int) -> Schedule:
    """The :class:`Schedule` of ``graph`` at ``split`` edges per segment (cached)."""
    per_graph = _CACHE.setdefault(graph, {})
    if split not in per_graph:
        per_graph[split] = _build(graph, split)
    return per_graph[split]


def _build(graph: CSRGraph, split: int) -> Schedule:
    indptr, _ = graph.compact_index()
    itype, dev = indptr.dtype, indptr.device
    ip = graph.indptr
    deg = ip[1:] - ip[:-1]
    order = torch.sort(deg, descending=True, stable=True).indices
    sdeg = deg[order]
    light_row = torch.where(sdeg > split, -1, order)
    n_long, n_seg = bounds(graph.num_rows, graph.num_edges, split)
    long_idx = order[:n_long]
    long_deg = sdeg[:n_long]
    is_long = long_deg > split
    long_row = torch.where(is_long, long_idx, -1)
    count = torch.where(is_long, (long_deg + split - 1) // split, 0)
    long_ptr = torch.zeros(n_long + 1, dtype=torch.int64, device=dev)
    torch.cumsum(count, 0, out=long_ptr[1:])
    slot = torch.arange(n_seg, dtype=torch.int64, device=dev)
    owner = torch.searchsorted(long_ptr[1:], slot, right=True).clamp_(max=max(n_long - 1, 0))
    used = slot < long_ptr[-1]
    row = long_idx[owner]
    first = ip[row] + (slot - long_ptr[owner]) * split
    seg_row = torch.where(used, row, -1)
    seg_start = torch.where(used, first, 0)
    seg_end = torch.where(used, torch.minimum(first + split, ip[row + 1]), 0)

    def c(t: Tensor) -> Tensor:
        return t.to(itype).contiguous()

    return Schedule(split, c(light_row), c(ip[order]), c(ip[order + 1]), c(long_row),
                    c(long_ptr), c(seg_row), c(seg_start), c(seg_end))
