"""Counter-based randomness: dropout masks that are a pure function of *which* entry they drop.

A mask drawn from a stream (``torch.rand``) depends on how many numbers the stream gave out
before, so a rank holding rows 500..999 of a [N, d] activation draws other numbers than the
single process does for those rows, and the loss curve depends on the grid, the world size and
the strategy. Here the keep/drop decision of entry (row i, column j) at dropout site ``site``
of training step ``step`` is ``hash(seed, step, site, i, j) >= p·2³²`` with i the node's
*original* id and j the global column: every layout that holds the entry draws the same
decision, so every grid gives the single-process curve, and a resumed run (same step
counter) the uninterrupted one.

The hash is Wellons' ``lowbias32`` finaliser, applied to the row's and the column's key and
once more to their xor. It runs as int64 tensor arithmetic on 32-bit values with every
multiplication split into 16-bit halves, so nothing overflows: the bits are defined by the
integer ops alone and are the same on any device and build (CPU, CUDA, ROCm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plexgt.ops import dropout_triton, native

Tensor = torch.Tensor

M32 = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x846CA68B


def mix32(x: int) -> int:
    """lowbias32 of a Python int (the scalar keys: seed, step, site)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def _mul32_(x: Tensor, c: int) -> Tensor:
    """x <- x·c mod 2³² in place, x int64 in [0, 2³²): c split into 16-bit halves keeps every
    product under 2⁴⁹."""
    hi = x * (c >> 16)
    x.mul_(c & 0xFFFF)
    return x.add_(hi.bitwise_and_(0xFFFF).bitwise_left_shift_(16)).bitwise_and_(M32)


def mix32_(x: Tensor) -> Tensor:
    """lowbias32 of every element in place: x int64 in [0, 2³²)."""
    x.bitwise_xor_(x >> 16)
    _mul32_(x, _C1)
    x.bitwise_xor_(x >> 15)
    _mul32_(x, _C2)
    return x.bitwise_xor_(x >> 16)


def threshold(p: float) -> int:
    """The 32-bit cut: an entry is kept when its hash is >= this (drop probability p)."""
    return min(1 << 32, round(p * (1 << 32)))


