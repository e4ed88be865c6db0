#!/usr/bin/env bash
# The GPU check of issue 52, as one command on a bare device machine (benchmarks/GPU.md says how to call it).
#
#   benchmarks/gpu_check.sh               # on the GPU machine: CUDA tensors, Triton kernels
#   benchmarks/gpu_check.sh --rehearse    # here, without a GPU: the same steps on the CPU (or GPU_CHECK_DEVICE=cpu)
#
# Where the checkout is the working directory, its own pyro_whvi/ (which has no _csrc: pyproject.toml maps the
# top-level cuda/ there at install) would shadow the installed copy; so every step runs from a copy of tests/ and
# benchmarks/ in a scratch folder, and `env` fails unless pyro_whvi and its kernels come from the install.
#
# GPU_CHECK_STEPS (default: all) names the steps to run, e.g. "tests gpu-kernels"; GPU_CHECK_KERNEL_ARGS and
# GPU_CHECK_SVI_ARGS replace the benchmarks' size arguments (a shorter rerun inside what is left of a lease).
#
# Steps, each with its own time limit (`timeout`), inside a global deadline of GPU_CHECK_DEADLINE_S seconds
# (default 540, well inside the device tool's 10 minutes); a failing step does not stop the later ones:
#   install       pyro-ppl and pyro-api from the carried wheels (.whl/, `make gpu-wheels` fetches them) and this
#                 project (--no-deps --no-build-isolation, offline) into one --target folder on PYTHONPATH
#   cpu-kernels   the compiled C++ CPU kernels (the tests compare CUDA with the CPU), in the background
#   dao           Dao-AILab's fast-hadamard-transform, built with nvcc in the background (<= 180 s) when a
#                 source tree with its CUDA sources (csrc/) is carried in .whl/; skipped otherwise, and said so
#   env           nvidia-smi, torch, Triton, the device's name
#   tests         tests/ops/test_cuda.py on CUDA tensors: every op and dtype against the float64 reference
#   gpu-kernels   benchmarks/gpu_kernels.py: fwht (out of place and in place) and whvi_matvec, forward and backward,
#                 float32, D = 2^4 ... 2^15, against the copy floor, the reference, dense cuBLAS (and Dao's kernel
#                 where built)
#   svi-step      benchmarks/svi_step.py --device cuda: plain PyTorch, the layers eager and compiled, SVI
#                 AutoNormal and AutoWHVIGuide, eager and JIT, D = 128 ... 1024
#   uci           whvi uci --device cuda end to end on diabetes (and the same run on the CPU, to compare)
#
# Everything goes to $OUT (default ./gpu_check_out, or /tmp/gpu_check_rehearsal when rehearsing): summary.txt
# (each step's exit status and seconds), the main tables as markdown, and gpu_check.tar.gz with every log and
# result. At most 8 files, as the device tool brings back. Exit status: 0 when every step passed, else 1.
set -u

REHEARSE=0
if [[ "${1:-}" == "--rehearse" || "${GPU_CHECK_DEVICE:-cuda}" == "cpu" ]]; then
    REHEARSE=1
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
if ((REHEARSE)); then
    DEVICE=cpu
    OUT=${OUT:-/tmp/gpu_check_rehearsal}
else
    DEVICE=cuda
    OUT=${OUT:-$ROOT/gpu_check_out}
fi
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SITE=$WORK/site
DAO_SITE=$WORK/dao_site
RESULTS=$WORK/results
mkdir -p "$OUT" "$RESULTS"
TREE=$WORK/tree
mkdir -p "$TREE" && cp -r "$ROOT/tests" "$ROOT/benchmarks" "$TREE/" && rm -rf "$TREE/benchmarks/results"
mkdir -p "$TREE/benchmarks/results"
STEPS=" ${GPU_CHECK_STEPS:-install env tests cpu-kernels gpu-kernels svi-step uci uci-cpu} "
SUMMARY=$WORK/summary.txt
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_DEADLINE_S:-540}))
FAILED=0
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

