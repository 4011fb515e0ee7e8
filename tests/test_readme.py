"""Every Python snippet in README.md runs as written, each on its own."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # snippets may write files (a trace)
    exec(compile(SNIPPETS[index], f"README.md snippet {index + 1}", "exec"), {})
    assert capsys.readouterr().out  # each snippet prints what it shows
