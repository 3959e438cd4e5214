"""A profile file's ``batch`` table: a measured :class:`~plexgt.plan.batch_fits.BatchProfile`
and the shape it was measured at, carried to another shape by counted ratios.

Apart from :mod:`plexgt.plan.batch_fits` because it is the profile's file form (written by
``plexgt profile``, :mod:`plexgt.plan.measure`; read by :func:`plexgt.plan.choose.choose`),
not the cost model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from plexgt.plan.batch_fits import BatchProfile, BlockFit, default_profile
from plexgt.plan.batch_shape import BatchShape
from plexgt.plan.host import Host

SHAPE_KEYS = ("hidden", "heads", "ffn_mult", "features", "classes", "embed_dim")
"""What a measured table's per-row terms depend on (stored beside it as ``shape``)."""
BLOCK_KEYS = ("hidden", "heads", "ffn_mult")
"""What a block's measured seconds (:attr:`BatchProfile.block_samples`, at (P_cp, B, R, S))
depend on beyond those: a table of another input width or class count keeps them."""


def profile_table(prof: BatchProfile, shape: BatchShape) -> dict[str, Any]:
    """A profile file's ``batch`` table: ``prof`` (:meth:`BatchProfile.to_dict`) and the
    shape it was measured at."""
    return {**prof.to_dict(), "shape": {k: getattr(shape, k) for k in SHAPE_KEYS}}


def from_table(table: dict[str, Any], shape: BatchShape, host: Host | None = None
               ) -> BatchProfile:
    """The profile a ``batch`` table gives ``shape``: as stored where it was measured at
    this width, heads, FFN and input; otherwise each per-row and per-score term scaled by
    what :func:`default_profile` counts at ``shape`` over what it counts at the measured
    shape (a measured rate carried to another width; per-call terms, the sampler, the
    collectives and the memory fit kept)."""
    prof = BatchProfile.from_dict(table, host)
    at = table.get("shape")
    if not at or all(at.get(k) == getattr(shape, k) for k in SHAPE_KEYS):
        return prof
    if any(at.get(k) != getattr(shape, k) for k in BLOCK_KEYS):
        prof = replace(prof, block_samples={})  # a block of another width: the fit carries
    old = default_profile(replace(shape, **{k: int(at[k]) for k in SHAPE_KEYS if k in at}))
    new = default_profile(shape)

    def ratio(a: float, b: float) -> float:
        return b / a if a > 0 else 1.0

    def scale(f: BlockFit, a: BlockFit, b: BlockFit) -> BlockFit:
        return BlockFit(f.per_call_s, f.per_row_s * ratio(a.per_row_s, b.per_row_s),
                        f.per_score_s * ratio(a.per_score_s, b.per_score_s),
                        f.per_merge_s * ratio(a.per_merge_s, b.per_merge_s))

    ob, nb = old.block_fit(1), new.block_fit(1)
    return replace(prof, block={k: scale(v, ob, nb) for k, v in prof.block.items()},
                   embed=scale(prof.embed, old.embed, new.embed),
                   head=scale(prof.head, old.head, new.head),
                   source=f"{prof.source}, carried from hidden {at.get('hidden')} by counts")
