"""The artifact's settings, as its scripts pass them, in the one place reproflow's Aceso commands read.

Aceso's artifact runs `scripts/aceso_{gpt,t5,resnet}_search.sh` (its `aceso_search.py`) and
`scripts/megatron_{gpt,t5,resnet}_search.sh` (its `gen_megatron_plan.py`) with one argument:
`small` (1 node x 4 GPUs on the miniset database), `large` (4 sizes per model on 4 to 32 GPUs of the
eurosys database; the smallest size is a given single-GPU config) or `scale` (GPT scale-layer, 8 to
1024 layers on 8 GPUs). Each row below is one model size of one setting, with both tools' options;
`tiny` is reproflow's own setting: the small setting's three models shrunk to train on CPU ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

# The performance models: "reference", the reference's predictions exactly; "runtime", also what
# reproflow's runtime spends outside the pipeline (the data-parallel gradient all-reduce and the
# optimizer step).
KINDS = ("runtime", "reference")
# The search's budget: explored cases per pipeline depth (the count the reference prints), not seconds,
# so that one database and one set of options give one config on any machine. Each count is at least
# what the reference's clock allowed on 2 idle cores (its 200 s a depth; 5 s for the tiny models), so
# the configs are as good as the clock's there (docs/aceso-search.md, "The search's budget").
CASES = 20000
TINY_CASES = 2000
# The tiny models' op profile runs in rounds over the micro-batches, each op's time the median over them:
# on 2 shared cores, micro-batches profiled one after another took their turns at different machine
# speeds, so the per-sample ratios between them moved by a tenth and more from run to run, and
# with them which config the search found (docs/aceso.md, "A profile in rounds").
TINY_PROFILE_ROUNDS = 5
# The tiny models' searches: configs predicted within this share of the fastest are a near tie, kept by a
# fixed order (search.settle). The standard error of a config's predicted time from such a profile: its
# rounds' spread over sqrt(rounds), measured on 2 shared cores (docs/aceso.md, "Near ties").
TINY_TIE_RESOLUTION = 0.01


@dataclass(frozen=True)
class SearchOptions:
    """`aceso_search.py`'s options for one model size."""

    memory_limit: float
    mbs: tuple[int, ...]
    budget_cases: int = CASES  # explored cases per depth
    max_hops: int = 7
    saved_configs: int = 1
    op_group_size: int = 1
    peak_mem_in_backward: float = 0.0  # MB added to a stage's memory when recompute is chosen
    finetune_after_trial: int = 0  # rounds of op-level tp/dp and algo tuning after each trial
    sort_metric: str = "max_stage_time"  # order of a hop's results: max_stage_time | total_gpu_time


@dataclass(frozen=True)
class Setting:
    """One model size of one setting: shape, batch, and the Aceso search and Megatron-LM plan options.

    `single_gpu` is the given (micro-batch, recompute) config the large setting uses for its smallest
    size instead of a search; both systems train it, so its normalised throughput is 1.00."""

    model: str
    size: str
    nodes: int
    gpus_per_node: int
    global_bs: int
    search: SearchOptions
    megatron_memory_limit: float
    megatron_mbs: tuple[int, ...]
    num_layers: int | None = None
    seq_len: int = 0  # 0: the size's own (tiny sets its sequence or image side)
    single_gpu: tuple[int, bool] | None = None
    network: str = ""  # run here: each emulated host's link (nodes > 1)
    # "memory": the memory limit of both systems is plans.pressure_limit's, where recomputation is needed.
    case: str = ""

    @property
    def selector(self) -> str:
        """How `aceso reproduce --models` names it: the model, with the case."""
        return f"{self.model}-{self.case}" if self.case else self.model

    @property
    def label(self) -> str:
        """The size as the artifact's result tables name it (scale-layer: its depth), with the case."""
        size = f"{self.num_layers}layers" if self.model == "scale-layer" else self.size
        return f"{size}-{self.case}" if self.case else size


GPT_MBS, RESNET_MBS = (1, 2, 4, 8), (16, 32, 48, 64)
TINY_LINK = "1gbit"
SMALL_MEMORY, LARGE_MEMORY = 12000.0, 28000.0


