"""Block layouts of the 3D tensor-parallel GCN: pure rank arithmetic, no MPI."""

from __future__ import annotations

import pytest

from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.distributed.layout3d import layer_layouts, layer_orders
from plexgt.plan.plexus_cost import Coefficients, estimate, plexus_step_bytes

GRIDS = [Grid3D(1, 1, 1), Grid3D(2, 1, 1), Grid3D(1, 3, 1), Grid3D(1, 1, 2), Grid3D(2, 2, 1),
         Grid3D(3, 2, 1), Grid3D(2, 1, 3), Grid3D(2, 2, 2)]
DIMS = [11, 7, 9, 5]


def test_auto_order_multiplies_first_where_a_layer_narrows():
    assert layer_orders([8415, 64, 64, 5]) == ["gemm_first", "aggregate_first", "gemm_first"]
    assert layer_orders([16, 64, 5], "aggregate_first") == ["aggregate_first"] * 2
    with pytest.raises(ValueError, match="'sideways' is not one of"):
        layer_orders([4, 4], "sideways")


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("order", ["aggregate_first", "gemm_first"])
def test_layers_chain_and_gemm_first_reduce_scatters_land_on_the_output_block(grid, order):
    every = {r: layer_layouts(grid, r, 23, DIMS, order) for r in range(grid.size)}
    for lays in every.values():
        for lay, nxt in zip(lays, lays[1:]):
            # output split of layer l is the input split of layer l+1: no redistribution
            assert lay.rows == nxt.cols and lay.out_cols == nxt.in_cols
        for lay in lays:
            perm = lay.w_column_order
            assert sorted(perm) == list(range(lay.d_out))
            ga, gb, _ = lay.g
            ia, ib, _ = lay.i
            # reduce-scatter over b keeps chunk ib of the W-ordered columns, then the one over
            # a keeps chunk ia of that: it must be the natural output block ia*Gb + ib
            after_b = perm[slice(*block_bounds(lay.d_out, gb, ib))]
            after_a = after_b[slice(*block_bounds(len(after_b), ga, ia))]
            if order == "gemm_first":
                assert after_a == list(range(*lay.out_cols))
            else:
                assert perm[slice(*lay.w_cols)] == list(range(*lay.w_cols))
    # every output column block is held, once per c coordinate
    for l in range(len(DIMS) - 1):
        held = sorted({every[r][l].out_cols for r in every})
        assert held[0][0] == 0 and held[-1][1] == every[0][l].d_out
        assert all(x[1] == y[0] for x, y in zip(held, held[1:]))


def test_gemm_first_moves_and_computes_less_on_a_wide_input():
    grid, n, nnz = Grid3D(2, 2, 2), 34_493, 530_417
    dims = [8415, 64, 5]
    agg = plexus_step_bytes(grid, 0, n, dims, 4, order="aggregate_first")
    gem = plexus_step_bytes(grid, 0, n, dims, 4, order="gemm_first")
    assert sum(gem.values()) < sum(agg.values())
    coef = Coefficients()
    e_agg = estimate(grid, n, nnz, dims, 4, coef, order="aggregate_first")
    e_auto = estimate(grid, n, nnz, dims, 4, coef, order="auto")
    assert e_auto.compute_s < e_agg.compute_s and e_auto.bytes_per_rank < e_agg.bytes_per_rank
