"""The README's Python examples run, in order, as written."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS = {"transformers": ("accelerate",)}


def test_readme_python_blocks_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 4
    # examples of optional frameworks (torch, transformers, ...) run where those are installed,
    # with what they need at run time (transformers' Trainer needs accelerate)
    blocks = [b for b in blocks if all(importlib.util.find_spec(name) is not None
                                       for imported in re.findall(r"^(?:from|import) (\w+)", b,
                                                                  re.M)
                                       for name in (imported, *NEEDS.get(imported, ())))]
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
