"""Dense attention with code bias (plexgt.ops.dense_attention) against torch's softmax.

Every check compares the blocked op (online softmax forward, backward from the saved lse)
with :func:`attend_reference` (the whole [Sq, Sk] scores through torch.softmax and autograd),
float64: the output and the gradients of q, k, v and the bias weight.
"""

from __future__ import annotations

import math

import pytest
import torch

from plexgt.ops.dense_attention import (
    GLOBAL_CODE,
    attend,
    attend_reference,
    block_backward,
    block_forward,
    merge_,
)

TOL = dict(rtol=1e-10, atol=1e-12)


def _inputs(B, h, sq, sk, d, rows, cols, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, d, generator=g, dtype=dtype).requires_grad_()
               for n in (sq, sk, sk))
    codes = torch.randint(0, 4, (B, rows, cols), generator=g).to(torch.int8)
    w = torch.randn(5, h, generator=g, dtype=dtype).requires_grad_()
    dout = torch.randn(B, h, sq, d, generator=g, dtype=dtype)
    return q, k, v, codes, w, dout


def _grads(fn, q, k, v, codes, w, dout):
    for t in (q, k, v, w):
        t.grad = None
    y = fn(q, k, v, codes, w)
    (y * dout).sum().backward()
    return [y.detach()] + [t.grad.clone() for t in (q, k, v, w)]


def _check(q, k, v, codes, w, dout, block):
    want = _grads(attend_reference, q, k, v, codes, w, dout)
    got = _grads(lambda *a: attend(*a, block=block), q, k, v, codes, w, dout)
    for name, g_, w_ in zip(("out", "dq", "dk", "dv", "dbias"), got, want, strict=True):
        torch.testing.assert_close(g_, w_, **TOL, msg=name)


@pytest.mark.parametrize("block", [1, 5, 7, 16, 1000])
def test_equals_softmax_attention_any_block(block):
    """Blocks of 5 and 7 do not divide Sk = 23; 1 is one column a step; 1000 is one block."""
    _check(*_inputs(2, 3, 19, 23, 4, 19, 23), block)


@pytest.mark.parametrize("rows,cols", [(17, 17), (17, 19), (15, 17), (15, 19)])
def test_global_rows_and_columns_past_the_codes_take_code_4(rows, cols):
    """q of 19 rows against 19 keys with codes of [rows, cols]: the rest are global pairs
    (the reference writes code 4 there explicitly)."""
    _check(*_inputs(3, 2, 19, 19, 5, rows, cols, seed=1), 6)


def test_code_4_inside_the_codes_and_a_constant_code():
    q, k, v, codes, w, dout = _inputs(2, 2, 9, 11, 3, 9, 11, seed=2)
    codes[:, :, -2:] = GLOBAL_CODE
    _check(q, k, v, codes, w, dout, 4)
    _check(q, k, v, 2, w, dout, 4)


def test_rows_of_equal_scores():
    """q = 0 and every code the same on a row: a uniform softmax there (P = 1/Sk), and keys
    all equal on another batch entry."""
    q, k, v, codes, w, dout = _inputs(2, 2, 8, 13, 4, 8, 13, seed=3)
    with torch.no_grad():
        q[0, :, 3] = 0.0
        k[1] = k[1, :, :1].clone()
    codes[0, 3] = 1
    codes[1] = 2
    _check(q, k, v, codes, w, dout, 5)
    y = attend(q, k, v, codes, w, block=5).detach()
    torch.testing.assert_close(y[0, :, 3], v[0].detach().mean(1), **TOL)


def test_large_scores_do_not_overflow():
    q, k, v, codes, w, dout = _inputs(1, 2, 6, 10, 4, 6, 10, seed=4)
    with torch.no_grad():
        q.mul_(300.0)
        w.mul_(500.0)
    _check(q, k, v, codes, w, dout, 3)


