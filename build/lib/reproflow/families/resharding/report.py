"""Tables and figures of the resharding family: Alpa's 1-to-m and n-to-m microbenchmarks.

Per experiment: every case and configuration with the reference's exec_time_mean / exec_time_var,
the speed-up of each configuration over plain send_recv (the paper's baseline), the records in the
reference's JSON shape (`1_to_m_result.json`, `n_to_m_result.json`), the 1-to-m figure (time
against the number of receivers, and send_recv's time over each broadcast's with its interval) with
its table (`resharding_1_to_m_ratios`), and the n-to-m bar chart (time relative to send_recv).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.families.resharding import FAMILY
from reproflow.families.resharding.plan import LOADBALANCE, problem
from reproflow.reporting.figures import save_figure
from reproflow.reporting.intervals import ratio_interval
from reproflow.reporting.report import aggregates, newest, wide, write_table
from reproflow.spec.params import resolve

CONFIG = ["resharding_mode", "resharding_loadbalance_mode", "use_local_allgather"]
SETTING = ["world_size", "backend", "device", "device_name"]
RUNS = ["runs", "warmup_runs"]
CASE_PARAMS = ["case", "src_mesh", "dst_mesh", "shape", "src_spec", "dst_spec", "scale"]
METRICS = ["exec_time_mean", "exec_time_var", "effective_bw", "unit_tasks", "max_host_sent_bytes", "wrong_elements"]
BASELINE = "send_recv"
GATHER = "send_recv + all-gather"
RING = "ring_broadcast/normal"  # Alpa's broadcast mode as it runs: NCCL's pipelined ring
BROADCAST = "broadcast/normal"  # the backend's own broadcast (gloo: a tree that ignores hosts)
# Reading order of the modes in tables: the baseline, then Alpa's broadcast, then the backend's.
MODE_ORDER = ("send_recv", "ring_broadcast", "broadcast")
NOTE = ("speed-up = exec_time_mean of send_recv (normal, no all-gather) / exec_time_mean of the configuration, "
        "same case, same job setting: above 1 the configuration is faster than send_recv, as the paper claims "
        "for broadcast and load balancing on its 5 x p3.8xlarge cluster. Each time is the mean of the runs kept "
        "({runs}; reference: 13 runs, the first 3 dropped), from a barrier until the slowest destination rank "
        "holds its tile.")


def config_name(mode: str, lb: str, gather: bool) -> str:
    """Short legend name of a configuration, e.g. 'broadcast/loadbalance_order'."""
    if mode == "send_recv" and lb == "normal":
        return GATHER if gather else BASELINE
    return f"{mode}/{lb}" + (" + all-gather" if gather else "")


def _layout(row: pd.Series) -> pd.Series:
    params = resolve(FAMILY.params, {k: row[k] for k in CASE_PARAMS if isinstance(row[k], str | int) and row[k] != ""})
    p = problem(params)
    return pd.Series({"src_mesh_shape": list(p.src_mesh.shape), "dst_mesh_shape": list(p.dst_mesh.shape),
                      "tensor_shape": list(p.shape), "src_sharding_spec": p.src_spec,
                      "dst_sharding_spec": p.dst_spec, "receivers": p.dst_mesh.hosts * p.dst_mesh.devices,
                      "tensor_mib": p.nbytes / 2**20})


def case_table(frame: pd.DataFrame) -> pd.DataFrame:
    rows = aggregates(newest(frame)).copy()
    for col in CASE_PARAMS:
        if col not in rows.columns:
            rows[col] = ""
    rows[["src_mesh", "dst_mesh", "shape", "src_spec", "dst_spec"]] = (
        rows[["src_mesh", "dst_mesh", "shape", "src_spec", "dst_spec"]].fillna("").astype(str))
    rows["scale"] = rows["scale"].astype(int)
    rows["use_local_allgather"] = rows["use_local_allgather"].astype(str) == "True"
    table = wide(rows, ["experiment", *CASE_PARAMS, *RUNS, *CONFIG, *SETTING], METRICS)
    table = pd.concat([table, table.apply(_layout, axis=1)], axis=1)
    table["config"] = [config_name(*c) for c in table[CONFIG].itertuples(index=False)]
    # The reference's order: send_recv first, then all-gather, then broadcast by load-balance mode.
    table["_order"] = [(MODE_ORDER.index(m), bool(g), LOADBALANCE.index(lb)) for m, lb, g in
                       table[CONFIG].itertuples(index=False)]
    table = table.sort_values(["experiment", "case", "_order"], kind="stable").drop(columns="_order")
    keys = ["experiment", *CASE_PARAMS, *RUNS, *SETTING]
    base = table[table["config"] == BASELINE][[*keys, "exec_time_mean"]].rename(
        columns={"exec_time_mean": "send_recv_time"})
    table = table.merge(base, on=keys, how="left")
    table["speedup_vs_send_recv"] = table["send_recv_time"] / table["exec_time_mean"]
    return table


def _verdict(speedups: pd.Series) -> str:
    """Which configuration was fastest for one case, and by how much against send_recv."""
    best = speedups.idxmax()
    if speedups[best] > 1:
        return f"{best} fastest, {speedups[best]:.2f}x send_recv's speed"
    return f"send_recv fastest; next {best} at {speedups[best]:.2f}x"


def _records(table: pd.DataFrame) -> list[dict]:
    """The reference benchmark's result records (benchmark.py's JSON)."""
    keys = ["src_mesh_shape", "dst_mesh_shape", "src_sharding_spec", "dst_sharding_spec", "tensor_shape",
            "resharding_mode", "use_local_allgather", "resharding_loadbalance_mode", "exec_time_mean",
            "exec_time_var"]
    out = []
    for row in table[keys].to_dict("records"):
        row["use_local_allgather"] = bool(row["use_local_allgather"])
        out.append(row)
    return out


def _one_to_m_ratios(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per 1-to-m case, send_recv's time over each broadcast's, geometric means of the kept runs with
    the interval at the claims' level."""
    send_recv = samples_of(runs, BASELINE)
    out = []
    for config in (RING, BROADCAST):
        other = samples_of(runs, config)
        for row in table[table["config"] == config].itertuples():
            key = tuple(map(str, (row.case, *(getattr(row, k) for k in SETTING))))
            if key in send_recv and key in other:
                r, iv = ratio_interval(send_recv[key], other[key])
                out.append({"case": row.case, "receivers": row.receivers, "hosts": row.dst_mesh_shape[0],
                            "config": config, "send_recv_over": r, "low": iv[0] if iv else r,
                            "high": iv[1] if iv else r})
    return pd.DataFrame(out)


