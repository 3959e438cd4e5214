"""A distributed model with a learnable node embedding in its input: its checkpoint form.

The embedding table [N, D] is never whole on any rank (:mod:`plexgt.models.node_embedding`):
each rank holds the block its layout's input holds — rows of the prepared directory's Q order
(node partition), table columns (the 3D grid's first-layer input columns). In the canonical
state it is one :class:`~torch.distributed._shard.sharded_tensor.ShardedTensor` with this
rank's block at its offset, so ``torch.distributed.checkpoint`` writes each block once, from
its owner, and a resume on another grid, world size or strategy reads exactly the blocks it now
holds (DCP reshards by offset). Why not gather it like the weights: at papers100M's size
(111M x 128) the table outweighs every other tensor of the run.

Rows are in Q order, not by node id: a rank's rows are a contiguous range of Q positions, the
form a sharded tensor's blocks take. A checkpoint is therefore tied to its prepared
directory's node order (the loop records the order's hash and refuses another).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, init_from_local_shards

from plexgt.models.node_embedding import NodeEmbedding

KEY = "node_embedding"
"""The table's key in the canonical state (beside the single-process model's parameters)."""


class WithNodeEmbedding(nn.Module):
    """``inner`` (a distributed model with ``to_canonical`` / ``from_canonical``) fed its input
    plus this rank's embedding block: x [rows_pad, w] -> inner(x + block)."""

    def __init__(self, inner: nn.Module, embedding: NodeEmbedding) -> None:
        super().__init__()
        self.inner = inner
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.embedding(x))

    def to_canonical(self, local: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The inner model's canonical tensors, and the table as a sharded tensor
        (collective: every rank states its block)."""
        out = self.inner.to_canonical({k.removeprefix("inner."): v for k, v in local.items()
                                       if k.startswith("inner.")})
        out[KEY] = self._sharded(local["embedding.weight"])
        return out

    def from_canonical(self, full: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`to_canonical`: this rank's block of the table (from a sharded
        tensor's local shard, or sliced from a whole one)."""
        inner = self.inner.from_canonical({k: v for k, v in full.items() if k != KEY})
        out = {f"inner.{k}": v for k, v in inner.items()}
        w = self.embedding.weight
        table = full[KEY]
        if isinstance(table, ShardedTensor):
            shards = table.local_shards()
            block = shards[0].tensor if shards else torch.zeros(w.shape)
        else:
            r0, c0 = self.embedding.position, self.embedding.col0
            block = table[r0:r0 + w.shape[0], c0:c0 + w.shape[1]]
        out["embedding.weight"] = block.to(w.device, w.dtype)
        return out

    def counted(self, name: str) -> bool:
        """Whether this rank counts parameter ``name`` in a global sum over ranks: its table
        block (no other rank holds it), and what the inner model counts."""
        if name.startswith("inner."):
            return bool(self.inner.counted(name.removeprefix("inner.")))
        return True

    def _sharded(self, block: torch.Tensor) -> ShardedTensor:
        emb = self.embedding
        k, m = block.shape
        shards = [] if k == 0 or m == 0 else [Shard(block.detach().cpu().contiguous(),
                                                    ShardMetadata([emb.position, emb.col0],
                                                                  [k, m],
                                                                  f"rank:{dist.get_rank()}/cpu"))]
        return init_from_local_shards(shards, *emb.shape)

    @property
    def step(self) -> int:
        """The inner model's training-step counter (the dropout key; checkpointed)."""
        return int(self.inner.step)

    @step.setter
    def step(self, value: int) -> None:
        self.inner.step = int(value)
