"""Every module of ``checker/commands/`` stays within :data:`LIMIT` lines (issue 38 item 9; the run
protocol set ~220 per command module): a command that grows past it moves a cohesive piece to where it
belongs (its rendering to outputs/, resolution to preflight/ or launch/, one idea per module), as
docs/development.md ("Layout") says. Read from the files, so it costs milliseconds."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LIMIT = 220


def oversized(root: Path, limit: int = LIMIT) -> list[str]:
    """One line per ``checker/commands/*.py`` under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted((root / "checker" / "commands").glob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root)}: {lines} lines (at most {limit})")
    return found


def test_every_command_module_is_within_the_limit() -> None:
    assert (REPO_ROOT / "checker" / "commands" / "check.py").is_file()  # the glob reads the real tree
    found = oversized(REPO_ROOT)
    assert not found, "command modules past the limit (move a cohesive piece out):\n" + "\n".join(found)


def test_a_module_one_line_past_the_limit_is_named(tmp_path: Path) -> None:
    commands = tmp_path / "checker" / "commands"
    commands.mkdir(parents=True)
    (commands / "small.py").write_text("x = 1\n" * LIMIT)
    assert oversized(tmp_path) == []
    (commands / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    assert oversized(tmp_path) == [f"checker/commands/big.py: {LIMIT + 1} lines (at most {LIMIT})"]
