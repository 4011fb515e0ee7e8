"""What a released package shows: its license, version and authors, as installed."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import jax_trn2
from jax_trn2 import cli

REPO = Path(__file__).resolve().parents[2]


def test_the_license_file_is_the_apache_license_the_metadata_names():
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202
    installed = metadata.metadata("jax-trn2")
    # PEP 639: `pip show` (pip 25 or later) prints this as License-Expression
    assert installed["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in installed.get_all("License-File")
    assert "maintainers" in installed["Author-email"]


def test_the_version_is_the_installed_packages(capsys):
    assert jax_trn2.__version__ == metadata.version("jax-trn2")
    assert jax_trn2.__version__[0].isdigit()
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"jax-trn2 {jax_trn2.__version__}\n"


@pytest.mark.parametrize("name", ["numerics", "plan", "serving", "training"])
def test_modules_the_readme_uses_are_attributes_of_the_package(name):
    """`import jax_trn2; jax_trn2.plan.sweep(...)`, as the README writes it, in a fresh
    interpreter (a test process has imported the modules already)."""
    code = f"import jax_trn2; print(jax_trn2.{name}.__name__)"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() in (f"jax_trn2.reports.{name}", f"jax_trn2.planner.{name}",
                                  "jax_trn2.planner.api")  # jax_trn2.plan's names
