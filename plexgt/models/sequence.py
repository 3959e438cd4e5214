"""What every node-sequence model (layout 'batch') and its distributed layouts share.

The hop codes, the attention's calling convention (:data:`Attend`), which rows of a
sequence a tensor holds (:class:`Rows`), the target rows and the step's loss: the contract
between a model module and :mod:`plexgt.parallel.batch_dist`, so that the layouts name no
model (a model is its module and a registry line).

Shapes: codes [B, N', N'] int8 (hop distance from j to i in the sequence's induced subgraph:
0 same node, 1, 2, 3 = farther or unreachable; :data:`GLOBAL_CODE` for pairs with a global
node), h [B, R, d] hidden rows, q/k/v [B, h, R, d']. The codes' constants (``NUM_CODES``,
``GLOBAL_CODE``) are :mod:`plexgt.ops.dense_attention`'s, the lowest layer that reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plexgt.ops.dense_attention import GLOBAL_CODE

Tensor = torch.Tensor

Attend = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""attend(q, k, v, codes, bias_weight) -> out [B, h, Rq, d'].

q [B, h, Rq, d'], k and v [B, h, Rk, d']; codes [B, r, c] int8: the hop codes of the first
r rows of q against the first c rows of k (sequence nodes); the remaining Rq - r rows of q
and Rk - c rows of k are global nodes, every pair with one of them coded :data:`GLOBAL_CODE`.
bias_weight [5, h]. The single process passes the whole sequence (r = c = N'); a
context-parallel rank passes its rows' q and codes and brings the other ranks' K/V."""


def pad_codes(codes: Tensor, rows: int, cols: int) -> Tensor:
    """codes [B, r, c] -> [B, rows, cols]: the global nodes' rows / columns (past r, c) coded
    :data:`GLOBAL_CODE`."""
    r, c = codes.shape[1], codes.shape[2]
    return F.pad(codes, (0, cols - c, 0, rows - r), value=GLOBAL_CODE)


def dense_attend(q: Tensor, k: Tensor, v: Tensor, codes: Tensor, bias_weight: Tensor
                 ) -> Tensor:
    """Exact :data:`Attend`: softmax(q kᵀ / sqrt(d') + bias) v, the [Rq, Rk] scores whole."""
    full = pad_codes(codes, q.shape[2], k.shape[2]).long()
    bias = bias_weight.to(q.dtype)[full].permute(0, 3, 1, 2)  # [B, h, Rq, Rk]
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1])) + bias
    return torch.matmul(torch.softmax(s, dim=-1), v)


@dataclass(frozen=True)
class Rows:
    """Which rows a tensor h [B, R, d] holds, the same in each of its B sequences.

    ``seq`` [B] int64: each sequence's index (unique within the step: the dropout key; the
    sampler's ``Sequence.index``). ``pos`` [R] int64: each row's position in its sequence,
    sequence rows (pos < n_seq) first, then global-node rows (n_seq <= pos < length).
    """

    seq: Tensor
    pos: Tensor
    n_seq: int
    """N': the sequence's node rows."""
    length: int
    """S = N' + N_s."""

    @classmethod
    def full(cls, seq: Tensor, n_seq: int, n_global: int) -> Rows:
        """Every row of the sequences ``seq``: positions 0..S-1."""
        s = n_seq + n_global
        return cls(seq.to(torch.int64), torch.arange(s, device=seq.device), n_seq, s)

    def part(self, lo: int, hi: int, global_nodes: bool = True) -> Rows:
        """Sequence rows [lo, hi), then (``global_nodes``) every global row: a context-parallel
        rank's share."""
        pos = torch.arange(lo, hi, device=self.pos.device)
        if global_nodes:
            pos = torch.cat([pos, torch.arange(self.n_seq, self.length, device=pos.device)])
        return Rows(self.seq, pos, self.n_seq, self.length)

    def select(self, seqs: slice) -> Rows:
        """The same rows of a sub-batch of the sequences (a micro-batch)."""
        return Rows(self.seq[seqs], self.pos, self.n_seq, self.length)

    @property
    def seq_rows(self) -> int:
        """r: how many rows are sequence nodes (they come first)."""
        return int((self.pos < self.n_seq).sum())

    def keys(self, device: torch.device) -> Tensor:
        """[B·R] int64 dropout row keys, seq · S + pos."""
        return (self.seq.to(device)[:, None] * self.length + self.pos.to(device)[None, :]
                ).reshape(-1)


def target_mask(rows: Rows, targets: Tensor) -> Tensor:
    """[B, R] bool: the rows of ``rows`` that are targets (position < the sequence's count)."""
    return rows.pos.to(targets.device)[None, :] < targets.to(torch.int64)[:, None]


def sequence_loss(logits: Tensor, labels: Tensor, total_targets: int) -> Tensor:
    """Sum of the targets' cross-entropy / the *step's* target count: summing this over
    micro-batches and replicas gives the step's mean whatever the split."""
    return F.cross_entropy(logits, labels, reduction="sum") / max(1, total_targets)
