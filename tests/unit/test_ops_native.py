"""Compiled CPU attention kernels (plexgt.ops.native) against torch's kernels and the dense
reference; head-major projections; the in-place residual; the build's lock handling."""

import os
import shutil
import time

import pytest
import torch
from torch import nn

from plexgt.models.layers import attention_conv
from plexgt.ops import native
from plexgt.ops.attention import dense_attention_reference, sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.ops.heads import head_major_linear

from .test_ops_attention import _graph, _qkv

NAT = native.load()
needs_native = pytest.mark.skipif(
    NAT is None, reason="compiled attention kernels unavailable here (no C++ compiler, or "
                        "PLEXGT_NATIVE=0); torch's kernels are tested by test_ops_attention")


def _run(graph, q, k, v, use_native, **kw):
    """Output and (q, k, v) gradients for a fixed output weighting, on one kernel family."""
    old = os.environ.get("PLEXGT_NATIVE")
    os.environ["PLEXGT_NATIVE"] = "1" if use_native else "0"
    try:
        y = sparse_attention(graph, q, k, v, **kw)
        w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
        grads = torch.autograd.grad((y * w).sum(), (q, k, v))
    finally:
        if old is None:
            del os.environ["PLEXGT_NATIVE"]
        else:
            os.environ["PLEXGT_NATIVE"] = old
    return [y.detach(), *grads]


@needs_native
@pytest.mark.parametrize("h,d", [(1, 8), (2, 16), (8, 16), (3, 32), (2, 64)])
@pytest.mark.parametrize("shape", [(40, 40), (25, 60), (60, 9)])
def test_native_matches_torch_kernels_float64(h, d, shape):
    nr, nc = shape
    graph = _graph(nr, nc, 300, seed=h * d, empty_rows=(0, 7))
    q, k, v = _qkv(nr, nc, h, d, seed=d)
    ours, ref = _run(graph, q, k, v, True), _run(graph, q, k, v, False)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.all(ours[0][[0, 7]] == 0)  # rows without neighbours


@needs_native
@pytest.mark.parametrize("d", [8, 16, 32, 64])
def test_native_float32_close_to_float64_dense_reference(d):
    """The vectorised exp, reductions and register-held SpMM rows of the float32 kernels stay
    at float32 rounding, forward and backward, at every compiled width."""
    graph = _graph(50, 70, 600, seed=4, empty_rows=(3,))
    q, k, v = _qkv(50, 70, 4, d, dtype=torch.float32, seed=1)
    ours = _run(graph, q, k, v, True)
    ref = dense_attention_reference(graph, *(t.detach().double() for t in (q, k, v)))
    torch.testing.assert_close(ours[0].double(), ref, rtol=2e-6, atol=2e-6)
    ref64 = _run(graph, *(t.detach().double().requires_grad_() for t in (q, k, v)), False)
    for a, b in zip(ours[1:], ref64[1:]):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


@needs_native
def test_native_scores_far_apart_do_not_overflow():
    # scores ~1e5: exp would overflow without the row max; most terms underflow to 0
    graph = _graph(30, 30, 200, seed=2)
    q, k, v = _qkv(30, 30, 2, 16, dtype=torch.float32, seed=3)
    with torch.no_grad():
        q.mul_(300.0)
        k.mul_(300.0)
    y = _run(graph, q, k, v, True)[0]
    ref = dense_attention_reference(graph, *(t.detach().double() for t in (q, k, v)))
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@needs_native
def test_native_gradcheck():
    graph = _graph(6, 9, 25, seed=11, empty_rows=(2,))
    q, k, v = _qkv(6, 9, 2, 8, seed=4)
    assert torch.autograd.gradcheck(lambda a, b, c: sparse_attention(graph, a, b, c), (q, k, v))


@needs_native
def test_native_graph_without_edges():
    graph = CSRGraph.from_coo(torch.zeros(0, dtype=torch.long),
                              torch.zeros(0, dtype=torch.long), 5, 4)
    q, k, v = _qkv(5, 4, 2, 8)
    y, dq, dk, dv = _run(graph, q, k, v, True)
    assert torch.all(y == 0) and torch.all(dq == 0) and torch.all(dk == 0)
    assert torch.all(dv == 0)


