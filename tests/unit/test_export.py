"""``plexgt export --format pyg``: predictions as a Data-compatible dict of tensors, in the
file's (the raw input's) node order, written atomically, refusals one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexgt.cli import main

from .test_predictions import N, _blocks, _schema, _write


@pytest.mark.parametrize("suffix", [".parquet", ".h5", ".npy"])
def test_export_holds_every_column_in_node_order(tmp_path, suffix, capsys):
    """Each predictions format exports to a dict loadable weights-only: pred, logits,
    embedding, node ids and the split masks equal the file's rows; no temporary left."""
    schema = _schema()
    blocks = _blocks(3, schema, np.random.default_rng(5))
    src = tmp_path / f"pred{suffix}"
    _write(src, schema, blocks)
    out = tmp_path / "out" / "pred.pt"
    out.parent.mkdir()
    assert main(["export", "--format", "pyg", "--predictions", str(src), "--out",
                 str(out)]) == 0
    got = torch.load(out, weights_only=True)
    want = {c: np.concatenate([b.columns[c] for b in blocks]) for c in schema.columns()}
    assert got["num_nodes"] == N
    for c in ("pred", "logits", "embedding", "node_id"):
        assert np.array_equal(got[c].numpy(), want[c]), c
    for key, code in (("train_mask", 1), ("val_mask", 2), ("test_mask", 3)):
        assert np.array_equal(got[key].numpy(), want["split"] == code), key
    assert [p.name for p in out.parent.iterdir()] == ["pred.pt"]
    pyg = pytest.importorskip("torch_geometric.data")
    data = pyg.Data.from_dict(got)
    assert data.num_nodes == N and data.logits.shape == (N, schema.classes)


def test_export_refuses_an_existing_file_and_bad_input_in_one_line(tmp_path, capsys):
    schema = _schema()
    src = tmp_path / "p.npy"
    _write(src, schema, _blocks(1, schema, np.random.default_rng(1)))
    out = tmp_path / "x.pt"
    out.write_text("mine")
    cases = [
        (["--predictions", str(src), "--out", str(out)], "x.pt: exists; pass --overwrite"),
        (["--predictions", str(tmp_path / "none.h5"), "--out", str(tmp_path / "y.pt")],
         "no such predictions file"),
        (["--predictions", str(src), "--out", str(tmp_path / "no" / "y.pt")],
         "no such directory"),
    ]
    for argv, msg in cases:
        capsys.readouterr()
        assert main(["export", "--format", "pyg", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0] and err[0].startswith("plexgt export: error:")
    assert out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npy", "x.pt"]
    assert main(["export", "--format", "pyg", "--predictions", str(src), "--out", str(out),
                 "--overwrite"]) == 0
    assert torch.load(out, weights_only=True)["num_nodes"] == N
