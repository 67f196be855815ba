"""GPU residency across cards: ``cards/_gpu.yaml`` names the GPUs and their VRAM, and the
residency the model cards declare must be satisfiable on them.

One GPU is what the pre-load check handles (workers/probes.py): with several, the
largest is the placement target.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fabric.cards.files import read_yaml, shown_path
from fabric.cards.problems import CardProblem, validation_problems
from fabric.cards.schema import Card, GpuResidency
from fabric.plain import Plain

if TYPE_CHECKING:
    from fabric.cards.models import GpuDevice

__all__ = ["GPU_REGISTRY", "gpu_problems"]

GPU_REGISTRY = "_gpu.yaml"


class _Resident(Plain):
    """A card that declares GPU residency, and the file it came from."""

    shown: str
    card: Card
    gpu: GpuResidency


def gpu_problems(loaded: list[tuple[str, Card]], directory: Path, base: Path) -> list[CardProblem]:
    """The residency policy must be satisfiable on the GPUs in ``cards/_gpu.yaml``:

    * a model card with a ``gpu`` availability shape declares its ``gpu`` residency (VRAM);
    * every model fits the largest GPU (its usable VRAM: ``vram_mb - reserved_mb``);
    * the never-evict set fits, and fits alongside the largest other model (else that model
      could never be loaded without evicting an interactive-critical one);
    * the never-evict set plus each co-residency group fit together;
    * a model in another co-residency group than a never-evict model could never load (the
      pre-load check refuses to evict a never-evict model of another group).
    """
    problems = _undeclared_residency(loaded)
    residents = [_Resident(shown, c, c.gpu) for shown, c in loaded if c.gpu is not None]
    if not residents:
        return problems
    path = directory / GPU_REGISTRY
    shown_reg = shown_path(path, base)
    gpu, found = _largest_gpu(path, shown_reg)
    if gpu is None:
        return problems + found
    return problems + _placement_problems(residents, gpu, shown_reg)


def _undeclared_residency(loaded: list[tuple[str, Card]]) -> list[CardProblem]:
    return [
        CardProblem(
            shown,
            "gpu",
            "a local GPU model must declare its residency: gpu: {vram_mb: …, never_evict: …}",
        )
        for shown, card in loaded
        if card.kind == "model" and "gpu" in card.shapes and card.gpu is None
    ]


def _largest_gpu(path: Path, shown_reg: str) -> tuple[GpuDevice | None, list[CardProblem]]:
    """The placement target from the registry file, or the problems reading it."""
    if not path.is_file():
        missing = CardProblem(
            shown_reg,
            "",
            "missing: cards declare GPU residency, so "
            "name the GPUs here (gpus: [{name, vram_mb, reserved_mb}])",
        )
        return None, [missing]
    data, found = read_yaml(path, shown_reg)
    if found:
        return None, found
    # Here, not at the top: only a registry file to check needs pydantic.
    from fabric.cards.models import GpuRegistry, ValidationError

    try:
        registry = GpuRegistry.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as exc:
        return None, validation_problems(shown_reg, exc)
    return max(registry.gpus, key=lambda g: g.usable_mb), []


class _Placement(Plain):
    """The residents on the GPU, and its never-evict (pinned) set."""

    residents: list[_Resident]
    room: int
    where: str
    pinned: list[_Resident]
    pinned_mb: int
    pinned_set: str


def _placement_problems(residents: list[_Resident], gpu: GpuDevice, shown_reg: str) -> list[CardProblem]:
    room = gpu.usable_mb
    where = f"GPU {gpu.name!r} ({room} MiB usable)"
    pinned = [r for r in residents if r.gpu.never_evict]
    pinned_mb = sum(r.gpu.vram_mb for r in pinned)
    pinned_set = f"the never-evict set ({', '.join(r.card.id for r in pinned)}: {pinned_mb} MiB)"
    at = _Placement(residents, room, where, pinned, pinned_mb, pinned_set)
    problems = [
        CardProblem(r.shown, "gpu.vram_mb", f"{r.gpu.vram_mb} MiB does not fit {where}")
        for r in residents
        if r.gpu.vram_mb > room
    ]
    if pinned and pinned_mb > room:
        problems.append(CardProblem(shown_reg, "", f"{pinned_set} does not fit {where}"))
        return problems
    return problems + _blocked_by_pinned(at) + _groups_too_big(at)


def _blocked_by_pinned(at: _Placement) -> list[CardProblem]:
    """Models that could never load beside the never-evict set: another group, or no room."""
    pinned_groups = {r.gpu.co_residency_group for r in at.pinned if r.gpu.co_residency_group}
    problems: list[CardProblem] = []
    for r in at.residents:
        if r.gpu.never_evict:
            continue
        group = r.gpu.co_residency_group
        other = sorted(g for g in pinned_groups if group is not None and g != group)
        if other:
            problems.append(
                CardProblem(
                    r.shown,
                    "gpu.co_residency_group",
                    f"{group!r} can never load: the never-evict model(s) of "
                    f"group {', '.join(other)} may not share the GPU with it",
                )
            )
        elif at.pinned and r.gpu.vram_mb + at.pinned_mb > at.room:
            problems.append(
                CardProblem(
                    r.shown,
                    "gpu.vram_mb",
                    f"{r.gpu.vram_mb} MiB does not fit alongside {at.pinned_set} on {at.where}",
                )
            )
    return problems


def _groups_too_big(at: _Placement) -> list[CardProblem]:
    """Co-residency groups that, with the never-evict set, do not fit together."""
    groups: dict[str, list[_Resident]] = {}
    for r in at.residents:
        if r.gpu.co_residency_group and not r.gpu.never_evict:
            groups.setdefault(r.gpu.co_residency_group, []).append(r)
    problems: list[CardProblem] = []
    for name in sorted(groups):
        members = groups[name]
        total = sum(m.gpu.vram_mb for m in members) + at.pinned_mb
        if len(members) > 1 and total > at.room:
            ids = ", ".join(m.card.id for m in members)
            problems.append(
                CardProblem(
                    members[0].shown,
                    "gpu.co_residency_group",
                    f"group {name!r} ({ids}) with the never-evict set needs {total} MiB, "
                    f"more than {at.where}",
                )
            )
    return problems
