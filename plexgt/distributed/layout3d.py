"""Where every block of a 3D tensor-parallel GCN lives: pure functions of the grid and a rank.

For layer l with axis roles (a, b, c) = ``layer_roles(l)`` and this rank's coordinates
(ia, ib, ic) on those axes:

====================  ===========================================  ==========================
tensor                shape on the rank                            split
====================  ===========================================  ==========================
input H               [ceil(N/Ga), d_in/(Gb*Gc)]                   rows over a, dims over b·c
adjacency block       [ceil(N/Gc), ceil(N/Ga)]                     rows over c, columns over a
weight W (din×dout)   [d_in/(Gb*Gc), d_out/Ga]                     rows over b·c, columns over a
bias                  [d_out/(Ga*Gb)]                              over a·b (copies over c)
output                [ceil(N/Gc), d_out/(Ga*Gb)]                  rows over c, dims over a·b
====================  ===========================================  ==========================

"dims over b·c" means flat block ``ib*Gc + ic`` of ``Gb*Gc`` equal blocks. The output split
(rows over c, dims over a·b) is the next layer's input split, because the roles rotate
(a', b', c') = (c, a, b); so layers chain with no redistribution.

Each layer runs in one of two orders with the same input, adjacency, weight-shard shape and
output blocks, so the choice is free per layer:

* ``aggregate_first`` (Â·H)·W: the SpMM runs on d_in/Gb columns. Cheaper when d_in <= d_out.
* ``gemm_first`` Â·(H·W): the SpMM runs on d_out/Gb columns; for a wide input (bag-of-words
  features, d_in in the thousands, hidden 64) this removes nearly all SpMM work, as PyG's
  GCNConv and DGL's GraphConv do by multiplying first when d_in > d_out. The W shard then
  holds the columns of W in ``gemm_first_columns`` order, so that the two reduce-scatters
  (over b, then over a) leave each rank exactly the natural output block ia*Gb + ib.

Dimensions are padded: d_in of layer 0 to a multiple of Gb*Gc, every later d to a multiple of
the previous layer's Ga*Gb; node blocks are ceil(N/G) long with short or empty trailing blocks.
Padding is zero and masked, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexgt.distributed.grid import Grid3D, block_bounds, layer_roles, padded

Range = tuple[int, int]


@dataclass(frozen=True)
class LayerLayout:
    """The blocks one rank holds at one layer (see the module table)."""

    layer: int
    roles: tuple[str, str, str]
    """(a, b, c) grid axes."""
    g: tuple[int, int, int]
    """(Ga, Gb, Gc)."""
    i: tuple[int, int, int]
    """(ia, ib, ic): this rank's coordinates along a, b, c."""
    n: int
    """Nodes N."""
    d_in: int
    """Padded input width."""
    d_out: int
    """Padded output width."""
    d_in_true: int
    """Unpadded input width."""
    d_out_true: int
    """Unpadded output width."""
    order: str = "aggregate_first"
    """'aggregate_first' ((Â·H)·W) or 'gemm_first' (Â·(H·W)); see the module docstring."""
    kind: str = "conv"
    """'conv' (Â·H·W, a GCN layer) or 'linear' (H·W, node-wise: an input projection or a
    classifier): the same blocks with Â's block replaced by the identity's, [rows over c,
    cols over a] in the layer's output x input orders, so the chain's layouts rotate
    alike."""

    @property
    def rows(self) -> Range:
        """Output node range (block ic of Gc), in the layer's output order."""
        return block_bounds(self.n, self.g[2], self.i[2])

    @property
    def cols(self) -> Range:
        """Input node range (block ia of Ga), in the layer's input order."""
        return block_bounds(self.n, self.g[0], self.i[0])

    @property
    def rows_pad(self) -> int:
        return padded(self.n, self.g[2]) // self.g[2]

    @property
    def cols_pad(self) -> int:
        return padded(self.n, self.g[0]) // self.g[0]

    @property
    def in_cols(self) -> Range:
        """Input feature columns held (flat block ib*Gc+ic of Gb*Gc); also the W shard rows."""
        w = self.d_in // (self.g[1] * self.g[2])
        k = self.i[1] * self.g[2] + self.i[2]
        return k * w, (k + 1) * w

    @property
    def gathered_cols(self) -> Range:
        """Input feature columns after the all-gather over c (block ib of Gb)."""
        w = self.d_in // self.g[1]
        return self.i[1] * w, (self.i[1] + 1) * w

    @property
    def w_cols(self) -> Range:
        """W shard columns (block ia of Ga), of W's columns taken in ``w_column_order``."""
        w = self.d_out // self.g[0]
        return self.i[0] * w, (self.i[0] + 1) * w

    @property
    def out_cols(self) -> Range:
        """Output feature columns held (flat block ia*Gb+ib of Ga*Gb); also the bias shard."""
        w = self.d_out // (self.g[0] * self.g[1])
        k = self.i[0] * self.g[1] + self.i[1]
        return k * w, (k + 1) * w

    @property
    def w_column_order(self) -> list[int]:
        """The padded d_out columns of W in the order the W shards split them.

        Natural for aggregate_first. For gemm_first, the blocks of width d_out/(Ga·Gb) go
        b-major: (ib=0: ia=0..Ga-1), (ib=1: ...), ...; the reduce-scatter over b hands rank ib
        its Ga blocks, the one over a hands rank ia block ia*Gb + ib.
        """
        if self.order == "aggregate_first":
            return list(range(self.d_out))
        ga, gb, _ = self.g
        w = self.d_out // (ga * gb)
        return [(ia * gb + ib) * w + j for ib in range(gb) for ia in range(ga) for j in range(w)]

    @property
    def matrix(self) -> str:
        """'A1' on even layers (Q order in, P order out), 'A2' on odd layers (P in, Q out)."""
        return "A1" if self.layer % 2 == 0 else "A2"

    @property
    def out_order(self) -> str:
        return "P" if self.layer % 2 == 0 else "Q"


