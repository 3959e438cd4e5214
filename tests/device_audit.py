"""An op-level device audit: run CPU code as if its device were a GPU, and catch what would not be.

A GPU run fails (or silently syncs) when a tensor stays on the host: a CUDA kernel refuses a CPU
operand ("Expected all tensors to be on the same device"), an NCCL group refuses CPU tensors, and
``.item()`` or a host copy inside a step stalls the stream. None of that shows on a CPU-only
machine, where every tensor is on the CPU. Here, tensors that a run puts on its device are
:class:`OnDevice` wrappers: CPU data that *report* the declared device (:data:`DECLARED`), so
the code under test takes its non-CPU branches and makes new tensors with ``device=x.device``
as it would on a GPU. :class:`DeviceAudit`, a dispatch mode, sees every op
(aten, c10d collectives, plexgt's custom Triton ops), and

* raises :class:`DeviceMismatch` when an op mixes device tensors with host tensors other than
  0-dim scalars (which CUDA ops accept), naming the op and the operands;
* records host->device and device->host copies and ``.item()``-style syncs on device tensors,
  with the Python line that made them, for the caller to assert on;
* counts the ops run on device tensors (:attr:`DeviceAudit.ops`; an accumulating
  ``index_put_`` as ``aten.index_put_.default(accumulate)``), so a test can check which
  kernels a GPU run would take (none that CUDA runs with atomics, say).

Factories with ``device=DECLARED`` and ``.to(DECLARED)`` make :class:`OnDevice` tensors;
everything else (files read, numpy arrays, default-device factories) is host memory, as it would
be on a GPU.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
DECLARED = torch.device("meta")
"""The declared device. Not ``cuda``: a CPU-only torch has no CUDA device guard, and autograd
and indexing take one for every CUDA-reporting tensor. ``meta`` has a guard, and no code path of
plexgt treats it as the CPU, so what is on it (and what is not) is what a GPU run would have."""


class DeviceMismatch(RuntimeError):
    """An op mixed device and host tensors: it would fail on a GPU."""


class OnDevice(torch.Tensor):
    """CPU data reporting the declared device (see the module docstring)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> OnDevice:
        strided = elem.layout == torch.strided
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride() if strided else None,
            storage_offset=elem.storage_offset() if strided else None, dtype=elem.dtype,
            layout=elem.layout, device=DECLARED, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    def __repr__(self) -> str:  # noqa: D105
        return f"OnDevice({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # outside an audit (e.g. a test's own comparison after it): compute, no checks
        return _run(func, args, kwargs or {}, wrap=True)


def _unwrap(x):
    return x.elem if isinstance(x, OnDevice) else x


