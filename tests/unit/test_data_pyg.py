"""``plexgt prep --format pyg``: a PyG Data, a dict of tensors, a dataset root; weights only,
anything else pickled refused unrun; the round trip gives the native source's tiles."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from plexgt.cli import main
from plexgt.data.formats.pyg import read_pyg
from plexgt.data.synthetic import sbm
from plexgt.errors import DataError
from tests.datagen import write_ogb_splits


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A 400-node SBM graph as a gnn-benchmark npz (CSR adjacency, row = source), and its
    arrays."""
    g = sbm(num_nodes=400, num_edges=3000, num_classes=5, num_features=12, seed=3)
    root = tmp_path_factory.mktemp("pyg")
    a = sp.csr_matrix((np.ones(g.num_edges, np.float32), (g.src, g.dst)),
                      shape=(g.num_nodes, g.num_nodes))
    a.sum_duplicates()
    a.sort_indices()
    path = root / "graph.npz"
    np.savez(path, adj_data=a.data, adj_indices=a.indices, adj_indptr=a.indptr,
             adj_shape=np.array(a.shape), attr_matrix=g.features, labels=g.labels)
    coo = a.tocoo()
    return path, {"src": coo.row.astype(np.int64), "dst": coo.col.astype(np.int64),
                  "x": g.features, "y": g.labels}


def _prep(fmt: str, src: Path, out: Path, *extra: str) -> dict:
    assert main(["prep", "--format", fmt, "--input", str(src), "--out", str(out),
                 "--tiles", "2", "--quiet", *extra]) == 0
    return json.loads((out / "manifest.json").read_text())


def _tensors(a: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {"edge_index": torch.from_numpy(np.stack([a["src"], a["dst"]])),
            "x": torch.from_numpy(a["x"]), "y": torch.from_numpy(a["y"])}


def _checksums(m: dict) -> dict[str, str]:
    return {k: v["sha256"] for k, v in m["files"].items()}


def test_a_dict_of_tensors_reproduces_the_native_sources_tiles(native, tmp_path):
    """The same graph from its gnn-benchmark npz and as a dict of tensors saved with
    torch.save (no PyG needed): every tile's, the features' and the nodes' checksums equal."""
    path, a = native
    want = _prep("gnn-benchmark", path, tmp_path / "native")
    torch.save(_tensors(a), tmp_path / "g.pt")
    got = _prep("pyg", tmp_path / "g.pt", tmp_path / "dict")
    assert any(k.startswith("A1/") for k in _checksums(want))
    assert _checksums(got) == _checksums(want)
    assert (got["N"], got["E"], got["F"], got["C"]) == (want["N"], want["E"], want["F"],
                                                       want["C"])


def test_a_pyg_data_reproduces_the_native_sources_tiles(native, tmp_path):
    """A PyG ``Data`` saved with torch.save (format recognised by ``--format auto``) prepares
    to the native source's checksums."""
    pyg = pytest.importorskip("torch_geometric.data")
    path, a = native
    want = _prep("gnn-benchmark", path, tmp_path / "native")
    torch.save(pyg.Data(**_tensors(a)), tmp_path / "data.pt")
    got = _prep("auto", tmp_path / "data.pt", tmp_path / "data")
    assert _checksums(got) == _checksums(want)


def test_a_pyg_dataset_root_with_stored_splits(native, tmp_path):
    """An InMemoryDataset root (PyG >= 2.4's (dict, slices, class) tuple) with [N, 2] masks:
    --split-index 1 takes the second column; an index it lacks is one line."""
    pyg = pytest.importorskip("torch_geometric.data")
    _, a = native
    n = a["x"].shape[0]
    masks = {k: torch.zeros(n, 2, dtype=torch.bool) for k in ("train_mask", "val_mask",
                                                               "test_mask")}
    masks["train_mask"][:100, 0] = True
    masks["train_mask"][100:250, 1] = True
    masks["val_mask"][300:350] = True
    masks["test_mask"][350:] = True
    (tmp_path / "ds" / "processed").mkdir(parents=True)
    pyg.InMemoryDataset.save([pyg.Data(**_tensors(a), **masks)],
                             str(tmp_path / "ds" / "processed" / "data.pt"))
    g = read_pyg(tmp_path / "ds", split_index=1)
    assert np.array_equal(g.splits["train"], np.arange(100, 250))
    assert np.array_equal(g.splits["test"], np.arange(350, n))
    with pytest.raises(DataError, match="holds 2 splits; --split-index 2"):
        read_pyg(tmp_path / "ds", split_index=2)


def test_an_ogb_root_s_one_split_is_split_0_and_no_other(native, tmp_path):
    """A dataset root without masks beside OGB's split/<kind>/*.csv.gz: split 0 (and
    ``--split-index all``) is that split; --split-index 3 is one line, not that split."""
    _, a = native
    root = tmp_path / "ogb"
    (root / "processed").mkdir(parents=True)
    torch.save(_tensors(a), root / "processed" / "data.pt")
    ids = {"train": np.arange(0, 200), "valid": np.arange(200, 300), "test": np.arange(300, 400)}
    write_ogb_splits(root, ids)
    g = read_pyg(root, split_index=0)
    for name, arr in ids.items():
        assert np.array_equal(g.splits[name], arr)
    assert len(read_pyg(root, split_index=None).stored_splits) == 1
    with pytest.raises(DataError, match=f"^{re.escape(str(root))}: holds 1 split; "
                       "--split-index 3 is not one of them$"):
        read_pyg(root, split_index=3)


class _Payload:
    """Unpickled unrestricted, it would create a file (any code could run there)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (open, (str(self.target), "w"))


def test_a_file_pickling_anything_else_is_refused_and_never_run(native, tmp_path, capsys):
    """A .pt whose pickle would create a file: prep refuses it in one line naming the file
    and the class, exit 2, no output directory, and the file was never created."""
    _, a = native
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({**_tensors(a), "extra": _Payload(marker)}, evil)
    capsys.readouterr()
    rc = main(["prep", "--format", "pyg", "--input", str(evil), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(evil) in err[0] and "refused, nothing in it was run" in err[0], err
    assert "open" in err[0]
    assert not marker.exists() and not (tmp_path / "o").exists()
    # read directly too (the reader itself, whatever the CLI does around it)
    with pytest.raises(DataError, match="evil.pt: pickles"):
        read_pyg(evil)
    assert not marker.exists()


@pytest.mark.parametrize("content,msg", [
    (b"not a torch file", "not a torch.save file"),
    (None, "has no 'edge_index'"),
])
def test_bad_pyg_files_are_one_line(tmp_path, content, msg):
    p = tmp_path / "bad.pt"
    if content is None:
        torch.save({"x": torch.zeros(3, 2)}, p)
    else:
        p.write_bytes(content)
    with pytest.raises(DataError, match=msg) as e:
        read_pyg(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert os.path.exists(p)
