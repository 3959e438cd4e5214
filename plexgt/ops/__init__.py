"""Single-rank sparse kernels: CSR graphs, sparse multi-head attention, GCN propagation."""

from plexgt.ops.attention import dense_attention_reference, sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm, gcn_spmm

__all__ = ["CSRGraph", "dense_attention_reference", "gcn_norm", "gcn_spmm", "sparse_attention"]
