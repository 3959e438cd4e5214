"""Reference models (single process = the oracle for every distributed strategy)."""

from plexgt.models.gcn import GCN
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.models.layers import ModelGraph, sparse_features
from plexgt.models.registry import default_registry

MODELS = {spec.name: spec.reference for spec in default_registry()}
"""Each registered model's reference class, by name."""

__all__ = ["GCN", "GPS", "MODELS", "GraphTransformer", "ModelGraph", "sparse_features"]
