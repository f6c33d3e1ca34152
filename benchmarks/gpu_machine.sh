# Sourced by the GPU node scripts: say (a line with the time) and machine OUT (the machine, once, for
# every row: GPU, driver, torch, CUDA, NCCL, cores, memory, and whether an emulated network can be built).
say() { echo "[$(date +%T)] $*"; }

machine() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "${py:-python3}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
          ".".join(map(str, torch.cuda.nccl.version())), "capability", torch.cuda.get_device_capability())'
    nvcc --version | tail -2
    echo "cpus $(nproc) memory $(free -g | awk '/Mem:/ {print $2}') GiB user $(id -un)"
    for tool in tc ip; do echo "$tool: $(command -v $tool || echo absent)"; done
  } > "$1/machine.txt" 2>&1
  cat "$1/machine.txt"
}
