"""Compressed sparse rows for message passing: ``A[dst, src]``, rows are destinations.

Every kernel in :mod:`plexgt.ops` takes a :class:`CSRGraph`. It is rectangular on purpose: a
distributed rank holds a block of destination rows against all (or a block of) source columns,
and the same kernels must run on that block unchanged. The transpose (``Aᵀ``, i.e. CSC of ``A``)
is what every backward pass needs (gradients flow dst -> src), so it is built once and cached,
together with the edge permutation that carries per-edge values from CSR order to transposed
order.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch

Tensor = torch.Tensor


def sparse_csr(indptr: Tensor, indices: Tensor, values: Tensor, shape: tuple[int, int]
               ) -> Tensor:
    """A torch sparse CSR tensor of already-valid (sorted, in range) index arrays, without the
    invariant check and without torch's "in beta" warning (printed once per process by every
    rank otherwise; plexgt uses the format knowingly)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=False)


class CSRGraph:
    """A ``[num_rows, num_cols]`` sparse matrix in CSR form with int64 index arrays.

    ``indptr`` [num_rows + 1] and ``indices`` [E] (column = source node) live on one device;
    ``values`` [E] is optional (None means a structural 0/1 pattern, as attention uses).
    Column indices inside a row are sorted and unique (the constructors guarantee it).
    Build with :meth:`from_coo` or :meth:`from_scipy`; the plain constructor trusts its input.
    """

    def __init__(
        self,
        indptr: Tensor,
        indices: Tensor,
        num_rows: int,
        num_cols: int,
        values: Tensor | None = None,
    ) -> None:
        if indptr.dtype != torch.int64 or indices.dtype != torch.int64:
            raise TypeError("CSRGraph indptr and indices must be int64")
        if indptr.shape != (num_rows + 1,):
            raise ValueError(f"indptr has shape {tuple(indptr.shape)}, expected ({num_rows + 1},)")
        if values is not None and values.shape != indices.shape:
            raise ValueError("values must have one entry per edge")
        self.indptr = indptr
        self.indices = indices
        self.num_rows = int(num_rows)
        self.num_cols = int(num_cols)
        self.values = values
        self._row: Tensor | None = None
        self._transpose: CSRGraph | None = None
        self._transpose_perm: Tensor | None = None
        self._csr_cache: dict[torch.dtype, Tensor] = {}
        self._blocks: dict[int, list[tuple[int, int, CSRGraph]]] = {}
        self._index32: tuple[Tensor, Tensor] | None = None
        self._transpose_perm32: Tensor | None = None

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def from_coo(
        cls,
        dst: Tensor | np.ndarray,
        src: Tensor | np.ndarray,
        num_rows: int,
        num_cols: int | None = None,
        values: Tensor | np.ndarray | None = None,
        duplicates: str = "merge",
    ) -> CSRGraph:
        """Build from edges ``src -> dst`` ([E] each): row = dst, column = src.

        ``duplicates='merge'`` collapses repeated (dst, src) pairs (summing their values, if
        any); ``'error'`` raises ValueError instead, for callers that promise a simple graph and
        want a broken promise caught early.
        """
        if duplicates not in ("merge", "error"):
            raise ValueError("duplicates must be 'merge' or 'error'")
        num_cols = num_rows if num_cols is None else num_cols
        dst_t = torch.as_tensor(dst, dtype=torch.int64).reshape(-1).cpu()
        src_t = torch.as_tensor(src, dtype=torch.int64).reshape(-1).cpu()
        if dst_t.shape != src_t.shape:
            raise ValueError("dst and src must have the same length")
        if dst_t.numel():
            if int(dst_t.min()) < 0 or int(dst_t.max()) >= num_rows:
                raise ValueError(f"a destination id lies outside [0, {num_rows})")
            if int(src_t.min()) < 0 or int(src_t.max()) >= num_cols:
                raise ValueError(f"a source id lies outside [0, {num_cols})")
        key = dst_t * num_cols + src_t
        ukey, inverse = torch.unique(key, sorted=True, return_inverse=True)
        if ukey.numel() != key.numel() and duplicates == "error":
            raise ValueError(f"{key.numel() - ukey.numel()} duplicate edge(s) in COO input")
        vals = None
        if values is not None:
            v = torch.as_tensor(values).reshape(-1).cpu()
            if v.shape != key.shape:
                raise ValueError("values must have one entry per edge")
            vals = torch.zeros(ukey.numel(), dtype=v.dtype).index_add_(0, inverse, v)
        rows = ukey // num_cols
        indices = ukey % num_cols
        counts = torch.bincount(rows, minlength=num_rows)
        indptr = torch.zeros(num_rows + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        return cls(indptr, indices, num_rows, num_cols, vals)

    @classmethod
    def from_scipy(
        cls, mat: sp.spmatrix | sp.sparray, duplicates: str = "merge", keep_values: bool = True
    ) -> CSRGraph:
        """Build from a scipy sparse matrix whose entry [dst, src] is the edge src -> dst."""
        coo = sp.coo_matrix(mat)
        vals = coo.data if keep_values else None
        return cls.from_coo(coo.row, coo.col, coo.shape[0], coo.shape[1], vals, duplicates)

    # ---------------------------------------------------------------------------- accessors
    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.num_cols)

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def row(self) -> Tensor:
        """[E] destination row of each edge (cached): the gather index for per-row results."""
        if self._row is None:
            counts = self.indptr[1:] - self.indptr[:-1]
            self._row = torch.repeat_interleave(
                torch.arange(self.num_rows, device=self.device), counts,
                output_size=self.num_edges,
            )
        return self._row

    def degrees(self) -> Tensor:
        """[num_rows] int64 number of stored entries per row (in-degree of each destination)."""
        return self.indptr[1:] - self.indptr[:-1]

    def with_values(self, values: Tensor | None) -> CSRGraph:
        """The same pattern with other per-edge values (shares index arrays and the transpose
        structure, so no re-sorting happens)."""
        g = CSRGraph(self.indptr, self.indices, self.num_rows, self.num_cols, values)
        g._row = self._row
        g._index32 = self._index32
        g._transpose_perm32 = self._transpose_perm32
        if self._transpose is not None:
            perm = self.transpose_perm
            tv = None if values is None else values[perm]
            t = self._transpose
            gt = CSRGraph(t.indptr, t.indices, t.num_rows, t.num_cols, tv)
            gt._row, gt._index32, gt._transpose = t._row, t._index32, g
            g._transpose, g._transpose_perm = gt, perm
        return g

    def transpose(self) -> CSRGraph:
        """``Aᵀ`` [num_cols, num_rows] in CSR form (= CSC of A), built once and cached.

        Its values (if any) are ``values[transpose_perm]``.
        """
        if self._transpose is None:
            col = self.indices
            # stable sort by column keeps rows ascending inside each transposed row
            perm = torch.sort(col, stable=True).indices if col.numel() else col.clone()
            counts = torch.bincount(col, minlength=self.num_cols)
            indptr = torch.zeros(self.num_cols + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(counts, 0, out=indptr[1:])
            tvals = None if self.values is None else self.values[perm]
            t = CSRGraph(indptr, self.row[perm], self.num_cols, self.num_rows, tvals)
            t._transpose = self  # its transpose_perm (the inverse of perm) is built on demand
            self._transpose = t
            self._transpose_perm = perm
        return self._transpose

    @property
    def transpose_perm(self) -> Tensor:
        """[E] int64: transposed edge j is CSR edge ``transpose_perm[j]``
        (so ``values_T = values[transpose_perm]``)."""
        t = self.transpose()
        if self._transpose_perm is None:  # self was built as the transpose of t
            tp = t.transpose_perm
            self._transpose_perm = torch.empty_like(tp).scatter_(
                0, tp, torch.arange(tp.numel(), device=tp.device)
            )
        return self._transpose_perm

    def row_slice(self, start: int, stop: int) -> CSRGraph:
        """Rows [start, stop) as a rectangular [stop-start, num_cols] graph (index views)."""
        e0, e1 = int(self.indptr[start]), int(self.indptr[stop])
        vals = None if self.values is None else self.values[e0:e1]
        return CSRGraph(
            self.indptr[start : stop + 1] - e0, self.indices[e0:e1], stop - start,
            self.num_cols, vals,
        )

    def row_blocks(self, block_rows: int) -> list[tuple[int, int, CSRGraph]]:
        """``(start, stop, block)`` for consecutive row blocks of ``block_rows`` rows (cached,
        so each block's transpose is built once per graph)."""
        if block_rows <= 0:
            raise ValueError("block_rows must be positive")
        if block_rows not in self._blocks:
            self._blocks[block_rows] = [
                (s, min(s + block_rows, self.num_rows),
                 self.row_slice(s, min(s + block_rows, self.num_rows)))
                for s in range(0, self.num_rows, block_rows)
            ]
        return self._blocks[block_rows]

    def _fits_int32(self) -> bool:
        return max(self.num_edges, self.num_rows, self.num_cols) < 2**31 - 1

    def compact_index(self) -> tuple[Tensor, Tensor]:
        """(indptr, indices) for the compiled CPU kernels and the fused GPU kernel: int32 copies
        (cached) when E fits, on every device, else the int64 arrays. Half the index bytes of
        every pass (on a GPU the index reads are a fifth of a d' = 16 bf16 gather's bytes),
        and what MKL wants anyway."""
        if not self._fits_int32():
            return self.indptr, self.indices
        if self._index32 is None:
            self._index32 = (self.indptr.to(torch.int32), self.indices.to(torch.int32))
        return self._index32

    def compact_transpose_perm(self) -> Tensor:
        """:attr:`transpose_perm` in the dtype of :meth:`compact_index` (cached)."""
        if not self._fits_int32():
            return self.transpose_perm
        if self._transpose_perm32 is None:
            self._transpose_perm32 = self.transpose_perm.to(torch.int32)
        return self._transpose_perm32

    def csr_tensor(self, values: Tensor) -> Tensor:
        """A torch sparse CSR tensor with this pattern and the given [E] values (no copy).

        On CPU the index arrays are int32 copies (cached): torch's MKL path converts int64
        indices to int32 on every product otherwise, which costs as much as a small SpMM. On a
        GPU they stay int64 (torch's cuSPARSE path as it was; the fused kernel, which serves
        GPUs, reads :meth:`compact_index`).
        """
        indptr, indices = (self.compact_index() if self.device.type == "cpu"
                           else (self.indptr, self.indices))
        return sparse_csr(indptr, indices, values, (self.num_rows, self.num_cols))

    def weighted_csr(self, dtype: torch.dtype) -> Tensor:
        """The stored values as a torch sparse CSR tensor of ``dtype`` (cached per dtype)."""
        if self.values is None:
            raise ValueError("this CSRGraph has no edge values")
        if dtype not in self._csr_cache:
            self._csr_cache[dtype] = self.csr_tensor(self.values.to(dtype))
        return self._csr_cache[dtype]

    # ------------------------------------------------------------------------------ movement
    def to(self, device: torch.device | str) -> CSRGraph:
        """A copy on ``device`` (the cached transpose travels with it)."""
        device = torch.device(device)
        if device == self.device:
            return self

        def mv(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        g = CSRGraph(
            self.indptr.to(device), self.indices.to(device), self.num_rows, self.num_cols,
            mv(self.values),
        )
        g._row = mv(self._row)
        if self._transpose is not None:
            t = self._transpose
            gt = CSRGraph(t.indptr.to(device), t.indices.to(device), t.num_rows, t.num_cols,
                          mv(t.values))
            gt._row = mv(t._row)
            gt._transpose = g
            gt._transpose_perm = mv(t._transpose_perm)
            g._transpose = gt
            g._transpose_perm = mv(self._transpose_perm)
        return g

    def to_scipy(self) -> sp.csr_matrix:
        """Host copy as scipy CSR (values 1.0 when the graph is structural)."""
        vals = (
            np.ones(self.num_edges) if self.values is None
            else self.values.detach().cpu().numpy()
        )
        return sp.csr_matrix(
            (vals, self.indices.cpu().numpy(), self.indptr.cpu().numpy()), shape=self.shape
        )

    def to_dense(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """[num_rows, num_cols] dense matrix (tests and tiny graphs only)."""
        out = torch.zeros(self.num_rows, self.num_cols, dtype=dtype, device=self.device)
        vals = (
            torch.ones(self.num_edges, dtype=dtype, device=self.device)
            if self.values is None else self.values.to(dtype)
        )
        out[self.row, self.indices] = vals
        return out

    def __repr__(self) -> str:
        w = "weighted" if self.values is not None else "structural"
        return (f"CSRGraph({self.num_rows}x{self.num_cols}, E={self.num_edges}, {w}, "
                f"device={self.device})")
