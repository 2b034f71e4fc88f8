"""Imports point down the layers of docs/architecture.md: cli → train/bench → data/io →
rendering → ops → backends. A test fails when an import points upward."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tilesplat"
LAYER = {
    "constants": -1, "assets": -1, "__version__": -1,
    "backends": 0, "ops": 1, "rendering": 2, "data": 3, "io": 3,
    "train": 4, "bench": 4, "cli": 5, "__init__": 6, "__main__": 6,
}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return rel.parts[0]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(SRC).with_suffix("")
    pkg_parts = ["tilesplat", *rel.parts[:-1]]
    if rel.parts[-1] == "__init__":
        pkg_parts = ["tilesplat", *rel.parts[:-1]]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
            for name in names:
                yield node.lineno, name
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name


def test_imports_point_down():
    problems = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        here = _package_of(path)
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "tilesplat" or len(parts) < 2:
                continue
            there = parts[1]
            if there not in LAYER:
                problems.append(f"{path.relative_to(SRC)}:{line} imports unknown {name}")
            elif LAYER[there] > LAYER[here]:
                problems.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {name}")
    assert not problems, "imports pointing upward:\n" + "\n".join(problems)


def test_backends_import_nothing_above():
    for path in (SRC / "backends").rglob("*.py"):
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "tilesplat" and len(parts) > 1:
                assert parts[1] in ("backends", "constants"), f"{path}:{line} imports {name}"


def test_train_and_bench_point_one_way():
    """bench replays the trainer's step (bench → train, bench/replay.py); train never imports
    bench, and cli/gate.py reaches the gate through train/gate.py."""
    for path in (SRC / "train").rglob("*.py"):
        for line, name in _imports(path):
            assert not name.startswith("tilesplat.bench"), f"{path}:{line} imports {name}"
    replay = {name for _, name in _imports(SRC / "bench" / "replay.py")}
    assert "tilesplat.train.step" in replay