{
    echo "gpu_check.sh on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ): device $DEVICE, rehearsal $REHEARSE"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with changes)')"
    printf '%-12s %6s %8s  %s\n' step status seconds note
} >"$SUMMARY"

# step NAME BUDGET_S NOTE -- COMMAND...: run COMMAND with its output in WORK/NAME.log, under the smaller of its
# budget and the time left before the deadline; record its exit status (124: timed out) and seconds.
step() {
    local name=$1 budget=$2 note=$3
    shift 4
    local now left limit began rc
    if [[ "$STEPS" != *" $name "* ]]; then
        printf '%-12s %6s %8s  %s\n' "$name" skipped 0 "not in GPU_CHECK_STEPS" >>"$SUMMARY"
        return
    fi
    now=$(date +%s)
    left=$((DEADLINE - now - 15))
    limit=$((budget < left ? budget : left))
    if ((limit < 5)); then
        printf '%-12s %6s %8s  %s\n' "$name" skipped 0 "no time left before the deadline" >>"$SUMMARY"
        FAILED=1
        return
    fi
    echo "== $name (limit ${limit}s): $*"
    began=$(date +%s)
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >"$WORK/$name.log" 2>&1  # bash: functions too
    rc=$?
    printf '%-12s %6s %8s  %s\n' "$name" "$rc" "$(($(date +%s) - began))" "$note" >>"$SUMMARY"
    tail -n 4 "$WORK/$name.log"
    if ((rc != 0)); then FAILED=1; fi
}

# The steps run in `bash -c` under `timeout`: the functions and the variables they read are exported.
export PYTHON WHEELS SITE DAO_SITE RESULTS DEVICE ROOT TREE

