"""Figures are byte-identical across runs and independent of the user's rc settings."""
import hashlib

import matplotlib
import numpy as np

from fpsim.plots import figure_style, new_figure, save_figure


def draw(stem):
    with figure_style():
        fig, ax = new_figure()
        x = np.linspace(0, 1, 50)
        ax.semilogy(x, np.exp2(-30 * x), label="a curve")
        ax.axvspan(0.2, 0.4, alpha=0.2, label="a band")
        ax.legend()
        ax.set_title("deterministic")
        return save_figure(fig, stem)


def digest(paths):
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_same_figure_same_bytes(tmp_path):
    first = draw(tmp_path / "one" / "fig")
    second = draw(tmp_path / "two" / "fig")
    assert [p.suffix for p in first] == [".png", ".svg"]
    assert digest(first) == digest(second)
    svg = first[1].read_text()
    assert "dc:date" not in svg and "Matplotlib v" not in svg
    assert b"Software" not in first[0].read_bytes()


def test_user_rc_settings_do_not_leak(tmp_path):
    clean = draw(tmp_path / "clean" / "fig")
    with matplotlib.rc_context({"lines.linewidth": 7.0, "axes.facecolor": "pink"}):
        dirty = draw(tmp_path / "dirty" / "fig")
    assert digest(clean) == digest(dirty)
