"""The ``fpsim`` console script is a launcher outside the package (fpsim_launcher.py): errors
while fpsim itself loads still get one line and an exit status, no traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from child_env import child_env

tomllib = pytest.importorskip("tomllib")    # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
ENV = child_env()


def launch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fpsim_launcher", *args], capture_output=True,
                          text=True, env=dict(ENV, **env), cwd=REPO)


def test_the_console_script_is_the_launcher():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert declared == {"fpsim": "fpsim_launcher:main"}
    installed = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert installed.get("fpsim") == "fpsim_launcher:main", "reinstall: pip install -e ."


def test_an_unknown_backend_is_one_line_and_status_2():
    done = launch("formats", FPSIM_BACKEND="tpu")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fpsim: error: ") and "tpu" in lines[0]
    assert "numpy" in lines[0]      # what is available


@pytest.mark.skipif(shutil.which("fpsim") is None, reason="the fpsim script is not installed")
def test_the_installed_script_reports_it_the_same_way(tmp_path):
    done = subprocess.run(["fpsim", "formats"], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, FPSIM_BACKEND="tpu"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_ctrl_c_while_fpsim_loads_is_one_line_and_status_130():
    # a Ctrl-C that lands while fpsim.cli is being imported, simulated at that import
    code = ("import builtins, sys, fpsim_launcher\n"
            "real = builtins.__import__\n"
            "def interrupted(name, *args, **kwargs):\n"
            "    if name == 'fpsim.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = interrupted\n"
            "sys.exit(fpsim_launcher.main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=ENV, cwd=REPO)
    assert done.returncode == 130 and done.stderr == "fpsim: interrupted (Ctrl-C)\n"


def test_the_launcher_runs_commands():
    done = launch("formats")
    assert done.returncode == 0 and done.stdout.startswith("name")
