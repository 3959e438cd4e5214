"""Hierarchical graph transformer (ANS-GT / MegaGraph style) over node sequences: the oracle.

A *sequence* is N' node ids (targets first, then sampled context: :mod:`plexgt.data.
node_batches`) followed inside the model by N_s learned global nodes, S = N' + N_s rows.
Every block attends densely over the whole sequence with a per-head structural bias:
score[b, h, i, j] = q_i·k_j / sqrt(d') + bias.weight[code[b, i, j], h], where code is the hop
distance from j to i in the sequence's induced subgraph (0 same node, 1, 2, 3 = farther or
unreachable) and :data:`GLOBAL_CODE` for every pair with a global node.

Shapes: x [B, N', F] features, ids [B, N'] node ids (the embedding table's rows), codes
[B, N', N'] int8, h [B, R, d] hidden rows, logits [M, C] of the M target rows.

Why the pieces are separate (:meth:`HierarchicalGT.embed_rows`, :meth:`~HierarchicalGT.
run_blocks`, :meth:`~HierarchicalGT.head_logits`): the distributed layouts run them apart.
A pipeline stage holds a contiguous range of blocks (embed on the first, head on the last)
under the full model's parameter names (``blocks.{i}`` by *global* index) and with the same
initial values, because every parameter is initialised from (seed, its name) alone
(:func:`init_parameters`), never from the order modules were built in. Context parallelism
runs a block on a *row slice* (:class:`Rows`: which sequence positions the rows are) with an
injected attention (:data:`Attend`) that brings the other rows' K/V. Dropout masks are keyed
by (seed, step, site = layer and sublayer, sequence index, position, column) through
:class:`~plexgt.ops.rng.CounterRNG`, never by rank, micro-batch or slice, so every layout
draws the single process's masks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plexgt.models.sequence import (
    Attend,
    Rows,
    dense_attend,
    target_mask,
)
from plexgt.models.spec import ModelSpec
from plexgt.ops.dense_attention import NUM_CODES
from plexgt.ops.rng import CounterRNG

Tensor = torch.Tensor

BLOCK_SITES = 8
"""Dropout sites per block: block i draws at 8(i + 1) + k (k: 0 attention residual, 1 inside
the FFN, 2 FFN residual); site 0 is the input dropout."""
TABLE_SITE = 1 << 20
"""Counter site of the node-embedding table's initial values."""

def site(layer: int, k: int) -> int:
    """Dropout site of sublayer k of block ``layer`` (global index)."""
    return BLOCK_SITES * (layer + 1) + k


@dataclass(frozen=True)
class StepDrop:
    """The dropout of one training step (``on`` false: evaluation, nothing dropped)."""

    seed: int
    step: int
    on: bool

    def __call__(self, x: Tensor, rows: Rows, site: int, p: float) -> Tensor:
        """Inverted dropout of x [B, R, m] (columns 0..m-1 of the activation at ``site``)."""
        if not self.on or p <= 0.0 or x.numel() == 0:
            return x
        b, r, m = x.shape
        rng = CounterRNG(self.seed, self.step, rows.keys(x.device))
        return rng.dropout(x.reshape(b * r, m), p, site).reshape(b, r, m)


NO_DROP = StepDrop(0, 0, False)


class HGTBlock(nn.Module):
    """Pre-norm block: h + Drop(W_o Attn(LN1 h)), then + Drop(FFN(LN2 h)), FFN d -> m·d -> d;
    ``bias`` the per-head bias of each hop code, [5, heads]."""

    def __init__(self, dim: int, heads: int, ffn_mult: int, dropout: float,
                 activation: str) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden size {dim} is not divisible by {heads} heads")
        self.heads, self.dropout, self.activation = heads, dropout, activation
        self.norm1 = nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.bias = nn.Embedding(NUM_CODES, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)

    def heads_of(self, x: Tensor) -> Tensor:
        """[B, R, d] -> [B, h, R, d']."""
        b, r, d = x.shape
        return x.view(b, r, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, h: Tensor, codes: Tensor, rows: Rows, layer: int,
                drop: StepDrop = NO_DROP, attend: Attend = dense_attend) -> Tensor:
        """h [B, R, d] (the rows ``rows`` says), codes [B, r, c] as :data:`Attend` takes them
        -> [B, R, d]. Only attention mixes rows, through ``attend``; everything else is
        row-local, so a slice of the rows computes its slice of the output."""
        a = self.norm1(h)
        q, k, v = (self.heads_of(lin(a)) for lin in (self.q, self.k, self.v))
        y = attend(q, k, v, codes, self.bias.weight)
        b, r, d = h.shape
        h = h + drop(self.o(y.transpose(1, 2).reshape(b, r, d)), rows, site(layer, 0),
                     self.dropout)
        act = F.gelu if self.activation == "gelu" else F.relu
        f = drop(act(self.ffn1(self.norm2(h))), rows, site(layer, 1), self.dropout)
        return h + drop(self.ffn2(f), rows, site(layer, 2), self.dropout)


