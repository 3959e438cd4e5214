"""The source formats ``plexgt prep`` knows: the one place a new format is added.

Each format is one module of this package ending in its ``SPEC``
(:class:`~plexgt.data.formats.spec.FormatSpec`); the registry is an object the caller builds
and may extend (``reg.register(...)``), so there is no module-level mutable state.
"""

from __future__ import annotations

from plexgt.data.formats import edgelist, gnn_benchmark, mtx, npz_edges, ogb, pyg, rmat, sbm, snap
from plexgt.data.formats.spec import FormatRegistry

FORMATS = (
    gnn_benchmark.SPEC,
    ogb.SPEC,
    npz_edges.SPEC,
    pyg.SPEC,
    snap.SPEC,
    edgelist.SPEC,
    mtx.SPEC,
    rmat.SPEC,
    sbm.SPEC,
)
"""Every built-in format, in the order ``--help`` lists them."""


def default_registry() -> FormatRegistry:
    """A fresh registry holding every built-in source format."""
    reg = FormatRegistry()
    for spec in FORMATS:
        reg.register(spec)
    return reg
