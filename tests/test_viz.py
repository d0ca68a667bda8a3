"""tpu_course.viz: frames, the strip, the widget (with its state saved headless), exports, plots."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from tpu_course import systolic, viz  # noqa: E402


@pytest.fixture(scope="module")
def run():
    a = np.arange(1, 7).reshape(2, 3)
    b = np.arange(1, 7).reshape(3, 2)
    return systolic.simulate(a, b, 3, 2, "ws", "tpu", trace=True)


def test_key_cycles_cover_start_end_and_phase_changes(run):
    picks = viz.key_cycles(run, 8)
    assert picks[0] == 0 and picks[-1] == len(run.trace) - 1
    phases = {run.trace[i].phase for i in picks}
    assert {"preload", "fill", "drain"} <= phases
    assert picks == sorted(set(picks))


def test_strip_and_frame_draw_every_cell(run):
    import matplotlib.pyplot as plt

    fig = viz.frame_strip(run, ncols=4)
    drawn = [ax for ax in fig.axes if ax.patches]
    assert len(drawn) == len(viz.key_cycles(run, 8))
    assert all(len(ax.patches) == run.rows * run.cols for ax in drawn)
    plt.close(fig)
    fig = viz.draw_frame(run, len(run.trace) - 1)
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert str(int((np.arange(1, 7).reshape(2, 3) @ np.arange(1, 7).reshape(3, 2))[1, 1])) in texts
    plt.close(fig)


def test_widget_has_one_step_per_cycle(run):
    pytest.importorskip("ipywidgets")
    box = viz.animate(run)
    assert box.slider.max == len(run.trace) - 1 == box.play.max
    box.slider.value = 3  # redraws without error


def test_untraced_run_is_refused():
    plain = systolic.simulate(np.ones((2, 2)), np.ones((2, 2)), 2, 2)
    with pytest.raises(ValueError, match="trace=True"):
        viz.frame_strip(plain)


@pytest.mark.slow
def test_exports(tmp_path):
    tiny = systolic.simulate(np.ones((1, 1)), np.ones((1, 1)), 1, 1, trace=True)
    gif = viz.export_animation(tiny, tmp_path / "a.gif", fps=4)
    assert gif.read_bytes()[:4] == b"GIF8"
    page = viz.export_animation(tiny, tmp_path / "a.html").read_text()
    assert "<script" in page and "animation" in page.lower()
    with pytest.raises(ValueError, match=".gif or .html"):
        viz.export_animation(tiny, tmp_path / "a.mp4")


def test_plots_return_figures():
    import matplotlib.pyplot as plt

    fig = viz.plot_utilization_vs_size([64, 128, 129, 256], arrays=(128, 256))
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    assert lines[0].get_ydata()[1] > lines[0].get_ydata()[2]  # the step down at 129
    plt.close(fig)
    fig = viz.plot_cycles_vs_size([2, 4, 8], [2, 8], rows=4, cols=4)
    closed, sim = fig.axes[0].get_lines()
    assert list(sim.get_ydata()) == [closed.get_ydata()[0], closed.get_ydata()[2]]
    plt.close(fig)
    fig = viz.plot_accesses_per_mac([64, 1024])
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == [
        "CPU (one ALU)", "GPU, no register tiling", "GPU, 64x64 register tile", "systolic 128x128"]
    assert list(lines[2].get_ydata()) == [systolic.memory_accesses_per_mac(n, "gpu", tile=64).per_mac
                                          for n in (64, 1024)]
    plt.close(fig)


def test_frame_shows_an_unloaded_weight_apart_from_a_zero():
    """Chapter 1's strip: a cell whose weight is not loaded yet is not drawn as "0"."""
    import matplotlib.pyplot as plt

    b = np.array([[0, 1], [2, 0]])  # real zeros on the diagonal
    run = systolic.simulate(np.ones((2, 2), np.int64), b, 2, 2, trace=True)
    first, last = run.trace[0], run.trace[-1]
    assert np.isnan(first.held).all()          # cycle 0: nothing latched yet
    assert not np.isnan(last.held).any() and (last.held == 0).sum() == 2
    fig = viz.draw_frame(run, 0, show_output=False)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "0" not in texts and texts.count("\u00b7") == 4
    plt.close(fig)
    fig = viz.draw_frame(run, len(run.trace) - 1, show_output=False)
    assert [t.get_text() for t in fig.axes[0].texts].count("0") >= 2
    plt.close(fig)


@pytest.mark.slow
def test_widget_state_is_saved_when_executed_headless(tmp_path):
    """Run a two-cell notebook through nbclient as JupyterLab would save it."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import numpy as np\nfrom tpu_course import systolic, viz\n"
        "run = systolic.simulate(np.ones((2, 2)), np.ones((2, 2)), 2, 2, trace=True)\n"
        "viz.animate(run)")]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = {v["model_name"] for v in state.values()}
    assert {"PlayModel", "IntSliderModel", "OutputModel"} <= models
    outputs = nb.cells[0].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


def test_html_export_is_self_contained(tmp_path):
    """Offline, a page that loads icons or scripts from a CDN shows grey bars: nothing
    in the exported file may point at the network."""
    import re

    run = systolic.simulate(np.ones((2, 2)), np.ones((2, 2)), 2, 2, trace=True)
    page = viz.export_animation(run, tmp_path / "a.html").read_text()
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", page, flags=re.I)
    assert refs, "the page should reference its (inline) frames"
    assert not [r for r in refs if re.match(r"(https?:)?//", r)], refs
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", page)
    assert "<link" not in page.lower()
    assert page.count("data:image/png;base64,") == len(run.trace) + 1  # frames + first
    for act in ("first", "prev", "play", "pause", "next", "last"):
        assert f'data-act="{act}"' in page


def test_html_player_refuses_nothing_to_play():
    with pytest.raises(ValueError, match="at least one frame"):
        viz.html_player([])


def test_widget_output_carries_the_offline_player(run):
    """A page without a kernel (the website) shows the widget's text/html: the same
    self-contained player as export_animation, one frame per cycle, no network."""
    import re

    pytest.importorskip("ipywidgets")
    data = viz.animate(run)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    player = data["text/html"]
    assert player.count("data:image/png;base64,") == len(run.trace) + 1
    assert "<html" not in player and 'data-act="next"' in player
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(https?:)?//""", player)
