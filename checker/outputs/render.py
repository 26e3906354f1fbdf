"""The one renderer seam: every command's result is a :class:`Document`, built once, and the renderers of
:data:`RENDERERS` turn it into what each reader gets (torch-free).

A command builds its document (its JSON data and the views a person or CI reads) and hands it to
:func:`emit` (stdout, in the format chosen once by :func:`stdout_format`) and :func:`write_artifacts`
(``--report``, ``--junit``, the GitHub step summary). Nothing outside this module asks which format was
chosen (tests/test_render_seam.py holds that). Each view is built only when a renderer asks for it, and
at most once: a view may compute things (the slots per request, the installed release) that another
never needs. Adding a field touches the document's data and the views that show it; adding a format is
one renderer here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

View = Callable[[], str]


class OutputChoice(Protocol):
    """What the user asked stdout to carry (``checker.config.OutputOptions`` is one)."""

    @property
    def format(self) -> str: ...

    @property
    def quiet(self) -> bool: ...


@dataclass(eq=False)
class Document:
    """One command's result. ``data``: the JSON document (``--format json``, ``--report``); ``lines``:
    the text a person reads; ``line``: ``--quiet``'s one line (None: the text); ``junit`` and
    ``markdown``: the JUnit XML and the GitHub step summary, where the command writes them. A view that
    is None has nothing to show in that format (the renderer prints nothing). ``indent``: the JSON's."""

    data: Callable[[], Mapping[str, object]]
    lines: Callable[[], Sequence[str]] | None = None
    line: View | None = None
    junit: View | None = None
    markdown: View | None = None
    indent: int | None = 2
    _built: dict[str, object] = field(default_factory=dict, repr=False)

    def built(self, name: str, view: Callable[[], object]) -> object:
        """``view()`` the first time ``name`` is asked for; the same object after."""
        if name not in self._built:
            self._built[name] = view()
        return self._built[name]

    def json_data(self) -> Mapping[str, object]:
        data = self.built("data", self.data)
        assert isinstance(data, Mapping)
        return data


class Renderer(Protocol):
    def __call__(self, doc: Document) -> str | None:
        """The document in this format, or None where it has nothing to show in it."""


def _json(doc: Document) -> str:
    return json.dumps(doc.json_data(), indent=doc.indent)


def _text(doc: Document) -> str | None:
    if doc.lines is None:
        return None
    lines = doc.built("lines", doc.lines)
    assert isinstance(lines, Sequence)
    return "\n".join(lines) if lines else None  # no line at all: nothing to print


def _quiet(doc: Document) -> str | None:
    return _text(doc) if doc.line is None else str(doc.built("line", doc.line))


def _junit(doc: Document) -> str | None:
    return None if doc.junit is None else str(doc.built("junit", doc.junit))


def _markdown(doc: Document) -> str | None:
    return None if doc.markdown is None else str(doc.built("markdown", doc.markdown))


RENDERERS: dict[str, Renderer] = {
    "text": _text,
    "json": _json,
    "quiet": _quiet,
    "junit": _junit,
    "markdown": _markdown,
}
"""Every format a document is rendered in: stdout's three (``text``, ``json``, ``quiet``) and the two
files CI reads (``junit``, ``markdown`` for the step summary)."""


def render(doc: Document, format: str) -> str | None:
    """The document in ``format`` (a key of :data:`RENDERERS`), or None where it has nothing to show."""
    return RENDERERS[format](doc)


def stdout_format(output: OutputChoice) -> str:
    """The one choice of what stdout carries: ``--format json`` wins over ``--quiet``."""
    if output.format == "json":
        return "json"
    return "quiet" if output.quiet else "text"


def emit(doc: Document, output: OutputChoice) -> None:
    """Print the document on stdout in the format chosen (nothing where that view is None)."""
    text = render(doc, stdout_format(output))
    if text is not None:
        print(text, flush=True)


def write_artifacts(
    doc: Document,
    *,
    report: str | None = None,
    report_flag: str = "--report",
    junit: str | None = None,
    step_summary: bool = True,
) -> list[str]:
    """Write every file asked for (``report``: the JSON; ``junit``; the step summary where
    ``GITHUB_STEP_SUMMARY`` is set and ``step_summary``), each bounded; the problems (one line each: the
    verdict must still print)."""
    # start-up: the bounded writers (checker.files) load only where a file is written
    from checker.files import append_file, write_file

    problems = []
    if report:
        problems.append(write_file(report, _json(doc) + "\n", what=report_flag))
    junit_text = _junit(doc) if junit else None
    if junit and junit_text is not None:
        problems.append(write_file(junit, junit_text, what="--junit"))
    step = os.environ.get("GITHUB_STEP_SUMMARY") if step_summary else None
    markdown = _markdown(doc) if step else None
    if step and markdown is not None:
        problems.append(append_file(step, markdown, what="GITHUB_STEP_SUMMARY"))
    return [p for p in problems if p]
