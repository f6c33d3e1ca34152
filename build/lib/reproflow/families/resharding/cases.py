"""The reference benchmark's cases (Alpa `benchmark/alpa/resharding/suite.py`), in reproflow's spec notation.

Tensors are int32. The n-to-m tensors are 2 GiB (case6 about 1.99 GiB) and the 1-to-m tensor 1 GiB;
the family's `scale` divides dim 0 to run them on small machines. Alpa's case8 is a byte-for-byte
copy of case7 and is kept so that a full run has the reference's 9 x 5 = 45 records.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """Source and destination mesh (HOSTSxDEVICES), tensor shape and the two specs."""

    src_mesh: str
    dst_mesh: str
    shape: str
    src_spec: str
    dst_spec: str


_N_TO_M_SHAPE = "1024x1024x512"

N_TO_M = {
    "case1": Case("2x4", "2x4", _N_TO_M_SHAPE, "S0,R", "S0,R"),
    "case2": Case("2x4", "2x4", _N_TO_M_SHAPE, "R,R", "S0,R"),
    "case3": Case("2x4", "2x4", _N_TO_M_SHAPE, "S1,R", "S0,R"),
    "case4": Case("2x4", "2x4", _N_TO_M_SHAPE, "S1,S1", "S0,S0"),
    "case5": Case("2x4", "2x4", _N_TO_M_SHAPE, "R,S0", "S0,R"),
    "case6": Case("2x4", "3x4", "3072x1024x170", "S0,R", "S0,R"),
    "case7": Case("1x4", "2x4", _N_TO_M_SHAPE, "R,S0", "R,R"),
    "case8": Case("1x4", "2x4", _N_TO_M_SHAPE, "R,S0", "R,R"),
    "case9": Case("2x4", "2x4", _N_TO_M_SHAPE, "S1,R", "S2,R"),
}

# One source device to a destination mesh of n hosts x g devices, all replicated: named 1-to-NxG.
ONE_TO_M = {
    f"1-to-{n}x{g}": Case("1x1", f"{n}x{g}", str(1 << 28), "R,R", "R,R")
    for n, g in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (3, 2), (4, 2)]
}

CASES = {**ONE_TO_M, **N_TO_M}