class HGTEmbed(nn.Module):
    """Input dropout on [x, table[ids]], ``input`` Linear F + D -> d; the global nodes'
    learned states ``global_nodes`` [N_s, d]."""

    def __init__(self, in_dim: int, hidden: int, global_nodes: int, num_nodes: int,
                 node_embedding: int) -> None:
        super().__init__()
        self.input = nn.Linear(in_dim + node_embedding, hidden)
        self.table = nn.Embedding(num_nodes, node_embedding) if node_embedding else None
        self.global_nodes = nn.Parameter(torch.zeros(global_nodes, hidden))

    def forward(self, x: Tensor, ids: Tensor | None, rows: Rows, drop: StepDrop, p: float
                ) -> Tensor:
        """x [B, r, F] and ids [B, r] of the sequence rows -> h [B, R, d] (global rows after
        them, as ``rows`` lists them)."""
        w = self.input.weight
        if self.table is not None:
            if ids is None:
                raise ValueError("a model with a node-embedding table needs the rows' ids")
            x = torch.cat([x.to(w.dtype), self.table(ids).to(w.dtype)], dim=-1)
        r = x.shape[1]
        hseq = self.input(drop(x.to(w.dtype), _seq_rows(rows, r), 0, p))
        gpos = rows.pos[r:] - rows.n_seq
        if gpos.numel() == 0:
            return hseq
        g = self.global_nodes[gpos.to(w.device)].unsqueeze(0).expand(x.shape[0], -1, -1)
        return torch.cat([hseq, g.to(hseq.dtype)], dim=1)


def _seq_rows(rows: Rows, r: int) -> Rows:
    """The first r (sequence) rows of ``rows``."""
    return Rows(rows.seq, rows.pos[:r], rows.n_seq, rows.length)


class HGTHead(nn.Module):
    """Final LayerNorm + Linear d -> C at the target rows."""

    def __init__(self, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, out_dim)

    def forward(self, h: Tensor, rows: Rows, targets: Tensor) -> Tensor:
        """h [B, R, d], targets [B] (sequence b's targets are its positions 0..targets[b]-1)
        -> logits [M, C] of the target rows held, in (sequence, row) order."""
        return self.out(self.norm(h[target_mask(rows, targets)]))


