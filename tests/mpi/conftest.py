"""Multi-rank tests: run as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``.

Every rank runs the same tests in the same order (collectives must match). How the ranks
report, and how one rank's failure is kept from spreading to the next tests, is
:mod:`tests.mpi.harness` (its hooks are taken here). With one rank (plain ``pytest``) it all
runs as a trivial world of size 1.
"""

from __future__ import annotations

import os

import pytest
from mpi4py import MPI

from plexgt.distributed.grid import factorizations, parse_grid

from .harness import (  # noqa: F401 - pytest takes a conftest's hooks by name
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_unconfigure,
)

WORLD = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()

# at 4, 6 and 8 ranks (6, 9 and 10 factorisations, oversubscribed 2-4x on the CI's 2 cores)
# the model-level tests run on these: every axis split > 1 in some grid, a 2D or 3D grid, and
# the shapes the issues name; PLEXGT_ALL_GRIDS=1 runs every factorisation
REPRESENTATIVE = {4: ("2x2x1", "1x2x2", "4x1x1", "1x1x4"),
                  6: ("3x2x1", "1x2x3", "2x1x3", "6x1x1"),
                  8: ("2x2x2", "4x2x1", "1x2x4", "8x1x1")}
# and the 20-step training curves (the slowest model tests) on two of them at 4 ranks, on
# one at 6 and 8 (a 2D and a 3D grid; the step tests cover the rest)
CURVES = {4: ("2x2x1", "1x1x4"), 6: ("1x2x3",), 8: ("2x2x2",)}
# and each of 4, 6 and 8 ranks once in another rank order (X or Z innermost instead of Y):
# the order moves which ranks hold which blocks, never the result
REORDERED = {4: ("2x2x1:xyz",), 6: ("3x2x1:zxy",), 8: ("2x2x2:zyx",)}
ALL_GRIDS = os.environ.get("PLEXGT_ALL_GRIDS") == "1"
ROW_PARTITIONED = pytest.mark.skipif(
    WORLD > 6 and not ALL_GRIDS,
    reason="row-partitioned attention runs up to 6 ranks (PLEXGT_ALL_GRIDS=1: at 8 too): 8 "
           "ranks (4x oversubscribed here) run what needs a 3D grid")
"""The row-partitioned models' tests (gt, super nodes, the rings, gps's 1D path): their
partitions are rows (and heads) of one group, which 3 and 6 ranks already split unevenly and
3 and 4 ranks leave a rank outside; at 8 ranks the suite keeps the collectives, the 3D GCN and
gps's 3D path, whose 2x2x2 grid no smaller world has."""


def grids_for_world(every: bool = True, curves: bool = False) -> list:
    """Gx x Gy x Gz of the current world size (parametrises grid tests): all of them, or with
    ``every=False`` (whole-model tests) the representative ones at 6 and 8 ranks, or with
    ``curves=True`` (training curves) two of those."""
    grids = factorizations(WORLD)
    other = [] if curves else [parse_grid(t) for t in REORDERED.get(WORLD, ())]
    if every or ALL_GRIDS or WORLD not in REPRESENTATIVE:
        return grids + other
    keep = CURVES[WORLD] if curves else REPRESENTATIVE[WORLD]
    return [g for g in grids if str(g) in keep] + other


@pytest.fixture(scope="session")
def dist_ctx():
    from plexgt.distributed.bootstrap import init_distributed, shutdown

    ctx = init_distributed("gloo", timeout_s=120, abort_on_error=False)
    yield ctx
    shutdown(ctx)


@pytest.fixture(scope="session")
def grid_groups(dist_ctx):
    """``grid_groups(grid)``: the GridGroups of ``grid``, built once per session and grid.

    Groups are never freed by torch until teardown, and each gloo group holds threads and
    sockets: rebuilding them in every test oversubscribes a small machine badly.
    """
    from plexgt.distributed.grid import build_groups

    return _cached(lambda grid: build_groups(grid, dist_ctx.rank, dist_ctx.world_size))


@pytest.fixture(scope="session")
def mesh_groups(dist_ctx):
    """``mesh_groups(mesh)``: the MeshGroups of a dp x pp x cp mesh, built once per session
    and mesh (as :func:`grid_groups`: gloo groups hold threads and sockets).

    Built when a test first asks: :func:`plexgt.distributed.mesh.build_mesh_groups` names
    its groups alike on every rank whatever groups earlier tests made (test_gt_dist's
    world-minus-one groups, gp_2d's sub-groups); tests/mpi/test_pipeline.py checks it.
    """
    from plexgt.distributed.mesh import build_mesh_groups

    return _cached(lambda mesh: build_mesh_groups(mesh, dist_ctx.rank, dist_ctx.world_size))


def _cached(build):
    """``build`` memoised per argument for the session (groups are built once)."""
    cache = {}

    def get(key):
        if key not in cache:
            cache[key] = build(key)
        return cache[key]

    return get


def prepare_on_rank0(tmp_path_factory, name: str, make_graph, **options):
    """A PreparedGraph every rank opens: rank 0 prepares ``make_graph()`` (symmetrised, no
    progress output, ``options`` as PrepOptions fields) while the others sleep."""
    from plexgt.data.loader import PreparedGraph
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.distributed.mpiwait import arrive

    comm = MPI.COMM_WORLD
    path = None
    if comm.rank == 0:
        path = tmp_path_factory.mktemp(name) / "prep"
        prepare(MemorySource(make_graph()), PrepOptions(out=path, symmetrize=True,
                                                        progress=False, **options))
    arrive(comm)
    return PreparedGraph(comm.bcast(path))

