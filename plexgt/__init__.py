"""plexgt: exact full-graph GNN and sparse graph transformer training with 3D tensor parallelism."""

__version__ = "0.1.0"
