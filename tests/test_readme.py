"""Every Python snippet in README.md runs as written, each on its own, and prints what the
README shows it printing (a `text` block after the snippet and one paragraph)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
# (snippet, the output shown after it or "")
SNIPPETS = re.findall(r"```python\n(.*?)```(?:\n\n[^`]*?\n\n```text\n(.*?)```)?",
                      README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # snippets may write files (a trace)
    snippet, shown = SNIPPETS[index]
    exec(compile(snippet, f"README.md snippet {index + 1}", "exec"), {})
    out = capsys.readouterr().out
    assert out  # each snippet prints what it shows
    if shown:
        assert out == shown
