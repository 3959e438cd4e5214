"""Every tensor of a training step on the rank's device, checked here without a GPU.

The device audit (tests/device_audit.py) runs the real task builder and training loop of gcn,
gt and gps with the rank's device declared to be another than the CPU: tensors put on the
device report it, everything else is host memory, and an op mixing the two (what a GPU run
dies of), a collective on host tensors (an NCCL group refuses them), a host<->device copy or
a ``.item()`` inside a step each fail the test with the line that did it. Covered: every
registered strategy (on one rank each still runs its own code), edge bias, super nodes, and
bfloat16 under CUDA autocast's casts (emulated: torch has no autocast for the declared
device). The branches only a ``cuda`` device takes (event ledger, TunedMatmul's GPU timing,
CUDA autocast, the step's syncs) are recorded-call tests in test_cuda_branches.py.
"""

import pytest
import torch
from torch import nn

from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.ops import attention_triton, precision
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.plexus3d import Plexus3DGCN
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.training import loop
from tests.device_audit import (
    DECLARED,
    DeviceAudit,
    DeviceMismatch,
    EmulatedAutocast,
    OnDevice,
)

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def test_audit_catches_a_host_tensor():
    """The audit itself: a host index into a device tensor, a host collective operand, a sync."""
    with DeviceAudit() as audit:
        x = torch.randn(5).to(DECLARED)
        assert isinstance(x, OnDevice) and x.device == DECLARED
        y = x * torch.tensor(2.0) + torch.zeros(5, device=x.device)  # scalars and device=x.device
        assert y.device == DECLARED
        with pytest.raises(DeviceMismatch, match="mixes device and host"):
            _ = x[torch.arange(3)]
        with pytest.raises(DeviceMismatch, match="mixes device and host"):
            x.add_(torch.ones(5))
        _ = y.sum().item()
        _ = y.cpu()
    assert [s[0] for s in audit.syncs] == ["aten._local_scalar_dense.default",
                                          "device->host aten._to_copy.default"]
    assert any("device->host" in t[0] for t in audit.transfers)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    path = tmp_path_factory.mktemp("audit") / "prep"
    g = sbm(90, 600, num_features=6, num_classes=3, seed=3)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path



@pytest.fixture(scope="module")
def prepared_edges(tmp_path_factory):
    """The audit's graph with edge features: gt and gps then train an edge bias."""
    path = tmp_path_factory.mktemp("audit_edges") / "prep"
    g = sbm(90, 600, num_features=6, num_classes=3, seed=3, edge_features=2)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path


def _no_sampled_addmm(*args, **kwargs):
    raise AssertionError("torch.sparse.sampled_addmm reached on the declared GPU")


def _audited_train(model, prepared, monkeypatch, tmp_path, overrides=None, half=False):
    """``plexgt train`` for two epochs under the audit: (audit, in-step events, task, summary,
    fused-kernel calls, config). ``overrides``: more config keys. ``half``: a bfloat16 run
    (``dtype``), CUDA autocast's casts emulated for the declared device
    (tests/device_audit.EmulatedAutocast: torch has no autocast for it)."""
    cfg = load_config(None, {"data": str(prepared), "model.name": model, "epochs": 2,
                             "progress": False, "model.hidden": 16, "model.heads": 2,
                             "model.dropout": 0.2, "model.input_dropout": 0.2,
                             "metrics": str(tmp_path / "m.jsonl"),
                             **({"dtype": "bfloat16"} if half else {}), **(overrides or {})})
    ctx = DistContext(0, 1, 0, 1, "gloo", DECLARED, "single")
    # what the loop asks of the CUDA runtime, answered as a GPU would (no CUDA here)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    # the declared device takes the GPU's kernels: attention by the fused Triton operators
    # (run under the interpreter on the audit's CPU data)
    monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cuda", DECLARED.type))
    # and no GPU path may reach torch's SDDMM (ROCm GPUs have none): a call fails the test
    monkeypatch.setattr(torch.sparse, "sampled_addmm", _no_sampled_addmm)
    fused_calls = []
    real_fused = attention_triton.fused_attention
    monkeypatch.setattr(attention_triton, "fused_attention",
                        lambda *a, **k: fused_calls.append(1) or real_fused(*a, **k))
    audit = DeviceAudit()
    in_step = {"syncs": [], "transfers": []}
    real_step = loop.step

    def audited_step(*a, **kw):
        s0, t0 = len(audit.syncs), len(audit.transfers)
        out = real_step(*a, **kw)
        in_step["syncs"] += audit.syncs[s0:]
        in_step["transfers"] += audit.transfers[t0:]
        return out

    monkeypatch.setattr(loop, "step", audited_step)
    amp = EmulatedAutocast()
    if half:
        amp.install(monkeypatch)
        monkeypatch.setattr(precision, "AUTOCAST_DEVICES",
                            (*precision.AUTOCAST_DEVICES, DECLARED.type))
    with audit, amp:
        task = build_task(cfg, ctx, CommLedger())
        assert isinstance(task.inputs, OnDevice) or task.inputs.device == DECLARED
        summary = loop.train(cfg, ctx, task, log=lambda m: None)
    return audit, in_step, task, summary, fused_calls, cfg