@needs_native
def test_native_int64_indices_match_int32():
    graph = _graph(30, 20, 150, seed=9)
    q, k, v = (t.detach().transpose(0, 1).contiguous() for t in _qkv(30, 20, 2, 16, seed=2))
    i32 = graph.compact_index()
    assert i32[0].dtype == torch.int32
    p32, lse32 = NAT.scores(*i32, q, k, 0.25)
    p64, lse64 = NAT.scores(graph.indptr, graph.indices, q, k, 0.25)
    torch.testing.assert_close(p32, p64, rtol=0, atol=0)
    torch.testing.assert_close(lse32, lse64, rtol=0, atol=0)
    # lse is the log of each row's softmax denominator
    s = torch.einsum("rhd,rhd->hr", q.transpose(0, 1)[graph.row], k.transpose(0, 1)[
        graph.indices]) * 0.25
    m = torch.full((2, 30), -torch.inf, dtype=s.dtype).scatter_reduce(
        1, graph.row.expand(2, -1), s, "amax")
    z = torch.zeros(2, 30, dtype=s.dtype).index_add_(1, graph.row, (s - m[:, graph.row]).exp())
    torch.testing.assert_close(lse32, m + z.log())


@needs_native
def test_native_rejects_bad_operands():
    graph = _graph(10, 10, 40, seed=1)
    ip, ix = graph.compact_index()
    xh = torch.randn(2, 10, 16)
    with pytest.raises(RuntimeError, match="head width"):
        NAT.scores(ip, ix, torch.randn(2, 10, 12), torch.randn(2, 10, 12), 1.0)
    with pytest.raises(RuntimeError, match=r"\[h, E\]"):
        NAT.spmm(ip, ix, None, torch.randn(2, graph.num_edges + 1), xh, None)
    with pytest.raises(RuntimeError, match="index dtype|indices' dtype"):
        NAT.spmm(ip.long(), ix, None, torch.randn(2, graph.num_edges), xh, None)


@pytest.mark.parametrize("use_native", [True, False])
@pytest.mark.parametrize("block_rows", [None, 4])
def test_residual_added_in_place(use_native, block_rows):
    if use_native and NAT is None:
        pytest.skip("compiled attention kernels unavailable here")
    graph = _graph(11, 13, 60, seed=5, empty_rows=(1,))
    q, k, v = _qkv(11, 13, 2, 8, seed=6)
    r0 = torch.randn(11, 16, dtype=torch.float64, requires_grad=True)
    os.environ["PLEXGT_NATIVE"] = "1" if use_native else "0"
    try:
        out = sparse_attention(graph, q, k, v, block_rows=block_rows, residual=r0 * 2.0)
        ref = r0 * 2.0 + dense_attention_reference(graph, q, k, v).reshape(11, 16)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        w = torch.randn_like(ref)
        g1 = torch.autograd.grad((out * w).sum(), (q, k, v, r0))
        g2 = torch.autograd.grad((ref * w).sum(), (q, k, v, r0))
    finally:
        del os.environ["PLEXGT_NATIVE"]
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_residual_shape_checked():
    graph = _graph(4, 4, 8, seed=1)
    q, k, v = _qkv(4, 4, 2, 8)
    with pytest.raises(ValueError, match="residual must be"):
        sparse_attention(graph, q, k, v, residual=torch.zeros(4, 2, 8, dtype=torch.float64))


def test_head_major_linear_equals_linear():
    torch.manual_seed(0)
    lin = nn.Linear(12, 16).double()
    x = torch.randn(5000, 12, dtype=torch.float64, requires_grad=True)  # > one row block
    y = head_major_linear(x, lin, 4)
    ref = lin(x).view(5000, 4, 4)
    assert y.shape == (5000, 4, 4) and y.transpose(0, 1).is_contiguous()
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-13)
    w = torch.randn_like(ref)
    g1 = torch.autograd.grad((y * w).sum(), (x, lin.weight, lin.bias))
    g2 = torch.autograd.grad((ref * w).sum(), (x, lin.weight, lin.bias))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d,heads", [(16, 2), (32, 2), (12, 3)])
