"""``--format sbm``: the stochastic block model (:func:`~plexgt.data.synthetic.sbm`) as a prep
source: a graph with learnable labels, for demos and tests."""

from __future__ import annotations

import argparse

from plexgt.data.formats.spec import EDGE_FEATURES, EDGES, NODES, FormatSpec
from plexgt.data.source import GraphSource, MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.hostcomm import HostComm

_PARAMETERS = (("num_nodes", "nodes"), ("num_edges", "edges"), ("num_classes", "classes"),
               ("num_features", "features"), ("edge_features", "edge_features"))
"""sbm's keyword -> prep's option (an option left out keeps sbm's default)."""


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    kw = {k: getattr(args, a) for k, a in _PARAMETERS if getattr(args, a)}
    return MemorySource(sbm(seed=args.seed, **kw), split_origin={
        "origin": "random", "fractions": [0.6, 0.2, 0.2], "seed": args.seed})


SPEC = FormatSpec(
    "sbm", "stochastic block model with learnable labels (--nodes --edges --classes "
    "--features; --edge-features' column 0 marks edges inside a community), in memory", _open,
    options=(NODES, EDGES, EDGE_FEATURES), draws_node_data=True)
