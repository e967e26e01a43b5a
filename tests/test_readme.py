"""The README's Python examples run, in order, as written, and its links reach their files."""
import re
import subprocess
import sys
from pathlib import Path

from doc_examples import python_blocks, runnable_blocks

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path):
    text = README.read_text()
    assert len(python_blocks(text)) >= 4
    # examples of optional frameworks (torch, transformers, ...) run where those are installed,
    # with what they need at run time (transformers' Trainer needs accelerate)
    blocks, _ = runnable_blocks(text)
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_readme_relative_links_reach_a_file():
    """The front door's links into the docs site, figures and lessons (GitHub resolves them
    from the repository root)."""
    targets = re.findall(r"\]\(([^)\s#]+)", README.read_text())
    assert any(target.startswith("docs/") for target in targets)
    for target in targets:
        if "://" not in target:
            assert (README.parent / target).exists(), target