def test_attention_layer_matches_plain_formula(d, heads):
    """The layer (head-major projections, residual in place) is X W_o + attention(Q, K, V)."""
    torch.manual_seed(d)
    graph = _graph(20, 20, 90, seed=d, empty_rows=(5,))
    lins = [nn.Linear(d, d).double() for _ in range(4)]
    x = torch.randn(20, d, dtype=torch.float64, requires_grad=True)
    out = attention_conv(graph, x, x, *lins, heads)
    shp = (20, heads, d // heads)
    ref = lins[3](x) + dense_attention_reference(
        graph, lins[0](x).view(shp), lins[1](x).view(shp), lins[2](x).view(shp)).reshape(20, d)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = [x, *[p for lin in lins for p in lin.parameters()]]
    g1 = torch.autograd.grad(out.square().sum(), params)
    g2 = torch.autograd.grad(ref.square().sum(), params)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("PLEXGT_NATIVE", "0")
    assert native.load() is None


def test_stale_build_lock_removed(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    native._clear_stale_lock(lock)  # fresh: a live build's, kept
    assert lock.exists()
    old = time.time() - native.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        native._clear_stale_lock(lock)
    assert not lock.exists()
    native._clear_stale_lock(tmp_path / "absent")  # nothing to do


def test_isa_tag_is_stable_and_names_the_checkout(monkeypatch, tmp_path):
    assert native._isa_tag() == native._isa_tag()
    assert len(native._isa_tag()) == 10
    # another checkout's source (or another torch) builds under another name, so two checkouts
    # sharing ~/.cache/torch_extensions never rebuild each other's kernels
    tag = native._isa_tag()
    monkeypatch.setattr(native, "SOURCE", tmp_path / "attention_cpu.cpp")
    assert native._isa_tag() != tag


def test_the_ninja_beside_the_interpreter_comes_first(monkeypatch, tmp_path):
    """A system ninja of another version first on PATH made every other process rebuild."""
    venv_bin, sys_bin = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for d in (venv_bin, sys_bin):
        d.mkdir(parents=True)
        (d / "ninja").write_text("#!/bin/sh\n")
        (d / "ninja").chmod(0o755)
    monkeypatch.setattr(native.sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(sys_bin))
    native._ninja_on_path()
    assert shutil.which("ninja") == str(venv_bin / "ninja")
    native._ninja_on_path()  # idempotent: not prepended twice
    assert os.environ["PATH"].count(str(venv_bin)) == 1


@needs_native
def test_native_nan_score_propagates_like_torch():
    """A NaN in K makes its rows' outputs NaN on both kernel families (a diverging run must
    not look finite)."""
    graph = _graph(12, 12, 50, seed=8)
    q, k, v = _qkv(12, 12, 2, 16, dtype=torch.float32, seed=2)
    with torch.no_grad():
        k[int(graph.indices[0])] = float("nan")
    ours = _run(graph, q, k, v, True)[0]
    ref = _run(graph, q, k, v, False)[0]
    assert torch.isnan(ours).any()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))


def test_attention_layer_with_no_rows():
    graph = CSRGraph.from_coo(torch.zeros(0, dtype=torch.long),
                              torch.zeros(0, dtype=torch.long), 0, 5)
    lins = [nn.Linear(16, 16) for _ in range(4)]
    x_dst, x_src = torch.zeros(0, 16, requires_grad=True), torch.randn(5, 16)
    out = attention_conv(graph, x_dst, x_src, *lins, 2)
    assert out.shape == (0, 16)
    out.sum().backward()
    assert lins[0].weight.grad is not None and torch.all(lins[0].weight.grad == 0)


def test_openmp_runtimes_found_in_the_process_maps():
    maps = "\n".join([
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/torch/lib/libgomp.so.1",
        "7f01-7f02 r--p 00001000 08:01 1 /venv/torch/lib/libgomp.so.1",
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0",
        "7f03-7f04 r-xp 00000000 08:01 3 /wheel/torch.libs/libgomp-a34b3233.so.1",
        "7f04-7f05 r-xp 00000000 08:01 4 /usr/lib/libgompfoo.so",  # not a runtime
        "7f05-7f06 rw-p 00000000 00:00 0 ",  # anonymous
        "7f06-7f07 r-xp 00000000 08:01 5 /opt/intel/libiomp5.so",
    ])
    assert native.openmp_runtimes(maps) == [
        "/opt/intel/libiomp5.so", "/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0",
        "/venv/torch/lib/libgomp.so.1", "/wheel/torch.libs/libgomp-a34b3233.so.1"]


