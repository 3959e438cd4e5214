"""Sizes a rank cannot hold, refused before the first allocation (one line naming the key).

Apart from :mod:`plexgt.tasks.task` because it is one rule of its own: what a configured size
costs each rank at least, against what the rank has.
"""

from __future__ import annotations

import os

import torch

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.errors import ConfigError
from plexgt.tasks.task import memory_limit


def check_memory(cfg: TrainConfig, pg: PreparedGraph, world_size: int,
                 device: torch.device | None = None) -> None:
    """ConfigError, before anything is allocated, when a node embedding or super nodes need
    more bytes on each rank than it has (parallel.memory_per_rank_gb, else what a plan may fill
    of the GPU, else the machine's physical memory): 10⁸ embedding columns or 10⁹ super nodes
    otherwise end in a MemoryError traceback in the first array they touch. The bytes are a lower
    bound whatever the layout: the table is never whole on a rank but its rows are spread
    over at most all P ranks (N·D/P, four times over: the table, its gradient and AdamW's two
    moments); every real node gains S pattern entries, spread likewise (N·S/P int64 indices),
    and the S super states [S, hidden] are replicated on every rank (four times over too)."""
    m = cfg.model
    esize = 8 if cfg.dtype == "float64" else 4
    limit = memory_limit(cfg, device)
    which = ("parallel.memory_per_rank_gb" if cfg.parallel.memory_per_rank_gb > 0 else
             "what a plan may fill of the GPU (parallel.gpu_memory_fraction, "
             "gpu_memory_reserve_gb)")
    if limit is None:
        limit, which = physical_memory(), "the machine's physical memory"
    need = {"model.node_embedding": (4 * esize * -(-pg.N * m.node_embedding // world_size),
                                     f"its [N={pg.N}, {m.node_embedding}] table"),
            "model.super_nodes": (8 * -(-pg.N * m.super_nodes // world_size)
                                  + 4 * esize * m.super_nodes * m.hidden,
                                  f"{pg.N} nodes attending to {m.super_nodes} each, and "
                                  f"their [{m.super_nodes}, {m.hidden}] states")}
    for key, (nbytes, what) in need.items():
        if limit and nbytes > limit:
            raise ConfigError(f"config key '{key}': {getattr(m, key.split('.')[1])} needs at "
                              f"least {nbytes:,} bytes a rank on {world_size} rank(s) "
                              f"({what}), more than {which} ({limit:,} bytes)")


def physical_memory() -> int:
    """Bytes of memory the machine has (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