def _one_to_m_figure(table: pd.DataFrame, ratios: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    for config, sub in table.groupby("config", sort=False):
        for multi, style in ((False, "-o"), (True, "--s")):
            part = sub[(sub["dst_mesh_shape"].str[0] > 1) == multi].sort_values("receivers")
            if part.empty:
                continue
            where = "N hosts x 2" if multi else "1 host x G"
            ax.plot(part["receivers"], part["exec_time_mean"] * 1e3, style, label=f"{config} ({where})")
    first = table.iloc[0]
    ax.set_xlabel("receiver devices M")
    ax.set_ylabel("exec_time_mean (ms)")
    ax.set_title(f"1-to-m: one sender to M receivers, {first['tensor_mib']:.0f} MiB, "
                 f"{first['world_size']} ranks {first['backend']}/{first['device']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for i, (config, sub) in enumerate(ratios.groupby("config", sort=False) if len(ratios) else ()):
        sub = sub.sort_values(["receivers", "hosts"])
        x = [m + (i - 0.5) * 0.12 for m in sub["receivers"]]
        bx.errorbar(x, sub["send_recv_over"], yerr=[sub["send_recv_over"] - sub["low"],
                                                    sub["high"] - sub["send_recv_over"]],
                    fmt="o", capsize=3, label=f"send_recv / {config}")
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_xlabel("receiver devices M")
    bx.set_ylabel("send_recv time / broadcast time (above 1: broadcast faster)")
    bx.set_title("each broadcast's advantage, with its interval", fontsize=9)
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7)
    return save_figure(fig, out_dir, name)


def _n_to_m_figure(table: pd.DataFrame, out_dir: Path, name: str) -> list[Path]:
    cases = list(dict.fromkeys(table["case"]))
    configs = list(dict.fromkeys(table["config"]))
    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    width = 0.8 / max(1, len(configs))
    for i, config in enumerate(configs):
        sub = table[table["config"] == config].set_index("case").reindex(cases)
        ax.bar([x + i * width for x in range(len(cases))], 1 / sub["speedup_vs_send_recv"], width=width, label=config)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(cases))], cases)
    ax.set_ylabel("time / send_recv time (lower is faster)")
    first = table.iloc[0]
    ax.set_title(f"n-to-m: resharding time relative to send_recv, {first['world_size']} ranks "
                 f"{first['backend']}/{first['device']}, tensors / {first['scale']}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir, name)


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """resharding_<experiment> tables, speed-up tables, reference JSON and figures."""
    table = case_table(frame)
    kept = kept_runs(frame)
    written: list[Path] = []
    for (exp, *setting), sub in table.groupby(["experiment", *SETTING]):
        tag = str(exp).replace("-", "_")
        if len(table.groupby(SETTING)) > 1:
            tag += f"_w{setting[0]}_{setting[2]}"
        sub = sub.reset_index(drop=True)
        runs = ", ".join(f"{int(r)} runs, the first {int(w)} dropped"
                         for r, w in sub[RUNS].drop_duplicates().itertuples(index=False))
        note = NOTE.format(runs=f"here {runs}")
        shown = sub[["case", "src_mesh_shape", "dst_mesh_shape", "src_sharding_spec", "dst_sharding_spec",
                     "tensor_mib", "config", "unit_tasks", "exec_time_mean", "exec_time_var", "effective_bw",
                     "speedup_vs_send_recv", "wrong_elements"]].copy()
        for col in ("src_mesh_shape", "dst_mesh_shape"):
            shown[col] = shown[col].map(lambda s: "x".join(map(str, s)))
        written += write_table(shown, out_dir, f"resharding_{tag}",
                               f"Resharding {exp}: every case and configuration ({setting[0]} ranks, "
                               f"{setting[1]}/{setting[2]}, {setting[3]})", note)
        speedups = sub.pivot_table(index="case", columns="config", values="speedup_vs_send_recv", sort=False)
        speedups = speedups.drop(columns=[BASELINE])
        speedups["verdict"] = [_verdict(row) for _, row in speedups.iterrows()]
        speedups = speedups.reset_index()
        speedups.columns.name = None
        written += write_table(speedups, out_dir, f"resharding_{tag}_speedup",
                               f"Resharding {exp}: speed-up over send_recv (above 1: faster)", note)
        json_path = out_dir / f"resharding_{tag}_result.json"
        json_path.write_text(json.dumps(_records(sub), indent=4) + "\n")
        written.append(json_path)
        if str(exp) == "1-to-m":
            same = (kept[SETTING].astype(str) == [str(v) for v in setting]).all(axis=1)
            ratios = _one_to_m_ratios(sub, kept[(kept["experiment"] == exp) & same])
            if len(ratios):
                written += write_table(ratios, out_dir, f"resharding_{tag}_ratios",
                                       f"Resharding {exp}: send_recv's time over each broadcast's, per M",
                                       "send_recv_over: geometric mean of send_recv's kept runs over the broadcast's, "
                                       "with its interval at the claims' level (low, high); hosts: destination hosts")
            written += _one_to_m_figure(sub, ratios, out_dir, f"resharding_{tag}")
        else:
            written += _n_to_m_figure(sub, out_dir, f"resharding_{tag}")
    return written


def kept_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """Every kept run's time (`value`) of the newest rows, with its configuration's name."""
    runs = aggregates(newest(rows))
    runs = runs[(runs["metric"] == "run_time") & (runs["kept"].astype(str) == "True")]
    return runs.assign(config=[config_name(m, lb, str(g) == "True") for m, lb, g in
                               runs[CONFIG].itertuples(index=False)])


def samples_of(runs: pd.DataFrame, config: str) -> dict[tuple[str, ...], list[float]]:
    """Per case and job setting, (case, *setting) as text, the kept run times of `config`."""
    part = runs[runs["config"] == config]
    return {tuple(map(str, key)): group["value"].astype(float).tolist()
            for key, group in part.groupby(["case", *SETTING], sort=False)}