def test_float32_and_bfloat16_inputs():
    q, k, v, codes, w, dout = _inputs(2, 2, 12, 12, 8, 12, 12, seed=5, dtype=torch.float32)
    want = _grads(attend_reference, q, k, v, codes, w, dout)
    got = _grads(lambda *a: attend(*a, block=5), q, k, v, codes, w, dout)
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    y = attend(qb, kb, vb, codes, w, block=5)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert qb.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32


def test_gradcheck():
    q, k, v, codes, w, _ = _inputs(1, 2, 5, 7, 3, 4, 6, seed=6)
    assert torch.autograd.gradcheck(lambda q, k, v, w: attend(q, k, v, codes, w, block=3),
                                    (q, k, v, w))


def test_blocks_merged_equal_the_whole():
    """Two K/V blocks attended apart and merged by lse (the ring's step) equal one pass, and
    their backward with the whole rows' lse and delta sums to the whole gradient."""
    q, k, v, codes, w, dout = _inputs(2, 3, 10, 14, 4, 10, 14, seed=7)
    scale = 1 / math.sqrt(4)
    qd, kd, vd, wd = (t.detach() for t in (q, k, v, w))
    out, lse = block_forward(qd, kd, vd, codes, wd, scale, block=4)
    o1, l1 = block_forward(qd, kd[:, :, :6], vd[:, :, :6], codes[:, :, :6], wd, scale, 4)
    o2, l2 = block_forward(qd, kd[:, :, 6:], vd[:, :, 6:], codes[:, :, 6:], wd, scale, 4)
    acc = torch.zeros_like(o1)
    acc_lse = torch.full_like(l1, -math.inf)
    merge_(acc, acc_lse, o2, l2)
    merge_(acc, acc_lse, o1, l1)
    torch.testing.assert_close(acc, out, **TOL)
    torch.testing.assert_close(acc_lse, lse, **TOL)
    delta = (dout * out).sum(-1)
    dq, dk, dv = torch.zeros_like(qd), torch.zeros_like(kd), torch.zeros_like(vd)
    db = torch.zeros_like(wd)
    for c0, c1 in ((0, 6), (6, 14)):
        block_backward(qd, kd[:, :, c0:c1], vd[:, :, c0:c1], codes[:, :, c0:c1], wd, scale, lse,
                       delta, dout, dq, dk[:, :, c0:c1], dv[:, :, c0:c1], db, block=4)
    want = _grads(attend_reference, q, k, v, codes, w, dout)
    for name, g_, w_ in zip(("dq", "dk", "dv", "dbias"), (dq, dk, dv, db), want[1:],
                            strict=True):
        torch.testing.assert_close(g_, w_, **TOL, msg=name)


@pytest.mark.parametrize("bad", ["codes_rows", "codes_float", "bias", "code_int", "kv"])
def test_bad_shapes_are_one_line_errors(bad):
    q, k, v, codes, w, _ = _inputs(1, 2, 5, 7, 3, 5, 7)
    if bad == "codes_rows":
        codes = torch.zeros(1, 6, 7, dtype=torch.int8)
    elif bad == "codes_float":
        codes = codes.double()
    elif bad == "bias":
        w = torch.zeros(4, 2)
    elif bad == "code_int":
        codes = 5
    else:
        v = v[:, :, :6]
    with pytest.raises(ValueError, match="dense attention") as e:
        attend(q, k, v, codes, w)
    assert "\n" not in str(e.value)


def test_bias_gradient_per_code():
    """dS summed per (code, head), over coded columns, global columns and global rows."""
    from plexgt.ops.dense_attention import _add_bias_grad_

    g = torch.Generator().manual_seed(8)
    ds = torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64)
    codes = torch.randint(0, 5, (2, 6, 9), generator=g).to(torch.int8)
    db = torch.zeros(5, 3, dtype=torch.float64)
    _add_bias_grad_(db, ds, codes, 6)  # columns 6..10: 3 coded, 2 global; row 6 global
    full = torch.full((2, 7, 5), GLOBAL_CODE)
    full[:, :6, :3] = codes[:, :, 6:].long()
    want = torch.stack([(ds * (full == c).unsqueeze(1)).sum((0, 2, 3)) for c in range(5)])
    torch.testing.assert_close(db, want, **TOL)
