"""hgt on the dp x pp x cp mesh equals the single process (float64, dropout on).

Every (dp, pp, cp) with product = the world size (pp <= 6 layers), uneven partitions, K = 1,
2, 4 where they divide a replica's share: the step's loss and every canonical gradient (the
distributed gradients gathered by ``to_canonical``), with DP covering the union of the
replicas' sequences; the ledger's bytes equal :func:`step_bytes`; evaluation's counts and a
20-step AdamW curve (clipped: ``counted``) equal the single process's.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from plexgt.config import BatchConfig
from plexgt.data.node_batches import EVAL_EPOCH, SPLITS, NodeBatches, collate
from plexgt.data.synthetic import sbm
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.mesh import Mesh, factorizations, partition
from plexgt.models.hgt import HierarchicalGT
from plexgt.models.sequence import sequence_loss
from plexgt.parallel.batch_dist import HGTPipeline, Layout, step_bytes
from plexgt.training.optim import clip_gradients

from .conftest import WORLD, prepare_on_rank0

pytestmark = pytest.mark.timeout(300)

L, D, HEADS, NS, EMB = 6, 8, 2, 2, 3
SIZE, TARGETS = 24, 4
G_STEP = 24
"""Sequences of the exactness step: divisible by every dp * K tried."""
G_CURVE = 4
STEP_KEY = 3
TOL = {"rtol": 1e-10, "atol": 1e-12}
TRAINED = {"rtol": 1e-8, "atol": 1e-10}
"""Parameters after 20 AdamW steps: the K projection's bias has an exactly zero gradient (a
shift of every score of a row by q·b_k cancels in the softmax), so its computed gradient is
rounding noise (~1e-17) that Adam divides by its own root mean square: the bias moves by a
few 1e-12 differently on each layout (seen: 4e-12), which changes no output."""

PARTITIONS = {1: ["6"], 2: ["1,5", "4,2"], 3: ["1,2,3"], 4: ["1,1,2,2"], 6: ["1,1,1,1,1,1"]}


class Cached:
    """The sampler with its sequences memoised (every case reads the same few)."""

    def __init__(self, nb: NodeBatches) -> None:
        self.nb, self.batch, self.memo = nb, nb.batch, {}

    def sequence(self, split, epoch, index):
        key = (split, epoch if split == "train" else EVAL_EPOCH, index)
        if key not in self.memo:
            self.memo[key] = self.nb.sequence(split, epoch, index)
        return self.memo[key]

    def steps(self, split):
        return self.nb.steps(split)

    def step_targets(self, split, step):
        return self.nb.step_targets(split, step)

    def count(self, split):
        return self.nb.count(split)


@pytest.fixture(scope="module")
def graph(tmp_path_factory, dist_ctx):
    pg = prepare_on_rank0(tmp_path_factory, "hgt", lambda: sbm(
        96, 600, num_classes=3, num_features=5, seed=2, centroid_scale=1.0))
    yield pg
    pg.close()


@pytest.fixture(scope="module")
def batches(graph):
    """batches(G): the cached sampler of steps of G sequences."""
    made = {}

    def get(g: int) -> Cached:
        if g not in made:
            cfg = BatchConfig(targets=TARGETS, size=SIZE, sequences=g, context="hop2",
                              global_nodes=NS)
            made[g] = Cached(NodeBatches(graph, cfg, seed=1))
        return made[g]

    return get



def kwargs(graph) -> dict:
    return dict(in_dim=graph.F, hidden=D, out_dim=graph.C, num_layers=L, heads=HEADS,
                dropout=0.2, input_dropout=0.1, seed=5, global_nodes=NS, num_nodes=graph.N,
                node_embedding=EMB)


def reference(graph) -> HierarchicalGT:
    """The single-process model, every parameter moved off its constant start (a fixed
    perturbation per name)."""
    ref = HierarchicalGT(**kwargs(graph)).double()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            seed = int.from_bytes(hashlib.sha256(n.encode()).digest()[:4], "little")
            g = torch.Generator().manual_seed(seed)
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref


def distributed(graph, mg, nb, stages: str, k: int, ref: HierarchicalGT) -> HGTPipeline:
    mesh = mg.mesh
    layout = Layout(mesh, partition(stages, L, mesh.pp), k)
    dm = HGTPipeline(HierarchicalGT, kwargs(graph), layout, mg, nb, CommLedger())
    with torch.no_grad():
        for n, p in dm.named_parameters():
            p.copy_(dm.from_canonical(ref.state_dict())[n])
    return dm


def reference_loss(ref, nb, g: int, epoch: int, i: int, step: int) -> torch.Tensor:
    b = collate([nb.sequence("train", epoch, i * g + j) for j in range(g)])
    logits = ref(b.x, b.ids, b.codes, b.targets, b.seq, step)
    return sequence_loss(logits, b.labels, nb.step_targets("train", i))


def cases() -> list[tuple[Mesh, str, int]]:
    out = []
    for mesh in factorizations(WORLD):
        if SIZE % mesh.cp:
            continue
        for stages in PARTITIONS.get(mesh.pp, []):
            out.extend((mesh, stages, k) for k in (1, 2, 4) if G_STEP % (mesh.dp * k) == 0)
    return out


def case_id(case) -> str:
    mesh, stages, k = case
    return f"{mesh}-{stages.replace(',', '.')}-K{k}"


@pytest.fixture(scope="module")
def want_step(graph, batches):
    """The single process's loss and gradients of step 0 (epoch 0, dropout key STEP_KEY)."""
    ref = reference(graph)
    ref.train()
    loss = reference_loss(ref, batches(G_STEP), G_STEP, 0, 0, STEP_KEY)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in ref.named_parameters()}


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_a_step_equals_the_single_process(graph, batches, mesh_groups, want_step, case):
    mesh, stages, k = case
    nb = batches(G_STEP)
    dm = distributed(graph, mesh_groups(mesh), nb, stages, k, reference(graph))
    dm.train()
    dm.step = STEP_KEY
    loss = dm.train_step(0, 0)
    assert dm.step == STEP_KEY + 1
    want_loss, want_grads = want_step
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-13)
    # the ledger holds exactly the formulas' bytes (before to_canonical's broadcasts,
    # which are not recorded)
    got_bytes = {key: (dm.ledger.sent[key], dm.ledger.recv[key]) for key in dm.ledger.calls
                 if dm.ledger.sent[key] or dm.ledger.recv[key]}
    want_bytes = step_bytes(dm.layout, dm.p, nb.batch, D,
                            [p.numel() * 8 for p in dm.parameters()], 8)
    assert got_bytes == want_bytes
    grads = dm.to_canonical({n: p.grad for n, p in dm.named_parameters()})
    assert grads.keys() == want_grads.keys()
    for n, g in want_grads.items():
        torch.testing.assert_close(grads[n], g, **TOL, msg=n)