def _stays_on_device(audit, in_step, summary, cfg) -> None:
    """Both epochs ran; no sync or copy inside a step; outside it, per epoch, at most the
    loss, the accuracy counts, the stats and the stop flags."""
    assert summary["last_epoch"] == 2
    assert in_step["syncs"] == [], in_step["syncs"]
    assert in_step["transfers"] == [], in_step["transfers"]
    assert len(audit.syncs) <= 4 * cfg.epochs, audit.syncs


NO_DETERMINISTIC_CUDA_KERNEL = ("aten.put_", "aten.histc", "aten.kthvalue", "aten.median",
                                "aten.nll_loss2d", "aten.index_reduce", "aten.scatter_reduce",
                                "aten.embedding_dense_backward", "aten._embedding_bag")
"""Ops torch has no deterministic CUDA kernel for (``use_deterministic_algorithms`` raises
on them): a ``--deterministic`` GPU run must reach none."""


@pytest.mark.parametrize("model", ["gcn", "gt", "gps"])
def test_training_step_stays_on_device(model, prepared, world, monkeypatch, tmp_path):
    """Two epochs of ``plexgt train`` (task build, step, loss, metrics, stop flags) with the
    device declared (tests/device_audit.DECLARED): no op mixes host and device tensors, and the
    steps themselves make no host<->device copy and no sync (the metrics' once-per-epoch ones
    are outside them)."""
    audit, in_step, task, summary, fused_calls, cfg = _audited_train(model, prepared,
                                                                     monkeypatch, tmp_path)
    _stays_on_device(audit, in_step, summary, cfg)
    assert bool(fused_calls) == (model != "gcn")
    # dropout (0.2 on features and hidden layers) by the one-pass Triton kernel, the GPU's
    assert audit.ops["plexgt.counter_dropout.default"] > 0, sorted(audit.ops)
    assert all(p.device == DECLARED for p in task.model.parameters())


STRATEGIES = default_registry().names()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_with_edge_bias_and_super_nodes_stays_on_device(
        strategy, prepared_edges, world, monkeypatch, tmp_path):
    """gt on each registered strategy (on one rank each still runs its own forward: the
    all-to-alls, the ring's column blocks and online merge, gp_2d's groups), every block
    with an edge bias (once torch's kernels on a GPU, whose host reads of the row pointers
    were syncs in every step; the fused kernel's now, the rings' blocks included) and two
    super nodes: no host tensor, no sync or copy inside a step, no call of
    torch.sparse.sampled_addmm (trapped in every audited run), and none of the ops CUDA has
    no deterministic kernel for."""
    audit, in_step, task, summary, fused_calls, cfg = _audited_train(
        "gt", prepared_edges, monkeypatch, tmp_path,
        {"parallel.strategy": strategy, "model.super_nodes": 2})
    _stays_on_device(audit, in_step, summary, cfg)
    assert task.strategy.split()[0] == strategy
    names = [n for n, _ in task.model.named_parameters()]
    assert any(".edge." in n for n in names) and any("super" in n for n in names), names
    assert not [op for op in audit.ops if op.startswith(NO_DETERMINISTIC_CUDA_KERNEL)]


@pytest.mark.parametrize("model,strategy,bias", [("gt", STRATEGIES[-1], True),
                                                 ("gps", STRATEGIES[0], False)])
def test_bfloat16_runs_stay_on_device(model, strategy, bias, prepared_edges, world,
                                      monkeypatch, tmp_path):
    """A bfloat16 run under (emulated) CUDA autocast: bfloat16 GEMM outputs through every
    later op (gt: a ring with the bias path's float32 sums and merge; gps: the fused kernel
    on bfloat16, the GCN SpMM's float32 sums; both: the super rows, the loss in float32)
    stay on the device."""
    audit, in_step, task, summary, fused_calls, cfg = _audited_train(
        model, prepared_edges, monkeypatch, tmp_path,
        {"parallel.strategy": strategy, "model.super_nodes": 1, "model.edge_bias": bias},
        half=True)
    _stays_on_device(audit, in_step, summary, cfg)
    assert task.amp == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in task.model.parameters())  # the masters
    assert audit.bf16["aten.addmm.default"], "no GEMM ran in bfloat16"
    assert bool(fused_calls) == (not bias)
    if fused_calls:
        assert audit.bf16["plexgt.fused_attention_forward.default"]