def _small(model: str, size: str, gbs: int, mbs: tuple[int, ...], finetune: int = 0,
           megatron: tuple[float, tuple[int, ...]] | None = None) -> Setting:
    mem, m_mbs = megatron or (SMALL_MEMORY, mbs)
    return Setting(model, size, 1, 4, gbs, SearchOptions(SMALL_MEMORY, mbs, finetune_after_trial=finetune), mem, m_mbs)


def _large(model: str, sizes: tuple[str, ...], gbs: int, mbs: tuple[int, ...], single: tuple[str, int],
           **search: object) -> tuple[Setting, ...]:
    opts = SearchOptions(LARGE_MEMORY, mbs, saved_configs=3, **search)  # type: ignore[arg-type]
    shapes = ((1, 4), (1, 8), (2, 8), (4, 8))
    first = Setting(model, single[0], 1, 1, gbs, opts, LARGE_MEMORY, mbs, single_gpu=(single[1], True))
    return (first, *(Setting(model, size, n, g, gbs, opts, LARGE_MEMORY, mbs)
                     for size, (n, g) in zip(sizes, shapes[:len(sizes)], strict=True)))


SETTINGS: dict[str, tuple[Setting, ...]] = {
    "small": (
        _small("gpt", "1_3B", 512, GPT_MBS),
        _small("t5", "770M", 512, GPT_MBS),
        # megatron_resnet_search.sh small alone gives the baseline more memory and a smaller micro-batch.
        _small("resnet", "1B", 768, RESNET_MBS, finetune=1, megatron=(15000.0, (8, 16, 32, 64))),
    ),
    "large": (
        *_large("gpt", ("1_3B", "2_6B", "6_7B", "13B"), 1024, GPT_MBS, ("350M", 8)),
        # The scripts also list T5-22B on 4 x 8 GPUs; the published database has no T5-22B tables.
        *_large("t5", ("3B", "6B", "11B"), 1024, GPT_MBS, ("770M", 2)),
        *_large("resnet", ("2B", "4B", "6_8B", "13B"), 1536, RESNET_MBS, ("500M", 64), finetune_after_trial=1,
                sort_metric="total_gpu_time"),
    ),
    "scale": tuple(
        Setting("scale-layer", "scale-layer", 1, 8, 1024,
                SearchOptions(LARGE_MEMORY, GPT_MBS, op_group_size=1, peak_mem_in_backward=1000.0),
                LARGE_MEMORY, GPT_MBS, num_layers=layers)
        for layers in (8, 16, 32, 64, 128, 256, 512, 1024)),
    # Not the artifact's: its three small-setting models shrunk to profile, search and train on CPU ranks,
    # one rank per core on each of 2 emulated hosts joined by a 1 Gbit/s link, so that where the
    # pipeline's stages are cut and what crosses the link matter, as between a cluster's nodes. A
    # batch of 32 to 64 makes 4 to 32 micro-batches: a pipeline whose bubble does not hide its
    # slowest stage. T5 keeps its size's sequences (128 encoder, 32 decoder tokens: the reference's
    # 4 to 1), so its encoder and decoder differ as the reference's do.
    # GPT once more under memory pressure: a limit under which no Megatron-LM plan fits without
    # recomputation (plans.pressure_limit), so that both systems' recomputation is exercised.
    "tiny": tuple(
        Setting(model, "tiny", 2, 1, gbs, SearchOptions(SMALL_MEMORY, mbs, budget_cases=TINY_CASES), SMALL_MEMORY, mbs,
                seq_len=seq, network=TINY_LINK, case=case)
        for model, gbs, mbs, seq, case in (("gpt", 32, GPT_MBS, 64, ""), ("t5", 32, GPT_MBS, 0, ""),
                                           ("resnet", 64, (4, 8, 16), 64, ""), ("gpt", 32, GPT_MBS, 64, "memory"))),
}

# The artifact README's expected small-setting output (samples/s on 1 node x 4 GPUs): Aceso over
# Megatron-LM is 1.24 (GPT-1.3B), 1.52 (T5-770M), 1.20 (Wide-ResNet-1B).
PUBLISHED_SMALL_THROUGHPUT = {"gpt": (6.98, 8.68), "t5": (9.94, 15.14), "resnet": (34.59, 41.52)}

