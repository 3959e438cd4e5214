"""The GPipe schedule over a pipeline's stages, and the gradient all-reduce over a stage's copies.

A step's sequences go to the replicas (dp), each replica's share into K micro-batches; every
rank of stage s runs its layers on each micro-batch in turn: all K forwards, then the K
backwards in reverse order (GPipe: K + P - 1 slots per phase, P - 1 of them idle at each end,
the bubble). The stage's computation is a callable, so any model whose layers are cut into
stages plugs in (hgt's: the embedding on the first stage, blocks by a partition of the global
layer indices, the head and loss on the last).

The loss of a step is already normalised by the step's total (number of targets over every
replica), so the step's loss is the plain SUM of the last stages' contributions over every
replica and context-parallel rank, and a parameter's gradient the SUM of its copies' gradients
(:func:`reduce_gradients`): dp replicas hold the same parameters on other data, cp ranks on
other rows of the same sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from plexgt.distributed.collectives import Comm, all_reduce_, all_reduce_bytes
from plexgt.distributed.p2p import Pipe, recv_forward, send_forward

StageFn = Callable[[int, Any], torch.Tensor]
"""``stage_fn(k, x)``: this stage's computation on micro-batch k. ``x`` is the stage's input:
``inputs(k)`` on the first stage, the previous stage's output (received, requires grad)
elsewhere. Returns the stage's output activation, or on the last stage the micro-batch's
loss contribution (0-d, already divided by the step's total)."""

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""Gradients are all-reduced in flat buckets of about this many bytes: one collective per
bucket instead of per tensor (latency), without doubling the gradients' memory at once."""


def gpipe_step(stage_fn: StageFn, pipe: Pipe, micro_batches: int,
               inputs: Callable[[int], Any] | None = None,
               in_shape: Sequence[int] | Callable[[int], Sequence[int]] | None = None,
               dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu",
               loss_comm: Comm | None = None) -> torch.Tensor:
    """One step of this rank's stage under GPipe: K forwards, then K backwards in reverse.

    ``pipe``: this rank's neighbours (:class:`~plexgt.distributed.p2p.Pipe`); first stage iff
    ``pipe.prev is None``, last iff ``pipe.next is None``. ``inputs(k)``: the first stage's
    input of micro-batch k (anything ``stage_fn`` takes). ``in_shape``: the shape of the
    activation a later stage receives (for micro-batch k when a callable), in ``dtype`` on
    ``device``. ``loss_comm``: a group holding every last-stage rank (the world) over which the
    step's loss is summed; None: the loss is this rank's own sum.

    Leaves each parameter's gradient of this micro-batch set accumulated in ``.grad`` (call
    :func:`reduce_gradients` next); returns the step's loss, 0-d float64 on ``device``, the
    same on every rank of ``loss_comm`` (detached)."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches} must be at least 1")
    first, last = pipe.prev is None, pipe.next is None
    if first and inputs is None:
        raise ValueError("the first stage needs inputs(k) for its micro-batches")
    if not first and in_shape is None:
        raise ValueError("a stage after the first needs in_shape of the activation it receives")
    outs: list[torch.Tensor] = []
    loss = torch.zeros((), dtype=torch.float64, device=device)  # summed where computed: no sync
    for k in range(micro_batches):
        if first:
            x = inputs(k)  # type: ignore[misc]
        else:
            shape = in_shape(k) if callable(in_shape) else in_shape
            x = recv_forward(shape, dtype, device, pipe)
        y = stage_fn(k, x)
        if last:
            if y.dim() != 0:
                raise ValueError(f"the last stage returned a loss of shape {tuple(y.shape)}, "
                                 "expected a 0-d tensor")
            loss += y.detach().to(device=loss.device, dtype=torch.float64)
            outs.append(y)
        else:
            outs.append(send_forward(y, pipe))
        del x, y
    for k in reversed(range(micro_batches)):
        before = pipe.grads_sent
        outs.pop().backward()
        if not first and pipe.grads_sent == before:
            # the stage's output did not depend on its input: its gradient is zero, and the
            # previous stage waits for it
            shape = in_shape(k) if callable(in_shape) else in_shape
            pipe.send_gradient(torch.zeros(tuple(shape), dtype=dtype, device=device))
    pipe.flush()
    if loss_comm is not None and loss_comm.size > 1:
        all_reduce_(loss, loss_comm)
    return loss  # on the device: the loop sums a step's losses there (no sync a step)


@torch.no_grad()
def gpipe_forward(stage_fn: Callable[[int, Any], Any], pipe: Pipe, micro_batches: int,
                  inputs: Callable[[int], Any] | None = None,
                  in_shape: Sequence[int] | Callable[[int], Sequence[int]] | None = None,
                  dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
                  ) -> list[Any]:
    """The forward half of :func:`gpipe_step` without autograd (evaluation): micro-batch k
    through this rank's stage, its output sent on; returns what ``stage_fn`` gave on the
    last stage for each micro-batch (anything: logits, counts), [] elsewhere.

    Why its own schedule: evaluation keeps no activations for a backward and sends no
    gradients back, so each micro-batch's memory is freed as soon as it has been sent."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches} must be at least 1")
    first, last = pipe.prev is None, pipe.next is None
    if first and inputs is None:
        raise ValueError("the first stage needs inputs(k) for its micro-batches")
    if not first and in_shape is None:
        raise ValueError("a stage after the first needs in_shape of the activation it receives")
    outs: list[Any] = []
    for k in range(micro_batches):
        if first:
            x = inputs(k)  # type: ignore[misc]
        else:
            shape = in_shape(k) if callable(in_shape) else in_shape
            x = recv_forward(shape, dtype, device, pipe)  # type: ignore[arg-type]
        y = stage_fn(k, x)
        if last:
            outs.append(y)
        else:
            send_forward(y, pipe)
        del x, y
    pipe.flush()
    return outs


def loss_bytes(world: int) -> int:
    """Bytes one rank sends (and receives) summing the step's loss (one float64) over
    ``world`` ranks: :func:`gpipe_step`'s ``loss_comm`` all-reduce."""
    return all_reduce_bytes(8, world)


# -- the gradient all-reduce -----------------------------------------------------------------


def bucket_sizes(nbytes: Sequence[int], cap: int = DEFAULT_BUCKET_BYTES) -> list[int]:
    """Tensors of ``nbytes`` (one dtype, in order) packed greedily into buckets of at most
    ``cap`` bytes (a tensor larger than ``cap`` is a bucket of its own): each bucket's size."""
    return [sum(nbytes[i] for i in b) for b in _buckets(nbytes, cap)]


def _buckets(nbytes: Sequence[int], cap: int) -> list[list[int]]:
    out: list[list[int]] = []
    size = 0
    for i, b in enumerate(nbytes):
        if not out or (size > 0 and size + b > cap):
            out.append([])
            size = 0
        out[-1].append(i)
        size += b
    return out


def gradient_bytes(nbytes: Sequence[int], p: int, cap: int = DEFAULT_BUCKET_BYTES) -> int:
    """Bytes one rank sends (and receives) in :func:`reduce_gradients` over ``p`` ranks, for
    parameters of ``nbytes`` each, all of one dtype, in order (several dtypes: the sum of this
    per dtype, each in its own buckets)."""
    if p <= 1:
        return 0
    return sum(all_reduce_bytes(b, p) for b in bucket_sizes(nbytes, cap))


@torch.no_grad()
def reduce_gradients(params: Iterable[torch.nn.Parameter], comm: Comm,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Sum every parameter's gradient over ``comm`` (the stage group: every copy of these
    parameters), in place, in flat buckets per dtype and device.

    Every rank of ``comm`` must pass the same parameters in the same order. A parameter with no
    gradient on this rank takes part as zeros (and gets the sum), so the buckets line up on
    every rank whichever parameters its data touched."""
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if comm.size <= 1:
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for members in groups.values():
        sizes = [p.grad.numel() * p.grad.element_size() for p in members]
        for idx in _buckets(sizes, bucket_bytes):
            grads = [members[i].grad for i in idx]
            flat = torch.cat([g.reshape(-1) for g in grads])
            all_reduce_(flat, comm)
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n
