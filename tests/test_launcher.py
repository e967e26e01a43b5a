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


# Stands in for NumPy, ahead of it on PYTHONPATH: a Ctrl-C lands while it loads, and a
# KeyboardInterrupt there is what NumPy's compiled start-up makes of it (``import_array()``:
# the traceback printed, then an ImportError that blames the install); loaded in peace, it
# hands over to the real NumPy.
FAKE_NUMPY = """
import os, signal, sys, traceback
try:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):     # the Python-level handler runs within these
        pass
except KeyboardInterrupt:
    traceback.print_exc()
    raise ImportError("IMPORTANT: PLEASE READ THIS FOR ADVICE ON HOW TO SOLVE THIS ISSUE! "
                      "numpy._core.multiarray failed to import; reinstall numpy") from None
sys.path.remove(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
del sys.modules["numpy"]
import numpy
"""


def test_ctrl_c_inside_numpys_import_is_one_line_and_status_130(tmp_path):
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text(FAKE_NUMPY)
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), ENV["PYTHONPATH"]]))
    done = subprocess.run([sys.executable, "-m", "fpsim_launcher", "formats"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert (done.returncode, done.stderr, done.stdout) == (130, "fpsim: interrupted (Ctrl-C)\n",
                                                            "")


def test_a_second_ctrl_c_while_fpsim_loads_stops_at_once(tmp_path):
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text(
        "import os, signal\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "while True:\n"
        "    pass\n")
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), ENV["PYTHONPATH"]]))
    done = subprocess.run([sys.executable, "-m", "fpsim_launcher", "formats"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert (done.returncode, done.stderr) == (130, "fpsim: interrupted (Ctrl-C)\n")


def test_the_launcher_runs_commands():
    done = launch("formats")
    assert done.returncode == 0 and done.stdout.startswith("name")
