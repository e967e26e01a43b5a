"""`fpsim reproduce` as a user meets it: a progress bar on a terminal and silence off one,
wall-clock timings that never dirty the repository's figures/, and run times in the docs
(docs/reproduce.md, the README's quick start) that match the measured table the benchmark
checks."""
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fpsim.cli import main
from fpsim.experiments.cli import MEASURED_SECONDS, ProgressBars

ROOT = Path(__file__).resolve().parents[1]


def test_off_a_terminal_only_the_final_line_is_printed(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--only", "underflow", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert len(captured.out.splitlines()) == 1
    assert captured.out.startswith(f"wrote 1 experiment(s) to {tmp_path}/")
    assert (tmp_path / "timings.json").exists() and (tmp_path / "timings.md").exists()


def test_progress_bars_show_the_whole_run_and_each_experiment(capsys):
    bars = ProgressBars({"first": 0.3, "second": 0.3})
    bars.start("first")
    bars.message("  a sub-run")
    time.sleep(0.7)  # past its expected time: it waits at 99%, not 100%
    assert bars.current.n == pytest.approx(0.99 * 0.3)
    bars.start("second")
    bars.close()
    err = capsys.readouterr().err
    assert "all experiments" in err and "a sub-run" in err and "first" in err
    assert bars.overall.n == pytest.approx(0.6)  # both finished: the overall bar is full


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and a checkout")
def test_timings_in_figures_are_not_tracked():
    for name in ("timings.json", "timings.md"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"figures/{name}"], cwd=ROOT,
                                 check=False)
        assert ignored.returncode == 0, f"figures/{name} must be ignored by git"
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", f"figures/{name}"],
                                 cwd=ROOT, capture_output=True, check=False)
        assert tracked.returncode != 0, f"figures/{name} must not be tracked"


def test_the_docs_state_the_measured_run_times():
    """docs/reproduce.md states each mode's CPU time; the quick start (the README's, and the
    site's getting-started page, which repeats it) the quick run's and the full run's in
    minutes: all of them the sums of the measured table."""
    seconds = {mode: round(sum(MEASURED_SECONDS[mode].values())) for mode in ("quick", "full")}
    text = (ROOT / "docs" / "reproduce.md").read_text()
    for mode, command in (("quick", "fpsim reproduce --quick"), ("full", "fpsim reproduce")):
        stated = re.search(rf"`{re.escape(command)}`\s+takes\s+about\s+(\d+)\s+s\s+of\s+CPU\s+time",
                           text)
        assert stated, (f"docs/reproduce.md must state the {mode} run time: '`{command}` takes "
                        f"about N s of CPU time'")
        assert int(stated.group(1)) == seconds[mode]
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        quick_start = " ".join(page.read_text().split())
        full = re.search(r"reproduce the paper's experiments into figures/ "
                         r"\(about (\d+) min on 2 cores\)", quick_start)
        quick = re.search(r"`fpsim reproduce --quick` runs every experiment smaller "
                          r"\(about (\d+) s of CPU", quick_start)
        assert full and quick, f"{page.name}: the quick start must state both run times"
        assert int(full.group(1)) == round(seconds["full"] / 60), page.name
        assert int(quick.group(1)) == seconds["quick"], page.name


@pytest.mark.parametrize("only", ["", ",,", " , "])
def test_an_only_that_names_nothing_is_refused_before_anything_runs(only, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["reproduce", "--quick", "--only", only, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fpsim: error: --only") and "underflow" in err[0]
    assert not out.exists()


def test_quick_runs_never_replace_a_full_run_silently(tmp_path, monkeypatch, capsys):
    from fpsim.experiments.cli import DEFAULT_OUT

    assert DEFAULT_OUT == {"full": "figures", "quick": "figures/quick"}
    monkeypatch.chdir(tmp_path)
    full = tmp_path / "figures"
    full.mkdir()
    summary = '{"mode": "full", "experiments": {}}\n'
    (full / "summary.json").write_text(summary)
    assert main(["reproduce", "--quick", "--only", "underflow", "--quiet"]) == 0
    assert (full / "summary.json").read_text() == summary          # the full run untouched
    assert '"mode": "quick"' in (full / "quick" / "summary.json").read_text()
    assert main(["reproduce", "--quick", "--only", "underflow", "--out", "figures"]) == 2
    assert "holds a full run" in capsys.readouterr().err and \
        (full / "summary.json").read_text() == summary
    assert main(["reproduce", "--quick", "--out", "figures", "--only", "underflow",
                 "--overwrite", "--quiet"]) == 0
    assert '"mode": "quick"' in (full / "summary.json").read_text()
