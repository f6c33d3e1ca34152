#!/bin/bash
# One GPU node's checks of what the gpu image compiles, built here against this node's own torch, CUDA
# and NCCL for its GPU's architecture alone, and of GEMM against the GPU's limits:
#   1. nccl-tests (MPI=0), apex with its C++ and CUDA extensions (as the image's Dockerfile builds it) and
#      DeepSpeed's fused Adam and CPU Adam ops, each build timed; then apex's fused layer norm and fused
#      Adam and DeepSpeed's fused Adam against torch's kernels, and all_reduce_perf -g 1 through param
#      comms' parser (benchmarks/gpu_compiled.py -> compiled.csv)
#   2. bf16 GEMM (dataset A, 8192^3, the fastest published H100 matmul's shape) against a bare torch.mm
#      loop and as fractions of the dense peak and of that published figure (gpu_bench.py -> gemm.csv);
#      the same shapes as param_compute rows and `reproflow report --reference h100-mamf` over them
#   (GEMM runs first: bounded and quick, it lands whatever the builds do.)
# Usage: benchmarks/gpu_node_checks.sh OUT [SOURCES [WHEELS]]
#   SOURCES: the pinned source tarballs (apex, nccl-tests; default ../shared/third-party)
#   WHEELS:  DeepSpeed's source distribution and the wheels it needs that the node lacks (hjson, pydantic)
# Every step writes under OUT as it goes and has its own time limit, so a failed or slow step loses
# nothing measured before it. Run from the repository root; python3 is the node's torch.
set -u
out=$(realpath -m "${1:?usage: gpu_node_checks.sh OUT [SOURCES [WHEELS]]}")
sources=$(realpath "${2:-../shared/third-party}")
wheels=${3:-}
mkdir -p "$out"
work=$(mktemp -d)
py=python3
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source benchmarks/gpu_node.sh
machine
arch=$($py -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
sm=${arch/./}
nccl=$($py -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
cuda_lib=$cuda/lib64; [ -d "$cuda_lib" ] || cuda_lib=$cuda/lib

# GEMM first, on a quiet node: bounded and quick, it lands whatever the builds do.
say "GEMM against the limits"
timeout 180 $py benchmarks/gpu_bench.py --out "$out" --dtypes bfloat16
timeout 120 $py -m reproflow.app.cli run gpu-one -e gemm-limit --results "$work/results" \
  && timeout 120 $py -m reproflow.app.cli report --results "$work/results" --out "$work/report" \
     --reference h100-mamf > "$out/report.txt" 2>&1
find "$work/results" -path '*gemm-limit*' -name '*.csv' -exec cp {} "$out/gemm_limit_rows.csv" \;
find "$work/report" -name 'reference_h100-mamf.md' -o -name 'limits.md' | xargs -r cp -t "$out/"

# Each build's output to build-PART.log, its seconds and exit status to builds.csv (gpu_node.sh's timed).
logs=build- csv=builds.csv

# nccl-tests against the NCCL torch runs with (its wheel has libnccl.so.2 only: link the name -lnccl wants).
tar -xzf "$sources"/nccl-tests-*.tar.gz -C "$work"
mkdir -p "$work/nccl/lib" && ln -s "$nccl/include" "$work/nccl/include"
ln -s "$nccl/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
timed nccl-tests 150 make -C "$work"/nccl-tests-* -j "$(nproc)" MPI=0 NCCL_HOME="$work/nccl" CUDA_HOME="$cuda" \
  CUDA_LIB="$cuda_lib" NVCC_GENCODE="-gencode=arch=compute_$sm,code=sm_$sm"
LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}" timeout 60 "$work"/nccl-tests-*/build/all_reduce_perf \
  -g 1 -b 8 -e 256M -f 4 -w 5 -n 20 > "$out/all_reduce_perf.txt" 2>&1

# apex as the image builds it (APEX_CPP_EXT, APEX_CUDA_EXT), its extensions four at a time, four jobs each.
tar -xzf "$sources"/apex-*.tar.gz -C "$work"
export py work arch wheels
timed apex 240 bash -c 'APEX_CPP_EXT=1 APEX_CUDA_EXT=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS=4 \
  APEX_PARALLEL_BUILD=4 $py -m pip install --no-build-isolation --no-deps --no-index "$work"/apex-* \
  && $py -c "import torch, apex, fused_layer_norm_cuda, amp_C"'

# DeepSpeed from its source distribution with the two ops the image builds; the packages it needs that
# the node lacks go to a folder of their own on PYTHONPATH.
if [ -n "$wheels" ]; then
  $py -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/*.whl
  export PYTHONPATH="$PYTHONPATH:$work/site"
fi
timed deepspeed 180 bash -c 'DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 TORCH_CUDA_ARCH_LIST="$arch" \
  MAX_JOBS="$(nproc)" $py -m pip install --no-build-isolation --no-deps --no-index "${wheels:-.}"/deepspeed-*.tar.gz \
  && $py -c "import deepspeed.ops.adam"'

say "checks of the compiled parts"
timeout 120 $py benchmarks/gpu_compiled.py --builds "$out/builds.csv" --nccl-tests "$out/all_reduce_perf.txt" \
  --out "$out/compiled.csv"

say "done"