# --- install: the carried wheels and the project, offline, into one folder (nothing else on the machine changes)
install() {
    shopt -s nullglob
    local wheels=("$WHEELS"/*.whl)
    if ((${#wheels[@]} == 0)) && ! "$PYTHON" -c "import pyro" 2>/dev/null; then
        echo "no wheels in $WHEELS and no pyro-ppl here: run 'make gpu-wheels' and carry .whl" >&2
        return 3
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" "$ROOT"
}
export -f install
step install 90 "$(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' 2>/dev/null | wc -l) wheels from $WHEELS + this project (--no-deps)" -- install
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH
cd "$TREE" || exit 2

# --- in the background: the CPU kernels, and Dao's kernel where its sources are carried
step_background() {
    local name=$1 budget=$2
    shift 2
    (
        began=$(date +%s)
        timeout --kill-after=10 "$budget" bash -c '"$@"' "$name" "$@" >"$WORK/$name.log" 2>&1
        echo "$? $(($(date +%s) - began))" >"$WORK/$name.status"
    ) &
}
CPU_KERNELS_PID=""
if [[ "$STEPS" == *" cpu-kernels "* ]]; then
    step_background cpu-kernels 240 "$PYTHON" -m pyro_whvi.ops.build
    CPU_KERNELS_PID=$!
fi

DAO_NOTE=""
DAO_SOURCE=""
for candidate in "$WHEELS"/fast-hadamard-transform "$WHEELS"/fast_hadamard_transform-*/; do
    if [[ -d "$candidate/csrc" ]]; then DAO_SOURCE=$candidate; fi
done
if [[ -z "$DAO_SOURCE" ]]; then
    for archive in "$WHEELS"/fast_hadamard_transform-*.tar.gz; do
        [[ -f "$archive" ]] || continue
        if tar -tzf "$archive" | grep -q '/csrc/.*\.cu$'; then
            mkdir -p "$WORK/dao_src" && tar -xzf "$archive" -C "$WORK/dao_src"
            DAO_SOURCE=$(echo "$WORK"/dao_src/*/)
        else
            DAO_NOTE="$(basename "$archive") holds no CUDA sources (csrc/): the PyPI sdist fetches a prebuilt wheel from GitHub instead, which this machine cannot reach"
        fi
    done
fi
DAO_PID=""
if [[ -n "$DAO_SOURCE" ]] && command -v nvcc >/dev/null && ((!REHEARSE)); then
    dao_build() {
        FAST_HADAMARD_TRANSFORM_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=8 \
            "$PYTHON" -m pip install -v --no-index --no-deps --no-build-isolation --no-cache-dir --target "$DAO_SITE" \
            "$DAO_SOURCE"
    }
    export DAO_SOURCE
    export -f dao_build
    step_background dao 180 dao_build
    DAO_PID=$!
elif [[ -z "$DAO_NOTE" ]]; then
    if [[ -z "$DAO_SOURCE" ]]; then
        DAO_NOTE="no source tree of fast-hadamard-transform with csrc/ in $WHEELS"
    elif ((REHEARSE)); then
        DAO_NOTE="rehearsal: not built on the CPU"
    else
        DAO_NOTE="no nvcc on PATH"
    fi
fi
if [[ -n "$DAO_NOTE" ]]; then
    printf '%-12s %6s %8s  %s\n' dao skipped 0 "Dao's kernel not timed: $DAO_NOTE" >>"$SUMMARY"
fi

# --- what the machine is
environment() {
    if command -v nvidia-smi >/dev/null; then nvidia-smi; fi
    "$PYTHON" - <<'EOF'
import importlib.metadata as metadata, os, sys, torch
import pyro, pyro_whvi
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("pyro", pyro.__version__, "from", os.path.dirname(pyro.__file__), "; pyro_whvi from", os.path.dirname(pyro_whvi.__file__))
import pyro_whvi._csrc.triton.kernels as kernels  # the Triton kernels: CUDA tensors fall back to the reference without
site = os.path.realpath(os.environ["SITE"])
for module in (pyro_whvi, kernels):
    if not os.path.realpath(module.__file__).startswith(site + os.sep):
        sys.exit(f"{module.__name__} comes from {module.__file__}, not the install in {site}")
if torch.cuda.is_available():
    from pyro_whvi.ops import triton_backend
    if not triton_backend.triton_available():
        sys.exit("CUDA tensors would use the reference ops: Triton's kernels are not available")
for name in ("triton", "gpytorch", "numpy", "scipy", "hypothesis", "pytest-xdist"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "missing")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "sm", f"{props.major}{props.minor}", "multiprocessors", props.multi_processor_count,
          "memory GiB", round(props.total_memory / 2**30, 1))
else:
    print("no CUDA device")
EOF
}
export -f environment
step env 30 "versions and the device" -- environment

# --- the tests on the device's tensors (the CPU when rehearsing)
workers=$( ((REHEARSE)) && echo 2 || echo 8)
export workers
run_tests() {
    local xdist=()
    if "$PYTHON" -c "import xdist" 2>/dev/null; then xdist=(-n "$workers"); fi
    PYRO_WHVI_TEST_DEVICE=$DEVICE "$PYTHON" -m pytest tests/ops/test_cuda.py -q -rs -p no:cacheprovider "${xdist[@]}" \
        --junitxml="$RESULTS/test_cuda.xml"
}
export -f run_tests
step tests 150 "tests/ops/test_cuda.py with PYRO_WHVI_TEST_DEVICE=$DEVICE" -- run_tests

# Timings need the machine to themselves: the background builds end first (they are bounded by their limits).
if [[ -n "$CPU_KERNELS_PID" ]]; then
    wait "$CPU_KERNELS_PID"
    read -r rc seconds <"$WORK/cpu-kernels.status"
    printf '%-12s %6s %8s  %s\n' cpu-kernels "$rc" "$seconds" "python -m pyro_whvi.ops.build (background)" >>"$SUMMARY"
    if ((rc != 0)); then FAILED=1; fi
fi
if [[ -n "$DAO_PID" ]]; then
    wait "$DAO_PID"
    read -r rc seconds <"$WORK/dao.status"
    note="fast-hadamard-transform from $DAO_SOURCE with nvcc (background)"
    if ((rc == 0)); then export PYTHONPATH=$DAO_SITE:$PYTHONPATH; else note="$note: failed, Dao's kernel not timed"; fi
    printf '%-12s %6s %8s  %s\n' dao "$rc" "$seconds" "$note" >>"$SUMMARY"
fi

# --- the kernels' speed
if ((REHEARSE)); then
    kernel_args=(--device cpu --max-log2-d 6 --dense-max-log2-d 5 --elements 1024 --min-run-time 0.01)
else
    # fwht and whvi_matvec in float32 at every D: about 6 s a row on an H200 (2026-11-27), so the whole sweep
    # (4 ops, 3 dtypes: about 140 rows) does not fit one call; GPU_CHECK_KERNEL_ARGS="--dtypes bfloat16" etc. for more
    kernel_args=(--device cuda --dtypes float32 --ops fwht,whvi_matvec --min-run-time 0.05)
fi
if [[ -n "${GPU_CHECK_KERNEL_ARGS:-}" ]]; then read -r -a kernel_args <<<"--device $DEVICE $GPU_CHECK_KERNEL_ARGS"; fi
step gpu-kernels 170 "benchmarks/gpu_kernels.py ${kernel_args[*]}" -- \
    "$PYTHON" benchmarks/gpu_kernels.py "${kernel_args[@]}" --out "$RESULTS"

# --- one training step, D = 128 ... 512 (128, 256 when rehearsing)
# The two 'JIT torch.compile' cases (Inductor, since this script's H200 run) compile a graph per D: not yet timed on
# a GPU, so D stops at 2^9 here (2^10 took 83 s on an H200 without them, compilation included).
if ((REHEARSE)); then
    svi_args=(--max-log2-d 8 --batch 8 --rounds 1 --min-run-time 0.01 --threads 1 --compile-backend aot_eager)
else
    svi_args=(--max-log2-d 9 --rounds 1 --min-run-time 0.1)
fi
if [[ -n "${GPU_CHECK_SVI_ARGS:-}" ]]; then read -r -a svi_args <<<"$GPU_CHECK_SVI_ARGS"; fi
step svi-step 110 "benchmarks/svi_step.py --device $DEVICE ${svi_args[*]}" -- \
    "$PYTHON" benchmarks/svi_step.py --device "$DEVICE" "${svi_args[@]}" --out "$RESULTS"

# --- a training run end to end, then the same on the CPU
steps=$( ((REHEARSE)) && echo 20 || echo 1000)
uci_args=(--dataset diabetes --methods mfg,whvi --splits 0 --steps "$steps" --samples 16)
step uci 60 "whvi uci --device $DEVICE ${uci_args[*]}" -- whvi uci --device "$DEVICE" "${uci_args[@]}" \
    --out "$RESULTS/uci_$DEVICE"
step uci-cpu 75 "the same on the CPU" -- whvi uci --device cpu "${uci_args[@]}" --out "$RESULTS/uci_cpu_baseline"

# --- what comes back: at most 8 files in $OUT
echo "total $(($(date +%s) - START)) s; every step passed: $( ((FAILED)) && echo no || echo yes)" >>"$SUMMARY"
cp "$SUMMARY" "$OUT/summary.txt"
for table in "$RESULTS"/gpu_kernels*.md "$RESULTS"/svi_step*.md; do
    [[ -f "$table" ]] && cp "$table" "$OUT/"
done
for run in "$RESULTS"/uci_*/; do
    [[ -f "$run/uci_diabetes.md" ]] && cp "$run/uci_diabetes.md" "$OUT/$(basename "$run").md"
done
tail -n 30 "$WORK/tests.log" >"$OUT/tests_tail.txt" 2>/dev/null
tar -czf "$OUT/gpu_check.tar.gz" -C "$WORK" --exclude=site --exclude=dao_site --exclude=dao_src .
files=$(find "$OUT" -maxdepth 1 -type f | wc -l)
if ((files > 8)); then echo "warning: $files files in $OUT; the device tool brings back 8" >&2; fi
echo
cat "$OUT/summary.txt"
rm -rf "$WORK"
exit "$FAILED"
