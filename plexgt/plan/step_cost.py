"""What one training step of a distributed gt / gps model communicates and holds, per rank.

The attention terms are each strategy's own exact functions (Table 1 of Lin, Madduri &
Kandemir, in :mod:`plexgt.parallel.attention`, beside each forward); this module adds the parts
outside attention: the GCN path of GPS (1D layout, or 3D on a grid with its redistribution,
whose bytes sit beside their forwards in :mod:`plexgt.parallel`), the loss statistics and the
gradient all-reduce of the replicated parameters. Everything is exact, so a run's
:class:`~plexgt.distributed.collectives.CommLedger` equals :func:`step_bytes_named` to the byte
on every rank; AGP (:mod:`plexgt.plan.agp`) prices these operations and checks the memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from plexgt.distributed.collectives import CommOp, all_reduce_bytes
from plexgt.distributed.grid import Grid3D
from plexgt.distributed.layout3d import layer_layouts
from plexgt.parallel.attention.strategy import AttentionProblem, AttentionStrategy, graph_bytes
from plexgt.parallel.attention.super_nodes import super_comm
from plexgt.parallel.gps_dist import gcn1d_comm
from plexgt.parallel.norms import batch_norm_comm
from plexgt.parallel.redistribute import gcn3d_comm


# -- whole models -----------------------------------------------------------------------------
def step_comm_named(strategy: AttentionStrategy, problem: AttentionProblem, rank: int,
                    p: int, layers: int, num_params: int, gcn: bool = False,
                    gcn_grid: Grid3D | None = None, block_rows: int | None = None,
                    batch_norms: Sequence[int] = (),
                    recompute_norms: Sequence[int] | None = None
                    ) -> list[tuple[str, CommOp]]:
    """Every collective of one training step on ``rank``, with the name of the group it runs
    over (the ledger's view): 'rows' (all p ranks) or a grid axis 'x', 'y', 'z'.

    Per layer the attention block's collectives (over 'rows', or a strategy's own sub-groups:
    gp_2d's 'heads' and 'ring'; with super nodes, every block but the last merges the super
    rows, :func:`~plexgt.parallel.attention.super_nodes.super_comm`) and, for gps
    (gcn=True), the GCN path's: the 1D layout's (:func:`gcn1d_comm`) or, given ``gcn_grid``
    (p ranks; ``block_rows``: the blocked aggregation's rows), the 3D path's with its
    redistribution all-to-alls (:func:`~plexgt.parallel.redistribute.gcn3d_comm`); then the
    loss statistics (sum, count: 2 elements) and one all-reduce of every parameter gradient,
    over 'rows'; each BatchNorm of width w in ``batch_norms`` all-reduces its column
    statistics over 'rows' (:func:`~plexgt.parallel.norms.batch_norm_comm`).

    ``recompute_norms`` (not None: the blocks are checkpointed, ``model.checkpoint``):
    backward runs every block's forward again, so each block's forward collectives (phase
    'forward': attention, super-row merges, the GCN path's) and those of its BatchNorms (the
    widths given) are issued twice, the second time in backward.
    """
    gcn3: list[tuple[str, CommOp]] = []
    if gcn and gcn_grid is not None:
        if gcn_grid.size != p:
            raise ValueError(f"GCN grid {gcn_grid} has {gcn_grid.size} ranks, not {p}")

        gcn3 = gcn3d_comm(gcn_grid, rank, problem.n, problem.d, problem.esize, block_rows)
    ops: list[tuple[str, CommOp]] = []
    for i in range(layers):
        ops += [(o.group or "rows", o) for o in strategy.comm(problem, rank, p)]
        if i < layers - 1:  # the last block's super states feed nothing: not merged
            ops += [("rows", o) for o in super_comm(problem, p)]
        if gcn and gcn_grid is None:
            ops += [("rows", o) for o in gcn1d_comm(problem, p)]
        ops += gcn3
    again: list[tuple[str, CommOp]] = []
    if recompute_norms is not None:
        again = [(n, o) for n, o in ops if o.phase == "forward"]
        again += [("rows", o) for w in recompute_norms
                  for o in batch_norm_comm(w, problem.esize, p) if o.phase == "forward"]
    for w in batch_norms:
        ops += [("rows", o) for o in batch_norm_comm(w, problem.esize, p)]
    ops += [(n, replace(o, phase="backward")) for n, o in again]
    if p > 1:
        b = all_reduce_bytes(2 * problem.esize, p)
        ops.append(("rows", CommOp("all_reduce", b, b)))
        b = all_reduce_bytes(num_params * problem.esize, p)
        ops.append(("rows", CommOp("all_reduce", b, b, "backward")))
    return ops


def step_comm(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
              layers: int, num_params: int, gcn: bool = False,
              gcn_grid: Grid3D | None = None, block_rows: int | None = None,
              batch_norms: Sequence[int] = ()) -> list[CommOp]:
    """Every collective of one training step of a distributed gt (gcn=False) or gps model
    (:func:`step_comm_named` without the group names)."""
    return [o for _, o in step_comm_named(strategy, problem, rank, p, layers, num_params, gcn,
                                          gcn_grid, block_rows, batch_norms)]


def step_bytes(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
               layers: int, num_params: int, gcn: bool = False, kind: str = "sent",
               gcn_grid: Grid3D | None = None, block_rows: int | None = None,
               batch_norms: Sequence[int] = ()) -> dict[str, int]:
    """Bytes ``kind`` ('sent' or 'recv') per operation name in one step (ledger's view):
    :func:`step_bytes_named` summed over the groups, operations of 0 bytes kept."""
    out: dict[str, int] = defaultdict(int)
    for (_, op), b in step_bytes_named(strategy, problem, rank, p, layers, num_params, gcn,
                                       kind, gcn_grid, block_rows, keep_zero=True,
                                       batch_norms=batch_norms).items():
        out[op] += b
    return dict(out)


def step_bytes_named(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
                     layers: int, num_params: int, gcn: bool = False, kind: str = "sent",
                     gcn_grid: Grid3D | None = None, block_rows: int | None = None,
                     keep_zero: bool = False, batch_norms: Sequence[int] = ()
                     ) -> dict[tuple[str, str], int]:
    """Bytes ``kind`` per (group name, operation) in one step: the keys of a
    :class:`~plexgt.distributed.collectives.CommLedger` (entries of 0 bytes left out unless
    ``keep_zero``)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for name, op in step_comm_named(strategy, problem, rank, p, layers, num_params, gcn,
                                    gcn_grid, block_rows, batch_norms):
        out[name, op.op] += op.total_sent if kind == "sent" else op.total_recv
    return {k: v for k, v in out.items() if v or keep_zero}


def dense_activation_elems(n_rows: int, d: int, ffn_mult: int, gcn: bool) -> int:
    """Elements a block keeps for backward outside Table 1's attention terms, ``n_rows`` rows.

    The block input (saved by the Q, K, V, O projections), this rank's head-major Q, the first
    residual sum and its LayerNorm output, the FFN's ReLU output [n, m·d] and the second
    residual sum: (5 + m)·d a row. GPS keeps no norm output but the FFN's input: the block
    input, Q, the two paths' residual sums, their sum, the ReLU output and the FFN's residual
    sum, (6 + m)·d (pre-norm alike: the paths' normalised inputs instead of their residual
    sums). Measured (one training step's live tensors, hidden 64, m = 2): gt 7·d, gps 8·d
    a layer, where 11·d had been counted for gps.
    """
    return n_rows * (5 + ffn_mult + (1 if gcn else 0)) * d


def block_moments(n_rows: int, d: int, ffn_mult: int, gcn: bool, checkpoint: bool
                  ) -> dict[str, int]:
    """Elements [n_rows rows] that the top block adds, at each moment of a training step
    where the peak can fall, to what every block keeps (its input, attention and dense
    activations). Why moments and not a sum: the backward's temporaries of one sublayer exist
    only once the later sublayers' activations are freed.

    - 'forward': the block's last norm running, with the sublayers' outputs its caller still
      holds: the attention output, the FFN output and the block output (gps: also the GCN
      path's output and both paths' norms: 6·d); a checkpointed block's recompute also has
      the incoming gradient (one more d).
    - 'tail': the FFN's backward: the gradient of the ReLU output and the ReLU backward's
      output [n, m·d] each (the residual sum it frees pays for the gradient of the block
      input): 2·m·d.
    - 'attention': the attention's backward (its own temporaries priced apart), after the
      FFN's and norms' activations are freed: of the dense ones the block input and Q stay
      (gps: the GCN path's residual sum too) less the dense activations, plus the output's
      and the input's gradients (2·d).

    Measured (one training step's live tensors, gt and gps, 1-2 ranks, 2 and 6 layers, with
    and without checkpointing): the peak was the 'tail' moment for gt (the 'forward' one when
    checkpointed), the 'forward' one for gps; the model's total within 0.5 % of the counted
    peak for gt on a 20k-node graph, within 5 % in tests/unit/test_attention_peak_memory.py."""
    dense = dense_activation_elems(n_rows, d, ffn_mult, gcn)
    fwd = (6 if gcn else 3) + (1 if checkpoint else 0)
    kept_by_attention = 3 if gcn else 2
    return {"forward": n_rows * fwd * d, "tail": n_rows * 2 * ffn_mult * d,
            "attention": n_rows * (kept_by_attention + 2) * d - dense}


ACC_BYTES = 4
"""Bytes per element of the float32 accumulation dtype of half-precision attention."""


def accumulated_y_bytes(strategy: AttentionStrategy, problem: AttentionProblem, p: int) -> int:
    """Bytes of the float32 output one attention layer keeps for its backward when the
    activations are in a half type (``problem.esize`` < 4): the fused kernel's y
    (:mod:`plexgt.ops.attention_triton`, whose delta = rowsum(dY ∘ Y) from a bf16 y put 3-4 %
    errors into dq and dk of a hub row) and a ring's merged output are float32 beside the
    half-precision y the layer returns; the strategies' Table-1 terms count that one at
    ``esize`` only. Elements: the rank's [heads, rows, d'] of its kernels' passes
    (:class:`~plexgt.parallel.attention.strategy.KernelWork`). 0 for float32 and float64."""
    if problem.esize >= ACC_BYTES:
        return 0
    work = strategy.work(problem, p)
    return work.heads * work.rows * problem.head_dim * ACC_BYTES


def model_memory(strategy: AttentionStrategy, problem: AttentionProblem, p: int, layers: int,
                 features: int, classes: int, num_params: int, ffn_mult: int = 2,
                 gcn: bool = False, gcn_grid: Grid3D | None = None,
                 feature_density: float | None = None, pre_norm: bool = False,
                 jk: str = "none", inference: bool = False, checkpoint: bool = False
                 ) -> dict[str, int]:
    """Per-rank bytes at a training step's peak: attention (Table 1's kept terms per layer, and
    the float32 y a half-precision layer keeps besides: :func:`accumulated_y_bytes`), dense
    activations, graphs, features, and parameters with gradients and two AdamW
    moments (4 copies).

    The peak is the largest of the top block's moments (:func:`block_moments`): the end of
    its forward, its FFN's backward, or its attention's backward, which adds the strategy's
    transient bytes (e.g. GP-AG's full-size dK, dV) and the kernel backward's three [h, E/p]
    temporaries. Counting those on top of every block's kept activations had over-predicted
    gt by 1.05-1.31 and gps by ~1.3 (bench_depth_memory, validate_plan).

    For gps the GCN operator is this rank's Â rows [N/p, N] (1D) or, on ``gcn_grid``, its Â
    block [N/Gz, N/Gx] of E/(Gx·Gz) entries, whose layer also keeps the aggregate
    [N/Gz, d/Gy] for the weight gradient. ``feature_density``: the input stored CSR.
    ``checkpoint``: the blocks recomputed in backward keep their input [N/p, d] (and the
    super states [S, d]) each, and one block at a time its activations.

    ``inference``: one forward under ``torch.inference_mode`` (``plexgt predict``): no
    autograd graph, so one block's activations live at a time (attention's and the dense
    ones of the largest block, no backward temporaries), the logits shard being written, and
    the parameters alone (no gradients, no AdamW moments); ``checkpoint`` is ignored (no
    backward, nothing kept for one)."""
    e = problem.esize
    att = strategy.memory(problem, p)
    n_loc = problem.rows(p)
    nnz_in = int(n_loc * features * (feature_density or 0.0))
    checkpoint = checkpoint and not inference  # a forward alone recomputes nothing
    # blocks whose activations are held at once (inference: the one running; checkpointing:
    # the one being recomputed)
    held = 1 if inference or checkpoint else layers
    att_bytes = held * att.activation_bytes
    dense = held * dense_activation_elems(n_loc, problem.d, ffn_mult, gcn) * e
    if checkpoint:  # every block's input, the recomputed one's among them
        dense += (layers * (n_loc + problem.super_nodes)
                  - n_loc) * problem.d * e
    if inference:  # the projection's output, the block output and the logits
        dense += n_loc * (2 * problem.d + classes) * e
        att_bytes += att.transient_bytes
    else:
        # the logits and their gradient; then the top block's largest moment
        dense += n_loc * 2 * classes * e
        mom = block_moments(n_loc, problem.d, ffn_mult, gcn, checkpoint)
        at_att = (mom["attention"] * e + att.transient_bytes + 3 * att.score_elems * e)
        if at_att > max(mom["forward"], mom["tail"]) * e:
            dense += mom["attention"] * e
            att_bytes += att.transient_bytes + 3 * att.score_elems * e
        else:
            dense += max(mom["forward"], mom["tail"]) * e
    # jumping knowledge: the combined blocks ('cat': [n, L·d] and its gradient; 'max' /
    # 'sum': the stacked [L, n, d] and the result); pre-norm's final norm of the
    # classifier's input (its output and the normalised values it keeps)
    head = problem.d * (layers if jk == "cat" else 1)
    if jk != "none":
        dense += n_loc * (2 * head if jk == "cat" else (layers + 1) * problem.d) * e
    if pre_norm:
        dense += n_loc * 2 * head * e
    graphs = att.graph_bytes
    if gcn and gcn_grid is not None:
        lay = layer_layouts(gcn_grid, 0, problem.n, [problem.d, problem.d])[0]
        nnz = -(-problem.e // (lay.g[0] * lay.g[2]))
        graphs += graph_bytes(lay.rows_pad, lay.cols_pad, nnz) + nnz * e
        dense += held * lay.rows_pad * (lay.d_in // lay.g[1]) * e
    elif gcn:
        graphs += graph_bytes(n_loc, p * n_loc, -(-problem.e // p)) + (
            -(-problem.e // p)) * e
    acc_y = 0 if inference else accumulated_y_bytes(strategy, problem, p)
    out = {
        "attention_activations": att_bytes + held * acc_y,
        "dense_activations": dense,
        "graph": graphs,
        # dense [N/p, F], or CSR used both ways (X·W, Xᵀ·dY): a graph with its transpose
        # and index caches, and both value arrays
        "features": (n_loc * features * e if feature_density is None else
                     graph_bytes(n_loc, features, nnz_in) + 2 * nnz_in * e),
        "parameters": (1 if inference else 4) * num_params * e,
    }
    out["total"] = sum(out.values())
    return out
