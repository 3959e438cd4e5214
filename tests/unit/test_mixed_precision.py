"""bfloat16 training: float32 masters, the curve of the float32 run to bfloat16's rounding."""

import json
import subprocess
import sys

import pytest

from tests.datagen import prepared_sbm

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("model", ["gcn", "gps"])  # gps: attention and the 1D GCN path
def test_bfloat16_follows_the_float32_curve(model, tmp_path):
    data = prepared_sbm(tmp_path / "prep", 600, 6000, num_features=16, num_classes=4, seed=2)
    curves = {}
    for dt in ("float32", "bfloat16"):
        m = tmp_path / f"{dt}.jsonl"
        subprocess.run([sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model",
                        model, "--epochs", "4", "--metrics", str(m), "--progress=false",
                        f"--dtype={dt}", "--model.hidden=32", "--model.heads=2"],
                       check=True, capture_output=True, env={"PLEXGT_NO_MPI": "1",
                                                               "OMP_NUM_THREADS": "1",
                                                               "PATH": "/usr/bin:/bin"})
        curves[dt] = [json.loads(line)["loss"] for line in m.read_text().splitlines()]
    assert len(curves["bfloat16"]) == 4
    for a, b in zip(curves["float32"], curves["bfloat16"]):
        assert abs(b - a) <= 0.02 * a, (curves["float32"], curves["bfloat16"])
    assert curves["bfloat16"] != curves["float32"]  # it did compute in bfloat16
