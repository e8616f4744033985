"""Imports point one way (docs/ARCHITECTURE.md): decode <- train, decode <- eval, draftsmith above all.

Read from the source with `ast`, so lazy imports inside functions count too.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("artifacts", "decode", "train", "eval", "draftsmith")
ALLOWED = {"artifacts": {"artifacts"}, "decode": {"decode"}, "train": {"artifacts", "decode", "train"},
           "eval": {"artifacts", "decode", "eval"}, "draftsmith": set(PACKAGES)}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name a file imports, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_packages_import_only_downwards():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in imported_modules(path):
                top = name.split(".")[0]
                if top in PACKAGES and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "imports against the direction decode <- train/eval <- draftsmith:\n" + "\n".join(wrong)


def test_tracking_does_not_import_the_wandb_registry_mirror():
    """wandb_registry uses tracking (wandb_mode, model_artifact); the reverse would be a cycle."""
    assert not any(n.startswith("draftsmith.wandb_registry") for n in imported_modules(ROOT / "draftsmith/tracking.py"))
    assert "draftsmith.tracking" in imported_modules(ROOT / "draftsmith/wandb_registry.py")


def test_stage_packages_never_import_hydra_or_wandb():
    """decode, train and eval take dataclasses and return results; the spine does the Hydra and W&B parts."""
    wrong = [f"{path.relative_to(ROOT)} imports {name}"
             for package in ("decode", "train", "eval") for path in sorted((ROOT / package).rglob("*.py"))
             for name in imported_modules(path) if name.split(".")[0] in ("hydra", "omegaconf", "wandb")]
    assert not wrong, "\n".join(wrong)
