"""What a distributed sparse-attention strategy is, what one rank holds, and the registry type.

A strategy is three functions over the same 1D node partition of p ranks (rows of the graph in
Q order, ``ceil(N/p)`` padded rows per rank, :func:`plexgt.distributed.grid.block_bounds`):

* ``forward(shard, q, k, v, block_rows, kv_super) -> y``: q, k, v [N/p, h, d'] (rows over the
  group) -> y [N/p, h, d'], through autograd collectives so the backward communicates by
  itself; ``kv_super``: the super nodes' replicated K, V [S, h, d'] (or None), which the
  shard's extra pattern columns index;
* ``comm(problem, rank, p) -> [CommOp]``: the collectives one attention block issues on that
  rank, forward and backward, with exact bytes (the ledger of a real run equals them);
* ``memory(problem, p) -> MemoryEstimate``: activation and graph-storage bytes per rank.

Plus ``full_graph``: whether each rank stores the whole graph (head partition) or only its row
block (node partition), which decides what :class:`AttentionShard` carries.

Each strategy is one module beside this one (``gp_ag.py``, ``gp_a2a.py``) holding its three
functions; :mod:`plexgt.parallel.attention.registry` lists them, and a registry is an object the
caller builds (``default_registry()``) and extends (``reg.register(...)``): no module-level
mutable state. Adding a strategy is one new module and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch

from plexgt.distributed.collectives import Comm, CommLedger, CommOp
from plexgt.distributed.grid import block_bounds
from plexgt.ops.csr import CSRGraph
from plexgt.ops.super_nodes import super_columns, super_positions

Tensor = torch.Tensor
Range = tuple[int, int]


def head_splits(heads: int, p: int) -> tuple[int, ...]:
    """Heads per rank when h heads are cut over p ranks: h//p each, one more for the first h%p.

    Balanced (never two ranks more than one head apart), and valid for h < p (some ranks then
    hold no head and only relay rows).
    """
    if heads < 1 or p < 1:
        raise ValueError(f"cannot split {heads} heads over {p} ranks")
    return tuple(heads_of(heads, p, j) for j in range(p))


def heads_of(heads: int, p: int, j: int) -> int:
    """Rank j's entry of :func:`head_splits` without building all p (a plan asks at
    p = 2048, for every scale)."""
    if heads < 1 or p < 1:
        raise ValueError(f"cannot split {heads} heads over {p} ranks")
    return heads // p + (1 if j < heads % p else 0)


@dataclass(frozen=True)
class AttentionProblem:
    """The sizes a strategy's cost and memory functions need (one attention block)."""

    n: int
    """Nodes N."""
    e: int
    """Edges E (nonzeros of the attention pattern, self loops included when stored)."""
    d: int
    """Hidden width d = h * d'."""
    heads: int
    """Heads h."""
    esize: int = 4
    """Bytes per element of activations."""
    head_parallel: int = 1
    """gp_2d: ranks a of the inner (head) axis; the ring runs over the p/a groups."""
    ring_chunks: int = 1
    """gp_ring / gp_2d: pieces c each rank's K/V block travels in (memory in flight 1/c)."""
    super_nodes: int = 0
    """Global super nodes S (every real row gains S columns; S dense super rows)."""
    block_rows: int = 0
    """gp_ag / gp_a2a: query rows per attention block (0: whole). Blocked, a layer keeps the
    [h, rows] log-sum-exp instead of the [h, E] probabilities and rebuilds the scores block
    by block in backward: one more SDDMM for memory [h, E_block] (``parallel.
    attention_block_rows``)."""

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    def rows(self, p: int) -> int:
        """Padded rows per rank, ceil(N/p)."""
        return -(-self.n // p)


def score_terms(problem: AttentionProblem, rows: int, edges: int, heads: int
                ) -> tuple[int, int, int]:
    """(kept elements, score elements, blocks) of a node-local attention over ``rows`` query
    rows and ``edges`` edges of ``heads`` heads: whole, the [h, E] probabilities kept and one
    [h, E] array per backward temporary; blocked by ``problem.block_rows``, the [h, rows]
    log-sum-exp kept and the temporaries one block's, E·(block rows)/rows edges on average
    (a skewed degree makes some blocks bigger: a model, not a bound)."""
    br = problem.block_rows
    if not br or br >= rows:
        return edges * heads, edges * heads, 1
    blocks = -(-rows // br)
    return rows * heads, -(-edges // blocks) * heads, blocks


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank bytes of one attention block (Table 1 of Lin et al., in bytes)."""

    activation_elems: int
    """Elements of the block's activations and their gradients (e.g. 4·N·d + E·h/p for GP-AG)."""
    activation_bytes: int
    graph_bytes: int
    """Stored pattern: row pointers + per-edge index arrays of the rows this rank holds."""
    score_elems: int = 0
    """Elements of one [h, E] score array on this rank (E·h/p): the kernel's backward holds
    about three more of them at once, for one layer at a time."""
    transient_bytes: int = 0
    """Bytes held during one layer's backward only (a ring's gradients and pieces in flight),
    beyond ``activation_bytes`` which every layer keeps until its backward."""

    @property
    def total(self) -> int:
        return self.activation_bytes + self.transient_bytes + self.graph_bytes


@dataclass(frozen=True)
class KernelWork:
    """What the busiest rank's attention kernels touch in one block: the sizes a cost model
    prices (:mod:`plexgt.plan.agp`), written beside each strategy's forward."""

    heads: int
    """Heads the rank computes."""
    edges: float
    """Edges it computes them on."""
    rows: int
    """Query rows of its [heads, rows, d'] passes."""
    cols: int
    """Key columns its kernels stream, in all."""
    own_cols: int
    """Of those, the ones that shrink with the ranks (the rest is overhead that does not)."""
    launches: int = 1
    """Kernel launches per head (one per column block of a ring)."""
    recompute: int = 0
    """SDDMMs the backward redoes per edge (a ring rebuilds its scores from the lse)."""
    copy_elems: int = 0
    """Elements of one node <-> head layout permute (all-to-all strategies)."""
    merge_elems: int = 0
    """Elements of the online-softmax merges of partial outputs (a ring's blocks)."""


@dataclass(frozen=True)
class AttentionShard:
    """What one rank of a p-rank group holds to run distributed attention.

    ``graph`` is [ceil(N/p), p·ceil(N/p)] (this rank's rows against all padded columns) for a
    node-partitioned strategy, or [p·ceil(N/p)] squared (every row) for a head-partitioned one;
    columns are global positions in Q order either way, so K/V gathered in group-rank order
    line up with them. Padding rows own no edges and no column points at them.
    """

    strategy: AttentionStrategy
    comm: Comm
    n: int
    """True node count N."""
    rows: Range
    """This rank's node range [lo, hi) in Q order (block ``comm.rank`` of ``comm.size``)."""
    n_loc: int
    """Padded rows per rank, ceil(N/p): the first dimension of q, k, v and y."""
    graph: CSRGraph
    heads: int
    groups: dict[str, Comm] = field(default_factory=dict)
    """Sub-groups a strategy runs over beyond ``comm`` (gp_2d: 'heads' of a ranks, 'ring' of
    p/a ranks)."""
    blocks: tuple[tuple[Any, ...], ...] = ()
    """Ring strategies: ``blocks[j][i]`` = the pattern's columns of ring member j's chunk i
    (a :class:`~plexgt.parallel.attention.ring.ColumnBlock`); built by the strategy's
    ``prepare``."""
    chunk_bounds: tuple[Range, ...] = ()
    """Ring strategies: row range of each chunk inside a member's K/V block."""
    head_parallel: int = 1
    """gp_2d: ranks a of the head axis (1 for every other strategy)."""
    ring_chunks: int = 1
    """Ring strategies: pieces each K/V block travels in."""
    super_nodes: int = 0
    """Global super nodes S: ``graph``'s real rows carry S more columns (after the p·N/p
    real ones) that index the super nodes' K/V, which every rank holds."""
    super_block: Any = None
    """Ring strategies with super nodes: the pattern's super columns as one
    :class:`~plexgt.parallel.attention.ring.ColumnBlock` (attended locally, never sent)."""
    edge_attr: Tensor | None = None
    """[E, F_e] features of ``graph``'s edges in its CSR order (zeros on super entries): the
    edge bias's input, sliced with the pattern wherever the pattern is cut."""

    @property
    def head_splits(self) -> tuple[int, ...]:
        return head_splits(self.heads, self.comm.size)

    @property
    def real_rows(self) -> int:
        """This rank's real (unpadded) rows of q, k, v: its share of the N nodes."""
        return self.rows[1] - self.rows[0]

    def to(self, device: torch.device | str) -> AttentionShard:
        """The same shard with its patterns (and their cached transposes) on ``device``."""
        sb = None if self.super_block is None else self.super_block.to(device)
        ea = None if self.edge_attr is None else self.edge_attr.to(device)
        return replace(self, graph=self.graph.to(device), super_block=sb, edge_attr=ea,
                       blocks=tuple(tuple(b.to(device) for b in row) for row in self.blocks))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, block_rows: int | None = None,
               kv_super: SuperKV | None = None, bias: Tensor | None = None) -> Tensor:
        """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (this rank's rows);
        with super nodes, ``kv_super`` = their K, V [S, h, d'] (replicated); ``bias`` [h, E]:
        the edge bias of ``graph``'s edges, every head (a head-partitioned rank slices)."""
        if (kv_super is None) != (self.super_nodes == 0):
            raise ValueError(f"the shard was built for {self.super_nodes} super nodes; "
                             f"got {'no' if kv_super is None else 'their'} K/V")
        if bias is not None and bias.shape != (self.heads, self.graph.num_edges):
            raise ValueError(f"edge bias must be [{self.heads}, {self.graph.num_edges}], got "
                             f"{tuple(bias.shape)}")
        return self.strategy.forward(self, q, k, v, block_rows, kv_super, bias)


SuperKV = tuple[Tensor, Tensor]
"""The super nodes' K and V [S, h, d'] (every head; a head-partitioned rank slices its own)."""
AttentionForward = Callable[[AttentionShard, Tensor, Tensor, Tensor, "int | None",
                             "SuperKV | None", "Tensor | None"], Tensor]
CommFunction = Callable[[AttentionProblem, int, int], list[CommOp]]
MemoryFunction = Callable[[AttentionProblem, int], MemoryEstimate]
WorkFunction = Callable[[AttentionProblem, int], KernelWork]
PatternRows = Callable[[int, int, int, int], Range]
GroupsFunction = Callable[[Comm, int, CommLedger, timedelta | None], dict[str, Comm]]


@dataclass(frozen=True)
class AttentionStrategy:
    """A named distributed attention: its forward, its cost and its memory function."""

    name: str
    description: str
    forward: AttentionForward
    comm: CommFunction
    """(problem, rank, p) -> the rank's collectives of one block, forward then backward."""
    memory: MemoryFunction
    """(problem, p) -> the most loaded rank's bytes of one block."""
    work: WorkFunction
    """(problem, p) -> the most loaded rank's kernel sizes of one block."""
    full_graph: bool
    """True: every rank stores all N rows of the pattern (head partition)."""
    pattern_rows: PatternRows | None = None
    """(n, p, rank, a) -> the padded Q-order rows [lo, hi) (whole ceil(N/p) blocks, so hi may
    pass N) whose pattern the rank stores; None: its own block (node partition) or, with
    ``full_graph``, all p blocks."""
    prepare: Callable[[AttentionShard], AttentionShard] | None = None
    """Builds what the forward needs beyond the padded pattern (a ring's column blocks)."""
    head_axes: Callable[[int], list[int]] | None = None
    """p -> the head-axis sizes a the strategy can run with on p ranks (gp_2d: the divisors
    of p); None: only a = 1."""
    groups: GroupsFunction | None = None
    """(comm, a, ledger, timeout) -> the sub-groups the forward runs over beyond ``comm``
    (gp_2d: 'heads' and 'ring'), created collectively by every rank of the job; None: none."""
    rings: bool = False
    """K/V blocks travel around a ring: ``ring_chunks`` applies (pieces in flight), and the
    backward rebuilds the scores from the saved lse, so row blocking is moot."""
    needs_sampled_addmm: bool = False
    """Its kernels are torch's sparse SDDMM (``torch.sparse.sampled_addmm``) whatever the
    sizes: a ROCm GPU has none, so there the strategy is refused when configured and never
    planned (:func:`~plexgt.ops.attention.sampled_addmm_available`). False: the fused kernel
    serves it on GPUs, as it does every built-in one (the rings' column blocks included)."""

    def label(self, p: int, head_parallel: int = 1) -> str:
        """How plans and metrics name the strategy on p ranks: its name, with the head axis
        as a x b where it has one ('gp_2d 2x4')."""
        if self.head_axes is None:
            return self.name
        return f"{self.name} {head_parallel}x{p // max(1, head_parallel)}"

    def check_head_axis(self, p: int, head_parallel: int) -> None:
        """ValueError when a configured head axis cannot tile p ranks (0: the plan's)."""
        if head_parallel and self.head_axes is not None and head_parallel not in \
                self.head_axes(p):
            raise ValueError(f"{self.name}: head_parallel={head_parallel} does not divide "
                             f"{p} ranks")

    def layouts(self, p: int, head_parallel: int = 0) -> list[int]:
        """The head axes a plan prices on p ranks: ``head_parallel`` when given (and valid),
        else every one :attr:`head_axes` allows."""
        axes = self.head_axes(p) if self.head_axes is not None else [1]
        if head_parallel and self.head_axes is not None:
            return [head_parallel] if head_parallel in axes else []
        return axes

    def padded_rows(self, n: int, p: int, rank: int, head_parallel: int = 1) -> Range:
        """Padded Q-order rows of the pattern ``rank`` of p stores (whole ceil(N/p) blocks)."""
        if self.pattern_rows is not None:
            return self.pattern_rows(n, p, rank, head_parallel)
        n_loc = -(-n // p)
        return (0, p * n_loc) if self.full_graph else (rank * n_loc, (rank + 1) * n_loc)

    def rows_held(self, n: int, p: int, rank: int, head_parallel: int = 1) -> Range:
        """The real rows among :meth:`padded_rows` (what a reader reads; maybe none)."""
        lo, hi = self.padded_rows(n, p, rank, head_parallel)
        return (min(lo, n), min(hi, n))

    def comm_bytes(self, problem: AttentionProblem, rank: int, p: int) -> dict[str, int]:
        """Bytes sent per operation name by ``rank`` in one block (forward + backward)."""
        out: dict[str, int] = {}
        for op in self.comm(problem, rank, p):
            out[op.op] = out.get(op.op, 0) + op.total_sent
        return out


INDEX_BYTES = 8
"""int64 row pointers."""
GRAPH_BYTES_PER_EDGE = 48
"""What a :class:`~plexgt.ops.csr.CSRGraph` keeps per edge once attention has run on it:
indices and row ids (int64), the transpose's indices and the two edge permutations (int64),
and the int32 index copies the CPU kernels and the fused GPU kernel read for the matrix and
its transpose (the int32 transpose permutation they also read, 4 more, is not counted)."""


def graph_bytes(rows: int, cols: int, edges: int) -> int:
    """Bytes of a stored [rows, cols] pattern of ``edges`` entries and its transpose."""
    return (rows + 1 + cols + 1) * INDEX_BYTES + edges * GRAPH_BYTES_PER_EDGE


class StrategyRegistry:
    """Strategies by name. Build with :func:`default_registry`; add with :meth:`register`."""

    def __init__(self) -> None:
        self._items: dict[str, AttentionStrategy] = {}

    def register(self, strategy: AttentionStrategy, replace: bool = False) -> AttentionStrategy:
        if strategy.name in self._items and not replace:
            raise ValueError(f"attention strategy {strategy.name!r} is already registered")
        self._items[strategy.name] = strategy
        return strategy

    def get(self, name: str) -> AttentionStrategy:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown attention strategy {name!r}; known: "
                           f"{', '.join(self._items)}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def baseline(self) -> AttentionStrategy:
        """The strategy a one-rank step is measured and priced as: on one rank every strategy
        computes the same step, so the first registered one stands for all."""
        if not self._items:
            raise KeyError("no attention strategy is registered")
        return next(iter(self._items.values()))

    def __iter__(self) -> Iterator[AttentionStrategy]:
        return iter(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)


def make_shard(strategy: AttentionStrategy, comm: Comm, n: int, heads: int,
               adjacency: CSRGraph, groups: dict[str, Comm] | None = None,
               head_parallel: int = 1, ring_chunks: int = 1, super_nodes: int = 0,
               edge_attr: Tensor | None = None) -> AttentionShard:
    """Wrap a rank's pattern as an :class:`AttentionShard`, padding it to the strategy's shape.

    ``adjacency``: [hi-lo, N], the rows :meth:`AttentionStrategy.rows_held` names (its own
    block, its head group's rows, or all N), columns in Q order. Rows are padded to a whole
    number of ceil(N/p) blocks, columns to p·ceil(N/p). ``groups``, ``head_parallel`` and
    ``ring_chunks`` are what gp_2d and the ring strategies run over. With ``super_nodes`` = S
    every real row gains the S super columns p·ceil(N/p) … +S-1
    (:func:`~plexgt.ops.super_nodes.super_columns`). ``edge_attr`` [E, F_e]: features of
    ``adjacency``'s edges (its CSR order), carried to the padded pattern's.
    """

    p = comm.size
    n_loc = -(-n // p)
    rows = block_bounds(n, p, comm.rank)
    lo, hi = strategy.rows_held(n, p, comm.rank, head_parallel)
    if adjacency.shape != (hi - lo, n):
        raise ValueError(f"{strategy.name} on rank {comm.rank}/{p} needs a {hi - lo}x{n} "
                         f"pattern, got {adjacency.shape[0]}x{adjacency.shape[1]}")
    if ring_chunks < 1:
        raise ValueError(f"ring_chunks must be at least 1, got {ring_chunks}")
    plo, phi = strategy.padded_rows(n, p, comm.rank, head_parallel)
    if super_nodes < 0:
        raise ValueError(f"super_nodes must be >= 0, got {super_nodes}")
    if edge_attr is not None and edge_attr.shape[0] != adjacency.num_edges:
        raise ValueError(f"{edge_attr.shape[0]} edge features for {adjacency.num_edges} edges")
    padded = pad_rows(adjacency, phi - plo, p * n_loc)
    real = min(phi, n) - plo
    g = super_columns(padded, super_nodes, real)
    if edge_attr is not None and super_nodes:
        pos = super_positions(padded, super_nodes, real)
        edge_attr = edge_attr.new_zeros(g.num_edges, edge_attr.shape[1]).index_copy_(
            0, pos, edge_attr)
    g.transpose()
    _ = g.row
    shard = AttentionShard(strategy, comm, n, rows, n_loc, g, heads, dict(groups or {}),
                           head_parallel=head_parallel, ring_chunks=ring_chunks,
                           super_nodes=super_nodes, edge_attr=edge_attr)
    return strategy.prepare(shard) if strategy.prepare is not None else shard


def pad_rows(g: CSRGraph, num_rows: int, num_cols: int) -> CSRGraph:
    """The same pattern as a [num_rows, num_cols] graph (extra rows empty, extra columns unused)."""
    if num_rows < g.num_rows or num_cols < g.num_cols:
        raise ValueError("padding cannot shrink a graph")
    extra = torch.full((num_rows - g.num_rows,), int(g.indptr[-1]), dtype=torch.int64,
                       device=g.device)
    return CSRGraph(torch.cat([g.indptr, extra]), g.indices, num_rows, num_cols, g.values)
