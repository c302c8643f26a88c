"""The house's floors: which room (a folder of hpctrain/, or train_entry/) may import which.

Data flows one way: a room imports only rooms on floors below its own (never up, never sideways),
counting imports under TYPE_CHECKING and inside functions too. tests/test_layers.py holds the code
to this; docs/design.md's picture of the house comes from the same table:

    .venv/bin/python tests/_house.py docs/house.png     # the picture, and the rooms' imports
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Top to bottom. Rooms on one floor do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("agent",),  # the login-node agent runs the CLI
    ("cli",),
    ("checks",),  # doctor and the preflight gate: commands of their own, jobs of their own
    ("service",),
    ("remote",),
    ("render",),
    ("dispatch", "report"),
    ("runs",),  # run folders: what was asked (jobs/) and how it went
    ("jobs",),
    ("plan", "launchers", "containers", "integrations"),
    ("profiles",),
    ("train_entry",),
    ("runtime",),
    ("kernel", "hpctrain"),  # `hpctrain`: the package's face (__version__)
)
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "train_entry":
        return "train_entry"
    if parts[0] != "hpctrain":
        return None
    if len(parts) == 1 or not (REPO / "hpctrain" / parts[1]).is_dir():
        return "hpctrain"  # the root's modules: its face and `python -m hpctrain`
    return parts[1]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the `file:line` of each import that crosses rooms."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for top in ("hpctrain", "train_entry"):
        for path in sorted((REPO / top).rglob("*.py")):
            me = _module(path)
            here = "hpctrain" if path.parent == REPO / "hpctrain" else room_of(me)
            package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    base = package[: len(package) - node.level + 1] if node.level else []
                    targets = [".".join([*base, node.module] if node.module else base)]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    there = room_of(target)
                    if there and here and there != here and here != "hpctrain":
                        rel = path.relative_to(REPO).as_posix()
                        found[(here, there)].append(f"{rel}:{node.lineno}")
    return dict(found)


def upward(found: dict[tuple[str, str], list[str]]) -> list[str]:
    """Imports that do not go down a floor, or name a room with no floor."""
    bad = []
    for (here, there), where in sorted(found.items()):
        if here not in FLOOR or there not in FLOOR:
            bad.append(f"{here} -> {there}: a room with no floor in tests/_house.py ({where[0]})")
        elif FLOOR[there] <= FLOOR[here]:
            bad.append(f"{here} -> {there}: {', '.join(where)}")
    return bad


def draw(out: Path) -> None:
    import matplotlib  # lazy: only the picture needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = imports()
    fig, ax = plt.subplots(figsize=(11, 9))
    spot: dict[str, tuple[float, float]] = {}
    for i, rooms in enumerate(FLOORS):
        for j, room in enumerate(rooms):
            x, y = (j + 1) / (len(rooms) + 1), 1 - (i + 0.5) / len(FLOORS)
            spot[room] = (x, y)
            ax.text(
                x,
                y,
                f"{room}/" if room != "hpctrain" else "hpctrain (face)",
                ha="center",
                va="center",
                fontsize=10,
                bbox={"boxstyle": "round", "fc": "#dde8f5"},
            )
    for (here, there), where in found.items():
        (x0, y0), (x1, y1) = spot[here], spot[there]
        color = "#b03030" if FLOOR[there] <= FLOOR[here] else "#7a8a99"
        ax.annotate(
            "",
            xy=(x1, y1 + 0.02),
            xytext=(x0, y0 - 0.02),
            arrowprops={
                "arrowstyle": "->",
                "color": color,
                "alpha": 0.6,
                "lw": 0.6 + 0.15 * min(len(where), 10),
            },
        )
    ax.set_axis_off()
    ax.set_title("hpctrain: rooms by floor; every import runs down (tests/_house.py)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    for (here, there), where in sorted(imports().items(), key=lambda e: FLOOR.get(e[0][0], 99)):
        print(f"{here:>12} -> {there:<12} {len(where):3} import(s)")
    print("\n".join(upward(imports())) or "every import runs down a floor")
    if len(sys.argv) > 1:
        draw(Path(sys.argv[1]))
        print(f"wrote {sys.argv[1]}")