SPARSE_ON_DEVICE: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Sparse tensors on the declared device: kept as plain tensors (a wrapper subclass cannot have
a sparse layout) and recognised by identity."""


def _wrap(x):
    if not isinstance(x, torch.Tensor) or isinstance(x, OnDevice):
        return x
    if x.layout != torch.strided:
        SPARSE_ON_DEVICE[x] = True
        return x
    return OnDevice(x)


def _to_cpu_kwargs(kwargs: dict) -> dict:
    if isinstance(kwargs.get("device"), torch.device) and kwargs["device"].type == DECLARED.type:
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs


def _run(func, args, kwargs, wrap: bool):
    out = func(*tree_map(_unwrap, args), **_to_cpu_kwargs(tree_map(_unwrap, kwargs)))
    return tree_map(_wrap, out) if wrap else out


def _where() -> str:
    """The innermost frame of the code under audit (not torch's, not this file's)."""
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = fr.filename
        if "/torch/" not in f and not f.endswith("device_audit.py"):
            return f"{f}:{fr.lineno} ({fr.line})"
    return "?"


def _kind(t: torch.Tensor) -> str | None:
    """'device', 'host', or None for a host 0-dim scalar (CUDA ops take those)."""
    if isinstance(t, OnDevice) or t in SPARSE_ON_DEVICE:
        return "device"
    if t.device.type == DECLARED.type:
        raise DeviceMismatch(f"a tensor really on {DECLARED} (no data) reached an op at "
                             f"{_where()}: a factory the audit does not route")
    if t.layout == torch.strided and t.dim() == 0 and t.device.type == "cpu":
        return None
    return "host"


def _routed(factory):
    def make(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == DECLARED.type:
            return factory(*args, **kwargs).to(DECLARED)
        return factory(*args, device=device, **kwargs)
    return make


@dataclass
class DeviceAudit(TorchDispatchMode):
    """The dispatch mode; ``transfers`` and ``syncs`` list (op, where) of each event, ``ops``
    counts the ops on device tensors by name."""

    transfers: list[tuple[str, str]] = field(default_factory=list)
    syncs: list[tuple[str, str]] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    bf16: Counter = field(default_factory=Counter)
    """Of ``ops``, those with a bfloat16 operand."""

    def __post_init__(self) -> None:
        super().__init__()
        self._factories: dict[str, object] = {}

    def __enter__(self):
        # torch.tensor(data, device=meta) makes a data-less tensor below the dispatcher; made
        # on the host and moved instead, which is also what it costs on a GPU (a copy)
        for name in ("tensor", "as_tensor"):
            real = self._factories[name] = getattr(torch, name)
            setattr(torch, name, _routed(real))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._factories.items():
            setattr(torch, name, real)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        kinds = {k for k in map(_kind, leaves) if k is not None}
        want = kwargs.get("device")
        to_device = isinstance(want, torch.device) and want.type == DECLARED.type
        to_host = isinstance(want, torch.device) and want.type == "cpu"
        name = str(func)
        if func is aten._to_copy.default:
            src = _kind(args[0]) or "host"
            dst = "device" if to_device else "host" if to_host else src
            if src != dst:
                self.transfers.append((f"{src}->{dst} {name}", _where()))
                if dst == "host":  # the host waits for the device's stream
                    self.syncs.append((f"{src}->{dst} {name}", _where()))
            return _run(func, args, kwargs, wrap=dst == "device")
        if func in (aten.copy_.default, aten._copy_from.default):
            if len(kinds) > 1:
                self.transfers.append(("copy_ between host and device", _where()))
            _run(func, args, kwargs, wrap=False)
            return args[0]
        if func is aten._local_scalar_dense.default and kinds == {"device"}:
            self.syncs.append((name, _where()))
        if len(kinds) > 1:
            shapes = ", ".join(f"{_kind(t) or 'scalar'} {tuple(t.shape)}" for t in leaves)
            raise DeviceMismatch(f"{name} mixes device and host tensors ({shapes}) at "
                                 f"{_where()}: on a GPU this op would fail")
        # (a barrier's tensor is torch.distributed's own, made for the group's backend)
        if name.startswith("c10d.") and name != "c10d.barrier.default" and "host" in kinds:
            raise DeviceMismatch(f"{name} on host tensors at {_where()}: an NCCL group has no "
                                 "CPU backend")
        on_device = "device" in kinds or to_device
        if on_device:
            accumulate = func in ACCUMULATING and (kwargs.get("accumulate") or (
                len(args) > 3 and args[3]))
            self.ops[name + ("(accumulate)" if accumulate else "")] += 1
            if any(t.dtype == torch.bfloat16 for t in leaves):
                self.bf16[name] += 1
        return _run(func, args, kwargs, wrap=on_device)


ACCUMULATING = (aten.index_put_.default, aten.index_put.default,
                aten._index_put_impl_.default)
"""Ops whose ``accumulate`` flag turns a copy into a sum (CUDA: atomics)."""


# --------------------------------------------------------------------------- emulated autocast
LOWER_PRECISION_OPS = ("__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm",
                       "chain_matmul", "linear", "matmul", "mm", "mv", "prelu")
"""What CUDA autocast runs in its low-precision dtype (torch's autocast op reference)."""
FLOAT32_OPS = ("__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin",
               "binary_cross_entropy_with_logits", "cosh", "cross_entropy", "cumprod",
               "cumsum", "dist", "erfinv", "exp", "expm1", "group_norm", "kl_div", "l1_loss",
               "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "mse_loss",
               "nll_loss", "norm", "normalize", "pow", "prod", "reciprocal", "rsqrt", "sinh",
               "softmax", "softmin", "softplus", "sum", "renorm", "tan")
"""What CUDA autocast runs in float32 (the same reference)."""
PROMOTE_OPS = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "index_put",
               "scatter_add", "tensordot")
