"""Every Python snippet in README.md and the pages under docs/ runs as written, each on its
own, and prints what the page shows it printing (a `text` block after the snippet and one
paragraph)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPET = re.compile(r"```python\n(.*?)```(?:\n\n[^`]*?\n\n```text\n(.*?)```)?", flags=re.S)
# (page, its snippet's number, snippet, the output shown after it or "")
SNIPPETS = [(page.relative_to(ROOT).as_posix(), number, *found) for page in PAGES
            for number, found in enumerate(SNIPPET.findall(page.read_text()), 1)]


def test_readme_has_snippets():
    assert sum(page == "README.md" for page, *_ in SNIPPETS) >= 3


@pytest.mark.parametrize("page, number, snippet, shown", SNIPPETS,
                         ids=[f"{page}:{number}" for page, number, *_ in SNIPPETS])
def test_readme_snippet_runs(page, number, snippet, shown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # snippets may write files (a trace)
    exec(compile(snippet, f"{page} snippet {number}", "exec"), {})
    out = capsys.readouterr().out
    assert out  # each snippet prints what it shows
    if shown:
        assert out == shown
