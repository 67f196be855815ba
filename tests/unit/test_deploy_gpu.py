"""GPU residency across cards: `agap cards validate` checks the policy against the GPUs
named in cards/_gpu.yaml, and refuses a policy that cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.cards import CardErrors, load_cards
from tests.conftest import ROOT
from workers.probes import GpuResidents

GPU = "gpus:\n  - name: house\n    vram_mb: 8192\n    reserved_mb: 192\n"  # 8000 usable


def model(name: str, vram: int, *, pinned: bool = False, group: str | None = None, shape: bool = True) -> str:
    lines = [
        f"id: {name}",
        "kind: model",
        f"name: {name}",
        "tier: small",
        "trust: trusted",
        "runtime: {mode: demo}",
    ]
    if shape:
        lines.append(f"availability: [{{shape: gpu, vram_mb: {vram}}}]")
    gpu = f"gpu: {{vram_mb: {vram}, never_evict: {'true' if pinned else 'false'}"
    gpu += f", co_residency_group: {group}}}" if group else "}"
    lines.append(gpu)
    return "\n".join(lines) + "\n"


def deck(tmp_path: Path, *cards: str, registry: str | None = GPU) -> Path:
    d = tmp_path / "cards"
    d.mkdir(parents=True)
    for text in cards:
        name = text.split("\n", 1)[0].removeprefix("id: ")
        (d / f"{name}.yaml").write_text(text)
    if registry is not None:
        (d / "_gpu.yaml").write_text(registry)
    return d


def problems(d: Path) -> list[str]:
    with pytest.raises(CardErrors) as err:
        load_cards(d, base_dir=d.parent)
    return [str(p) for p in err.value.problems]


def test_the_repositorys_cards_satisfy_their_gpu_policy() -> None:
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    residents = GpuResidents.from_cards(cards)
    assert set(residents.residents) == {"gemma-local"}


def test_a_consistent_policy_loads(tmp_path: Path) -> None:
    d = deck(
        tmp_path,
        model("embedder", 1200, pinned=True),
        model("reranker", 800, pinned=True),
        model("gemma", 3300, group="house"),
        model("phi", 2500, group="house"),
        model("big", 6000, group="solo"),
    )
    cards = load_cards(d, base_dir=tmp_path)
    # The pre-load check agrees: with the pinned pair loaded, gemma fits beside them.
    residents = GpuResidents.from_cards(cards, loaded=["embedder", "reranker"])
    assert residents.preload_check("gemma", 8000 - 2000).available


def test_the_registry_is_required_once_a_card_declares_residency(tmp_path: Path) -> None:
    d = deck(tmp_path, model("gemma", 3300), registry=None)
    assert problems(d) == [
        "cards/_gpu.yaml: missing: cards declare GPU residency, so name the "
        "GPUs here (gpus: [{name, vram_mb, reserved_mb}])"
    ]


def test_a_gpu_shaped_model_must_declare_its_vram(tmp_path: Path) -> None:
    text = model("gemma", 3300).replace("gpu: {vram_mb: 3300, never_evict: false}\n", "")
    d = deck(tmp_path, text)
    assert problems(d) == [
        "cards/gemma.yaml: gpu: a local GPU model must declare its residency: "
        "gpu: {vram_mb: …, never_evict: …}"
    ]


def test_a_model_larger_than_the_gpu_is_refused(tmp_path: Path) -> None:
    d = deck(tmp_path, model("huge", 9000))
    assert problems(d) == [
        "cards/huge.yaml: gpu.vram_mb: 9000 MiB does not fit GPU 'house' (8000 MiB usable)"
    ]


def test_the_never_evict_set_must_fit(tmp_path: Path) -> None:
    d = deck(tmp_path, model("embedder", 5000, pinned=True), model("reranker", 4000, pinned=True))
    assert problems(d) == [
        "cards/_gpu.yaml: the never-evict set (embedder, reranker: 9000 MiB) "
        "does not fit GPU 'house' (8000 MiB usable)"
    ]


def test_every_model_must_fit_beside_the_never_evict_set(tmp_path: Path) -> None:
    d = deck(tmp_path, model("embedder", 3000, pinned=True), model("big", 6000))
    assert problems(d) == [
        "cards/big.yaml: gpu.vram_mb: 6000 MiB does not fit alongside the "
        "never-evict set (embedder: 3000 MiB) on GPU 'house' (8000 MiB usable)"
    ]


def test_a_co_residency_group_must_fit_together_with_the_never_evict_set(tmp_path: Path) -> None:
    d = deck(
        tmp_path,
        model("embedder", 2000, pinned=True),
        model("alpha", 3000, group="pair"),
        model("beta", 3500, group="pair"),
    )
    assert problems(d) == [
        "cards/alpha.yaml: gpu.co_residency_group: group 'pair' (alpha, beta) with the "
        "never-evict set needs 8500 MiB, more than GPU 'house' (8000 MiB usable)"
    ]


def test_a_group_a_never_evict_model_excludes_can_never_load(tmp_path: Path) -> None:
    d = deck(
        tmp_path,
        model("embedder", 1000, pinned=True, group="interactive"),
        model("gemma", 3000, group="batch"),
    )
    assert problems(d) == [
        "cards/gemma.yaml: gpu.co_residency_group: 'batch' can never load: the "
        "never-evict model(s) of group interactive may not share the GPU with it"
    ]
    # The pre-load check says the same at run time.
    residents = GpuResidents.from_cards(
        load_cards(
            deck(
                tmp_path / "ok",
                model("embedder", 1000, pinned=True, group="interactive"),
                model("gemma", 3000),
            ),
            base_dir=tmp_path / "ok",
        ),
        loaded=["embedder"],
    )
    assert residents.preload_check("gemma", 7000).available


def test_a_broken_registry_is_reported(tmp_path: Path) -> None:
    d = deck(tmp_path, model("gemma", 3300), registry="gpus:\n  - name: house\n    vram: 8192\n")
    found = problems(d)
    assert "cards/_gpu.yaml: gpus.0.vram: unknown field" in found
    assert "cards/_gpu.yaml: gpus.0.vram_mb: required" in found


def test_the_registry_is_not_a_card(tmp_path: Path) -> None:
    d = deck(tmp_path, model("gemma", 3300))
    assert [c.id for c in load_cards(d, base_dir=tmp_path)] == ["gemma"]
