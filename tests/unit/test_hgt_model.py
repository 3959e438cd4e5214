"""The node-sequence reference model (hgt): what every distributed layout is checked against.

float64 throughout, dropout on: pipeline stages chained equal the whole model, a block run on
row slices equals the block, micro-batches with the step's normalisation equal one batch."""

from __future__ import annotations

import pytest
import torch

from plexgt.models.hgt import HierarchicalGT, StepDrop
from plexgt.models.sequence import Rows, dense_attend, sequence_loss
from plexgt.ops.dense_attention import GLOBAL_CODE

L, F_IN, D, C, HEADS, NS, NODES, EMB = 6, 5, 8, 3, 2, 2, 40, 3


def make(**kw) -> HierarchicalGT:
    args = dict(num_layers=L, heads=HEADS, dropout=0.3, input_dropout=0.2, seed=7,
                global_nodes=NS, num_nodes=NODES, node_embedding=EMB)
    args.update(kw)
    return HierarchicalGT(F_IN, D, C, **args).double()


def batch(b: int = 4, n: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, F_IN, generator=g, dtype=torch.float64)
    ids = torch.randint(0, NODES, (b, n), generator=g)
    codes = torch.randint(1, 4, (b, n, n), generator=g, dtype=torch.int8)
    codes[:, torch.arange(n), torch.arange(n)] = 0
    targets = torch.tensor([3, 1, 0, 4][:b])
    labels = torch.randint(0, C, (int(targets.sum()),), generator=g)
    return x, ids, codes, targets, torch.arange(10, 10 + b), labels


