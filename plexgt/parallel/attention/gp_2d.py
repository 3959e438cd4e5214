"""GP-2D: heads inside a group of a ranks (all-to-all), a ring across the b = p/a groups.

p = a·b ranks; group g holds the rows of its a ranks, [a·N/p] (contiguous in Q order), and
rank k of the group (a 'heads' axis, meant to sit inside a node) works on h_k of the h heads
(h//a, one more on the first h%a ranks). Ranks with the same k form the 'ring' axis, stride a.

forward
    Q, K, V [N/p, h, d'] --all-to-all over heads--> [a·N/p, h_k, d']   (as GP-A2A, in a group)
    ring attention across the b groups for those heads (:mod:`~plexgt.parallel.attention.ring`):
    the group's pattern rows [a·N/p, N] cut into b column blocks, K/V blocks rotating
    Y [a·N/p, h_k, d'] --all-to-all--> [N/p, h, d']
backward: the ring's backward, the adjoint all-to-alls

Why: GP-A2A stores the whole graph on every rank and has nothing for more ranks than heads;
GP-Ring keeps all heads on every rank. Here a rank stores its group's rows (E/b edges), holds
K/V of 2·N·d/p, and the ring's traffic shrinks with a. a = 1 is GP-Ring, b = 1 is GP-A2A.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from plexgt.distributed.collectives import (
    Comm,
    CommLedger,
    CommOp,
    groups_held,
    partition_group,
    world_bound_to_device,
)
from plexgt.parallel.attention.heads import heads_to_nodes, my_heads, nodes_to_heads
from plexgt.parallel.attention.ring import (
    Ring,
    chunk_bounds,
    ring_attention,
    ring_comm,
    ring_graph_bytes,
    ring_memory_elems,
    ring_shard,
)
from plexgt.parallel.attention.strategy import (
    AttentionProblem,
    AttentionShard,
    AttentionStrategy,
    KernelWork,
    MemoryEstimate,
    SuperKV,
    heads_of,
)

Tensor = torch.Tensor


def check_factor(p: int, a: int) -> None:
    """a must divide p (the head axis tiles the ranks)."""
    if a < 1 or p % a:
        raise ValueError(f"gp_2d: head_parallel={a} does not divide {p} ranks")


def factorisations(p: int) -> list[int]:
    """Every head-axis size a of p ranks (the divisors of p), smallest first."""
    return [a for a in range(1, p + 1) if p % a == 0]


def group_rows(n: int, p: int, rank: int, a: int) -> tuple[int, int]:
    """Padded Q-order rows of ``rank``'s head group: its a ranks' blocks of ceil(N/p)."""
    check_factor(p, a)
    n_loc = -(-n // p)
    g = rank // a
    return g * a * n_loc, (g + 1) * a * n_loc


def make_groups(comm: Comm, a: int, ledger: CommLedger, timeout: timedelta | None = None
                ) -> dict[str, Comm]:
    """This rank's 'heads' (a consecutive ranks of ``comm``) and 'ring' (stride a) groups.

    When ``comm`` spans the job (a training run), collective over it: the head groups, then
    the ring groups, each a partition of the world's ranks, created by
    :func:`~plexgt.distributed.collectives.partition_group` (gloo: every rank creates every
    group, p/a + a of them, globally synchronised; bound to a GPU, NCCL: each rank splits off
    its own, members-only, two splits of the world in all), so that a group's ranks agree on
    it whatever groups the job made before. With the world bound to a device each
    ``new_group`` is an ``ncclCommSplit`` of the world's communicator, which every world rank
    must join in the same order; a rank outside a sub-group ``comm`` would skip it and leave
    the others waiting in it for ever, so there a sub-group ``comm`` is refused (ValueError)
    rather than hanging. A world not bound to a device (gloo) creates a sub-group's groups
    among its own ranks (members-only: the others take no part), which the multi-rank tests
    use to run p of P ranks. Torch names a members-only group by its ranks and by how many
    groups the calling rank holds, so ``comm``'s ranks first compare those counts (one
    all-gather over ``comm``): after an earlier group that some of them joined and others did
    not, they would name their groups differently and wait in gloo's rendezvous until the
    store timed out; that is refused (ValueError) too. An axis of extent p is ``comm``'s own
    group, of extent 1 a trivial one: neither creates a group, on every rank alike.
    """
    p = comm.size
    check_factor(p, a)
    b, g, k = p // a, comm.rank // a, comm.rank % a
    if p == 1:
        return {"heads": Comm.single("heads", ledger), "ring": Comm.single("ring", ledger)}
    world = dist.get_world_size()
    local = p != world
    if local and world_bound_to_device():
        raise ValueError(f"gp_2d: its groups are created by every rank of the job (each is a "
                         f"split of the world's communicator), but comm holds {p} of the "
                         f"{world} ranks")
    members = [dist.get_global_rank(comm.group, i) for i in range(p)]
    kw = {} if timeout is None else {"timeout": timeout}
    axes = (("heads", a, [[members[gg * a + j] for j in range(a)] for gg in range(b)], g),
            ("ring", b, [[members[j * a + kk] for j in range(b)] for kk in range(a)], k))
    if local and 1 < a < p:
        _check_groups_held_alike(comm)
    out = {}
    for name, size, all_groups, mine in axes:
        if size == 1:
            out[name] = Comm.single(name, ledger)
        elif size == p:  # the whole group (a = 1 or b = 1): no new group to create
            out[name] = Comm(comm.group, p, comm.rank, name, ledger)
        elif local:
            grp = dist.new_group(all_groups[mine], use_local_synchronization=True, **kw)
            out[name] = Comm.from_group(grp, name, ledger)
        else:
            grp = partition_group(all_groups, members[comm.rank], **kw)
            out[name] = Comm.from_group(grp, name, ledger)
    return out


def _check_groups_held_alike(comm: Comm) -> None:
    """Refuse (ValueError) when ``comm``'s ranks hold different numbers of process groups:
    their members-only groups would get different names (see :func:`make_groups`)."""
    held = torch.tensor([groups_held()], dtype=torch.int64)
    seen = [torch.zeros_like(held) for _ in range(comm.size)]
    dist.all_gather(seen, held, group=comm.group)
    counts = [int(t.item()) for t in seen]
    if len(set(counts)) > 1:
        raise ValueError(f"gp_2d: the {comm.size} ranks of a sub-group comm hold {counts} "
                         "process groups (an earlier group joined by some of them only), so "
                         "torch would name their members-only groups differently and they "
                         "would wait for each other until the store timed out")


def _prepare(shard: AttentionShard) -> AttentionShard:
    a = shard.head_parallel
    p = shard.comm.size
    check_factor(p, a)
    if set(shard.groups) != {"heads", "ring"}:
        raise ValueError("gp_2d needs its 'heads' and 'ring' groups (gp_2d.make_groups)")
    return ring_shard(shard, p // a, a * shard.n_loc)


def gp_2d_forward(shard: AttentionShard, q: Tensor, k: Tensor, v: Tensor,
                  block_rows: int | None = None, kv_super: SuperKV | None = None,
                  bias: Tensor | None = None) -> Tensor:
    """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (rows over the group);
    the super nodes' K/V of this rank's heads stay put (one local column block)."""
    heads = shard.groups["heads"]
    n_loc, h = shard.n_loc, shard.heads
    qh, kh, vh = (nodes_to_heads(t, heads, n_loc, h) for t in (q, k, v))
    h0, h1 = my_heads(h, heads)
    if kv_super is not None:
        kv_super = (kv_super[0][:, h0:h1], kv_super[1][:, h0:h1])
    if bias is not None:
        bias = bias[h0:h1]
    ring = Ring(shard.groups["ring"], shard.blocks, shard.chunk_bounds, shard.super_block)
    y = ring_attention(qh, kh, vh, ring, kv_super, bias)
    return heads_to_nodes(y, heads, n_loc, h)


def gp_2d_comm(problem: AttentionProblem, rank: int, p: int) -> list[CommOp]:
    """Over 'heads' (a ranks): Q, K, V to the head partition and Y back, and their adjoints,
    each moving (a-1)/a of n·d when a divides h; over 'ring' (b ranks): the ring's steps for
    this rank's h_k heads on a·N/p rows."""
    a = problem.head_parallel
    check_factor(p, a)
    b, k = p // a, rank % a
    n_loc = problem.rows(p)
    hk = heads_of(problem.heads, a, k)
    ops: list[CommOp] = []
    if a > 1:
        row = n_loc * problem.head_dim * problem.esize
        to_heads = ((problem.heads - hk) * row, (a - 1) * hk * row)
        to_nodes = (to_heads[1], to_heads[0])
        ops += [CommOp("all_to_all", s, r, "forward", "heads", a)
                for s, r in [to_heads] * 3 + [to_nodes]]
    ring = [CommOp(o.op, o.sent, o.recv, o.phase, "ring", b, o.count)
            for o in ring_comm(a * n_loc, hk, problem.head_dim, b, problem.ring_chunks,
                               problem.esize)]
    ops += ring
    if a > 1:
        ops += [CommOp("all_to_all", s, r, "backward", "heads", a)
                for s, r in [to_heads] + [to_nodes] * 3]
    return ops