@dataclass(frozen=True)
class CounterRNG:
    """The dropout randomness of one training step on one rank.

    ``rows`` [n] int64: the original node id of each row this rank's activations hold (a
    padded row gets an id >= N; what it draws never reaches a real node). ``seed`` and
    ``step`` select the step's draw; a forward numbers its dropout sites and passes ``site``.
    """

    seed: int
    step: int
    rows: Tensor

    def _key(self, site: int, salt: int) -> int:
        k = mix32(self.seed ^ mix32((self.seed >> 32) ^ mix32(self.step ^ mix32(site))))
        return mix32(k ^ salt)

    def _row_keys(self, site: int, rows: Tensor) -> Tensor:
        r = rows.to(torch.int64)
        h = mix32_(r.bitwise_and(M32).bitwise_xor_(self._key(site, 0x5EED)))
        return mix32_(h.bitwise_xor_(r >> 32))

    def _col_keys(self, site: int, col0: int, m: int, device: torch.device) -> Tensor:
        c = torch.arange(col0, col0 + m, dtype=torch.int64, device=device)
        return mix32_(c.bitwise_xor_(self._key(site, 0xC011)))

    def keep(self, site: int, m: int, col0: int, p: float, device: torch.device) -> Tensor:
        """[n, m] bool: entries (rows, col0 + j) that dropout at ``site`` keeps."""
        h = self._row_keys(site, self.rows.to(device))[:, None] ^ \
            self._col_keys(site, col0, m, device)[None, :]
        return mix32_(h) >= threshold(p)

    def multipliers(self, site: int, m: int, col0: int, p: float, dtype: torch.dtype,
                    device: torch.device, use_native: bool = True) -> Tensor:
        """[n, m] of 1/(1-p) where :meth:`keep` keeps, else 0, in ``dtype``. On CPU one pass
        of the compiled kernel (the tensor form makes ~20 int64 passes over [n, m]: it was
        45% of a GT step on 2 cores), on a GPU one Triton pass (:mod:`~plexgt.ops.
        dropout_triton`, the same bits); elsewhere, or without the kernels, the tensor form."""
        scale = 1.0 / (1.0 - p)
        if use_native and dropout_triton.serves(device, dtype) and p < 1.0:
            return dropout_triton.multipliers(self._row_keys(site, self.rows.to(device)),
                                              self._col_keys(site, col0, m, device),
                                              threshold(p), p, dtype)
        mod = native.load() if use_native and device.type == "cpu" else None
        if mod is not None and dtype in (torch.float32, torch.float64):
            rk = self._row_keys(site, self.rows.to(device)).contiguous()
            ck = self._col_keys(site, col0, m, device)
            return mod.dropout_scale(rk, ck, threshold(p), scale,
                                     torch.empty(0, dtype=dtype))
        return self.keep(site, m, col0, p, device).to(dtype).mul_(scale)

    def keep_pairs(self, site: int, row_index: Tensor, cols: Tensor, p: float) -> Tensor:
        """[E] bool for the entries (rows[row_index[e]], cols[e]) (the stored entries of a
        sparse matrix): the same decisions :meth:`keep` makes for them."""
        dev = row_index.device
        hr = self._row_keys(site, self.rows.to(dev))[row_index]
        c = cols.to(torch.int64)
        hc = mix32_(c.bitwise_xor(self._key(site, 0xC011)))
        return mix32_(hr.bitwise_xor_(hc)) >= threshold(p)

    def uniform(self, site: int, m: int, col0: int, device: torch.device) -> Tensor:
        """[n, m] float64 in (0, 1): the hash of entry (rows, col0 + j) at ``site``."""
        h = self._row_keys(site, self.rows.to(device))[:, None] ^ \
            self._col_keys(site, col0, m, device)[None, :]
        return (mix32_(h).to(torch.float64) + 0.5) / float(1 << 32)

    def normal(self, site: int, m: int, col0: int, device: torch.device) -> Tensor:
        """[n, m] float64 standard normals of entries (rows, col0 + j) (Box-Muller of the
        uniforms at ``site`` and ``site + 1``): a parameter initialised from these is the same
        on every partition of its rows and columns."""
        u1, u2 = self.uniform(site, m, col0, device), self.uniform(site + 1, m, col0, device)
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)

    def dropout(self, x: Tensor, p: float, site: int, col0: int = 0) -> Tensor:
        """Inverted dropout of x [n, m], columns col0..col0+m of the global activation."""
        if p <= 0.0:
            return x
        if x.shape[0] != self.rows.shape[0]:
            raise ValueError(f"dropout on {x.shape[0]} rows with ids for {self.rows.shape[0]}")
        if p >= 1.0:
            return x * 0
        if dropout_triton.serves(x.device, x.dtype):  # one pass, multipliers recomputed
            return dropout_triton.dropout(x, self._row_keys(site, self.rows.to(x.device)),
                                          self._col_keys(site, col0, x.shape[1], x.device),
                                          threshold(p), p)
        return x * self.multipliers(site, x.shape[1], col0, p, x.dtype, x.device)

    def dropout_values(self, values: Tensor, row_index: Tensor, cols: Tensor, p: float,
                       site: int) -> Tensor:
        """Inverted dropout of a sparse matrix's stored ``values`` [E] at (row_index, cols)."""
        if p <= 0.0:
            return values
        if p < 1.0 and dropout_triton.serves(values.device, values.dtype):
            return dropout_triton.dropout_pairs(
                values, self._row_keys(site, self.rows.to(values.device)), row_index, cols,
                self._key(site, 0xC011), threshold(p), p)
        keep = self.keep_pairs(site, row_index, cols, p)
        return values * keep.to(values.dtype).mul_(1.0 / (1.0 - p)) if p < 1.0 else values * 0