def row_blocks(rows: int, block_rows: int | None) -> list[Range]:
    """The row blocks of blocked aggregation: ``block_rows`` each (all rows when None)."""
    step = max(1, block_rows or rows or 1)
    return [(r, min(rows, r + step)) for r in range(0, max(rows, 1), step)]


def padded_dims(grid: Grid3D, dims: list[int]) -> list[int]:
    """Padded widths [d_0, ..., d_L] for layer widths ``dims`` (input first, classes last)."""
    out = []
    for l, d in enumerate(dims):
        if l == 0:
            _, b, c = layer_roles(0)
            out.append(padded(d, grid.dim(b) * grid.dim(c)))
        else:
            a, b, _ = layer_roles(l - 1)
            out.append(padded(d, grid.dim(a) * grid.dim(b)))
    return out


ORDERS = ("aggregate_first", "gemm_first")


def layer_orders(dims: list[int], order: str = "auto") -> list[str]:
    """Per layer order: ``order`` for all, or 'auto': gemm_first where the layer narrows
    (d_out < d_in), so the SpMM always runs on the narrower side."""
    if order == "auto":
        return ["gemm_first" if b < a else "aggregate_first" for a, b in zip(dims[:-1], dims[1:])]
    if order not in ORDERS:
        raise ValueError(f"GCN layer order '{order}' is not one of auto, {', '.join(ORDERS)}")
    return [order] * (len(dims) - 1)


def layer_layouts(grid: Grid3D, rank: int, n: int, dims: list[int],
                  order: str = "aggregate_first", first_order: str | None = None,
                  kinds: list[str] | None = None) -> list[LayerLayout]:
    """One :class:`LayerLayout` per layer for ``rank`` (``len(dims) - 1`` layers); ``order``
    as in :func:`layer_orders`, layer 0's replaced by ``first_order`` when given (sparse
    input features run gemm_first whatever the widths); ``kinds``: each layer's kind
    (default all 'conv')."""
    coords = dict(zip("xyz", grid.coords(rank)))
    ext = dict(zip("xyz", grid.shape))
    pd = padded_dims(grid, dims)
    orders = layer_orders(dims, order)
    if first_order is not None:
        orders[0] = layer_orders(dims[:2], first_order)[0]
    out = []
    for l in range(len(dims) - 1):
        roles = layer_roles(l)
        out.append(
            LayerLayout(
                layer=l,
                roles=roles,
                g=(ext[roles[0]], ext[roles[1]], ext[roles[2]]),
                i=tuple(coords[r] for r in roles),
                n=n,
                d_in=pd[l],
                d_out=pd[l + 1],
                d_in_true=dims[l],
                d_out_true=dims[l + 1],
                order=orders[l],
                kind=kinds[l] if kinds is not None else "conv",
            )
        )
    return out


def output_plane(roles: tuple[str, str, str]) -> str:
    """Name of the grid plane spanned by roles a and b (the class shards of a row block)."""
    a, b, _ = roles
    for p in ("xy", "yz", "zx"):
        if set(p) == {a, b}:
            return p
    raise ValueError(f"axes {a} and {b} span no plane")