def gp_2d_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """Q, K, V, Y of h/a heads on the group's a·N/p rows (4·N·d/p, kept), the ring's terms
    on them, and the group's pattern (E/b edges) cut into b column blocks."""
    a = problem.head_parallel
    check_factor(p, a)
    b = p // a
    n_loc = problem.rows(p)
    m = a * n_loc
    hk = heads_of(problem.heads, a, 0)
    dh = problem.head_dim
    e_grp = -(-problem.e // b)
    pieces = len(chunk_bounds(m, problem.ring_chunks)) or 1
    e_blk = -(-e_grp // (b * pieces))
    kept, transient = ring_memory_elems(m, m, hk, dh, b, problem.ring_chunks)
    kept += 4 * m * hk * dh
    graph = ring_graph_bytes(m, b, m, problem.ring_chunks, e_grp)
    return MemoryEstimate(kept, kept * problem.esize, graph, e_blk * hk,
                          transient * problem.esize)


def gp_2d_work(problem: AttentionProblem, p: int) -> KernelWork:
    """h/a heads on the group's E/b edges and a·N/p rows, over b·c column blocks; the
    layout permutes of the head axis and the ring's merges."""
    a = problem.head_parallel
    check_factor(p, a)
    b = p // a
    m = a * problem.rows(p)
    hk = heads_of(problem.heads, a, 0)
    blocks = b * (len(chunk_bounds(m, problem.ring_chunks)) or 1)
    per = m * hk * problem.head_dim
    return KernelWork(hk, problem.e / b, m, b * m, m, launches=blocks, recompute=1,
                      copy_elems=per if a > 1 else 0, merge_elems=(blocks - 1) * per)


GP_2D = AttentionStrategy(
    name="gp_2d",
    description="heads by all-to-all inside groups of a ranks, ring across the groups",
    forward=gp_2d_forward,
    comm=gp_2d_comm,
    memory=gp_2d_memory,
    work=gp_2d_work,
    full_graph=False,
    pattern_rows=group_rows,
    prepare=_prepare,
    head_axes=factorisations,
    groups=make_groups,
    rings=True,
)
