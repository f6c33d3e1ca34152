#!/bin/bash
# One GPU node's runs that gpu_node_checks.sh leaves for later:
#   aceso: Aceso at the reference sizes on the GPU, T5-770M first (the model whose configs the search
#      ranked wrongly on one GPU), then GPT-1.3B: each profiled, searched, its Megatron-LM grid screened
#      (the fastest plan as measured is the baseline), then Aceso's config and that plan in 4 ABBA rounds
#      (the t interval over 2 rounds has 1 degree of freedom: 12.7 standard errors wide each side).
#      At a global batch of 64, the artifact's 512 / 8, so that T5 fits one lending: on one GPU a
#      config is one stage, whose iteration is its micro-batches one after another plus one optimizer
#      step, so every plan's time shrinks alike and their order stays.
#   cores: the claims that need a CPU core per rank, on the node's CPUs with its GPU hidden: spatial's
#      timed points and chart (5 ranks: the tiles against layer parallelism, halo-D2 against a halo before
#      every convolution) and Aceso's and CFP's local settings at 4 ranks
#      (workflows/reproduce/four-ranks.toml), CFP first.
# Usage: benchmarks/gpu_node_aceso_cores.sh OUT [PARTS [WORK]]
#   PARTS: aceso, cores, or "aceso cores" (the default, in that order)
#   WORK:  results, logs and reports, kept between calls (default gpu-work): a part that ran out of
#          time resumes there, every point measured before kept.
# Each command has its own time limit; after each command, its part's rows and logs (tarballs), claims and
# tables are copied to OUT. Run from the repository root; python3 is the node's torch (PYTHON: another
# interpreter).
set -u
out=$(realpath -m "${1:?usage: gpu_node_aceso_cores.sh OUT [PARTS [WORK]]}")
parts=${2:-aceso cores}
work=$(realpath -m "${3:-gpu-work}")
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source benchmarks/gpu_node.sh
machine
csv=runs.csv  # each command's seconds and exit status (gpu_node.sh's timed); its output in OUT/<step>.log
rf=("$py" -m reproflow.app.cli)  # an array, not a function: timeout runs it

# keep PART: its rows and its logs as tarballs, its claims, tables and summary.json (what
# `tools/docs.py record` keeps, with --results at the rows unpacked) in OUT/PART. The logs hold what
# explains a prediction after the machine is gone: the profiles, each search folder's baseline.json
# (every plan's prediction and measurement) and ops_*.csv (each op's), each training's per-rank CSVs.
keep() {
  local part=$1
  mkdir -p "$out/$part"
  for folder in results logs; do
    tar -czf "$out/$part/$folder.tar.gz" -C "$work/$part" "$folder" 2>/dev/null
  done
  find "$work/$part/reports" -maxdepth 2 \( -name '*.md' -o -name '*.csv' -o -name summary.json \) \
    -exec cp -t "$out/$part/" {} + 2>/dev/null
}

# step NAME LIMIT COMMAND...: timed, then the part kept, so that a call cut short by its own limit loses
# only the command it was in (which resumes from WORK); its exit status is the command's.
step() {
  timed "$@"
  local rc=$?
  keep "$part"
  return $rc
}

for part in $parts; do
  w=$work/$part
  case $part in
    aceso)
      for m in t5 gpt; do
        step "aceso-$m" 540 "${rf[@]}" aceso reproduce small --sizes reference --models $m --num-gpus-per-node 1 \
          --memory-limit 120000 --global-batch-size 64 --screen-iters 3 \
          --train-iters 4 --train-rounds 4 --no-megatron-core --log-path "$w/logs" --results "$w/results" \
          --out "$w/reports" \
          && step "aceso-report-$m" 120 "${rf[@]}" report --results "$w/results" --out "$w/reports"
      done ;;
    cores)
      # The GPU hidden: every rank runs on the CPUs under gloo.
      export CUDA_VISIBLE_DEVICES=
      folders=(--results "$w/results" --logs "$w/logs" --reports "$w/reports")
      step cores-spatial 300 "${rf[@]}" reproduce --only spatial-chart "${folders[@]}"
      step cores-four-ranks 540 "${rf[@]}" reproduce --plan workflows/reproduce/four-ranks.toml "${folders[@]}"
      unset CUDA_VISIBLE_DEVICES ;;
    *) echo "part $part: give aceso or cores" >&2; exit 2 ;;
  esac
done
say "done"
