"""How an instruction's origin is shown: short paths, never site-packages ones
(mesh.isa.sites)."""

import os

from mesh import isa
from mesh.isa.sites import line_text, short_path, site_text


def test_a_file_under_the_working_directory_is_shown_relative(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert short_path(str(tmp_path / "models" / "lm.py")) == os.path.join("models", "lm.py")


def test_an_installed_package_is_shown_by_its_package_path():
    path = "/opt/venv/lib/python3.11/site-packages/flax/linen/linear.py"
    assert short_path(path) == "flax/linen/linear.py"
    assert short_path("/usr/lib/python3/dist-packages/optax/_src/alias.py") == \
        "optax/_src/alias.py"


def test_another_file_is_shown_by_its_name(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert short_path("/elsewhere/train.py") == "train.py"
    assert short_path("<module>") == "<module>"  # a module text's own lines


def test_site_text_names_scope_user_line_and_library_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    instr = isa.Transpose((1,), (0,), permutation=(1, 0), loc=f"{tmp_path}/lm.py:41:7",
                          via="/v/site-packages/flax/linen/linear.py:287:8",
                          scope="Model/block0/attn/q")
    assert site_text(instr) == "Model/block0/attn/q lm.py:41 (via flax/linen/linear.py:287)"
    assert line_text("") == "" and site_text(isa.Transpose((1,), (0,), permutation=(1, 0))) == ""
