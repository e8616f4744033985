"""The house's rules, read from the source with `ast` (lazy imports inside functions count too).

- One import name: every module is imported as ``draftsmith.<room>``; a bare ``import decode`` (which works
  from the repository root only, and loads a second copy of every module) is refused everywhere.
- Imports point one way (docs/ARCHITECTURE.md): the ground floor (artifacts, decode, serve), the stage rooms
  above it (train, eval, monitor) that never import each other, the spine (draftsmith/) on top.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPINE = "draftsmith"
ROOMS = ("artifacts", "decode", "serve", "train", "eval", "monitor", "conf")  # folders installed as draftsmith.<room>
GROUND = {"artifacts", "decode", "serve"}
ALLOWED = {  # room -> the rooms it may import (itself included)
    "artifacts": {"artifacts"},
    "decode": {"artifacts", "decode"},
    "serve": {"artifacts", "decode", "serve"},
    "train": GROUND | {"train"},
    "eval": GROUND | {"eval"},
    "monitor": GROUND | {"monitor"},
}


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


def room_of(name: str) -> str | None:
    """The room a module name lives in: 'decode' for draftsmith.decode.loop, 'draftsmith' for the spine."""
    parts = name.split(".")
    if parts[0] != SPINE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else SPINE


def sources() -> list[Path]:
    """Every Python file of the repository that is ours (not a venv, not a build)."""
    skip = {".git", "build", "dist"}
    return sorted(p for p in ROOT.rglob("*.py") if not ({part for part in p.relative_to(ROOT).parts[:-1]} & skip
                                                       or p.relative_to(ROOT).parts[0].startswith(".")))


def test_the_sources_are_found():
    """The checks below can fail: they see the rooms' files (an empty glob would pass anything)."""
    files = {str(p.relative_to(ROOT)) for p in sources()}
    assert {"decode/loop.py", "train/trainer.py", "eval/runner.py", "draftsmith/cli.py", "tests/conftest.py"} <= files
    assert room_of("draftsmith.decode.loop") == "decode" and room_of("draftsmith.cli") == SPINE
    assert room_of("decode.loop") is None


def test_no_bare_import_of_a_room():
    """`import decode` / `from eval.runner import ...` anywhere (code, tests, scripts) is a bug: it is our module
    only when run from the repository root, and a second copy of it (two UserError classes) when it is."""
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sources()
             for name in imported_modules(path) if name.split(".")[0] in ROOMS]
    assert not wrong, "import these as draftsmith.<room>:\n" + "\n".join(sorted(set(wrong)))


def test_rooms_import_only_downwards():
    wrong = []
    for room, allowed in ALLOWED.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            for name in imported_modules(path):
                other = room_of(name)
                if other is not None and other not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, ("imports against the direction ground (artifacts, decode, serve) <- train/eval/monitor "
                       "<- draftsmith:\n" + "\n".join(wrong))


def test_tracking_does_not_import_the_wandb_registry_mirror():
    """wandb_registry uses tracking (wandb_mode, model_artifact); the reverse would be a cycle."""
    assert not any(n.startswith("draftsmith.wandb_registry") for n in imported_modules(ROOT / "draftsmith/tracking.py"))
    assert "draftsmith.tracking" in imported_modules(ROOT / "draftsmith/wandb_registry.py")


def test_rooms_never_import_hydra_or_wandb():
    """The rooms take dataclasses and return results; the spine does the Hydra and W&B parts."""
    wrong = [f"{path.relative_to(ROOT)} imports {name}"
             for room in ALLOWED for path in sorted((ROOT / room).rglob("*.py"))
             for name in imported_modules(path) if name.split(".")[0] in ("hydra", "omegaconf", "wandb")]
    assert not wrong, "\n".join(wrong)


def module_graph(room: str) -> dict[str, set[str]]:
    """module -> the modules of the same room it imports (lazy imports included), e.g. train.trainer -> {train.loop}."""
    graph = {}
    for path in sorted((ROOT / room).glob("*.py")):
        own = f"{SPINE}.{room}.{path.stem}"
        graph[own] = set()
        for name in imported_modules(path):
            parts = name.split(".")
            if len(parts) >= 3 and parts[:2] == [SPINE, room] and (ROOT / room / f"{parts[2]}.py").exists():
                if f"{SPINE}.{room}.{parts[2]}" != own:
                    graph[own].add(f"{SPINE}.{room}.{parts[2]}")
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_a_cycle_is_found_where_there_is_one():
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_inside_a_room():
    """One training loop: the objectives import train/loop.py, never the stage that picks them (train/trainer.py);
    no room's modules import each other in a circle."""
    assert "draftsmith.train.loop" in module_graph("train")["draftsmith.train.trainer"]
    cycles = {room: a_cycle(module_graph(room)) for room in ALLOWED}
    assert not any(cycles.values()), {room: " -> ".join(c) for room, c in cycles.items() if c}
