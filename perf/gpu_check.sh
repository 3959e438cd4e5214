#!/usr/bin/env bash
# The GPU check: one prepared run for a lent machine with one GPU (one command of at most 10
# minutes, 15 minutes of device time in all, at most 8 files back from $OUT). Its step limits
# add up to 300 s, so a rerun still fits; every step runs under `timeout -k 10` (SIGTERM at the
# limit, SIGKILL to its whole process group 10 s later: `plexgt train` heeds SIGTERM only at an
# epoch's end, and an orphan would hold the GPU while later steps are timed), and the script
# goes on when one fails, so one run reports every step that breaks. After EACH step it
# rewrites gpu_check.json (each step's result, exit status, seconds and limit; the GPU named)
# and the log archive, so a run killed midway still returns what it did.
#
#   bash perf/gpu_check.sh [--out DIR] [--dry-run]
#
# Writes into --out (default $OUT where the lent machine sets it, else perf/results) these
# files and nothing else: gpu_check.json, gpu_check_logs.tar.gz (every step's log, the training
# metrics, the attention table), bench_attention_cuda.json, bench_attention_bandwidth_cuda.json,
# bench_dropout_cuda.json, profile_gpu.json. Everything else (data, checkpoints, Triton's cache)
# lives in a temporary folder, removed at the end. Ends with one RESULT line; exits 1 when a step failed, 3 (one
# line, nothing written) when torch sees no CUDA device. --dry-run prints the steps, their
# limits, their sum and the files, and creates nothing.
#
# The whole run is one process per command (PLEXGT_NO_MPI=1: no MPI launcher) on torch's
# kernels for the CPU parts (PLEXGT_NATIVE=0: no C++ build on the clock). Python: $PY if set,
# else .venv/bin/python when its torch sees the GPU, else the machine's python3 (a carried
# CPU-only .venv is named and passed over). Steps:
#   env         the GPU, the torch / CUDA / Triton builds (and the interpreter choice)
#   cuda_tests  the tests marked cuda (CSR moves, the GCN and attention kernels against the
#               CPU, the ledger's CUDA events) and every test of the fused Triton kernel,
#               compiled for the GPU (no interpreter there)
#   prep        a 10K-node SBM graph with 4 edge features
#   train_gcn   1-rank nccl gcn, 3 epochs: stopped with a checkpoint after 2, resumed
#   train_gt    the same for gt in bfloat16 (the fused kernel: no edge bias)
#   train_gps   the same for gps on GP-Ring's block kernels (cuSPARSE) with the edge bias and
#               4 super nodes
#   resume_cpu  gcn: 1 epoch on the CPU (gloo) with a checkpoint, resumed on the GPU (nccl):
#               a checkpoint written on one device type resumed on another
#   dropout     perf/bench_dropout.py on the GPU (counter-based vs stream masks)
#   attention   perf/bench_attention.py on the GPU, the 1M-node / 20M-edge graph, float32 and
#               bfloat16: the fused kernel vs torch's sparse kernels (cuSPARSE) vs gather /
#               scatter, time and peak memory of each
#   bandwidth   perf/bench_attention_bandwidth.py on the GPU: the fused kernel's passes (plain,
#               edge bias, ring blocks; float32, bfloat16; the uniform 1M/20M graph and a
#               power-law one with hubs): bytes each must move, GB/s and the fraction of the
#               device-to-device copy bandwidth measured in the same run (written case by
#               case: a step stopped at its limit returns the cases it finished)
#   profile     plexgt profile --quick on the GPU (the planner's coefficients)
set -uo pipefail
cd "$(dirname "$0")/.."

OUTDIR=${OUT:-perf/results}
DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUTDIR="${2:?--out needs a folder}"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        *) echo "gpu_check.sh: unknown argument '$1' (use --out DIR, --dry-run)" >&2; exit 2 ;;
    esac
done

TOTAL_LIMIT_S=300
GRACE_S=10
RETURNED=(gpu_check.json gpu_check_logs.tar.gz bench_attention_cuda.json
          bench_attention_bandwidth_cuda.json bench_dropout_cuda.json profile_gpu.json)
BENCH_FILES=(bench_attention_cuda.json bench_attention_bandwidth_cuda.json
             bench_dropout_cuda.json profile_gpu.json)

STEPS=()
declare -A CMD LIMIT
step() {  # step NAME LIMIT_S COMMAND (run by bash -c with PY, WORK and LOGS exported)
    STEPS+=("$1")
    LIMIT[$1]=$2
    CMD[$1]=$3
}

