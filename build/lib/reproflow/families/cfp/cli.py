"""`reproflow cfp`: CFP's passes with the reference scripts' options.

  reproflow cfp analysis --model moe --num_layer 4 --batch_size 64
  reproflow cfp --mode profile --model moe --num_layer 4 --batch_size 64     (the scripts' form)
  reproflow cfp search --model moe --num_layer 4 --batch_size 64
  reproflow cfp all --model gpt,moe,llama                                     (the three passes, each model)
  reproflow cfp enum --model gpt      (communication volume vs measured communication and compute time)

Each command writes a suite under --results and runs it here on --nproc ranks (gloo on CPUs), or
submits it to Slurm with --submit; rows land in the results folder, the analysis files and the
profiles in --work_dir. The search needs the profiles, the profiles are reused when the model,
batch and mesh are unchanged (--force re-profiles).
"""

from __future__ import annotations

import argparse

from reproflow import api
from reproflow.api.options import generated_suite_options, placement
from reproflow.families.cfp.choices import BASELINES, MODELS
from reproflow.spec.errors import ReproflowError
from reproflow.spec.params import number, whole
from reproflow.spec.suite import suite_toml

PASSES = ("analysis", "profile", "search")


def suite_text(models: list[str], passes: list[str], args: argparse.Namespace) -> str:
    """A suite with one experiment per (model, mesh, pass), in pass order for each model and mesh."""
    common = {"size": args.size, "num_layer": args.num_layer, "batch_size": args.batch_size, "warmup": args.warmup,
              "repeats": args.repeats, "lower_top": args.lower_top,
              "lower_repeats": args.lower_repeats, "runs": args.runs, "screen": args.screen,
              "memory_limit_gb": args.memory_limit_gb, "work_dir": args.work_dir, "force": args.force,
              "verbose": args.verbose, "verify": not args.no_verify, "baselines": args.baselines}
    return suite_toml({"description": f"CFP {', '.join(passes)} of {', '.join(models)} on {args.nproc} ranks"},
                      {"nodes": args.nodes, "time_limit": "04:00:00", "network": args.network},
                      [{"name": f"{m}{f'-m{mesh}' if mesh else ''}-{p}", "family": "cfp",
                        "launch": {"procs_per_node": args.nproc // args.nodes},
                        "params": {"mode": p, "model": m, "mesh": mesh, **common}}
                       for m in models for mesh in args.mesh.split(",") for p in passes])


def cmd_cfp(args: argparse.Namespace) -> int:
    mode = args.mode or args.pass_
    if mode is None:
        raise ReproflowError("no pass given: reproflow cfp analysis|profile|search|all (or --mode PASS).")
    models = [m for m in args.model.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ReproflowError(f"--model {args.model!r} names no model or an unknown one; give a comma-separated "
                             f"list of {', '.join(MODELS)}.")
    if args.nodes < 1 or args.nproc % args.nodes:
        raise ReproflowError(f"--nodes {args.nodes}: the --nproc {args.nproc} ranks must spread evenly over the "
                             "nodes; give a divisor of --nproc.")
    passes = list(PASSES) if mode == "all" else [mode]
    meshes = args.mesh.replace(",", "-") if args.mesh else ""
    name = (f"cfp-{'-'.join(models)}-{mode}-{args.size}-L{args.num_layer}-B{args.batch_size}-n{args.nproc}"
            + (f"-N{args.nodes}" if args.nodes > 1 else "") + (f"-m{meshes}" if meshes else ""))
    api.run_generated_suite(suite_text(models, passes, args), name, placement(args))
    return 0


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `reproflow cfp ...`."""
    p = sub.add_parser("cfp", help="CFP: analysis, profile and search passes (GPT, MoE, LLaMA)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pass_", nargs="?", choices=[*PASSES, "all", "enum"], metavar="PASS",
                   help="analysis, profile, search, all three in order, or enum (the reference's "
                        "enum_and_benchmark: communication volume against measured time per plan)")
    p.add_argument("--mode", choices=[*PASSES, "all", "enum"], help="the pass, as the reference's scripts give it")
    p.add_argument("--model", default="gpt", help=f"model(s), comma-separated: {', '.join(MODELS)}")
    p.add_argument("--size", default="tiny",
                   help="model size (tiny or wide for CPUs; the reference's: see reproflow list)")
    p.add_argument("--num_layer", type=whole(0), default=0, help="layers (0: the size's)")
    p.add_argument("--batch_size", type=whole(1), default=8, help="global batch size")
    p.add_argument("--nproc", type=whole(1), default=4, help="ranks (devices of the mesh)")
    p.add_argument("--nodes", type=whole(1), default=1, help="nodes the ranks spread over (here: emulated hosts)")
    p.add_argument("--network", default="", metavar="RATE",
                   help="run here: each emulated host's link at RATE each way, e.g. 1gbit (root and iproute2)")
    p.add_argument("--mesh", default="", help="device mesh shapes, comma-separated: '' (1-D, the default) or AxB "
                                              "with A*B = nproc, e.g. 1x4,2x2,4x1 (1xN and Nx1 are the 1-D mesh)")
    p.add_argument("--warmup", type=whole(0), default=1, help="untimed steps before each measurement")
    p.add_argument("--repeats", type=whole(1), default=2, help="profile: timed steps per combination")
    p.add_argument("--lower_top", type=whole(0), default=4,
                   help="profile: the fastest combinations per segment and input partition timed again lowered")
    p.add_argument("--lower_repeats", type=whole(1), default=5,
                   help="profile: timed steps of each combination timed again lowered (in turns; the median is read)")
    p.add_argument("--runs", type=whole(1), default=3, help="search: timed steps of each plan")
    p.add_argument("--screen", type=whole(0), default=0,
                   help="search: timed steps of every plan first; then only CFP's plan and the fastest of each "
                        "kind of baseline take the --runs steps (0: every plan takes them)")
    p.add_argument("--memory_limit_gb", type=number(), default=0.0, help="search: memory limit per device (0: none)")
    p.add_argument("--baselines", default=",".join(BASELINES),
                   help="search: plans run beside CFP's (alpa: per-contraction strategies by an integer program; "
                        "ddp, fsdp2: PyTorch's DistributedDataParallel and fully_shard on the module; zero1-3: "
                        "DeepSpeed's ZeRO stages, an optional extra)")
    p.add_argument("--work_dir", default="cfp-logs", help="analysis files and profiles")
    p.add_argument("--force", action="store_true", help="profile again segments already profiled")
    p.add_argument("--verbose", action="store_true", help="analysis: print every ParallelBlock")
    p.add_argument("--no-verify", action="store_true",
                   help="search: skip checking each plan against the unsharded model (needed above tiny sizes)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_cfp)