OPTIONS = {
    "gcn": {"model.norm": "batch", "model.residual": "identity", "model.input_proj": True,
            "model.head": True, "model.jk": "cat", "optim.clip_norm": 1.0,
            "optim.decay": "weights", "optim.name": "adam", "patience": 5},
    "gt": {"model.norm": "batch", "model.pre_norm": True, "model.jk": "max",
           "optim.clip_norm": 1.0},
}


@pytest.mark.parametrize("model", list(OPTIONS))
def test_model_and_training_options_stay_on_device(model, prepared, world, monkeypatch,
                                                   tmp_path):
    """The options' layers (identity blocks, hops, BatchNorm's statistics and running
    statistics, the clipped norm) keep the step on the device, without a sync."""
    audit, in_step, task, summary, _, cfg = _audited_train(model, prepared, monkeypatch,
                                                           tmp_path, OPTIONS[model])
    assert summary["last_epoch"] == 2
    assert all(p.device == DECLARED for p in task.model.parameters())
    assert in_step["syncs"] == [], in_step["syncs"]
    assert in_step["transfers"] == [], in_step["transfers"]


def test_audit_catches_adjacency_left_on_the_host(prepared, world, monkeypatch, tmp_path):
    """The bug this audit was written for: without Plexus3DGCN._apply, ``model.to(device)``
    skips the 3D GCN's adjacency blocks (plain lists of sparse tensors), and the first SpMM
    of a GPU run multiplies host blocks with device features."""
    monkeypatch.setattr(Plexus3DGCN, "_apply", nn.Module._apply)
    with pytest.raises(DeviceMismatch, match=r"_sparse_addmm.*plexus_aggregate.py"):
        _audited_train("gcn", prepared, monkeypatch, tmp_path)


def test_train_builds_the_layout_the_plan_chooses(prepared, world):
    """What run_plan decides is what the task builds: attention row blocks (given, or the
    plan's when a tight memory per rank needs them) reach the model, and a plan that fits
    nothing is a one-line error."""
    from plexgt.errors import ConfigError
    from plexgt.tasks.task import run_plan

    base = {"data": str(prepared), "model.name": "gt", "progress": False,
            "model.hidden": 16, "model.heads": 2}
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    cfg = load_config(None, {**base, "parallel.attention_block_rows": 7})
    assert run_plan(cfg, PreparedGraph(prepared), 1).attention_block_rows == 7
    assert build_task(cfg, ctx, CommLedger()).model.model.block_rows == 7
    whole = load_config(None, base)
    rp = run_plan(whole, PreparedGraph(prepared), 1)
    assert rp.attention_block_rows == 0
    tight = load_config(None, {**base, "parallel.memory_per_rank_gb":
                               0.999 * rp.memory_bytes / 2**30})
    rp2 = run_plan(tight, PreparedGraph(prepared), 1)
    assert rp2.attention_block_rows > 0 and rp2.memory_bytes < rp.memory_bytes
    assert build_task(tight, ctx, CommLedger()).model.model.block_rows == \
        rp2.attention_block_rows
    with pytest.raises(ConfigError, match="no configuration fits .* per rank on 1 ranks"):
        run_plan(load_config(None, {**base, "parallel.memory_per_rank_gb": 1e-6}),
                 PreparedGraph(prepared), 1)


def test_deterministic_runs_do_not_time_their_gemm_forms(prepared, world):
    """The 3D GCN's GEMM form is chosen by timing both, and a loaded machine can choose the
    other one in a resumed run, whose losses then drift by an ulp (the kill-and-resume test
    failed so under CI's load): ``deterministic`` runs keep the plain product."""
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    base = {"data": str(prepared), "model.name": "gcn", "progress": False, "model.hidden": 16}
    for det in (False, True):
        task = build_task(load_config(None, {**base, "deterministic": det}), ctx, CommLedger())
        assert task.model.mm.enabled is not det


def test_node_sequence_training_stays_on_device(prepared, world, monkeypatch, tmp_path):
    """hgt's two epochs (the sampler, the stage's GPipe step, GA-CP's attention on one
    member, the loss and the batched evaluation) with the device declared: no op mixes host
    and device tensors and no step syncs with the host or copies device memory back; the
    only copies inside a step are the sampled sequences going to the device (features, node
    ids, hop codes, labels: host-side sampling is the design)."""
    audit, in_step, task, summary, _, cfg = _audited_train(
        "hgt", prepared, monkeypatch, tmp_path,
        {"batch.targets": 8, "batch.size": 24, "batch.sequences": 2, "model.layers": 2,
         "model.node_embedding": 4})
    assert summary["last_epoch"] == 2
    assert in_step["syncs"] == [], in_step["syncs"]
    assert not [t for t in in_step["transfers"] if "device->host" in t[0]], in_step["transfers"]
    assert all(p.device == DECLARED for p in task.model.parameters())
