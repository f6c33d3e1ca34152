"""One step of a model split into spatial stages (image tiles) and layer-parallel stages.

Forward: the first spatial stage cuts each micro-batch into tiles; spatial stages hand tiles on
rank to rank; the last one sends every tile to the first layer-parallel (LP) stage (a slice of the
batch to each of its `local_dp` replicas), which joins them into the whole image; LP stages pass
activations on; the last computes the loss. Backward runs the same path in reverse: the joining
rank cuts the gradient into tiles and sends each back. Gradients are then summed over each spatial
group (tiles) and each LP replica group, and the optimizer steps. Micro-batches (`--parts`) run as
in GPipe: every forward, then every backward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from reproflow.families.spatial.comm import Comm
from reproflow.families.spatial.halo import Grid, Patch, Space, Span
from reproflow.families.spatial.layers import Fused, Seq
from reproflow.families.spatial.layout import Layout
from reproflow.families.spatial.models import amoebanet_d, resnet_v2
from reproflow.rank.memory import SavedBytes

# fp64 is not the reference's: the checks against the unsplit model run in it, because the gradients of
# a freshly initialised 110-layer network move by ~10 % when the input moves by 1e-6 in fp32.
DTYPES = {"fp32": torch.float32, "fp_16": torch.float16, "fp64": torch.float64}
FORWARD_TAG, BACKWARD_TAG = 1000, 2000


@dataclass(frozen=True)
class Setup:
    """Everything a step depends on, from the reference's options."""

    model: str
    layout: Layout
    image_size: int
    batch_size: int
    micro_batches: int = 1
    halo_d2: bool = False
    fused_layers: int = 1
    num_layers: int = 18
    num_filters: int = 416
    num_classes: int = 10
    balance: tuple[int, ...] = ()
    train: bool = True
    precision: str = "fp32"
    optimizer: str = "sgd"
    learning_rate: float = 1e-3
    seed: int = 0
    resnet_depth: int = 110

    @property
    def dtype(self) -> torch.dtype:
        """Parameter and activation dtype."""
        return DTYPES[self.precision]

    @property
    def micro(self) -> int:
        """Images per micro-batch."""
        return self.batch_size // self.micro_batches


def build_layers(s: Setup) -> list[nn.Module]:
    """The model's layers, initialised from `s.seed` (every rank builds the same weights)."""
    torch.manual_seed(s.seed)
    if s.model == "resnet":
        layers = resnet_v2(s.resnet_depth, s.num_classes, s.image_size)
    else:
        layers = amoebanet_d(s.num_layers, s.num_filters, s.num_classes)
    for m in layers:
        m.to(s.dtype)
        m.train(s.train)
    return layers


