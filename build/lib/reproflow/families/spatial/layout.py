"""Which rank does what: spatial stages over image tiles, then layer-parallel (LP) stages.

Ranks 0 … spatial_size·parts − 1 hold the tiles of the spatial stages (stage r // parts, tile
r % parts in row-major grid order); the other ranks hold the LP stages, `local_dp` replicas each.
Per model replica that is split_size + Σparts − spatial_size + (split_size − spatial_size)(local_DP − 1)
ranks, the reference's formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SLICES = ("square", "vertical", "horizontal")


@dataclass(frozen=True)
class Role:
    """One rank's place: its stage, whether it is spatial, its tile or replica index."""

    stage: int
    spatial: bool
    index: int


@dataclass(frozen=True)
class Layout:
    """split_size partitions, the first spatial_size over `parts` tiles each, the rest `local_dp` times."""

    split_size: int
    spatial_size: int
    parts: int
    local_dp: int
    slice_method: str

    @property
    def spatial_ranks(self) -> int:
        """Ranks of all spatial stages."""
        return self.spatial_size * self.parts

    @property
    def world(self) -> int:
        """Ranks the layout needs."""
        return self.spatial_ranks + (self.split_size - self.spatial_size) * self.local_dp

    def grid(self) -> tuple[int, int]:
        """Tile rows × columns of a spatial stage."""
        if self.slice_method == "square":
            side = math.isqrt(self.parts)
            return side, side
        return (1, self.parts) if self.slice_method == "vertical" else (self.parts, 1)

    def role(self, rank: int) -> Role:
        """What `rank` does."""
        if rank < self.spatial_ranks:
            return Role(rank // self.parts, True, rank % self.parts)
        lp = rank - self.spatial_ranks
        return Role(self.spatial_size + lp // self.local_dp, False, lp % self.local_dp)

    def ranks(self, stage: int) -> list[int]:
        """The ranks of one stage: its tiles, or its replicas."""
        if stage < self.spatial_size:
            return list(range(stage * self.parts, (stage + 1) * self.parts))
        first = self.spatial_ranks + (stage - self.spatial_size) * self.local_dp
        return list(range(first, first + self.local_dp))

    def problems(self, image_size: int, batch_size: int, micro_batches: int) -> list[str]:
        """What is wrong with this layout for the run, each naming the option to change."""
        found = []  # ranges and choices of single options are the parameters' own (Param) checks
        if not 0 <= self.spatial_size < self.split_size:
            found.append(f"--spatial-size {self.spatial_size} must be in [0, --split-size {self.split_size}): the "
                         "last partition is layer-parallel, where the tiles are joined for the classifier")
        if self.spatial_size and self.parts < 2:
            found.append("--num-spatial-parts must be at least 2 when --spatial-size > 0")
        elif self.spatial_size and self.slice_method == "square" and math.isqrt(self.parts) ** 2 != self.parts:
            found.append(f"--slice-method square needs a perfect-square --num-spatial-parts, not {self.parts}; "
                         "use 4, 9, 16, or --slice-method vertical/horizontal")
        if image_size < 32 or image_size & (image_size - 1):
            found.append(f"--image-size {image_size} must be a power of two, at least 32")
        if micro_batches < 1 or batch_size % micro_batches:
            found.append(f"--batch-size {batch_size} must split into --parts {micro_batches} micro-batches")
        elif (batch_size // micro_batches) % self.local_dp:
            found.append(f"a micro-batch of {batch_size // micro_batches} images must split over --local-DP "
                         f"{self.local_dp} replicas; raise --batch-size")
        return found
