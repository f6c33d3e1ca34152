"""`reproflow aceso profile | search | train | megatron | predict | database | reproduce | e2e |
search-cost | perf-model-acc`: Aceso's tools and result scripts, with the reference's option names.

Search and plan generation are CPU-only and read a profiled database in the reference's format
(`--profiled-time-path`). Outputs follow the reference: config JSON per pipeline depth, the best
ones under `top_configs/`, per-stage info CSVs under `csv/`, and a search-cost summary CSV.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

from reproflow.api.options import generated_suite_options, job_options, placement
from reproflow.families.aceso.settings import CASES, KINDS, TINY_CASES
from reproflow.spec.params import number, whole

T = TypeVar("T")

# Each command parses into a request of pipeline.py, imported (torch, pandas, the search) only when it runs.


def request(cls: type[T], args: argparse.Namespace) -> T:
    """A request dataclass from the parsed options of the same names (lists become tuples)."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


def cmd_megatron(args: argparse.Namespace) -> int:
    """The fastest feasible uniform (pp, tp, dp, micro-batch, recompute) plan, as Aceso's JSON."""
    from reproflow.families.aceso import pipeline

    return 0 if pipeline.megatron(request(pipeline.SearchRequest, args)) is not None else 1


def cmd_search(args: argparse.Namespace) -> int:
    """One search per pipeline depth in parallel; write the reference's outputs and compare with Megatron-LM.

    A search is keyed by the database's content hash and its options: a second search of the same
    database with the same options reuses the first one's configs (unless --force)."""
    from reproflow.families.aceso import pipeline

    outcome = pipeline.search(request(pipeline.SearchRequest, args), placement(args))
    return 0 if outcome.found else 1