step env 20 "(preflight: the interpreter and its CUDA torch)"
step cuda_tests 50 '$PY -m pytest -q -p no:cacheprovider -rfE -m cuda $(grep -l "mark.cuda" tests/unit/test_*.py | grep -v attention_triton) && $PY -m pytest -q -p no:cacheprovider -rfE tests/unit/test_ops_attention_triton.py'
step prep 10 '$PY -m plexgt prep --format sbm --nodes 10000 --edges 200000 --edge-features 4 --out $WORK/sbm --quiet'
TRAIN='$PY -m plexgt train --data $WORK/sbm --epochs 3 --backend nccl'
step train_gcn 25 "$TRAIN --model gcn --checkpoint-dir \$WORK/ck-gcn --metrics \$LOGS/m-gcn.jsonl --stop-after 2 && $TRAIN --model gcn --checkpoint-dir \$WORK/ck-gcn --metrics \$LOGS/m-gcn.jsonl --resume"
GT="--model gt --dtype=bfloat16 --model.edge_bias=false --checkpoint-dir \$WORK/ck-gt --metrics \$LOGS/m-gt.jsonl"
step train_gt 30 "$TRAIN $GT --stop-after 2 && $TRAIN $GT --resume"
GPS="--model gps --strategy gp_ring --model.super_nodes=4 --checkpoint-dir \$WORK/ck-gps --metrics \$LOGS/m-gps.jsonl"
step train_gps 30 "$TRAIN $GPS --stop-after 2 && $TRAIN $GPS --resume"
CPU='$PY -m plexgt train --data $WORK/sbm --epochs 3 --model gcn --checkpoint-dir $WORK/ck-cpu --metrics $LOGS/m-cpu-then-gpu.jsonl'
step resume_cpu 25 "$CPU --backend gloo --stop-after 1 && $CPU --backend nccl --resume"
step dropout 15 '$PY -m perf.bench_dropout --device cuda --rows 2000000 --nodes 100000 --edges 2000000 --out bench_dropout_cuda.json'
step attention 55 '$PY -m perf.bench_attention --devices cuda --graphs large --dtypes float32 bfloat16 --reps 3 --no-pyg --name bench_attention_cuda'
step bandwidth 25 '$PY -m perf.bench_attention_bandwidth --device cuda --reps 2 --name bench_attention_bandwidth_cuda.json'
step profile 15 '$PY -m plexgt profile --quick --backend nccl --out $PLEXGT_RESULTS_DIR/profile_gpu.json'

sum=0
for s in "${STEPS[@]}"; do sum=$((sum + LIMIT[$s])); done
if [ "$DRY" = 1 ]; then
    for s in "${STEPS[@]}"; do
        printf '%-11s %3s s  %s\n' "$s" "${LIMIT[$s]}" "${CMD[$s]}"
    done
    echo "total       $sum s of step limits (at most $TOTAL_LIMIT_S; a step killed at its limit takes up to $GRACE_S s more)"
    echo "returns     ${#RETURNED[@]} files into $OUTDIR: ${RETURNED[*]}"
    exit 0
fi
if [ "$sum" -gt "$TOTAL_LIMIT_S" ]; then
    echo "gpu_check.sh: the step limits add up to $sum s, over $TOTAL_LIMIT_S s" >&2
    exit 2
fi

# -- env: the interpreter, and fail fast without a GPU (nothing is written then) -------------
T0=$(date +%s%N)
VENV=${VENV:-.venv}
HAS_CUDA='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
NOTE=""
if [ -z "${PY:-}" ]; then
    PY=python3
    if [ -x "$VENV/bin/python" ]; then
        timeout -k 2 8 "$VENV/bin/python" -c "$HAS_CUDA" >/dev/null 2>&1
        case $? in
            0) PY=$VENV/bin/python ;;
            124|137) NOTE="$VENV/bin/python did not answer within 8 s: using python3 instead" ;;
            *) NOTE="$VENV's torch sees no CUDA device (a CPU-only venv carried here?): using python3 instead" ;;
        esac
        [ -n "$NOTE" ] && echo "gpu_check.sh: $NOTE" >&2
    fi
fi
# the env step's limit holds both probes: 8 s for the venv's, the rest for this one
INFO=$(timeout -k 2 $((LIMIT[env] - 8)) "$PY" -c '
import sys
try:
    import torch
except Exception as e:
    print(f"cannot import torch ({type(e).__name__}: {e})".splitlines()[0]); sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)")
    sys.exit(1)
try:
    import triton
    tv = triton.__version__
except Exception:
    tv = "missing"
print(torch.__version__, torch.version.cuda or "-", torch.version.hip or "-", tv,
      torch.cuda.get_device_name(0).replace(" ", "_"))
