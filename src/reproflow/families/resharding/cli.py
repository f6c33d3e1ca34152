"""`reproflow resharding`: one case with the options of Alpa's benchmark_cross_mesh_resharding.py."""

from __future__ import annotations

import argparse

from reproflow import api
from reproflow.api import options
from reproflow.families.resharding.cases import N_TO_M, ONE_TO_M
from reproflow.families.resharding.plan import LOADBALANCE, MODES
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.params import whole


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """`reproflow resharding`: one case with the options of Alpa's benchmark_cross_mesh_resharding.py."""
    parser = sub.add_parser("resharding", help="one resharding case with the reference benchmark's options",
                            formatter_class=formatter,
                            description="Run one case of the resharding suites with the options of Alpa's "
                                        "benchmark_cross_mesh_resharding.py; it becomes `reproflow run resharding "
                                        "-e SUITE --set ...`.")
    parser.add_argument("--suite", required=True, choices=("1-to-m", "n-to-m"),
                        help="1-to-m: one source device to a destination mesh; n-to-m: the multi-device cases")
    parser.add_argument("--n-nodes", type=whole(1), default=1, help="1-to-m: hosts of the destination mesh")
    parser.add_argument("--gpu-per-node", type=whole(1), default=1, help="1-to-m: devices per destination host")
    parser.add_argument("--case", default=None, help="n-to-m: " + ", ".join(N_TO_M))
    parser.add_argument("--resharding-mode", required=True, choices=MODES)
    parser.add_argument("--resharding-loadbalance-mode", required=True, choices=LOADBALANCE)
    parser.add_argument("--use-local-allgather", action="store_true",
                        help="send_recv: receive 1/r per device, then all-gather within the host")
    parser.add_argument("--disable-tqdm", action="store_true", help="accepted for compatibility; no effect")
    options.run_options(parser)
    parser.set_defaults(func=_run_case)


def _run_case(args: argparse.Namespace) -> int:
    try:
        return api.run_suite("resharding", [args.suite], results=args.results, sets=[*_case_sets(args), *args.set],
                             nodes=args.nodes, procs_per_node=args.procs_per_node, network=args.network,
                             force=args.force, dry_run=args.dry_run, explain=args.explain)
    except ParamError as exc:
        raise ReproflowError(f"resharding: {exc}") from None


def _case_sets(args: argparse.Namespace) -> list[str]:
    """The seed's options as --set items of the resharding suite."""
    if args.suite == "1-to-m":
        case = f"1-to-{args.n_nodes}x{args.gpu_per_node}"
        if args.case is not None:
            raise ParamError("--case belongs to --suite n-to-m; 1-to-m cases are chosen with --n-nodes and "
                             "--gpu-per-node.")
        if case not in ONE_TO_M:
            raise ParamError(f"the 1-to-m suite has no destination mesh {args.n_nodes}x{args.gpu_per_node}.",
                             ", ".join(c.removeprefix("1-to-") for c in ONE_TO_M) + " (--n-nodes x --gpu-per-node)")
    else:
        case = args.case or ""
        if case not in N_TO_M:
            raise ParamError(f"--case {case or '(missing)'} is not an n-to-m case.", ", ".join(N_TO_M))
    return [f"case={case}", f"resharding_mode={args.resharding_mode}",
            f"resharding_loadbalance_mode={args.resharding_loadbalance_mode}",
            f"use_local_allgather={'true' if args.use_local_allgather else 'false'}"]
