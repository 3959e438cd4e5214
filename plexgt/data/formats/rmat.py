"""``--format rmat``: the streamed R-MAT generator (:class:`~plexgt.data.synthetic.RmatSource`)
as a prep source: a power-law graph of any size, for scale."""

from __future__ import annotations

import argparse

from plexgt.data.formats.spec import EDGE_FEATURES, EDGES, NODES, FormatSpec
from plexgt.data.source import GraphSource
from plexgt.data.synthetic import RmatSource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import UsageError


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    if args.nodes is None or args.edges is None:
        raise UsageError("--format rmat needs --nodes and --edges")
    return RmatSource(args.nodes, args.edges, args.seed, edge_features=args.edge_features or 0)


SPEC = FormatSpec(
    "rmat", "R-MAT power-law generator (--nodes --edges [--edge-features]), streamed, any size",
    _open, options=(NODES, EDGES, EDGE_FEATURES))
