"""Distributed sparse graph transformer: :class:`plexgt.models.gt.GraphTransformer`, rows over p.

Shapes on a rank of a p-rank group (n = ceil(N/p), see :mod:`plexgt.parallel.rows1d`):
x [n, F] -> logits [n, C], rows = this rank's block in Q order. Every dense layer (input
projection, Q/K/V/O projections, LayerNorm, FFN, classifier) is row-local on replicated
parameters; only attention communicates, through the strategy of the graph's
:class:`~plexgt.parallel.attention.strategy.AttentionShard`, and a BatchNorm's column
statistics (:func:`row_norm`). After ``backward`` the caller sums parameter gradients over
the group (:func:`~plexgt.parallel.rows1d.all_reduce_gradients`), one ledger-counted
all-reduce.

The class *is* the reference model (same modules, same names, same initialisation for the same
seed), only ``forward`` differs, so ``load_state_dict`` moves weights either way.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from plexgt.models.gt import GraphTransformer, GTBlock
from plexgt.models.layers import NO_DROP, AttentionParams, Drop, Features, NormFn, apply_norm
from plexgt.parallel.attention.strategy import AttentionShard
from plexgt.parallel.attention.super_nodes import super_rows
from plexgt.parallel.norms import batch_norm_rows
from plexgt.parallel.rows1d import DistGraph

Tensor = torch.Tensor


def dist_attention(params: AttentionParams, x: Tensor, shard: AttentionShard,
                   block_rows: int | None = None, z: Tensor | None = None,
                   update_super: bool = True) -> tuple[Tensor, Tensor | None]:
    """X W_o + softmax(Q Kᵀ/sqrt(d') ⊙ A) V for this rank's rows: x [n, d] -> [n, d], and
    for the super states z [S, d] (replicated) the same over every node -> [S, d] (None
    without super nodes or ``update_super``: the real rows still attend to them). With an
    edge encoder, the bias of the shard's edges [h, E] comes from its ``edge_attr``.

    Q, K, V [n, h, d'] come from local rows; the shard's strategy supplies whatever rows or
    heads the kernel needs. The same function as :func:`plexgt.models.layers.attention_conv`
    (and :meth:`~plexgt.models.layers.AttentionParams.with_super`), whose single-process
    layout tricks (head-major projections, in-place residual) do not apply to gathered or
    exchanged operands; results agree to float rounding.
    """
    if params.heads != shard.heads:
        raise ValueError(f"model has {params.heads} heads, shard was built for {shard.heads}")
    n, d = x.shape[0], params.q.out_features
    q, k, v = (params.split(lin(x)) for lin in (params.q, params.k, params.v))
    bias = params.bias(shard.edge_attr)
    if z is None:
        return params.o(x) + shard.attend(q, k, v, block_rows, None, bias).reshape(n, d), None
    qs, ks, vs = (params.split(lin(z)) for lin in (params.q, params.k, params.v))
    y = shard.attend(q, k, v, block_rows, (ks, vs), bias)
    if not update_super:
        return params.o(x) + y.reshape(n, d), None
    real = shard.real_rows
    ys = super_rows(qs, ks, vs, k[:real], v[:real], shard.comm,
                    1.0 / math.sqrt(d // params.heads))
    return params.o(x) + y.reshape(n, d), params.o(z) + ys.to(z.dtype).reshape(z.shape)


def row_norm(graph: DistGraph) -> NormFn:
    """The norms of a row-partitioned model: LayerNorm (and none) are row-local, the
    reference modules as they are; BatchNorm's column statistics run over every rank's real
    rows (:func:`~plexgt.parallel.norms.batch_norm_rows` over the group; padding rows
    excluded)."""
    shard = graph.attention
    real = shard.real_rows

    def nf(norm: nn.Module, x: Tensor) -> Tensor:
        if not isinstance(norm, nn.BatchNorm1d):
            return norm(x)
        mask = torch.arange(x.shape[0], device=x.device) < real
        return batch_norm_rows(x, norm, mask, shard.n, shard.comm)

    return nf


def dist_gt_block(blk: GTBlock, x: Tensor, graph: DistGraph, block_rows: int | None = None,
                  drop: Drop = NO_DROP, z: Tensor | None = None, update_super: bool = True,
                  nf: NormFn = apply_norm) -> tuple[Tensor, Tensor | None]:
    """One GT block on rows [n, d] (and super states [S, d]): attention (distributed) then
    FFN (row-local, but for a BatchNorm's statistics); dropout at the reference block's
    sites, keyed on the rows' node ids."""
    a, az = dist_attention(blk.attn, blk.attention_input(x, nf), graph.attention, block_rows,
                           None if z is None else blk.attention_input(z, nf), update_super)
    return blk.tail(x, a, drop, nf), None if az is None else blk.tail(z, az, nf=nf)


class DistGraphTransformer(GraphTransformer):
    """GraphTransformer over a 1D node partition (constructor as the reference).

    Dropout masks are keyed on the graph's ``node_ids`` (counter-based, :mod:`plexgt.ops.rng`),
    so with dropout on every layout trains the single-process model's curve.
    """

    def forward(self, x: Features, graph: DistGraph) -> Tensor:  # type: ignore[override]
        return self.run(x, graph, dist_gt_block, row_norm(graph))
