"""Published figures and hardware limits as data (workflows/reference/limits.toml), each with its source.

`compare` sets runs against a published reference (`--reference p5-2node`) and shows each rate also as a
fraction of the limit of the hardware that measured it (a GPU's dense peak for the point's dtype, its
memory bandwidth, its NVLink), where the rows name the hardware and the table knows it. The table says
which metric meets which limit (`[[use]]`), so a family's rates need no code here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from reproflow.spec.documents import Count, Either, MapOf, read
from reproflow.spec.errors import ParamError
from reproflow.spec.paths import project_root

LIMITS = Path("workflows") / "reference" / "limits.toml"


@dataclass(frozen=True)
class Gpu:
    """One GPU model's limits."""

    name: str
    match: tuple[str, ...]  # parts of the name torch reports (torch.cuda.get_device_name)
    limits: Mapping[str, Any]  # limit name -> number, or dtype -> number
    source: str


@dataclass(frozen=True)
class Use:
    """Which limit bounds a family's metric, looked up by one of the point's parameters where it has one."""

    family: str
    metric: str
    limit: str
    by: str = ""
    # Only points of several ranks within one host (NVLink bounds busBW inside a node, the network across
    # nodes, nothing a single rank's).
    one_host: bool = False


@dataclass(frozen=True)
class Published:
    """A published figure: a metric of a family at the given parameters, measured on the named hardware."""

    name: str
    family: str
    metric: str
    unit: str
    values: tuple[tuple[Mapping[str, str], float], ...]  # (parameters, value)
    hardware: str
    source: str
    hosts: int = 1  # nodes it was measured on
    ranks: int = 1  # and GPUs (ranks) in all


@dataclass(frozen=True)
class Limits:
    """The whole table."""

    version: int
    gpus: tuple[Gpu, ...]
    uses: tuple[Use, ...]
    published: Mapping[str, Published]

    def gpu(self, device_name: str) -> Gpu | None:
        """The GPU a device name is (the first entry matching it), or None."""
        for gpu in self.gpus:
            if any(part in device_name for part in gpu.match):
                return gpu
        return None

    def limit(self, family: str, metric: str, params: Mapping[str, str], device_name: str, hosts: int,
              ranks: int) -> tuple[float, str] | None:
        """The limit bounding a metric measured on a device, and what it is ('H200 bfloat16 dense peak');
        None where the table knows none."""
        gpu = self.gpu(device_name)
        if gpu is None:
            return None
        for use in self.uses:
            if use.family != family or use.metric != metric or (use.one_host and (hosts != 1 or ranks < 2)):
                continue
            value = gpu.limits.get(use.limit)
            if use.by:
                value = value.get(str(params.get(use.by, ""))) if isinstance(value, Mapping) else None
            if isinstance(value, int | float) and value > 0:
                return float(value), f"{gpu.name} {params.get(use.by, '') + ' ' if use.by else ''}{use.limit}"
        return None


SHAPE = {
    "version": Count,
    "gpu": [{"name": str, "match": [str], "source": str, "dense_tflops?": MapOf(float), "memory_gbs?": float,
             "nvlink_gbs?": float}],
    "use": [{"family": str, "metric": str, "limit": str, "by?": str, "one_host?": bool}],
    "published": [{"name": str, "family": str, "metric": str, "unit": str, "hardware": str, "source": str,
                   "hosts?": Count, "ranks?": Count, "values": [MapOf(Either(str, float))]}],
}
WHAT = ("a table of hardware limits ([[gpu]]), which metric each bounds ([[use]]) and published figures "
        "([[published]]), each with its source, as workflows/reference/limits.toml")


def load_limits(path: Path) -> Limits:
    """The table at `path`, every entry checked (ParamError naming the file and field)."""
    data = read(path, WHAT, SHAPE)
    gpus = tuple(Gpu(g["name"], tuple(g["match"]), {k: v for k, v in g.items() if k not in ("name", "match", "source")},
                     g["source"]) for g in data.get("gpu", []))
    uses = tuple(Use(u["family"], u["metric"], u["limit"], u.get("by", ""), u.get("one_host", False))
                 for u in data.get("use", []))
    published = {}
    for i, p in enumerate(data.get("published", [])):
        values = []
        for j, v in enumerate(p["values"]):
            if not isinstance(v.get("value"), int | float) or not v["value"] > 0:
                raise ParamError(f"{path}: the field 'published[{i}].values[{j}].value' must be a positive number, "
                                 f"not {v.get('value')!r}.", WHAT)
            values.append(({k: str(x) for k, x in v.items() if k != "value"}, float(v["value"])))
        published[p["name"]] = Published(p["name"], p["family"], p["metric"], p["unit"], tuple(values),
                                         p["hardware"], p["source"], p.get("hosts", 1), p.get("ranks", 1))
    return Limits(data["version"], gpus, uses, published)


@cache
def limits() -> Limits:
    """The project's table."""
    return load_limits(project_root() / LIMITS)
