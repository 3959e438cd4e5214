"""Inference on a distributed model: which rows and columns of a layer's output a rank holds,
a layer's output captured during the forward, and the exchange that puts every node's row on
the rank that writes it.

Where a rank's outputs live (n_pad = ceil(N/p)):

==================  ================================  ========================================
model               logits / a layer's output         rows, columns
==================  ================================  ========================================
3D GCN (Plexus)     [ceil(N/Gc), d/(Ga·Gb)]           block ic of the layer's output order (P
                                                      for even layers, Q for odd), columns
                                                      block ia·Gb+ib of the layer's width
gt, gps (rows)      [n_pad, d]                        block i of p in Q order, every column
==================  ================================  ========================================

:func:`to_id_blocks` moves such shards, in one all-to-all, into blocks of the *original*
node order: rank r ends with nodes [r·n_pad, (r+1)·n_pad) of the raw input, every column,
so each rank writes a contiguous slab of the output file and no rank holds more than its
share (the row sets of the shards partition the nodes; a 3D layer's column blocks partition
the columns, so every entry arrives exactly once).

Layer names are the single-process model's: ``layers.0`` … ``layers.{L-1}`` for gcn (the
output of layer i after its activation: what the next layer reads; the last is the logits),
``input`` (the input projection), ``blocks.0`` … ``blocks.{L-1}`` (each block's output) and
``classifier`` (the logits) for gt and gps; ``hidden`` names the input of the last layer in
either. Captured by wrapping, on the instance and for the one forward, the per-layer call the
model already makes (``Plexus3DGCN.layer``, ``BlockStack.run``'s block), so the models carry
no inference code and train exactly as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from plexgt.data.loader import PreparedGraph, read_node_ids
from plexgt.distributed.grid import block_bounds
from plexgt.models.layers import BlockStack
from plexgt.parallel.node_embedding import WithNodeEmbedding
from plexgt.parallel.plexus3d import Plexus3DGCN
from plexgt.parallel.rows1d import RowParallel

Tensor = torch.Tensor
HIDDEN = "hidden"
"""The alias of the last layer's input, whatever the model."""


def unwrap(model: nn.Module) -> nn.Module:
    """The distributed model under a node-embedding wrapper: a Plexus3DGCN or RowParallel."""
    inner = model.inner if isinstance(model, WithNodeEmbedding) else model
    if not isinstance(inner, Plexus3DGCN | RowParallel) or (
            isinstance(inner, RowParallel) and not isinstance(inner.model, BlockStack)):
        what = type(inner.model if isinstance(inner, RowParallel) else inner).__name__
        raise ValueError(f"plexgt does not know where a {what}'s outputs live")
    return inner


def layer_names(model: nn.Module) -> list[str]:
    """The names ``--embeddings`` accepts for ``model`` (module docstring), 'hidden' last."""
    inner = unwrap(model)
    if isinstance(inner, Plexus3DGCN):
        names = [f"layers.{l}" for l in range(len(inner.layouts))]
        return names + ([HIDDEN] if len(names) > 1 else [])
    blocks = len(inner.model.blocks)
    return ["input", *(f"blocks.{i}" for i in range(blocks)), "classifier", HIDDEN]


def resolve_layer(model: nn.Module, name: str) -> str:
    """``name`` as a layer of ``model`` ('hidden' resolved); ValueError listing the names."""
    names = layer_names(model)
    if name not in names:
        raise ValueError(f"the model has no such layer; its layers: {', '.join(names)}")
    if name != HIDDEN:
        return name
    inner = unwrap(model)
    if isinstance(inner, Plexus3DGCN):
        return f"layers.{len(inner.layouts) - 2}"
    return f"blocks.{len(inner.model.blocks) - 1}"


@dataclass
class Captured:
    """The tensor a :func:`capture` recorded (None until the forward reaches the layer)."""

    value: Tensor | None = None


@contextlib.contextmanager
def capture(model: nn.Module, layer: str | None) -> Iterator[Captured]:
    """Record the output of ``layer`` (a resolved name, or None: nothing) in the forwards run
    inside the context; the model's own methods are back in place when it ends."""
    got = Captured()
    if layer is None:
        yield got
        return
    inner = unwrap(model)
    if isinstance(inner, Plexus3DGCN):
        want = int(layer.split(".")[1])
        last = len(inner.layouts) - 1
        plain = inner.layer

        def tapped_layer(h: Any, l: int, res: Tensor | None = None) -> Tensor:
            # the next layer's input: layer ``want`` after its activation (and, with the
            # model options, after the next op's pre-norm)
            if l == want + 1:
                got.value = h
            y = plain(h, l, res)
            if l == want == last:
                got.value = y
            return y

        inner.layer = tapped_layer  # type: ignore[method-assign]
        owner, attr = inner, "layer"
    else:
        stack = inner.model
        plain_run = stack.run

        def tapped_run(x: Any, graph: Any, block: Any, *norm: Any) -> Tensor:
            seen = [0]

            def tapped(blk: nn.Module, h: Tensor, *rest: Any) -> Any:
                i = seen[0]
                if i == 0 and layer == "input":
                    got.value = h
                out = block(blk, h, *rest)
                if layer == f"blocks.{i}":
                    got.value = out[0]
                seen[0] += 1
                return out

            y = plain_run(x, graph, tapped, *norm)  # the row-split norms, if given
            if layer == "classifier":
                got.value = y
            return y

        stack.run = tapped_run  # type: ignore[method-assign]
        owner, attr = stack, "run"
    try:
        yield got
    finally:
        delattr(owner, attr)  # the class's method again


@dataclass
class ShardIndex:
    """Where this rank's shard of a layer's output sits in the [N, width] whole."""

    ids: Tensor
    """[rows] int64 original node id of each local row (>= N: padding)."""
    cols: Tensor
    """[cols] int64 column of each local column (-1: padding)."""
    width: int
    """Columns of the whole."""


