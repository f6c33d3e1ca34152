"""Run one resharding plan on every rank, optionally with two destination tiles swapped in the
expected layout, and print the wrong elements the tile check finds (rank 0). Launched by
test_resharding_run.py through reproflow's local launcher.

Arguments: exact|swap MODE [CHUNK_BYTES [DST_SPEC]] (defaults: 512 KiB, 'S0,R').
"""

from __future__ import annotations

import dataclasses
import sys

from reproflow.families.resharding import FAMILY, plan_for
from reproflow.families.resharding.execute import run_plan
from reproflow.rank.context import RunContext
from reproflow.spec.params import resolve


def main() -> None:
    swap = sys.argv[1] == "swap"
    ctx = RunContext.from_env("cpu", "gloo", 60)
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 524288
    dst_spec = sys.argv[4] if len(sys.argv) > 4 else "S0,R"
    params = resolve(FAMILY.params, {"case": "custom", "src_mesh": "1x2", "dst_mesh": "2x2", "shape": "8x6",
                                     "src_spec": "R,S1", "dst_spec": dst_spec, "resharding_mode": sys.argv[2],
                                     "chunk_bytes": chunk})
    plan = plan_for(params, ctx.host_size)
    if swap:  # ranks 2 and 4 hold different halves; expecting them the other way round must fail
        boxes = dict(plan.dst_boxes)
        boxes[2], boxes[4] = boxes[4], boxes[2]
        plan = dataclasses.replace(plan, dst_boxes=boxes)
    times, wrong = run_plan(ctx, plan, 2)
    if ctx.rank == 0:
        print(f"runs={len(times)} wrong={wrong}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
