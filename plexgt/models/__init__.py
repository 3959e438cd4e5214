"""Reference models (single process = the oracle for every distributed strategy)."""

from plexgt.models.gcn import GCN
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.models.layers import ModelGraph, sparse_features

MODELS = {"gcn": GCN, "gt": GraphTransformer, "gps": GPS}

__all__ = ["GCN", "GPS", "MODELS", "GraphTransformer", "ModelGraph", "sparse_features"]
