#!/usr/bin/env bash
# The gnn-benchmark sets (Amazon Computers/Photo, Coauthor CS/Physics, Cora, CiteSeer, DBLP):
# each NAME.npz in SRC_DIR -> OUT_DIR/NAME, symmetrised (some are stored directed).
#   data_prep/gnn-benchmark.sh ../shared/datasets/gnn-benchmark /scratch/gnn-benchmark
set -euo pipefail
SRC=${1:?usage: $0 SRC_DIR OUT_DIR [prep options]}; OUT=${2:?usage: $0 SRC_DIR OUT_DIR}; shift 2
for f in "$SRC"/*.npz; do
    "${PYTHON:-python}" -m plexgt prep --format gnn-benchmark --input "$f" \
        --out "$OUT/$(basename "$f" .npz)" --symmetrize "$@"
done