def init_seed(seed: int, name: str) -> int:
    """The generator seed of parameter ``name``: a function of (seed, name) alone."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") \
        & ((1 << 63) - 1)


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int, prefix: str = "") -> None:
    """Every parameter of ``model`` from (seed, its full name): Linear weights and biases
    uniform within 1/sqrt(fan_in) (nn.Linear's), LayerNorms 1 and 0, bias tables N(0, 0.02²),
    global nodes N(0, 1), the node table entry (v, j) the counter normal of (seed, v, j) (so a
    shard of its rows initialises alike). Drawn in float64, then cast."""
    mods = dict(model.named_modules())
    for name, p in model.named_parameters():
        full = prefix + name
        owner, _, leaf = name.rpartition(".")
        mod = mods[owner]
        g = torch.Generator().manual_seed(init_seed(seed, full))
        if isinstance(mod, nn.Linear):
            bound = 1.0 / math.sqrt(mod.in_features) if mod.in_features else 0.0
            val = torch.empty(p.shape, dtype=torch.float64).uniform_(-bound, bound, generator=g)
        elif isinstance(mod, nn.LayerNorm):
            val = torch.ones(p.shape) if leaf == "weight" else torch.zeros(p.shape)
        elif isinstance(mod, nn.Embedding) and full.endswith("table.weight"):
            n, d = p.shape
            val = CounterRNG(seed, 0, torch.arange(n)).normal(TABLE_SITE, d, 0,
                                                             torch.device("cpu"))
        elif isinstance(mod, nn.Embedding):
            val = torch.empty(p.shape, dtype=torch.float64).normal_(0.0, 0.02, generator=g)
        else:
            val = torch.empty(p.shape, dtype=torch.float64).normal_(0.0, 1.0, generator=g)
        p.copy_(val.to(p.dtype))


class HierarchicalGT(nn.Module):
    """embed -> blocks -> head; or a pipeline stage of it: ``blocks`` a contiguous range of
    the L global block indices, ``embed`` / ``head`` (default: whether the range starts at 0 /
    ends at L). Parameters: ``embed.input``, ``embed.table`` (node_embedding D > 0: [|V|, D]),
    ``embed.global_nodes`` [N_s, d]; ``blocks.{i}.*``; ``head.norm``, ``head.out``: the same
    names and values in a stage as in the whole model."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 heads: int = 8, dropout: float = 0.1, input_dropout: float | None = None,
                 ffn_mult: int = 2, seed: int = 0, global_nodes: int = 1,
                 num_nodes: int = 0, node_embedding: int = 0, activation: str = "gelu",
                 blocks: range | None = None, embed: bool | None = None,
                 head: bool | None = None) -> None:
        super().__init__()
        blocks = range(num_layers) if blocks is None else blocks
        if num_layers < 1 or blocks.step != 1 or not 0 <= blocks.start <= blocks.stop \
                <= num_layers:
            raise ValueError(f"blocks {blocks} is not a contiguous range of 0..{num_layers}")
        if global_nodes < 0 or node_embedding < 0 or (node_embedding and num_nodes < 1):
            raise ValueError(f"global_nodes {global_nodes}, node_embedding {node_embedding} "
                             f"(with num_nodes {num_nodes}): negative, or a table of no rows")
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation {activation!r} is not gelu or relu")
        embed = blocks.start == 0 if embed is None else embed
        head = blocks.stop == num_layers if head is None else head
        self.num_layers, self.hidden, self.seed = num_layers, hidden, seed
        self.global_count = global_nodes
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.layer_range = blocks
        self.embed = HGTEmbed(in_dim, hidden, global_nodes, num_nodes, node_embedding) \
            if embed else None
        self.blocks = nn.ModuleDict({str(i): HGTBlock(hidden, heads, ffn_mult, dropout,
                                                      activation) for i in blocks})
        self.head = HGTHead(hidden, out_dim) if head else None
        init_parameters(self, seed)

    def drop(self, step: int) -> StepDrop:
        """The dropout of training step ``step`` (off in eval mode)."""
        return StepDrop(self.seed, step, self.training)

    def rows(self, seq: Tensor, n_seq: int) -> Rows:
        """Every row of sequences ``seq`` of N' = ``n_seq`` nodes."""
        return Rows.full(seq, n_seq, self.global_count)

    def embed_rows(self, x: Tensor, ids: Tensor | None, rows: Rows, step: int = 0) -> Tensor:
        """x [B, r, F] (+ ids [B, r]) of the sequence rows ``rows`` holds -> h [B, R, d]."""
        assert self.embed is not None, "this stage has no embedding"
        return self.embed(x, ids, rows, self.drop(step), self.input_dropout)

    def run_blocks(self, h: Tensor, codes: Tensor, rows: Rows, step: int = 0,
                   attend: Attend = dense_attend) -> Tensor:
        """h [B, R, d] through this model's blocks, in order (codes: :data:`Attend`'s)."""
        drop = self.drop(step)
        for name, blk in self.blocks.items():
            h = blk(h, codes, rows, int(name), drop, attend)
        return h

    def head_logits(self, h: Tensor, rows: Rows, targets: Tensor) -> Tensor:
        """Logits [M, C] of the target rows of h [B, R, d]."""
        assert self.head is not None, "this stage has no head"
        return self.head(h, rows, targets)

    def forward(self, x: Tensor, ids: Tensor | None, codes: Tensor, targets: Tensor,
                seq: Tensor, step: int = 0, attend: Attend = dense_attend) -> Tensor:
        """The whole model on B sequences: x [B, N', F], ids [B, N'], codes [B, N', N'] int8,
        targets [B], seq [B] (dropout keys) -> logits [M, C] of every target, sequence by
        sequence (labels in the same order: each sequence's, concatenated)."""
        rows = self.rows(seq, x.shape[1])
        h = self.run_blocks(self.embed_rows(x, ids, rows, step), codes, rows, step, attend)
        return self.head_logits(h, rows, targets)


SPEC = ModelSpec("hgt", "hierarchical graph transformer: dense attention over sampled node "
                 "sequences with hop-code bias and global nodes", HierarchicalGT, "batch")