def partition(n: int, split: int, balance: Sequence[int]) -> list[range]:
    """Layer ranges of the partitions: `balance` counts, or even with the remainder to the last."""
    counts = list(balance) or [n // split] * (split - 1) + [n - (n // split) * (split - 1)]
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [range(a, a + c) for a, c in zip(starts, counts, strict=True)]


def program(layers: Sequence[nn.Module], fused: int) -> list[nn.Module]:
    """`layers` with runs of halo-D2 groups merged `fused` at a time (never across partitions)."""
    out: list[nn.Module] = []
    run: list[Fused] = []

    def flush() -> None:
        if run:
            out.append(run[0] if len(run) == 1 else Fused(Seq(*[f.body for f in run])))
            run.clear()

    for m in layers:
        if isinstance(m, Fused) and fused > 1:
            run.append(m)
            if len(run) == fused:
                flush()
        else:
            flush()
            out.append(m)
    flush()
    return out


def boundary_shapes(s: Setup) -> list[list[torch.Size]]:
    """Shapes of every layer's output(s) for one micro-batch of whole images (on the meta device)."""
    with torch.device("meta"):
        layers = build_layers(s)
    x: Any = Patch.whole(torch.empty(s.micro, 3, s.image_size, s.image_size, device="meta", dtype=s.dtype))
    shapes = []
    with torch.no_grad():
        for m in layers:
            m.eval()
            x = m(x)
            shapes.append([e.data.shape if isinstance(e, Patch) else e.shape for e in _elements(x)])
    return shapes


@functools.lru_cache(maxsize=64)
def dry_run(s: Setup) -> None:
    """The split forward on the meta device, one tile per spatial stage: raises ValueError (naming the
    option to change) where a tile does not split evenly or is narrower than a halo, before any rank
    waits for another. Remembered per setup (steps and repeats are not part of it), so a process that
    loads a suite again (the Python API, a notebook) does not repeat the meta forward."""
    with torch.device("meta"):
        layers = build_layers(s)
    rows, cols = s.layout.grid()
    tiles = Space(Grid(rows, cols, 0, 0, tuple(range(rows * cols))), None, None, s.halo_d2)
    x: Any = Patch.whole(torch.empty(s.micro, 3, s.image_size, s.image_size, device="meta", dtype=s.dtype))
    with torch.no_grad():
        # Only spatial stages split tiles; the layer-parallel ones after them cannot fail this way.
        for bounds in partition(len(layers), s.layout.split_size, s.balance)[:s.layout.spatial_size]:
            x = _like(x, [Patch(e.data, Span(0, e.extent[0]), Span(0, e.extent[1]), e.extent, tiles)
                          .crop(*tiles.own(e.extent)) for e in _elements(x)])
            for m in program([layers[i].eval() for i in bounds], s.fused_layers if s.halo_d2 else 1):
                x = m(x)
            if not isinstance(x, Patch | tuple):
                return
            x = _like(x, [Patch(torch.empty(e.data.shape[:2] + e.extent, device="meta", dtype=s.dtype),
                                Span(0, e.extent[0]), Span(0, e.extent[1]), e.extent, tiles) for e in _elements(x)])


def _nbytes(x: Any) -> int:
    return sum((e.data if isinstance(e, Patch) else e).nbytes for e in _elements(x))


def _elements(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _like(x: Any, parts: list[Any]) -> Any:
    return tuple(parts) if isinstance(x, tuple) else parts[0]


def tiles(t: torch.Tensor, rows: int, cols: int) -> list[torch.Tensor]:
    """The row-major tiles of the last two dims."""
    return [c for r in t.chunk(rows, dim=-2) for c in r.chunk(cols, dim=-1)]


def join(parts: Sequence[torch.Tensor], rows: int, cols: int) -> torch.Tensor:
    """The mosaic of row-major tiles."""
    return torch.cat([torch.cat(list(parts[r * cols:(r + 1) * cols]), dim=-1) for r in range(rows)], dim=-2)


class Stage:
    """This rank's partition and its messages. Construct on every rank together (groups are collective)."""

    def __init__(self, s: Setup, comm: Comm, rank: int, device: torch.device) -> None:
        lay = s.layout
        self.s, self.comm, self.lay, self.device = s, comm, lay, device
        self.role = lay.role(rank)
        self.last = self.role.stage == lay.split_size - 1
        layers = build_layers(s)
        self.bounds = partition(len(layers), lay.split_size, s.balance)
        self.layers = [layers[i].to(device) for i in self.bounds[self.role.stage]]
        self.shapes = boundary_shapes(s)
        spatial_group = comm.group([lay.ranks(k) for k in range(lay.spatial_size)])
        replica_group = comm.group([lay.ranks(k) for k in range(lay.spatial_size, lay.split_size)])
        if self.role.spatial:
            rows, cols = lay.grid()
            grid = Grid(rows, cols, self.role.index // cols, self.role.index % cols, tuple(lay.ranks(self.role.stage)))
            self.space, self.group = Space(grid, comm, spatial_group, s.halo_d2), spatial_group
        else:
            self.space, self.group = Space(), replica_group if lay.local_dp > 1 else None
        self.program = program(self.layers, s.fused_layers if s.halo_d2 else 1)
        self.params = [p for m in self.layers for p in m.parameters()]
        self.opt: torch.optim.Optimizer | None = None
        if s.train and self.params:
            self.opt = (torch.optim.SGD(self.params, lr=s.learning_rate, momentum=0.9) if s.optimizer == "sgd"
                        else torch.optim.Adam(self.params, lr=s.learning_rate))
        self.activation_bytes = 0  # the largest step's (see forward and step)
        self.logits: list[torch.Tensor] = []
        self.loss = self.correct = 0.0  # the last step's, on the last stage (summed over its samples)

    # -- messages ------------------------------------------------------------------------------------
    def _shapes_in(self) -> list[torch.Size]:
        return self.shapes[self.bounds[self.role.stage].start - 1]

    def _tile_shape(self, shape: torch.Size, batch: int) -> list[int]:
        rows, cols = self.lay.grid()
        return [batch, shape[1], shape[2] // rows, shape[3] // cols]

    def _recv(self, plan: list[tuple[list[int], int, int]]) -> list[torch.Tensor]:
        bufs = [torch.empty(shape, dtype=self.s.dtype, device=self.device) for shape, _, _ in plan]
        self.comm.wait([self.comm.irecv(b, src, tag) for b, (_, src, tag) in zip(bufs, plan, strict=True)])
        return bufs

    def _send(self, plan: list[tuple[torch.Tensor, int, int]]) -> None:
        self.comm.wait([self.comm.isend(t.contiguous(), dst, tag) for t, dst, tag in plan])

    def _replica_slice(self, t: torch.Tensor, j: int) -> torch.Tensor:
        n = t.shape[0] // self.lay.local_dp
        return t[j * n:(j + 1) * n]

    def receive(self, m: int, images: torch.Tensor) -> Any:
        """This stage's input for micro-batch `m` (`images`: the whole micro-batch)."""
        role, lay, space = self.role, self.lay, self.space
        if role.stage == 0:
            if role.spatial:
                own = space.own(images.shape[-2:])
                data = images[..., own[0].lo:own[0].hi, own[1].lo:own[1].hi].contiguous()
                return Patch(data, *own, tuple(images.shape[-2:]), space)
            return Patch.whole(self._replica_slice(images, role.index).contiguous(), space)
        shapes, per = self._shapes_in(), self.s.micro // lay.local_dp
        prev = lay.ranks(role.stage - 1)
        if role.spatial:
            plan = [(self._tile_shape(sh, self.s.micro), prev[role.index], FORWARD_TAG + 8 * m + e)
                    for e, sh in enumerate(shapes)]
            parts = self._recv(plan)
        elif role.stage == lay.spatial_size:
            rows, cols = lay.grid()
            parts = []
            for e, sh in enumerate(shapes):
                got = self._recv([(self._tile_shape(sh, per), q, FORWARD_TAG + 8 * m + e) for q in prev])
                parts.append(join(got, rows, cols))
        else:
            parts = self._recv([([per, *sh[1:]], prev[role.index], FORWARD_TAG + 8 * m + e)
                                for e, sh in enumerate(shapes)])
        patches = []
        for e, data in enumerate(parts):
            data.requires_grad_(self.s.train)
            extent = tuple(shapes[e][-2:])
            own = space.own(extent)
            patches.append(Patch(data, *own, extent, space))
        return tuple(patches) if len(patches) > 1 else patches[0]

    def send(self, m: int, out: Any) -> None:
        """Hand micro-batch `m`'s output to the next stage."""
        role, lay = self.role, self.lay
        nxt = lay.ranks(role.stage + 1)
        elems = [e.crop(*self.space.own(e.extent)).data for e in _elements(out)]
        if role.spatial and role.stage == lay.spatial_size - 1:
            plan = [(self._replica_slice(d, j), q, FORWARD_TAG + 8 * m + e)
                    for e, d in enumerate(elems) for j, q in enumerate(nxt)]
        else:
            plan = [(d, nxt[role.index], FORWARD_TAG + 8 * m + e) for e, d in enumerate(elems)]
        self._send(plan)

    def receive_grads(self, m: int, out: Any) -> list[torch.Tensor]:
        """Gradients of micro-batch `m`'s outputs, from the next stage."""
        role, lay = self.role, self.lay
        nxt = lay.ranks(role.stage + 1)
        elems = [e.data for e in _elements(out)]
        if role.spatial and role.stage == lay.spatial_size - 1:
            grads = []
            for e, d in enumerate(elems):
                shape = [d.shape[0] // lay.local_dp, *d.shape[1:]]
                got = self._recv([(shape, q, BACKWARD_TAG + 8 * m + e) for q in nxt])
                grads.append(torch.cat(got))
            return grads
        return self._recv([(list(d.shape), nxt[role.index], BACKWARD_TAG + 8 * m + e) for e, d in enumerate(elems)])

    def send_grads(self, m: int, inp: Any) -> None:
        """Send the gradients of micro-batch `m`'s inputs back to the previous stage."""
        role, lay = self.role, self.lay
        prev = lay.ranks(role.stage - 1)
        grads = [e.data.grad if e.data.grad is not None else torch.zeros_like(e.data) for e in _elements(inp)]
        if not role.spatial and role.stage == lay.spatial_size:
            rows, cols = lay.grid()
            plan = [(t, q, BACKWARD_TAG + 8 * m + e)
                    for e, g in enumerate(grads) for q, t in zip(prev, tiles(g, rows, cols), strict=True)]
        else:
            plan = [(g, prev[role.index], BACKWARD_TAG + 8 * m + e) for e, g in enumerate(grads)]
        self._send(plan)

    # -- the step ------------------------------------------------------------------------------------
    def forward(self, x: Any) -> Any:
        """This partition on one micro-batch. In inference, the largest input + output of a layer is
        the activation memory (nothing is kept for backward)."""
        for layer in self.program:
            y = layer(x)
            if not self.s.train:
                self.activation_bytes = max(self.activation_bytes, _nbytes(x) + _nbytes(y))
            x = y
        return x

    def step(self, images: torch.Tensor, labels: torch.Tensor, update: bool = True) -> float:
        """One training (or inference) step of the whole batch; this rank's seconds."""
        s = self.s
        start = time.perf_counter()
        self.logits = []
        self.loss = self.correct = 0.0
        kept = []
        grad_mode = torch.enable_grad() if s.train else torch.no_grad()
        with grad_mode, SavedBytes(self.params) as saved:
            for m in range(s.micro_batches):
                xb = images[m * s.micro:(m + 1) * s.micro].to(self.device, s.dtype)
                inp = self.receive(m, xb)
                out = self.forward(inp)
                if self.last:
                    yb = self._replica_slice(labels[m * s.micro:(m + 1) * s.micro], self.role.index).to(self.device)
                    self.logits.append(out.detach())
                    self.correct += float((out.argmax(dim=1) == yb).sum())
                    out = F.cross_entropy(out.float(), yb, reduction="sum") / s.batch_size
                    self.loss += float(out)
                else:
                    self.send(m, out)
                kept.append((inp, out))
        # Everything saved for backward is alive together at the end of the forwards.
        self.activation_bytes = max(self.activation_bytes, saved.total)
        if s.train:
            for m in reversed(range(s.micro_batches)):
                inp, out = kept[m]
                if self.last:
                    out.backward()
                else:
                    datas = [e.data for e in _elements(out)]
                    torch.autograd.backward(datas, self.receive_grads(m, out))
                if self.role.stage > 0:
                    self.send_grads(m, inp)
            self.sync_grads()
            if update and self.opt is not None:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def sync_grads(self) -> None:
        """Sum parameter gradients over the tiles (or the replicas) of this stage, one bucket."""
        if self.group is None or not self.params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        acc = torch.promote_types(grads[0].dtype, torch.float32)
        flat = torch.cat([g.reshape(-1).to(acc) for g in grads])
        self.comm.all_reduce(flat, self.group)
        offset = 0
        for p, g in zip(self.params, grads, strict=True):
            p.grad = flat[offset:offset + g.numel()].view_as(g).to(g.dtype)
            offset += g.numel()

    def grads(self) -> dict[int, list[torch.Tensor]]:
        """Parameter gradients by global layer index."""
        return {i: [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
                for i, m in zip(self.bounds[self.role.stage], self.layers, strict=True)}

    def zero_grads(self) -> None:
        """Forget gradients (after a checking step that must not update)."""
        for p in self.params:
            p.grad = None


def serial_reference(s: Setup, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor,
                                                                                    dict[int, list[torch.Tensor]]]:
    """The unsplit model on one process: logits and (training) gradients of the same step, micro-batch
    by micro-batch as the pipeline runs it. With local-DP, the layer-parallel layers run on each
    replica's slice of the batch, so their batch norm sees what each replica sees."""
    layers = build_layers(s)
    joint = partition(len(layers), s.layout.split_size, s.balance)[s.layout.spatial_size].start
    replicas = s.layout.local_dp
    logits = []
    grad_mode = torch.enable_grad() if s.train else torch.no_grad()
    with grad_mode:
        for m in range(s.micro_batches):
            x: Any = Patch.whole(images[m * s.micro:(m + 1) * s.micro].to(s.dtype))
            for layer in layers[:joint]:
                x = layer(x)
            for j in range(replicas):
                y: Any = _like(x, [Patch.whole(e.data.chunk(replicas)[j]) for e in _elements(x)])
                for layer in layers[joint:]:
                    y = layer(y)
                logits.append(y.detach())
                if s.train:
                    y_labels = labels[m * s.micro:(m + 1) * s.micro].chunk(replicas)[j]
                    (F.cross_entropy(y.float(), y_labels, reduction="sum") / s.batch_size).backward(retain_graph=True)
    grads = {i: [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
             for i, m in enumerate(layers)}
    return torch.cat(logits), grads


def synthetic_batch(s: Setup, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's images and labels (`--app 3`, like torchvision's FakeData): the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    images = torch.randn(s.batch_size, 3, s.image_size, s.image_size, generator=g)
    labels = torch.randint(0, s.num_classes, (s.batch_size,), generator=g)
    return images, labels