"""What CUDA autocast runs in the widest floating dtype of its operands."""


def _funcs(names: tuple[str, ...]) -> set:
    import torch.nn.functional as F

    return {getattr(ns, n) for n in names for ns in (torch, torch.Tensor, F)
            if hasattr(ns, n)}


class EmulatedAutocast(TorchFunctionMode):
    """CUDA autocast's casts for tensors on the declared device, which torch has no autocast
    for (``torch.autocast('meta')`` raises; CPU autocast leaves them alone).

    Above autograd, as autocast is, so its casts are recorded and the backward sees the
    dtypes a GPU run's does: the ops of :data:`LOWER_PRECISION_OPS` get their floating
    operands in ``dtype``, those of :data:`FLOAT32_OPS` in float32, those of
    :data:`PROMOTE_OPS` in the widest. :meth:`install` makes ``torch.autocast``,
    ``torch.is_autocast_enabled`` and ``torch.get_autocast_dtype`` answer for the declared
    device type from it (enabled inside ``torch.autocast(DECLARED.type, dtype)``, off inside
    ``enabled=False``), so code asking whether autocast is on (plexgt.ops.precision) sees
    what it would on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[torch.dtype | None] = []
        self._low, self._f32, self._promote = (_funcs(LOWER_PRECISION_OPS),
                                               _funcs(FLOAT32_OPS), _funcs(PROMOTE_OPS))

    @property
    def dtype(self) -> torch.dtype | None:
        return self.stack[-1] if self.stack else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        want = None
        if self.dtype is not None and (func in self._low or func in self._f32
                                       or func in self._promote):
            leaves = [t for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor)]
            floats = [t for t in leaves if t.is_floating_point()]
            if any(isinstance(t, OnDevice) for t in leaves) and floats:
                want = (self.dtype if func in self._low else torch.float32
                        if func in self._f32 else
                        max((t.dtype for t in floats), key=lambda d: torch.finfo(d).bits))
        if want is not None:
            args, kwargs = tree_map(
                lambda t: t.to(want) if isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.dtype != want else t, (args, kwargs))
        return func(*args, **kwargs)

    def context(self, dtype: torch.dtype | None = None, enabled: bool = True):
        """What ``torch.autocast(DECLARED.type, ...)`` returns under :meth:`install`."""
        mode = self

        class _Ctx:
            def __enter__(self):
                mode.stack.append(dtype or mode.dtype or torch.bfloat16 if enabled else None)
                return self

            def __exit__(self, *exc):
                mode.stack.pop()
                return False

        return _Ctx()

    def install(self, monkeypatch) -> None:
        """Route torch's autocast queries and contexts for the declared device type here."""
        real_autocast, real_enabled = torch.autocast, torch.is_autocast_enabled
        real_dtype = torch.get_autocast_dtype

        def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == DECLARED.type:
                return self.context(dtype, enabled)
            return real_autocast(device_type, dtype=dtype, enabled=enabled,
                                 cache_enabled=cache_enabled)

        monkeypatch.setattr(torch, "autocast", autocast)
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: (
            self.dtype is not None if device_type == DECLARED.type
            else real_enabled(device_type) if device_type is not None else real_enabled()))
        monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: (
            self.dtype if device_type == DECLARED.type else real_dtype(device_type)))
