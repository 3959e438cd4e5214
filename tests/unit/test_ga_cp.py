"""GA-CP's single-process pieces: one member is the whole attention, the byte and memory
formulas' numbers, and one-line errors for inputs that do not fit (checked before any
message is sent, so a fake three-member ring needs no group)."""

from __future__ import annotations

import pytest
import torch

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.ops.dense_attention import attend_reference
from plexgt.parallel.ga_cp import GACPAttention, ga_cp_bytes, ga_cp_comm, ga_cp_memory_elems


def test_one_member_is_the_single_process_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    codes = torch.randint(0, 4, (2, 7, 7), generator=g).to(torch.int8)  # 2 global rows
    w = torch.randn(5, 3, generator=g, dtype=torch.float64).requires_grad_()
    ledger = CommLedger()
    got = GACPAttention(Comm.single("cp", ledger), block=3)(q, k, v, codes, w)
    want = attend_reference(q, k, v, codes, w)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    dg = torch.autograd.grad(got.sum(), (q, k, v, w))
    dw = torch.autograd.grad(want.sum(), (q, k, v, w))
    for a, b in zip(dg, dw, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert not ledger.sent


def test_bytes_formula():
    # B=2, N'=12 over 3 members (n=4), h=8, d'=16: a K/V block is 2*2*4*8*16 = 2048 elements
    assert ga_cp_bytes(2, 12, 8, 16, 3, 4) == (2 * 2048 * 4, 2 * 2048 * 4 * 2)
    assert ga_cp_bytes(2, 12, 8, 16, 3, 2) == (2 * 2048 * 2, 2 * 2048 * (2 + 4))  # bf16
    assert ga_cp_bytes(2, 12, 8, 16, 1, 4) == (0, 0)
    assert [o.count for o in ga_cp_comm(2, 12, 8, 16, 3, 4)] == [2, 2, 2]
    with pytest.raises(ValueError, match="P_cp = 5 does not divide the sequence's 12 nodes"):
        ga_cp_bytes(2, 12, 8, 16, 5, 4)


def test_memory_falls_with_the_ring():
    one = ga_cp_memory_elems(1, 2048, 1, 8, 16, 1)
    four = ga_cp_memory_elems(1, 2048, 1, 8, 16, 4)
    assert four[0] < one[0] / 3.9 and four[1] < one[1] / 3  # K/V in flight on 4


@pytest.mark.parametrize("bad,match", [
    ("rows", "hold 3 rows against 12 columns, not N'/P_cp"),
    ("kv", "q holds 6 rows and k 5"),
    ("int", "codes must be a .B, n, N'. tensor"),
])
def test_bad_member_inputs_are_one_line_errors(bad, match):
    q = k = v = torch.zeros(1, 2, 6, 4)
    codes = torch.zeros(1, 4, 12, dtype=torch.int8)
    w = torch.zeros(5, 2)
    if bad == "rows":
        codes = codes[:, :3]
    elif bad == "kv":
        k = v = torch.zeros(1, 2, 5, 4)
    else:
        codes = 1
    attn = GACPAttention(Comm(None, 3, 0, "cp", CommLedger()))
    with pytest.raises(ValueError, match=match) as e:
        attn(q, k, v, codes, w)
    assert "\n" not in str(e.value)