' 2>&1)
case $? in
    0) ;;
    124|137) echo "gpu_check.sh: no GPU check: $PY did not import torch within $((LIMIT[env] - 8)) s" >&2; exit 3 ;;
    *) echo "gpu_check.sh: no GPU check on this machine: $PY: ${INFO##*$'\n'}" >&2; exit 3 ;;
esac
read -r TORCH_V CUDA_V HIP_V TRITON_V GPU <<< "${INFO##*$'\n'}"
GPU=${GPU//_/ }

WORK=$(mktemp -d -t plexgt-gpu-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/results" "$OUTDIR"
export PY WORK LOGS
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PLEXGT_NATIVE=0 PLEXGT_NO_MPI=1
export PLEXGT_RESULTS_DIR=$WORK/results PLEXGT_BENCH_CACHE=$WORK/bench-cache
export TRITON_CACHE_DIR=$WORK/triton-cache  # shared by the steps: each kernel compiles once
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
{
    [ -n "$NOTE" ] && echo "$NOTE"
    echo "python: $PY"
    echo "torch $TORCH_V, CUDA $CUDA_V, HIP $HIP_V, triton $TRITON_V, GPU $GPU"
    nvidia-smi -L 2>/dev/null || true
} > "$LOGS/env.log" 2>&1

declare -A RC SECS
json_str() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
secs_since() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }
result_of() {  # ok | failed | timeout | running | pending
    local s=$1
    if [ -z "${RC[$s]:-}" ]; then
        [ "$s" = "${CURRENT:-}" ] && echo running || echo pending
    elif [ "${RC[$s]}" = 0 ]; then echo ok
    elif [ "${RC[$s]}" = 124 ] || [ "${RC[$s]}" = 137 ]; then echo timeout
    else echo failed
    fi
}
collect() {  # the summary, the log archive and the benchmark results, into OUTDIR
    local status=$1 s first=1
    for f in "${BENCH_FILES[@]}"; do
        [ -f "$WORK/results/$f" ] && cp "$WORK/results/$f" "$OUTDIR/$f"
    done
    cp "$WORK"/results/*.md "$LOGS"/ 2>/dev/null
    tar -czf "$OUTDIR/gpu_check_logs.tar.gz.tmp" -C "$WORK" logs \
        && mv -f "$OUTDIR/gpu_check_logs.tar.gz.tmp" "$OUTDIR/gpu_check_logs.tar.gz"
    {
        printf '{"bench": "gpu_check", "date": "%s", "status": "%s",\n' \
            "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$status"
        printf ' "gpu": %s, "torch": %s, "cuda": %s, "hip": %s, "triton": %s, "python": %s,\n' \
            "$(json_str "$GPU")" "$(json_str "$TORCH_V")" "$(json_str "$CUDA_V")" \
            "$(json_str "$HIP_V")" "$(json_str "$TRITON_V")" "$(json_str "$PY")"
        printf ' "seconds": %s, "limits_total_s": %s, "steps": {\n' "$(secs_since "$T0")" "$sum"
        for s in "${STEPS[@]}"; do
            [ $first = 1 ] || printf ',\n'
            first=0
            printf '  "%s": {"result": "%s", "limit_s": %s, "rc": %s, "seconds": %s}' "$s" \
                "$(result_of "$s")" "${LIMIT[$s]}" "${RC[$s]:-null}" "${SECS[$s]:-null}"
        done
        printf '\n }}\n'
    } > "$OUTDIR/gpu_check.json.tmp" && mv -f "$OUTDIR/gpu_check.json.tmp" "$OUTDIR/gpu_check.json"
}

RC[env]=0
SECS[env]=$(secs_since "$T0")
echo "gpu_check: env ok in ${SECS[env]} s ($GPU, torch $TORCH_V, $PY)" >&2
for s in "${STEPS[@]:1}"; do
    CURRENT=$s
    collect running
    t0=$(date +%s%N)
    timeout -k "$GRACE_S" "${LIMIT[$s]}" bash -c "${CMD[$s]}" > "$LOGS/$s.log" 2>&1 < /dev/null
    RC[$s]=$?
    SECS[$s]=$(secs_since "$t0")
    echo "gpu_check: $s $(result_of "$s") (exit ${RC[$s]}) in ${SECS[$s]} s of ${LIMIT[$s]}" >&2
done
CURRENT=""
collect done

passed=0
failed=()
for s in "${STEPS[@]}"; do
    if [ "${RC[$s]}" = 0 ]; then passed=$((passed + 1)); else failed+=("$s"); fi
done
failed_list=$(IFS=,; echo "${failed[*]:-none}")
echo "RESULT bench=gpu_check gpu=\"$GPU\" steps=${#STEPS[@]} passed=$passed failed=$failed_list seconds=$(secs_since "$T0") out=$OUTDIR"
[ "${#failed[@]}" = 0 ]
