# Sourced by the GPU node scripts (they set py, the interpreter, and out, the folder that comes back):
#   say TEXT: a line with the time;
#   machine: the machine, once, for every row (GPU, driver, torch, CUDA, NCCL, cores, memory, and
#     whether an emulated network can be built) -> $out/machine.txt;
#   timed PART LIMIT COMMAND...: COMMAND under LIMIT seconds, its output appended to
#     $out/$logs$PART.log (logs: a prefix the script may set), a row part,seconds,status appended to
#     $out/$csv (the script sets csv), so that a part that fails or runs out of time loses nothing
#     measured before it; its exit status is COMMAND's.
say() { echo "[$(date +%T)] $*"; }

machine() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
          ".".join(map(str, torch.cuda.nccl.version())), "capability", torch.cuda.get_device_capability())'
    nvcc --version | tail -2
    echo "cpus $(nproc) memory $(free -g | awk '/Mem:/ {print $2}') GiB user $(id -un)"
    for tool in tc ip; do echo "$tool: $(command -v $tool || echo absent)"; done
  } > "$out/machine.txt" 2>&1
  cat "$out/machine.txt"
}

timed() {
  local part=$1 limit=$2; shift 2
  say "$part: $* (at most ${limit} s)"
  local start; start=$(date +%s%N)
  timeout "$limit" "$@" >> "$out/${logs:-}$part.log" 2>&1
  local rc=$? seconds; seconds=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  local status=ok; [ $rc = 0 ] || status="exit $rc$([ $rc = 124 ] && echo ' (time limit)')"
  [ -f "$out/$csv" ] || echo "part,seconds,status" > "$out/$csv"
  echo "$part,$seconds,$status" >> "$out/$csv"
  say "$part: $status in $seconds s"
  return $rc
}