def perturb(model: torch.nn.Module) -> None:
    """Non-trivial values everywhere (bias tables and LayerNorms start at constants)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            g = torch.Generator().manual_seed(100 + i)
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_initial_values_depend_on_seed_and_name_only():
    full = make()
    stage = make(blocks=range(3, 5))
    assert stage.embed is None and stage.head is None
    assert [n for n, _ in stage.named_parameters()][0] == "blocks.3.norm1.weight"
    mine = dict(full.named_parameters())
    for n, p in stage.named_parameters():
        assert torch.equal(p, mine[n]), n
    assert not torch.equal(make(seed=8).blocks["3"].q.weight, full.blocks["3"].q.weight)
    assert make(blocks=range(5, 6)).head is not None and make(blocks=range(0, 1)).embed


def test_dropout_is_on_and_keyed_by_sequence():
    model = make()
    model.train()
    x, ids, codes, targets, seq, _ = batch()
    x[1] = x[0]
    ids[1], codes[1], targets[1] = ids[0], codes[0], targets[0]
    out = model(x, ids, codes, targets, seq, step=3)
    again = model(x, ids, codes, targets, seq, step=3)
    assert torch.equal(out, again)
    assert not torch.equal(out, model(x, ids, codes, targets, seq, step=4))
    # sequence 0 and its copy in slot 1 draw different masks: keyed by seq, not content
    assert not torch.allclose(out[:3], out[3:6])
    model.eval()
    ev = model(x, ids, codes, targets, seq)
    assert torch.allclose(ev[:3], ev[3:6])


def test_pipeline_stages_chained_equal_the_whole_model():
    """embed+blocks[0:2], blocks[2:5], blocks[5:6]+head, activations passed as detached
    leaves and gradients sent back as a pipeline does: the loss and every gradient."""
    full = make()
    perturb(full)
    full.train()
    x, ids, codes, targets, seq, labels = batch()
    total = int(targets.sum())
    loss = sequence_loss(full(x, ids, codes, targets, seq, step=5), labels, total)
    loss.backward()
    want = grads(full)

    stages = [make(blocks=range(0, 2)), make(blocks=range(2, 5)), make(blocks=range(5, 6))]
    for s in stages:
        s.load_state_dict({k: v for k, v in full.state_dict().items()
                           if k in s.state_dict()})
        s.train()
    rows = stages[0].rows(seq, x.shape[1])
    h0 = stages[0].run_blocks(stages[0].embed_rows(x, ids, rows, 5), codes, rows, 5)
    in1 = h0.detach().requires_grad_()
    h1 = stages[1].run_blocks(in1, codes, rows, 5)
    in2 = h1.detach().requires_grad_()
    out = stages[2].head_logits(stages[2].run_blocks(in2, codes, rows, 5), rows, targets)
    got_loss = sequence_loss(out, labels, total)
    got_loss.backward()
    h1.backward(in2.grad)
    h0.backward(in1.grad)
    torch.testing.assert_close(got_loss, loss, rtol=1e-12, atol=1e-12)
    got = {}
    for s in stages:
        got.update(grads(s))
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("slices", [[(0, 3, False), (3, 7, True)],
                                    [(0, 2, False), (2, 5, False), (5, 7, False),
                                     (7, 7, True)]])
def test_a_block_on_row_slices_equals_the_block(slices):
    """Slices of the rows (q local, k/v of the whole sequence brought by the attend callable,
    as context parallelism's ring does), outputs put back in place: output and gradients,
    dropout and global nodes included."""
    model = make()
    perturb(model)
    blk = model.blocks["3"]
    x, _, codes, _, seq, _ = batch(3, 7)
    b, n = 3, 7
    s = n + NS
    g = torch.Generator().manual_seed(1)
    h = torch.randn(b, s, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(b, s, D, generator=g, dtype=torch.float64)
    drop = StepDrop(7, 2, True)
    rows = Rows.full(seq, n, NS)
    full = blk(h, codes, rows, 3, drop)
    (full * w).sum().backward()
    want_h, want = h.grad.clone(), grads(blk)
    h.grad = None
    blk.zero_grad()

    out = torch.zeros(b, s, D, dtype=torch.float64)
    a = blk.norm1(h)
    k_all, v_all = blk.heads_of(blk.k(a)), blk.heads_of(blk.v(a))
    for lo, hi, glob in slices:
        part = rows.part(lo, hi, glob)
        if part.pos.numel() == 0:
            continue

        def ring(q, k, v, c, bw):  # noqa: ARG001 -- the local k/v replaced by every row's
            return dense_attend(q, k_all, v_all, c, bw)

        y = blk(h[:, part.pos], codes[:, lo:hi], part, 3, drop, ring)
        out = out.index_put((torch.arange(b)[:, None], part.pos[None, :]), y)
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)
    (out * w).sum().backward()
    torch.testing.assert_close(h.grad, want_h, rtol=1e-10, atol=1e-12)
    for name, gr in grads(blk).items():
        if name in want:
            torch.testing.assert_close(gr, want[name], rtol=1e-10, atol=1e-12, msg=name)
    assert set(want) <= set(grads(blk))


def test_global_pairs_take_the_global_code():
    """Any pair with a global node reads bias row 4: changing that row moves only them."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    codes = torch.zeros(1, 3, 3, dtype=torch.int8)
    bw = torch.zeros(5, 2, dtype=torch.float64)
    base = dense_attend(q, k, v, codes, bw)
    bw2 = bw.clone()
    bw2[GLOBAL_CODE] = 5.0
    moved = dense_attend(q, k, v, codes, bw2)
    assert not torch.allclose(moved[:, :, :3], base[:, :, :3])  # sequence rows see globals
    bw3 = bw.clone()
    bw3[1:4] = 5.0  # codes 1..3 unused: nothing moves
    torch.testing.assert_close(dense_attend(q, k, v, codes, bw3), base)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_micro_batches_with_the_steps_normalisation_equal_one_batch(group):
    model = make()
    perturb(model)
    model.train()
    x, ids, codes, targets, seq, labels = batch(4, 7)
    total = int(targets.sum())
    loss = sequence_loss(model(x, ids, codes, targets, seq, step=9), labels, total)
    loss.backward()
    want = grads(model)
    model.zero_grad()
    got_loss = torch.zeros((), dtype=torch.float64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), targets.cumsum(0)])
    for a in range(0, 4, group):
        sl = slice(a, a + group)
        lab = labels[offsets[a]:offsets[min(4, a + group)]]
        part = sequence_loss(model(x[sl], ids[sl], codes[sl], targets[sl], seq[sl], step=9),
                             lab, total)
        part.backward()
        got_loss += part.detach()
    torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-12, atol=1e-12)
    for n, gr in grads(model).items():
        torch.testing.assert_close(gr, want[n], rtol=1e-10, atol=1e-12, msg=n)


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="not a contiguous range"):
        make(blocks=range(4, 8))
    with pytest.raises(ValueError, match="not divisible"):
        make(heads=3)
    with pytest.raises(ValueError, match="a table of no rows"):
        make(num_nodes=0)