def cmd_megatron_lm(args: argparse.Namespace) -> int:
    """Megatron-LM itself on a uniform GPT plan (from `aceso megatron` or `aceso search`): print the
    torchrun command of its pretrain_gpt.py with the plan's tp, pp, per-DP-rank micro-batch, global
    batch, shape and recompute on mock data; with --run, run it (on a GPU node, in the megatron
    container) and write the iteration time as the reference's CSV under
    --log-path/megatron-lm/runtime/gpt/<size>/csv/."""
    from reproflow.families.aceso import pipeline

    pipeline.megatron_lm(args.config, args.megatron_dir, args.num_nodes, args.train_iters, args.log_path, args.run)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Per-stage time and memory of a config JSON (Aceso's or reproflow's)."""
    from reproflow.families.aceso import pipeline

    pipeline.predict(request(pipeline.SearchRequest, args), args.config)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train config JSONs, or a search folder's best config and its Megatron-LM plan (--plan), with
    reproflow's runtime: here on gloo ranks, or on Slurm (--submit, after --after jobs). Writes the
    reference's per-rank CSVs under --log-path/{aceso,megatron}/runtime/<model>/<size>/csv/ and
    result rows under --results."""
    from reproflow.families.aceso import pipeline

    pipeline.train(request(pipeline.TrainRequest, args), placement(args))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile a model's ops (per TP size, micro-batch and algo), collectives and P2P here, then write the
    database: a suite is generated under --results, so reruns only profile what is missing."""
    from reproflow.families.aceso import pipeline

    pipeline.profile(request(pipeline.ProfileRequest, args), placement(args))
    return 0


def cmd_database(args: argparse.Namespace) -> int:
    """Write the profiler's rows under --results as Aceso's database files."""
    from reproflow.families.aceso import pipeline

    pipeline.database(args.results, args.out)
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """One of the artifact's settings, one command, with the artifact's own settings for every model.

    small: for each model, profile its ops, search configs, train every Megatron-LM plan once (one job,
    shuffled) and take the fastest measured that fits memory as the baseline (tiny sizes: GPT once more
    under a memory limit where recomputation pays, gpt-memory); then train Aceso's config and
    the baseline in ABBA rounds in one job with the same runtime (the plan also on megatron-core's
    tensor-parallel layers where megatron-core is installed), and print the end-to-end, search-cost
    and performance-model tables. With --submit the steps of each model are Slurm jobs chained with
    afterok dependencies; run the result scripts (`reproflow aceso e2e small` ...) when they have
    finished.

    small --sizes reference --profiled-time-path DB, large, scale: the search step of the artifact's
    experiments on a profiled database (the artifact
    asks reviewers without GPUs to reproduce exactly this): every model and size of its scripts,
    Aceso's search and the Megatron-LM plan, predicted throughput normalised to Megatron-LM beside the
    published measured one, and search cost beside the published. CPU only; --submit makes each
    search a CPU-only Slurm job."""
    from reproflow.families.aceso import artifact

    artifact.reproduce(request(artifact.ReproduceRequest, args), placement(args))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    """The reference's result scripts: tables printed and written as CSVs, and the paper's figure."""
    from reproflow.families.aceso import artifact

    artifact.results(args.script, args.setting, args.log_path, args.out, args.published)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-name", required=True, choices=("gpt", "t5", "resnet", "scale-layer"))
    p.add_argument("--model-size", default="", help="e.g. 1_3B, 770M, 1B (scale-layer: none)")
    p.add_argument("--num-layers", type=whole(1), default=None,
                   help="default: the size's depth; required for scale-layer")
    p.add_argument("--global-batch-size", type=whole(1), required=True)
    p.add_argument("--micro-batch-size", type=whole(1), nargs="+", default=None,
                   help="profiled micro-batch sizes (default: 16 32 48 64 for resnet, else 1 2 4 8)")
    p.add_argument("--num-nodes", type=whole(1), required=True)
    p.add_argument("--num-gpus-per-node", type=whole(1), required=True)
    p.add_argument("--memory-limit", type=number(), default=28000, help="MB per GPU")
    p.add_argument("--max-tp", type=whole(1), default=None, help="default: GPUs per node (4 for GPT-350M)")
    p.add_argument("--start-num-stages", type=whole(1), default=1)
    p.add_argument("--end-num-stages", type=whole(1), default=None, help="default: min(GPUs, 16)")
    p.add_argument("--profiled-time-path", type=Path, required=True, help="the profiled database folder")
    p.add_argument("--config-save-path", type=Path, required=True, help="where config JSONs go")
    p.add_argument("--model", dest="cost_model", choices=KINDS, default=None,
                   help="performance model: runtime (also the gradient all-reduce and optimizer step, which need "
                   "the optimizer and all_reduce tables reproflow's profiler writes) or reference (Aceso's own); "
                   "default: runtime where the database has those tables, else reference (the artifact's)")


def _budget(p: argparse.ArgumentParser, cases_help: str, default: int | None) -> None:
    """The search's budget: a count of explored cases, or the artifact's clock."""
    p.add_argument("--budget-cases", type=whole(1), default=default, metavar="N", help=cases_help)
    p.add_argument("--time-budget-total", type=number(), default=None, metavar="S",
                   help="the artifact's budget instead: S seconds per pipeline depth (its 200); the config then "
                   "depends on the machine's speed and on what else runs on it")


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `reproflow aceso ...`."""
    top = sub.add_parser("aceso", help="Aceso: profile, search, train, Megatron-LM plans, result scripts",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tools = top.add_subparsers(dest="aceso_command", required=True, metavar="TOOL")
    p = tools.add_parser("search", help="iterative bottleneck alleviation, one search per pipeline depth",
                         formatter_class=formatter, description=cmd_search.__doc__)
    _common(p)
    p.add_argument("--max-num-hops", type=whole(1), default=7)
    _budget(p, f"explored cases per pipeline depth (default: {CASES}): one database, one config, on any machine",
            CASES)
    p.add_argument("--num-of-saved-configs", type=whole(1), default=1)
    p.add_argument("--tie-resolution", type=number(), default=0.0, metavar="SHARE",
                   help="configs predicted within this share of the fastest (0.01: 1 %%) are a near tie, and the "
                        "smallest micro-batch, then the fewest stages, is kept, for Aceso's configs and the "
                        "Megatron-LM plan alike (default 0: the fastest; the tiny models' reproduction: 0.01)")
    p.add_argument("--op-group-size", type=whole(1), default=1, help="ops moved together by an op migration")
    p.add_argument("--peak-mem-in-backward", type=number(), default=0.0,
                   help="MB added to a stage's memory when choosing what to recompute")
    p.add_argument("--finetune-after-trial", type=whole(0), default=0,
                   help="rounds of op-level tp/dp and algo tuning after each trial")
    p.add_argument("--sort-metric", choices=("max_stage_time", "total_gpu_time"), default="max_stage_time",
                   help="order in which a hop's results are searched further")
    p.add_argument("--log-path", type=Path, default=None, help="summary CSV folder (default: --config-save-path)")
    p.add_argument("--config-suffix", default="", help="file-name suffix (default: the start time)")
    p.add_argument("--processes", type=whole(0), default=0,
                   help="depths searched at once (default: one a core; on the clock, every depth)")
    p.add_argument("--from-results", type=Path, default=None,
                   help="first write the database at --profiled-time-path from these profiler results")
    p.add_argument("--megatron-memory-limit", type=number(), default=None,
                   help="MB per GPU for the Megatron-LM plan (default: --memory-limit)")
    p.add_argument("--megatron-micro-batch-size", type=whole(1), nargs="+", default=None,
                   help="micro-batch sizes of the Megatron-LM plan (default: --micro-batch-size)")
    p.add_argument("--force", action="store_true", help="search again even if this database and these options "
                   "were searched before")
    p.add_argument("--submit", action="store_true", help="run as a CPU-only Slurm job (through submitit)")
    job_options(p, "with --submit: ")
    p.set_defaults(func=cmd_search)
    p = tools.add_parser("megatron", help="the fastest feasible Megatron-LM uniform plan",
                         formatter_class=formatter, description=cmd_megatron.__doc__)
    _common(p)
    p.set_defaults(func=cmd_megatron)
    p = tools.add_parser("profile", help="profile a model's ops, collectives and P2P here and write the database",
                         formatter_class=formatter, description=cmd_profile.__doc__)
    p.add_argument("--prof-model-name", required=True, choices=("gpt", "t5", "resnet", "scale-layer"))
    p.add_argument("--prof-model-size", required=True, help="e.g. tiny, 1_3B, 770M, 1B, scale-layer")
    p.add_argument("--prof-tp-size", type=whole(1), nargs="+", default=[1, 2], help="TP sizes (local ranks each)")
    p.add_argument("--prof-mbs-list", type=whole(1), nargs="+", default=[1, 2, 4, 8], help="micro-batch sizes")
    p.add_argument("--prof-seq-len", type=whole(0), default=0, help="sequence length or image side; 0: the size's")
    p.add_argument("--prof-warmup-times", type=whole(0), default=3)
    p.add_argument("--prof-repeat-times", type=whole(1), default=10)
    p.add_argument("--prof-repeat-seconds", type=number(), default=0.0,
                   help="more timed passes over the ops than --prof-repeat-times until they take this many seconds")
    p.add_argument("--prof-rounds", type=whole(1), default=1,
                   help="time the ops in this many rounds over every micro-batch and algo in turn, the repeats and "
                   "seconds shared among them; the database takes each op's median over the rounds")
    p.add_argument("--prof-comm-sizes", default="0-64", help="collective sizes in whole MB, e.g. '0-16,32'")
    p.add_argument("--prof-path", type=Path, required=True, help="database folder to write")
    p.add_argument("--prof-num-nodes", type=whole(1), default=1,
                   help="nodes the ops are timed on (each with the largest --prof-tp-size ranks); 2 or more: "
                   "P2P between nodes too")
    p.add_argument("--network", default="", metavar="RATE",
                   help="run here: each emulated host's link at RATE each way, e.g. 1gbit (root and iproute2)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_profile)
    p = tools.add_parser("database", help="the profiler's rows as Aceso's database files",
                         formatter_class=formatter, description=cmd_database.__doc__)
    p.add_argument("--results", type=Path, default=Path("results"), help="results folder with profiler rows")
    p.add_argument("--out", type=Path, required=True, help="database folder to write")
    p.set_defaults(func=cmd_database)
    p = tools.add_parser("train", help="train config JSONs with reproflow's runtime (here or on Slurm)",
                         formatter_class=formatter, description=cmd_train.__doc__)
    p.add_argument("--config", type=Path, nargs="+", required=True,
                   help="config JSONs, or a search's --config-save-path (its best config / Megatron-LM plan)")
    p.add_argument("--plan", nargs="+", choices=("aceso", "megatron"), default=["aceso"],
                   help="for a search folder: which configs to train; for a file: its runtime column")
    p.add_argument("--num-nodes", type=whole(1), default=1)
    p.add_argument("--num-gpus-per-node", type=whole(0), default=0, help="ranks per node (default: the config's GPUs)")
    p.add_argument("--train-iters", type=whole(1), default=5, help="iterations (then one more with op timers)")
    p.add_argument("--train-seconds", type=number(), default=0.0,
                   help="more iterations than --train-iters until the timed ones take this many seconds")
    p.add_argument("--seq-len", type=whole(0), default=0, help="sequence length or image side the database used")
    p.add_argument("--dropout", type=number(), default=0.1)
    p.add_argument("--log-path", type=Path, default=Path("aceso-logs"), help="root of the runtime CSVs")
    p.add_argument("--tp-impl", nargs="+", choices=("reproflow", "megatron-core"), default=["reproflow"],
                   help="tensor-parallel linear layers: reproflow's and/or megatron-core's (one run each)")
    p.add_argument("--network", default="", metavar="RATE",
                   help="run here: each emulated host's link at RATE each way, e.g. 1gbit (root and iproute2)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_train)
    p = tools.add_parser("reproduce", help="one of the artifact's settings, one command: small (profile -> search "
                         "-> train -> tables), large and scale (search on a profiled database -> tables)",
                         formatter_class=formatter, description=cmd_reproduce.__doc__)
    p.add_argument("setting", choices=("small", "large", "scale"), help="the artifact's setting")
    p.add_argument("--sizes", choices=("tiny", "reference"), default="tiny",
                   help="small: tiny (the three models shrunk for CPUs) or reference (GPT-1.3B, T5-770M, WRN-1B: GPUs)")
    p.add_argument("--models", nargs="+", choices=("gpt", "t5", "resnet", "gpt-memory"),
                   default=["gpt", "t5", "resnet", "gpt-memory"],
                   help="small, tiny sizes: gpt-memory is GPT under a memory limit where recomputation is needed")
    p.add_argument("--model-sizes", nargs="+", default=[], metavar="SIZE",
                   help="large and scale: only these sizes (e.g. 1_3B 13B, or 8layers 1024layers)")
    p.add_argument("--profiled-time-path", type=Path, default=None,
                   help="large and scale (and small --sizes reference, search only): the profiled database "
                   "(the artifact's profiled-time-eurosys, or -miniset for small)")
    p.add_argument("--artifact-configs", type=Path, default=None,
                   help="large and scale: the artifact's own search output (its logs-large/aceso/configs), scored "
                   "with the reference model beside reproflow's")
    p.add_argument("--model", dest="cost_model", choices=KINDS, default=None,
                   help="performance model (default: runtime for small, reference for large and scale, whose "
                   "database has no optimizer tables)")
    p.add_argument("--num-nodes", type=whole(0), default=0,
                   help="small: nodes (default: 1; tiny models: 2 emulated hosts)")
    p.add_argument("--num-gpus-per-node", type=whole(0), default=0,
                   help="small: GPUs (local ranks) per node (default: 4; tiny models: 1 per emulated host)")
    p.add_argument("--network", default=None, metavar="RATE",
                   help="small, run here: each emulated host's link at RATE each way (default: 1gbit for tiny "
                   "models; '' for loopback)")
    p.add_argument("--memory-limit", type=number(), default=None,
                   help="MB per GPU for the search and the plan (default: the artifact's, per model)")
    _budget(p, f"explored cases per pipeline depth (default: {CASES}; {TINY_CASES} for tiny models): one "
            "database, one config, on any machine", None)
    p.add_argument("--processes", type=whole(0), default=0,
                   help="depths searched at once (default: one a core; on the clock, every depth)")
    p.add_argument("--train-iters", type=whole(1), default=None,
                   help="iterations per training (default: 6 for tiny models, the first untimed; 5 for the "
                   "reference sizes, the first 2 untimed)")
    p.add_argument("--train-seconds", type=number(), default=None,
                   help="more iterations than --train-iters until the timed ones take this many seconds (default: "
                   "0)")
    p.add_argument("--train-rounds", type=whole(1), default=None,
                   help="rounds in which Aceso's config and the Megatron-LM plan train in turns (ABBA, one job); "
                   "the speed-up's interval is over the rounds, so it spans the machine's drift between them "
                   "(default: 4 for tiny models, 1 for the reference sizes)")
    p.add_argument("--screen-iters", type=whole(1), default=None,
                   help="iterations of each Megatron-LM plan in the screen that finds the fastest, the first untimed "
                   "(default: 4)")
    p.add_argument("--global-batch-size", type=whole(1), default=None,
                   help="small, profiled and trained here: every model's global batch (default: the artifact's 512, "
                   "768 for Wide-ResNet; tiny sizes 32, 64), e.g. to fit a GPU's time: at one stage an iteration's "
                   "time is its micro-batches' and every plan's shrinks alike")
    p.add_argument("--until", choices=("search", "train"), default="train",
                   help="small: search: profile and search only (figure 8); train: also train (figures 7, 9)")
    p.add_argument("--log-path", type=Path, default=None,
                   help="root of profiles, configs, CSVs (default: aceso-logs, or aceso-logs-large)")
    p.add_argument("--published", type=Path, default=None, help="the artifact's results/ref/ CSVs, drawn beside")
    p.add_argument("--out", type=Path, default=None, help="tables and figures (default: <log-path>/results)")
    p.add_argument("--no-megatron-core", action="store_true",
                   help="train the Megatron-LM plan on reproflow's layers only (default: also on megatron-core's)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_reproduce)
    for name, what in (("e2e", "end-to-end throughput (figure 7)"), ("search-cost", "search cost (figure 8)"),
                       ("predicted", "predicted throughput of the searched configs against the Megatron-LM plan"),
                       ("perf-model-acc", "time and memory prediction accuracy (figure 9)")):
        p = tools.add_parser(name, help=f"the reference's result script: {what}", formatter_class=formatter,
                             description=cmd_results.__doc__)
        p.add_argument("setting", choices=("small", "large", "scale"))
        p.add_argument("--log-path", type=Path, default=None,
                       help="log root (default: aceso-logs for small, aceso-logs-large otherwise)")
        p.add_argument("--out", type=Path, default=None, help="tables and figures (default: <log-path>/results)")
        p.add_argument("--published", type=Path, default=None,
                       help="the artifact's results/ref/ CSVs (published numbers drawn beside)")
        p.set_defaults(func=cmd_results, script=name)
    p = tools.add_parser("megatron-lm", help="Megatron-LM's own pretrain_gpt.py on a uniform plan (GPU nodes)",
                         formatter_class=formatter, description=cmd_megatron_lm.__doc__)
    p.add_argument("--config", type=Path, required=True, help="a uniform GPT plan JSON")
    p.add_argument("--megatron-dir", type=Path, default=Path("/opt/Megatron-LM"), help="Megatron-LM checkout")
    p.add_argument("--num-nodes", type=whole(1), default=1)
    p.add_argument("--train-iters", type=whole(1), default=5)
    p.add_argument("--log-path", type=Path, default=Path("aceso-logs"), help="root of the runtime CSVs")
    p.add_argument("--run", action="store_true", help="run it (default: print the command)")
    p.set_defaults(func=cmd_megatron_lm)
    p = tools.add_parser("predict", help="per-stage time and memory of a config JSON",
                         formatter_class=formatter, description=cmd_predict.__doc__)
    _common(p)
    p.add_argument("--config", type=Path, required=True, help="config JSON")
    p.set_defaults(func=cmd_predict)

