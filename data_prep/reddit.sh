#!/usr/bin/env bash
# Reddit (233K nodes, 114.6M edges, 602 features, 41 classes) -> prepared dir.
# RAW is the directory holding reddit_data.npz and reddit_graph.npz (the files PyG's Reddit
# dataset downloads); the graph is stored symmetric already.
#   data_prep/reddit.sh /data/reddit/raw /scratch/reddit
set -euo pipefail
RAW=${1:?usage: $0 RAW_DIR OUT_DIR [prep options]}; OUT=${2:?usage: $0 RAW_DIR OUT_DIR}; shift 2
exec "${PYTHON:-python}" -m plexgt prep --format gnn-benchmark --input "$RAW" --out "$OUT" "$@"