@needs_native
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc/self/maps here")
def test_one_openmp_runtime_with_the_kernels_loaded():
    """With this torch, the extension's libgomp.so.1 resolves to the runtime torch loaded (a
    torch shipping a renamed libgomp fails here: the case the warning is for)."""
    assert len(native.openmp_runtimes()) == 1


@needs_native
def test_a_second_openmp_runtime_is_warned_about(monkeypatch):
    monkeypatch.delitem(native._state, "module")
    monkeypatch.setattr(native, "openmp_runtimes", lambda: ["/t/libgomp.so.1",
                                                            "/t/libgomp-a34b.so.1"])
    with pytest.warns(RuntimeWarning, match="more than one OpenMP runtime"):
        assert native.load() is not None


@pytest.fixture
def fake_compile(monkeypatch, tmp_path):
    """torch's own load path (its versioner, its lock file) with the compile and the import
    replaced: a build takes milliseconds, and a test can leave torch's lock as a killed
    build leaves it."""
    from torch.utils import cpp_extension

    built = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(cpp_extension, "_write_ninja_file_and_build_library",
                        lambda name, **kw: built.append(name))
    monkeypatch.setattr(cpp_extension, "_import_module_from_library",
                        lambda name, path, is_python_module: f"module {name}")
    src = tmp_path / "k.cpp"
    src.write_text("// a kernel\n")
    # a name of its own: torch's versioner (per process) renames a known name built elsewhere
    name = f"plexgt_fake_{abs(hash(str(tmp_path)))}"
    return src, built, name, tmp_path / "ext" / name


def _killed_build_lock(build_dir):
    """torch's lock file as a build killed while holding it leaves it (FileBaton.try_acquire
    creates it with O_CREAT | O_EXCL; its release never ran)."""
    from torch.utils.file_baton import FileBaton

    build_dir.mkdir(parents=True, exist_ok=True)
    baton = FileBaton(str(build_dir / "lock"))
    assert baton.try_acquire()
    os.close(baton.fd)


@pytest.mark.timeout(30)
def test_a_killed_builds_lock_does_not_stall_the_next_build(fake_compile, tmp_path, capsys):
    """A job killed during the first build left torch's lock; the next waited silently until
    the lock was 600 s old. plexgt's own build lock (an flock) dies with its holder, so whoever
    holds it knows torch's lock is a dead build's and removes it at once."""
    src, built, name, build_dir = fake_compile
    _killed_build_lock(build_dir)
    t0 = time.monotonic()
    assert native.build(name, source=src) == f"module {name}"
    assert time.monotonic() - t0 < 5 and built == [name]
    assert not (build_dir / "lock").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "killed build" in err[0] and str(build_dir) in err[0], err


@pytest.mark.timeout(30)
def test_a_live_build_is_waited_for_with_one_line(fake_compile, tmp_path, capsys, monkeypatch):
    """Another process building holds plexgt's flock: the next says so in one line and waits
    for it, up to BUILD_WAIT_S (then the build fails: load() falls back to torch's kernels)."""
    import fcntl
    import threading

    src, built, name, build_dir = fake_compile
    build_dir.mkdir(parents=True)
    holder = open(build_dir / native.BUILD_LOCK, "a")  # noqa: SIM115 - released by the timer
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(1.0, holder.close).start()  # that build finishes a second later
    t0 = time.monotonic()
    assert native.build(name, source=src) == f"module {name}"
    assert time.monotonic() - t0 >= 0.9
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "waiting for another process" in err[0], err
    holder = open(build_dir / native.BUILD_LOCK, "a")  # noqa: SIM115
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        monkeypatch.setattr(native, "BUILD_WAIT_S", 0.5)
        with pytest.raises(TimeoutError, match="still building after 0.5 s"):
            native.build(name, source=src)
    finally:
        holder.close()


@pytest.mark.timeout(30)
def test_without_flock_a_stale_lock_is_still_cleared(fake_compile, tmp_path, monkeypatch,
                                                      capsys):
    """Where the filesystem has no flock (some Lustre mounts), the lock's age decides."""
    src, built, name, build_dir = fake_compile

    def no_flock(f, op):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(native.fcntl, "flock", no_flock)
    _killed_build_lock(build_dir)
    old = time.time() - native.STALE_LOCK_S - 60
    os.utime(build_dir / "lock", (old, old))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        assert native.build(name, source=src) == f"module {name}"
    assert built == [name]
