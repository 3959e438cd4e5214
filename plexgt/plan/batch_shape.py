"""A node-sequence (hgt) training step's sizes and the mesh it runs on, as the planner's cost
model (:mod:`plexgt.plan.batch_memory`, :mod:`plexgt.plan.batch_cost`) sees them.

A step on the mesh: replica r of P_dp takes G/P_dp of the step's G sequences and
splits them into K GPipe micro-batches of B = G/(P_dp·K); each of the P_pp stages holds a
contiguous run of blocks; each sequence's N' rows are split over the P_cp ranks of a stage,
every cp rank also holding the N_s global rows (replicated, their K/V never sent). So on one
rank of a stage, per sequence: R = N'/P_cp + N_s query rows, S = N' + N_s key columns, and
its own key block Rk = N'/P_cp rows travels around the cp ring (:func:`micro_rows`).

:class:`BatchMesh` is :class:`plexgt.distributed.mesh.Mesh` (the ranks' dp x pp x cp layout)
with the micro-batch count K that the cost depends on too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plexgt.config import TrainConfig
from plexgt.distributed.mesh import Mesh, check_layout, parse_stages


@dataclass(frozen=True)
class BatchShape:
    """One node-sequence training step's sizes (model, batch and graph)."""

    layers: int
    """Blocks L."""
    hidden: int
    """Width d."""
    heads: int
    """Heads h (d' = d / h)."""
    size: int
    """Sequence length N' (``batch.size``); P_cp divides it."""
    sequences: int
    """Sequences per step G over all replicas (``batch.sequences``); P_dp divides it."""
    features: int
    """Input width F."""
    classes: int
    """Classes C."""
    ffn_mult: int = 2
    """FFN width in units of d."""
    global_nodes: int = 1
    """Learned global nodes N_s (replicated on every cp rank)."""
    targets: int = 256
    """Targets per sequence (its first rows; the head reads only them)."""
    nodes: int = 0
    """|V|: rows of the node-embedding table (0 with no table)."""
    embed_dim: int = 0
    """D: the table's width (``model.node_embedding``; 0: none)."""
    esize: int = 4
    """Bytes per activation element."""
    state_bytes: int = 16
    """Bytes per parameter: AdamW float32 = the parameter, its gradient, 2 moments."""
    grad_bytes: int = 4
    """Bytes per parameter's gradient (what the stage group all-reduces)."""
    mask_bytes: int = 0
    """Bytes a dropout site saves per element: 0 where the counter-based mask is recomputed
    in backward (the Triton kernel, GPUs), the element size where torch multiplies by a saved
    multiplier tensor (CPU)."""

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "size", "sequences", "features", "classes",
                  "ffn_mult", "esize", "state_bytes"):
            if getattr(self, k) < 1:
                raise ValueError(f"node-sequence shape: {k} = {getattr(self, k)} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"node-sequence shape: hidden {self.hidden} is not divisible by "
                             f"{self.heads} heads")

    @classmethod
    def from_config(cls, cfg: TrainConfig, nodes: int, features: int, classes: int) -> BatchShape:
        """The shape a config trains on a graph of ``nodes`` nodes, ``features`` input
        columns and ``classes`` classes (float32 state; masks saved on a CPU's torch path
        are the caller's to set)."""
        m, b = cfg.model, cfg.batch
        return cls(m.layers, m.hidden, m.heads, b.size, b.sequences, features, classes,
                   m.ffn_mult, b.global_nodes, b.targets, nodes if m.node_embedding else 0,
                   m.node_embedding, cfg.esize)

    @property
    def block_params(self) -> int:
        """One block: LN1, QKV, Wo, LN2, FFN (biased Linears), the [5, h] bias table."""
        d, m = self.hidden, self.ffn_mult
        return (4 + 2 * m) * d * d + (9 + m) * d + 5 * self.heads

    @property
    def embed_params(self) -> int:
        """Stage 0's own: the input Linear (F + D) -> d, the [|V|, D] table, [N_s, d]."""
        d = self.hidden
        return (self.features + self.embed_dim) * d + d + self.nodes * self.embed_dim \
            + self.global_nodes * d

    @property
    def head_params(self) -> int:
        """The last stage's own: final LayerNorm and Linear d -> C."""
        return 2 * self.hidden + self.hidden * self.classes + self.classes

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.embed_params + self.head_params


@dataclass(frozen=True)
class BatchMesh(Mesh):
    """(dp, pp, cp) of :class:`~plexgt.distributed.mesh.Mesh` and the step's GPipe
    micro-batches K: the cost of a step depends on all four."""

    micro_batches: int
    """K: micro-batches each replica's share of the step is split into."""

    @property
    def world(self) -> int:
        """Ranks of the mesh (:attr:`size`): the world the ranks share a node in."""
        return self.size

    def __str__(self) -> str:
        return f"{super().__str__()}xK{self.micro_batches}"


def check_mesh(shape: BatchShape, mesh: BatchMesh) -> None:
    """One-line ConfigError unless the mesh divides the step as the design requires
    (:func:`plexgt.distributed.mesh.check_layout`'s rules)."""
    check_layout(shape.sequences, shape.size, shape.layers, mesh.dp, mesh.pp, mesh.cp,
                 mesh.micro_batches)


def check_stages(shape: BatchShape, stages: Sequence[int], pp: int | None = None) -> None:
    """One-line ConfigError unless ``stages`` (blocks per stage) partition the shape's layers
    over ``pp`` stages (:func:`plexgt.distributed.mesh.parse_stages`' rules)."""
    parse_stages(stages, shape.layers, pp)


def position(i: int, pp: int) -> int:
    """Stage i's position code: 3 the only stage, 0 first, 2 last, 1 middle."""
    return 3 if pp == 1 else 0 if i == 0 else 2 if i == pp - 1 else 1


def micro_rows(shape: BatchShape, cp: int) -> tuple[int, int, int]:
    """(R, Rk, S): query rows a rank holds per sequence (its N'/P_cp and the N_s global
    rows), its own key rows (N'/P_cp, what travels), and the key columns (N' + N_s)."""
    rk = shape.size // cp
    return rk + shape.global_nodes, rk, shape.size + shape.global_nodes

