#!/usr/bin/env bash
# make gpu-image-here, after the build: what was built and whether its compiled parts are whole, checked inside
# the gpu flavour's squash file as Enroot starts it (no GPU needed; what needs one is said).
#   bash containers/check-gpu-image.sh APPS
# Prints a summary (each build step's seconds, the image's and the squash file's sizes, the disk the build
# used, what was skipped and why, each in-image check) and writes it to APPS/reproflow-gpu.summary.md.
# Exits 1 when a check fails.
set -euo pipefail
apps=${1:?usage: check-gpu-image.sh APPS}
image=$apps/reproflow-gpu.sqsh
[ -f "$image" ] && [ -f "$image.json" ] || { echo "no $image (and .json): build it with make gpu-image-here" >&2; exit 1; }
apps=$(cd "$apps" && pwd)
image=$apps/reproflow-gpu.sqsh summary=$apps/reproflow-gpu.summary.md
command -v enroot >/dev/null || { echo "enroot not found: tests/enroot-pyxis.sh builds it" >&2; exit 1; }
builder=$(sed -n 's/.*"builder": "\(.*\)".*/\1/p' "$image.json")

steps() {  # the step-time table of one build: | seconds | step |
    [ -f "$1" ] || return 0
    awk '{ s = $1; $1 = ""; $2 = ""; sub(/^  /, ""); gsub(/\|/, "\\|"); printf "| %s | `%s` |\n", s, $0 }' "$1"
}
total() { awk '{ s += $1 } END { print s + 0 }' "$1" 2>/dev/null || echo 0; }

# The checks run in the squash file, as Enroot starts it on a node; no GPU here, so Enroot's NVIDIA hook is off.
name=reproflow-gpu-check-$$
trap 'enroot remove -f "$name" >/dev/null 2>&1 || true' EXIT
unpack_start=$SECONDS
enroot create -f -n "$name" "$image" >/dev/null
unpack=$((SECONDS - unpack_start))
checks=$(enroot start -e NVIDIA_VISIBLE_DEVICES=void "$name" bash -s <<'EOF'
set -uo pipefail
check() {  # check WHAT COMMAND...: one table row, pass or fail, with what the command printed
    local what=$1 out status=pass
    shift
    out=$("$@" 2>&1) || status=FAIL
    printf '| %s | %s | %s |\n' "$what" "$(echo "$out" | tr '\n|' '; ' | sed 's/; $//' | cut -c1-400)" "$status"
}
check "torch, its CUDA and NCCL" python -c '
import torch
nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}")'
check "apex's C++ and CUDA extensions import" python -c '
import importlib, importlib.metadata as md
import torch  # noqa: F401  (the extensions link its libraries)
names = sorted({f.name.split(".")[0] for f in md.files("apex") if f.name.endswith(".so") and "/" not in str(f)})
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as err:
        failed.append(f"{name} ({err})")
print(f"{len(names) - len(failed)} of {len(names)} import:", " ".join(names))
assert names and not failed, failed'
check "DeepSpeed's fused Adam and CPU Adam ops are built" python -c '
import importlib, deepspeed
for name in ("fused_adam_op", "cpu_adam_op"):
    module = importlib.import_module(f"deepspeed.ops.adam.{name}")
    print(f"deepspeed {deepspeed.__version__} {name}:", module.__file__.rsplit("/", 1)[-1])'
check "nccl-tests' binaries link" bash -c '
shopt -s nullglob; bins=(/opt/nccl-tests/build/*_perf*); missing=""
for b in "${bins[@]}"; do missing+=$(ldd "$b" | grep "not found" || true); done
nccl=$(ldd /opt/nccl-tests/build/all_reduce_perf | sed -n "s/.*libnccl.so.2 => \([^ ]*\).*/\1/p")
echo "${#bins[@]} binaries (MPI=0 and _mpi), every library found; libnccl.so.2 -> $(readlink -f "$nccl")"
[ "${#bins[@]}" -gt 0 ] && [ -z "$missing" ] || { echo "missing: $missing"; exit 1; }'
# (Open MPI's CUDA components load the driver's libcuda.so.1, which only a GPU node has: not said here.)
check "mpi4py loads Open MPI built with CUDA support" bash -c '
export OMPI_MCA_mca_base_component_show_load_errors=0
ompi_info --parsable --all | grep "mpi_built_with_cuda_support:value:true"
python -c "import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI
print(\"mpi4py\", mpi4py.__version__, \"loads\", MPI.Get_library_version().splitlines()[0].strip())"'
check "aws-ofi-nccl and libfabric (EFA provider)" bash -c '
ls /opt/aws-ofi-nccl/lib/libnccl-net*.so* | head -n 1 | xargs -r basename
fi_info --version | head -n 1; fi_info --list | grep -w efa'
check "param's comms.py and driver.py at the pinned commit" bash -c '
ls "$PARAM_DIR/train/comms/pt/comms.py" "$PARAM_DIR/train/compute/pt/driver.py" && echo "PARAM_COMMIT=$PARAM_COMMIT"'
check "Open MPI's and libfabric's tools on the caller's PATH" bash -c 'command -v mpirun ompi_info fi_info'
check "the srun --mpi plugin it names" bash -c 'echo "REPROFLOW_SRUN_MPI=$REPROFLOW_SRUN_MPI"; [ "$REPROFLOW_SRUN_MPI" = pmix ]'
check "what the build left out" bash -c 'echo "REPROFLOW_IMAGE_SKIPPED=${REPROFLOW_IMAGE_SKIPPED:-none}"'
EOF
)

{
    echo "# The gpu flavour built here ($(date -u +%Y-%m-%d), $(nproc) cores)"
    echo
    sed -n 's/^  "\(image\|image_id\|base_image\|builder\|squashed_with\|git_commit\)": "\(.*\)",\{0,1\}$/- \1: `\2`/p' "$image.json"
    echo "- skipped: $(sed -n 's/^  "skipped": {\(.*\)}$/\1/p' "$image.json" | sed 's/^$/nothing/')"
    echo "- image size ($builder): $("$builder" image inspect --format '{{.Size}}' localhost/reproflow-gpu:latest 2>/dev/null \
        | awk '{ printf "%.1f GB", $1 / 1e9 }')"
    echo "- squash file: $(du -h "$image" | cut -f1), unpacked by enroot create in $unpack s"
    echo "- container storage now: $(du -sh /var/lib/containers/storage 2>/dev/null | cut -f1)"
    echo
    echo "## Build steps (seconds; 0 where the step came from the builder's cache)"
    echo
    echo "Stand-in CUDA base: $(total "$apps/.build-reproflow-cuda-standin.steps") s; the image: $(total "$apps/.build-reproflow-gpu.steps") s."
    echo
    echo "| s | step |"
    echo "|---|---|"
    steps "$apps/.build-reproflow-cuda-standin.steps"
    steps "$apps/.build-reproflow-gpu.steps"
    echo
    echo "## Checks inside the squash file (enroot start)"
    echo
    echo "| check | output | result |"
    echo "|---|---|---|"
    echo "$checks"
    echo
    echo "Not checked here (no GPU, no EFA): the kernels running, NCCL over the OFI plugin, GPUDirect RDMA."
} > "$summary"
cat "$summary"
! grep -q '| FAIL |$' <<<"$checks"