def shard_index(model: nn.Module, pg: PreparedGraph, layer: str | None,
                device: torch.device) -> ShardIndex:
    """The :class:`ShardIndex` of ``layer``'s output (None: the logits) on this rank."""
    inner = unwrap(model)
    if isinstance(inner, Plexus3DGCN):
        l = len(inner.layouts) - 1 if layer is None else int(layer.split(".")[1])
        lay = inner.layouts[l]
        ids = read_node_ids(pg, lay.out_order, lay.rows, lay.rows_pad)
        c0, c1 = lay.out_cols
        cols = torch.arange(c0, c1, dtype=torch.int64)
        cols[cols >= lay.d_out_true] = -1
        return ShardIndex(torch.from_numpy(ids).to(device), cols.to(device), lay.d_out_true)
    stack = inner.model
    ids = inner.graph.node_ids
    if ids is None:
        raise ValueError("a row-parallel model's graph has no node ids")
    width = (stack.classifier.out_features if layer in (None, "classifier")
             else stack.classifier.in_features)
    return ShardIndex(ids.to(device), torch.arange(width, dtype=torch.int64, device=device),
                      width)


def to_id_blocks(values: Tensor, index: ShardIndex, n: int) -> Tensor:
    """This rank's shard ``values`` [rows, cols] (placed by ``index``) -> rows
    [lo, hi) = block rank of P of the original node order, [hi - lo, width], from every
    rank's shard (collective over the world group: one all-to-all of the entries, one of the
    counts, one all-gather of the column lists). A rank none of whose columns is real sends
    nothing."""
    p = dist.get_world_size() if dist.is_initialized() else 1
    me = dist.get_rank() if dist.is_initialized() else 0
    lo, hi = block_bounds(n, p, me)
    size = max(1, -(-n // p))
    real = index.cols >= 0
    keep = (index.ids < n) & (index.ids >= 0)
    if not bool(real.any()):
        keep = torch.zeros_like(keep)
    ids = index.ids[keep]
    vals = values[keep]
    dest = ids // size
    order = torch.argsort(dest, stable=True)
    ids, vals, dest = ids[order], vals[order], dest[order]
    out = torch.zeros(hi - lo, index.width, dtype=values.dtype, device=values.device)
    if p == 1:
        _place(out, ids - lo, index.cols, vals)
        return out
    sent = torch.bincount(dest, minlength=p).to(torch.int64)
    recv = torch.empty_like(sent)
    dist.all_to_all_single(recv, sent)
    widths: list[Any] = [None] * p
    dist.all_gather_object(widths, index.cols.cpu().tolist())
    w = max(len(c) for c in widths)
    if vals.shape[1] < w:  # equal trailing shapes for the exchange: zero columns, placed nowhere
        vals = torch.cat([vals, vals.new_zeros(vals.shape[0], w - vals.shape[1])], dim=1)
    s_list, r_list = sent.cpu().tolist(), recv.cpu().tolist()
    got_ids = ids.new_empty(sum(r_list))
    dist.all_to_all_single(got_ids, ids.contiguous(), r_list, s_list)
    got = vals.new_empty(sum(r_list), w)
    dist.all_to_all_single(got, vals.contiguous(), r_list, s_list)
    off = 0
    for src, k in enumerate(r_list):
        cols = torch.as_tensor(widths[src] + [-1] * (w - len(widths[src])), dtype=torch.int64,
                               device=values.device)
        _place(out, got_ids[off:off + k] - lo, cols, got[off:off + k])
        off += k
    return out


def _place(out: Tensor, rows: Tensor, cols: Tensor, vals: Tensor) -> None:
    """out[rows, cols] = vals for the real (>= 0) columns."""
    real = cols >= 0
    if rows.numel() and bool(real.any()):
        out[rows[:, None], cols[real][None, :]] = vals[:, real]


def drop_backward(model: nn.Module) -> None:
    """Free what only a backward pass reads: the transposed Â blocks of the 3D GCN (and of
    gps's 3D GCN path), as large as the blocks themselves. An inference-only model; training
    it afterwards would fail in backward."""
    try:
        inner = unwrap(model)
    except ValueError:
        return  # a model this module does not know: it keeps what it has
    blocked = list(inner.adj) if isinstance(inner, Plexus3DGCN) else []
    if isinstance(inner, RowParallel) and inner.graph.gcn3d is not None:
        blocked.append(inner.graph.gcn3d.adj)
    for a in blocked:
        a.bwd = []


def split_codes(masks: dict[str, np.ndarray]) -> np.ndarray:
    """[rows] int8 split code (0 none, 1 train, 2 valid, 3 test) from the split masks."""
    n = len(next(iter(masks.values())))
    out = np.zeros(n, dtype=np.int8)
    for code, split in enumerate(("train", "valid", "test"), start=1):
        out[np.asarray(masks[split], dtype=bool)] = code
    return out


def split_shard(model: nn.Module, pg: PreparedGraph, index: ShardIndex) -> Tensor:
    """[rows, 1] split codes of the logits shard's rows (read in their order); zeros where
    the rank holds no column 0, so each node's code is sent once."""
    inner = unwrap(model)
    ids = index.ids
    if isinstance(inner, Plexus3DGCN):
        lay = inner.layouts[-1]
        rows, order = lay.rows, lay.out_order
    else:
        rows, order = block_bounds(pg.N, inner.comm.size, inner.comm.rank), "Q"
    codes = np.zeros(len(ids), dtype=np.int8)
    codes[: rows[1] - rows[0]] = split_codes(pg.read_masks(rows, order))
    return torch.from_numpy(codes).to(ids.device)[:, None]