def curve_meshes() -> list[Mesh]:
    """The mesh(es) of the 20-step curve: the most axes split, then the largest cp."""
    ok = [m for m in factorizations(WORLD) if m.pp <= L and SIZE % m.cp == 0
          and G_CURVE % (m.dp * (2 if G_CURVE // m.dp % 2 == 0 else 1)) == 0]
    ok.sort(key=lambda m: (-sum(x > 1 for x in m.shape), -m.cp, -m.pp))
    return ok[:1]


@pytest.mark.parametrize("mesh", curve_meshes(), ids=str)
def test_twenty_steps_and_evaluation_follow_the_single_process(graph, batches, mesh_groups,
                                                                 mesh):
    nb = batches(G_CURVE)
    k = 2 if G_CURVE // mesh.dp % 2 == 0 else 1
    stages = PARTITIONS[mesh.pp][0]
    ref = reference(graph)
    dm = distributed(graph, mesh_groups(mesh), nb, stages, k, ref)
    opt = torch.optim.AdamW(dm.parameters(), lr=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    got, want, step = [], [], 0
    steps = nb.steps("train")
    while step < 20:
        epoch, i = divmod(step, steps)
        dm.train()
        opt.zero_grad(set_to_none=True)
        got.append(float(dm.train_step(epoch, i)))
        clip_gradients(dm, 1.0)
        opt.step()
        ref.train()
        ref_opt.zero_grad(set_to_none=True)
        loss = reference_loss(ref, nb, G_CURVE, epoch, i, step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        want.append(float(loss.detach()))
        step += 1
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert want[-1] < want[0]
    # evaluation: every split's targets, in order, no dropout
    acc = dm.evaluate()
    assert dm.training
    ref.eval()
    with torch.no_grad():
        for split in SPLITS:
            correct = 0
            for i in range(nb.steps(split)):
                b = collate([nb.sequence(split, EVAL_EPOCH, i * G_CURVE + j)
                             for j in range(G_CURVE)])
                pred = ref(b.x, b.ids, b.codes, b.targets, b.seq).argmax(dim=1)
                correct += int((pred == b.labels).sum())
            assert acc[split] == (correct, nb.count(split)), split
    # the canonical state round-trips
    state = dm.to_canonical(dict(dm.named_parameters()))
    assert state.keys() == dict(ref.named_parameters()).keys()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(state[n], p.detach(), **TRAINED,
                                   msg=lambda m, n=n: f"{n}: {m}")
    back = dm.from_canonical(state)
    for n, p in dm.named_parameters():
        assert torch.equal(back[n], p.detach()), n


def test_counted_marks_one_copy_per_stage(graph, batches, mesh_groups):
    """Exactly one rank counts each stage's parameters (the gradient norm's sum)."""
    from mpi4py import MPI

    mesh = curve_meshes()[0]
    dm = distributed(graph, mesh_groups(mesh), batches(G_CURVE), PARTITIONS[mesh.pp][0], 1,
                     reference(graph))
    mine = [n.removeprefix("model.") for n, _ in dm.named_parameters() if dm.counted(n)]
    every = [n for part in MPI.COMM_WORLD.allgather(mine) for n in part]
    assert sorted(every) == sorted(n for n, _ in reference(graph).named_parameters())

