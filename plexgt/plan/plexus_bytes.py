"""The bytes of a 3D tensor-parallel GCN step, exact: per rank, per axis (and a norm's plane),
operation by operation, from the collectives' own per-rank formulas, so the ledger of a real
run equals :func:`plexus_step_bytes` to the byte (tests check it); checkpointed blocks
(``model.checkpoint``) count their forward's collectives twice, an inference pass its forward's
alone. :mod:`plexgt.plan.plexus_cost` prices them (and re-exports these names).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from plexgt.distributed.collectives import all_gather_bytes, all_reduce_bytes, reduce_scatter_bytes
from plexgt.distributed.grid import Grid3D
from plexgt.distributed.layout3d import LayerLayout, layer_layouts, output_plane, row_blocks
from plexgt.models.gcn import GCNOp, jk_hops
from plexgt.parallel.norms import batch_norm_comm, layer_norm_comm


def hop_bytes(lay: LayerLayout, esize: int, block_rows: int | None,
              forward_only: bool = False) -> list[tuple[str, str, int]]:
    """(axis role, op, bytes sent) of a jumping-knowledge hop (aggregate_first, a constant
    identity weight, no bias): the input's all-gather over c, the identity block's blocked
    all-reduce over a, the reduce-scatter over b, and their adjoints."""
    return layer_bytes(replace(lay, order="aggregate_first"), esize, block_rows, True,
                       weighted=False, forward_only=forward_only)


def layer_bytes(lay: LayerLayout, esize: int, block_rows: int | None, input_grad: bool,
                gathered_input: bool = False, residual: str = "none", pre_act: bool = False,
                weighted: bool = True, forward_only: bool = False
                ) -> list[tuple[str, str, int]]:
    """(axis role, op, bytes sent) of one layer's forward and backward, in issue order
    (``gathered_input``: sparse input features, read already gathered over c; ``residual``:
    the conv's residual path, 'identity' or 'linear', fused into its collectives as
    :class:`~plexgt.parallel.plexus3d.Plexus3DGCN` runs it; ``pre_act``: pre-norm, the
    residual reads the raw input, gathered on its own; ``weighted=False``: aggregate_first
    with a constant weight and no bias, :func:`hop_bytes`; ``forward_only``: the forward's
    alone, what an inference pass sends and a checkpointed block runs again in backward)."""
    ga, gb, gc = lay.g
    a, b, c = lay.roles
    din_b, dout_a = lay.d_in // gb, lay.d_out // ga
    rows_pad, cols_pad = lay.rows_pad, lay.cols_pad  # properties: computed once here
    res = residual != "none"
    learned = residual == "linear"
    nbias = 2 if learned else 1
    gather_in = (c, "all_gather", all_gather_bytes(cols_pad * (din_b // gc) * esize, gc))
    scatter_in = (c, "reduce_scatter", reduce_scatter_bytes(cols_pad * din_b * esize, gc))
    raw = [gather_in] if res and pre_act else []
    raw_grad = [scatter_in] if res and pre_act else []
    if lay.order == "gemm_first":
        blocks = row_blocks(rows_pad, block_rows)
        dout_b, dout_ab = lay.d_out // gb, lay.d_out // (ga * gb)
        w_gather = [(c, "all_gather", all_gather_bytes((din_b // gc) * dout_a * esize, gc)),
                    (a, "all_gather", all_gather_bytes(din_b * dout_a * esize, ga))]
        w_grad = [(a, "reduce_scatter", reduce_scatter_bytes(din_b * lay.d_out * esize, ga)),
                  (c, "reduce_scatter", reduce_scatter_bytes(din_b * dout_a * esize, gc))]
        t_scatter = (b, "reduce_scatter", reduce_scatter_bytes(cols_pad * lay.d_out * esize,
                                                               gb))
        t_gather = (b, "all_gather", all_gather_bytes(cols_pad * dout_b * esize, gb))
        fwd = [
            *([] if gathered_input else [gather_in]),
            *w_gather,
            t_scatter,
            *((raw + (w_gather if learned else []) + [t_scatter]) if res else []),
            *[(a, "reduce_scatter", reduce_scatter_bytes((r1 - r0) * dout_b * esize, ga))
              for r0, r1 in blocks],
        ]
        if forward_only:
            return fwd
        ops = [
            *fwd,
            # backward
            (c, "all_reduce", all_reduce_bytes(nbias * dout_ab * esize, gc)),
            *[(a, "all_gather", all_gather_bytes((r1 - r0) * dout_ab * esize, ga))
              for r0, r1 in blocks],
            t_gather,
            *w_grad,
            *(([t_gather] + (w_grad if learned else []) + raw_grad) if res else []),
        ]
        if input_grad:
            ops.append(scatter_in)
        return ops
    # the residual's rows are aggregated beside Â's: [Â; I] (or diag(Â, I)), 2·rows_pad rows
    blocks = row_blocks(2 * rows_pad if res else rows_pad, block_rows)
    w_gather = (c, "all_gather", all_gather_bytes((din_b // gc) * dout_a * esize, gc))
    w_grad = (c, "reduce_scatter", reduce_scatter_bytes(din_b * dout_a * esize, gc))
    fwd = [
        gather_in,
        *raw,
        *[(a, "all_reduce", all_reduce_bytes((r1 - r0) * din_b * esize, ga)) for r0, r1 in blocks],
        *([w_gather] if weighted else []),
        *([w_gather] if learned else []),
        (b, "reduce_scatter", reduce_scatter_bytes(rows_pad * dout_a * esize, gb)),
    ]
    if forward_only:
        return fwd
    ops = [
        *fwd,
        # backward
        (b, "all_gather", all_gather_bytes(rows_pad * (dout_a // gb) * esize, gb)),
        *([(c, "all_reduce", all_reduce_bytes(nbias * (dout_a // gb) * esize, gc)), w_grad]
          if weighted else []),
        *([w_grad] if learned else []),
    ]
    if input_grad:
        ops += [(a, "all_reduce", all_reduce_bytes((r1 - r0) * din_b * esize, ga))
                for r0, r1 in blocks]
        ops.append(scatter_in)
        ops += raw_grad
    return ops


def norm_bytes(lay: LayerLayout, norm: str, esize: int, stack: int = 1,
               forward_only: bool = False, training: bool = True
               ) -> list[tuple[str, str, int]]:
    """(group, op, bytes sent) of a norm of ``lay``'s output in a training step: LayerNorm's
    row statistics over the plane (a, b), BatchNorm's column statistics over c
    (:mod:`plexgt.parallel.norms`), and the backward's sum of the parameters' gradients over
    their copies (c); ``stack``: the norm of ``stack`` such outputs side by side (jumping
    knowledge 'cat'; ``forward_only``: the statistics' all-reduces alone, a checkpointed
    block's recompute; ``training=False`` too: an inference pass's, where BatchNorm reads its
    running statistics and sends nothing)."""
    if norm == "none":
        return []
    ga, gb, gc = lay.g
    w = stack * lay.d_out // (ga * gb)
    c = lay.roles[2]
    if norm == "layer":
        group, ops = output_plane(lay.roles), layer_norm_comm(lay.rows_pad, esize, ga * gb)
    else:
        group, ops = c, batch_norm_comm(w, esize, gc, training=training)
    out = [(group, o.op, o.sent) for o in ops if o.phase == "forward" or not forward_only]
    return out if forward_only else out + [(c, "all_reduce", all_reduce_bytes(2 * w * esize,
                                                                              gc))]


def chain_bytes(lays: list[LayerLayout], esize: int, block_rows: int | None,
                input_grad: bool, sparse_input: bool, ops: list[GCNOp] | None = None,
                norm: str = "none", checkpoint: bool = False, forward_only: bool = False
                ) -> list[tuple[str, str, int]]:
    """(group, op, bytes sent) of every layer of a chain (``ops``: each layer's residual and
    norms, :func:`plexgt.models.gcn.gcn_ops`; None: plain GCN layers). ``checkpoint``:
    every op is a checkpointed block (``model.checkpoint = 'block'``), whose forward
    collectives, its norms' statistics included, run once more in backward.
    ``forward_only``: an inference pass's (evaluation-mode norms; no backward, so
    ``checkpoint`` adds nothing)."""
    out: list[tuple[str, str, int]] = []
    hops = {} if ops is None else jk_hops(ops)
    for path in hops.values():
        for m in path:
            out += hop_bytes(lays[m], esize, block_rows, forward_only)
    # each op's passes (forward_only of each): inference's forward alone; a training step,
    # and a checkpointed op's forward once more
    passes = (True,) if forward_only else (False, True) if checkpoint else (False,)
    train = not forward_only
    for k, lay in enumerate(lays):
        op = None if ops is None else ops[k]
        for fwd in passes:
            out += layer_bytes(lay, esize, block_rows, k > 0 or input_grad,
                               sparse_input and k == 0,
                               "none" if op is None else op.residual,
                               op is not None and op.pre_act, forward_only=fwd)
            if op is not None and op.pre_norm is not None:
                out += norm_bytes(lays[k - 1], norm, esize, lay.d_in // lays[k - 1].d_out,
                                  fwd, train)
            if op is not None and op.post_norm is not None:
                out += norm_bytes(lay, norm, esize, forward_only=fwd, training=train)
    return out


def loss_bytes(last: LayerLayout, esize: int, multilabel: bool = False
               ) -> list[tuple[str, str, int]]:
    """Parallel cross-entropy: row max and (exp-sum, target) over the class plane, totals over
    c. Multi-label binary cross-entropy is elementwise: (sum, count) over the plane, then c."""
    ga, gb, gc = last.g
    plane = output_plane(last.roles)
    if multilabel:
        return [(plane, "all_reduce", all_reduce_bytes(2 * esize, ga * gb)),
                (last.roles[2], "all_reduce", all_reduce_bytes(2 * esize, gc))]
    return [
        (plane, "all_reduce", all_reduce_bytes(last.rows_pad * esize, ga * gb)),
        (plane, "all_reduce", all_reduce_bytes(last.rows_pad * 2 * esize, ga * gb)),
        (last.roles[2], "all_reduce", all_reduce_bytes(2 * esize, gc)),
    ]


def plexus_step_bytes(grid: Grid3D, rank: int, n: int, dims: list[int], esize: int,
                      block_rows: int | None = None, order: str = "aggregate_first",
                      input_grad: bool = False, multilabel: bool = False,
                      sparse_input: bool = False, ops: list[GCNOp] | None = None,
                      norm: str = "none", checkpoint: bool = False) -> dict[str, int]:
    """Bytes ``rank`` sends per axis (and plane) in one forward + loss + backward
    (``input_grad``: the input is trained, a node embedding, so layer 0's input gradient is
    communicated too; ``multilabel``: the binary cross-entropy's loss; ``sparse_input``:
    CSR-stored features, layer 0 gemm_first on its input read already gathered; ``ops``
    and ``norm``: a GCN with :class:`~plexgt.models.gcn.GCNArch` options, ``dims`` then its
    :func:`~plexgt.models.gcn.op_widths`; ``checkpoint``: blocks recomputed,
    :func:`chain_bytes`)."""
    out: dict[str, int] = defaultdict(int)
    lays = chain_layouts(grid, rank, n, dims, order, sparse_input, ops)
    for axis, _, nbytes in chain_bytes(lays, esize, block_rows, input_grad, sparse_input,
                                       ops, norm, checkpoint):
        out[axis] += nbytes
    for axis, _, nbytes in loss_bytes(lays[-1], esize, multilabel):
        out[axis] += nbytes
    return {k: v for k, v in out.items() if v}


def chain_layouts(grid: Grid3D, rank: int, n: int, dims: list[int], order: str,
                  sparse_input: bool = False, ops: list[GCNOp] | None = None
                  ) -> list[LayerLayout]:
    """The layouts of a chain of ``dims`` (``ops``: their kinds; sparse input: layer 0
    gemm_first), as the gcn task builds them."""
    lays = layer_layouts(grid, rank, n, dims, order,
                         first_order="gemm_first" if sparse_input else None,
                         kinds=None if ops is None else [op.kind for op in ops])
    if ops is not None and len(ops) > 1 and ops[-1].d_in != ops[-2].d_out:
        # jumping knowledge 'cat': the classifier reads the L layers' blocks side by side,
        # each padded as the last GCN layer's output
        stack = ops[-1].d_in // ops[-2].d_out
        lays[-1] = replace(lays[-1], d_in=stack * lays[-2].d_out, d_in_true=ops[-1].d_in)
    return lays


def row1d_step_bytes(p: int, n: int, dims: list[int], esize: int) -> int:
    """Bytes per rank of the 1D baseline: rows over p ranks, H all-gathered every layer.

    Forward all-gathers H [N/p, d] per layer; backward reduce-scatters dH (not for layer 0);
    the replicated weight and bias gradients are all-reduced; the loss sums two scalars.
    """
    rows = -(-n // p)
    total = 0
    for l in range(len(dims) - 1):
        total += all_gather_bytes(rows * dims[l] * esize, p)
        if l > 0:
            total += reduce_scatter_bytes(rows * p * dims[l] * esize, p)
        total += all_reduce_bytes(dims[l] * dims[l + 1] * esize, p)
        total += all_reduce_bytes(dims[l + 1] * esize, p)
    return total + all_reduce_bytes(2 * esize, p)  # the loss total
