#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with one GPU (the device tool lends one to
# some sessions for a few minutes). Every step runs under its own time limit and the script
# goes on when one fails, so a single lent run reports every step that breaks. Writes, under
# --out (default perf/results): gpu_check.json (each step's exit status and seconds, the GPU
# named), gpu_check_<step>.log, and what the benchmarks write; ends with one RESULT line.
#
#   bash perf/gpu_check.sh [--out DIR] [--dry-run]
#
# Steps (limits add up to 12 minutes, for a step that hangs; the run is meant to take under 5):
#   env        the GPU and the torch build
#   cuda_tests pytest -m cuda (the CUDA-only tests: the Triton kernel compiled for the GPU, CSR
#              moves, attention and GCN kernels against the CPU)
#   train_*    1-rank nccl training of gcn, gt and gps: 3 epochs, stopped after 2, resumed;
#              train_gt_ring: gt with GP-Ring's kernels (one rank, one block), 3 epochs
#              train_gt_extras: gt with an edge bias (4 edge features) and 4 super nodes, 3 epochs
#   dropout    perf/bench_dropout.py on the GPU (counter-based vs stream masks)
#   attention  perf/bench_attention.py on the GPU: fused Triton vs torch sparse (cuSPARSE) vs
#              gather/scatter vs PyG TransformerConv, 100K/1M and 1M/20M-edge graphs, fp32, bf16
#   profile    plexgt profile --quick on the GPU (AGP's and the 3D planner's coefficients)
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=perf/results
DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        *) echo "gpu_check.sh: unknown argument '$1' (use --out DIR, --dry-run)" >&2; exit 2 ;;
    esac
done
# the project's venv where there is one; else the machine's python3 with its CUDA torch (the
# lent GPU machines have torch, triton and torch_geometric but no network to install plexgt:
# it runs from the checkout). No MPI launcher: one process, told so (PLEXGT_NO_MPI).
if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
if [ -x .venv/bin/mpiexec ]; then
    LAUNCH=${LAUNCH:-".venv/bin/mpiexec -n 1"}
else
    LAUNCH=${LAUNCH:-"env PLEXGT_NO_MPI=1"}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY" = 1 ]; then
    WORK=${WORK:-\$TMPDIR/plexgt-gpu-XXXX}  # a dry run creates nothing
else
    WORK=${WORK:-$(mktemp -d -t plexgt-gpu-XXXX)}
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

STEPS=()
declare -A CMD LIMIT
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    STEPS+=("$name")
    LIMIT[$name]=$limit
    CMD[$name]="$*"
}

step env 20 "nvidia-smi -L; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.version.hip, torch.cuda.get_device_name(0))'"
# the Triton kernel's tests compile it for the GPU (no interpreter there); the CPU references
# use torch's kernels (PLEXGT_NATIVE=0: no C++ build on the clock)
step cuda_tests 90 "PLEXGT_NATIVE=0 $PY -m pytest -q -p no:cacheprovider -m cuda tests/unit && PLEXGT_NATIVE=0 $PY -m pytest -q -p no:cacheprovider tests/unit/test_ops_attention_triton.py"
step prep 40 "$PY -m plexgt prep --format sbm --nodes 20000 --edges 400000 --out $WORK/sbm --overwrite --quiet"
for model in gcn gt gps; do
    common="--data $WORK/sbm --model $model --epochs 3 --checkpoint-dir $WORK/ck-$model --metrics $WORK/m-$model.jsonl --parallel.backend=nccl"
    step "train_$model" 60 "$LAUNCH $PY -m plexgt train $common --stop-after 2 && $LAUNCH $PY -m plexgt train $common --resume"
done
# the ring attention's block kernels on the GPU (one rank: one block; cuSPARSE SDDMM / SpMM)
step train_gt_ring 45 "$LAUNCH $PY -m plexgt train --data $WORK/sbm --model gt --strategy gp_ring --epochs 3 --metrics $WORK/m-gt-ring.jsonl --parallel.backend=nccl"
step train_gt_extras 60 "$PY -m plexgt prep --format sbm --nodes 20000 --edges 400000 --edge-features 4 --out $WORK/sbm-ef --overwrite --quiet && $LAUNCH $PY -m plexgt train --data $WORK/sbm-ef --model gt --strategy gp_ring --epochs 3 --model.super_nodes=4 --metrics $WORK/m-gt-extras.jsonl --parallel.backend=nccl"
step dropout 45 "$PY -m perf.bench_dropout --device cuda --rows 2000000 --nodes 200000 --edges 4000000 --out bench_dropout_cuda.json"
step attention 170 "$PY -m perf.bench_attention --devices cuda --graphs synthetic large --dtypes float32 bfloat16 --reps 5 --name bench_attention_cuda"
step profile 60 "$LAUNCH $PY -m plexgt profile --quick --backend nccl --out $OUT/profile_gpu.json"

if [ "$DRY" = 1 ]; then
    for s in "${STEPS[@]}"; do
        printf '%-12s (<= %3s s)  %s\n' "$s" "${LIMIT[$s]}" "${CMD[$s]}"
    done
    echo "gpu_check.sh: dry run; results would go to $OUT"
    exit 0
fi

mkdir -p "$OUT"
results=()
ok=0
for s in "${STEPS[@]}"; do
    t0=$(date +%s%N)
    timeout "${LIMIT[$s]}" bash -c "${CMD[$s]}" > "$OUT/gpu_check_$s.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    secs=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
    [ "$rc" = 0 ] && ok=$((ok + 1))
    echo "gpu_check: $s exit $rc in ${secs} s" >&2
    results+=("\"$s\": {\"rc\": $rc, \"seconds\": $secs, \"limit_s\": ${LIMIT[$s]}}")
done
# the benchmarks write into perf/results under GPU names; copies go to --out
for f in bench_dropout_cuda.json bench_attention_cuda.json bench_attention_cuda.md; do
    if [ -f "perf/results/$f" ] && [ "$OUT" != perf/results ]; then
        cp "perf/results/$f" "$OUT/$f"
    fi
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
    echo "{\"bench\": \"gpu_check\", \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo " \"gpu\": \"${gpu:-unknown}\", \"steps\": {"
    (IFS=,; echo "  ${results[*]}")
    echo " }}"
} > "$OUT/gpu_check.json"
echo "RESULT bench=gpu_check gpu=\"${gpu:-unknown}\" steps=${#STEPS[@]} passed=$ok"
