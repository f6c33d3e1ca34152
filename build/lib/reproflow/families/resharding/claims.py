"""The Alpa paper's resharding claims, judged on the kept runs: the ring broadcast is faster than
send/recv when one sender feeds several receivers, its advantage grows with the receiving hosts, and
load balancing by order is at least as fast as none in each n-to-m case. All three are about links
slower than a host's memory: on loopback they are not applicable."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reproflow.families.resharding import FAMILY
from reproflow.families.resharding.report import BASELINE, GATHER, RING, case_table, kept_runs, samples_of
from reproflow.launch.network import UNSHAPED
from reproflow.reporting.claims import (
    Claim,
    ClaimSpec,
    Comparison,
    Design,
    Requirement,
    Selection,
    judge,
    not_measured,
)
from reproflow.reporting.report import newest


def on_loopback(rows: pd.DataFrame) -> str:
    """Why rows of a local run whose emulated links were not set up cannot judge the claim ('' otherwise):
    over loopback a transfer costs memory copies, and broadcast's advantage is the link time it saves."""
    if "network" not in rows.columns:
        return ""
    unshaped = int((rows["network"].astype(str) == UNSHAPED).sum())
    if not unshaped:
        return ""
    return (f"{unshaped} of its {len(rows)} rows ran on {UNSHAPED}: the emulated links between hosts were not set "
            "up (they need root and iproute2; the step log says why), and the claim is about links slower than "
            "a host's memory")


LINKS = Requirement("links between hosts slower than a host's memory (real, or emulated with tc)", on_loopback)
PAPER = "up to 10x faster than existing systems (arXiv 2211.05322 abstract); per-case numbers not published"

FASTER = ClaimSpec(
    family=FAMILY.name, statement="broadcast resharding is faster than send/recv for one-to-many (1-to-m, 2 or "
    "more receivers)", ratio=f"send/recv time / {RING} time (Alpa's broadcast, pipelined along a ring of the "
    "receivers by host), geometric means of the kept runs", paper=PAPER, system=f"{RING}",
    baselines=f"{BASELINE} (the paper's baseline) and {GATHER} (one copy per host, then an all-gather)",
    design=Design.INDEPENDENT, selection=Selection.EVERY, at_least=1.0, requires=(LINKS,),
    target="resharding-1-to-m", cases="each 1-to-m case with 2 or more receivers")
GROWS = ClaimSpec(
    family=FAMILY.name, statement="broadcast's advantage over send/recv grows with the receiving hosts (1-to-m, "
    "2 receivers a host)", ratio=f"(send_recv / {RING} time with one more host) / (the same with one host fewer), "
    "geometric means of the kept runs", paper=PAPER + "; the sender sends send/recv's copies over its one link",
    system=f"{RING}", baselines=f"{BASELINE}", design=Design.GROWTH, at_least=1.0, requires=(LINKS,),
    target="resharding-1-to-m", cases="each step from H to H + 1 receiving hosts of 2 devices (1x2 to 4x2)")
ORDER = ClaimSpec(
    family=FAMILY.name, statement="load balancing by order is at least as fast as no load balancing (n-to-m, "
    "Alpa's broadcast)", ratio="ring_broadcast/no_loadbalance time / ring_broadcast/loadbalance_order time, "
    "geometric means of the kept runs", paper="load balancing and ordering make the n-to-m cases faster (arXiv "
    "2211.05322 section 5.3.1; Alpa PR #486); per-case numbers not published", system="ring_broadcast/"
    "loadbalance_order", baselines="ring_broadcast/no_loadbalance", design=Design.INDEPENDENT, at_least=1.0,
    requires=(LINKS,), target="resharding-n-to-m", cases="each n-to-m case")
CLAIMS = (FASTER, GROWS, ORDER)


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """The three claims on the family's rows."""
    one = frame[frame["experiment"] == "1-to-m"] if len(frame) else frame
    many = frame[frame["experiment"] == "n-to-m"] if len(frame) else frame
    if one.empty:
        missing = "no 1-to-m rows: make resharding-1-to-m"
        return [not_measured(FASTER, missing), not_measured(GROWS, missing), _order(many)]
    return [*_one_to_m(one), _order(many)]


def _one_to_m(rows: pd.DataFrame) -> list[Claim]:
    """The ring against each send/recv per case with 2+ receivers; its advantage from each host count to
    the next."""
    table = case_table(rows)
    shape = {str(c): (int(s[0]), int(s[1])) for c, s in zip(table["case"], table["dst_mesh_shape"], strict=False)}
    runs = kept_runs(rows)
    send_recv, gathered, ring = (samples_of(runs, c) for c in (BASELINE, GATHER, RING))
    newest_rows = newest(rows)
    faster = [Comparison(key[0], base[key], ring[key], baseline=name)
              for key in ring if shape[key[0]][0] * shape[key[0]][1] >= 2
              for name, base in ((BASELINE, send_recv), (GATHER, gathered)) if key in base]
    by_hosts = {shape[k[0]][0]: k for k in ring if k in send_recv and shape[k[0]][1] == 2}
    grows = [Comparison(f"{by_hosts[h][0]} over {by_hosts[h - 1][0]}", (send_recv[by_hosts[h]], ring[by_hosts[h]]),
                        (send_recv[by_hosts[h - 1]], ring[by_hosts[h - 1]]))
             for h in sorted(by_hosts) if h - 1 in by_hosts]
    return [judge(FASTER, faster, newest_rows, missing=f"no 1-to-m case with 2+ receivers run with both {BASELINE} "
                  f"and {RING}"),
            judge(GROWS, grows, newest_rows, missing=f"1-to-m needs two host counts of 2 receivers each, run with "
                  f"{BASELINE} and {RING}")]


def _order(rows: pd.DataFrame) -> Claim:
    """Per n-to-m case, no load balancing over load balancing by order, both on the ring."""
    if rows.empty:
        return not_measured(ORDER, "no n-to-m rows: make resharding-n-to-m")
    runs = kept_runs(rows)
    none, order = (samples_of(runs, f"ring_broadcast/{lb}") for lb in ("no_loadbalance", "loadbalance_order"))
    return judge(ORDER, [Comparison(key[0], none[key], order[key]) for key in none if key in order], newest(rows),
                 missing="no n-to-m case run with ring_broadcast and both no_loadbalance and loadbalance_order: make "
                 "resharding-n-to-m")
