"""Runs as DataFrames (src/runlog/frames.py) and labels that tell runs apart (src/runlog/runs.py), on hand-built
run folders (tests/fake_runs.py): two runs of one variant get distinct labels in `load_runs`, in the report's
legends and in its timing table; an overlapping run is `cub4+overlap`; the per-layer statistics keys become one row
per run, step and layer. The frames of a real training run and of its W&B record are tested in test_wandb_runs.py."""
from __future__ import annotations

import pandas as pd

from fake_runs import GPT_LAYERS, gpt_config, layer_keys, timing_rows, write_run
from src.runlog.report import make_report
from src.runlog.runs import distinguish, load_run, load_runs, told_apart
from src.runlog.timing_table import table_rows


def timed(folder, config):
    return write_run(folder, config, timing_rows(4, 0.01, 0.02, 0.001, 0.05, 0.002))


def test_two_runs_of_one_variant_get_distinct_labels(tmp_path):
    small = timed(tmp_path / "a", gpt_config("cub4", batch=4))
    large = timed(tmp_path / "b", gpt_config("cub4", batch=8))
    runs = load_runs([tmp_path])
    expected = ["cub4 (data.batch_size=4)", "cub4 (data.batch_size=8)"]
    assert list(dict.fromkeys(runs.metrics["label"])) == expected
    assert [r.label for r in distinguish(runs)] == expected
    assert [r["label"] for r in table_rows([small, large])] == expected
    out = make_report([small, large], tmp_path / "report")
    assert "cub4 (data.batch_size=4)" in out["timing_md"].read_text()
    assert load_run(small).label == "cub4"  # alone, a run keeps its own label


def test_same_config_is_told_apart_by_folder_and_overlap_by_its_label(tmp_path):
    timed(tmp_path / "first", gpt_config("cub4"))
    timed(tmp_path / "second", gpt_config("cub4"))
    overlap = gpt_config("cub4")
    overlap["variant"]["overlap"] = True
    timed(tmp_path / "third", overlap)
    labels = told_apart(load_runs([tmp_path]))
    assert labels == ["cub4 (first)", "cub4 (second)", "cub4+overlap"]


def test_a_set_label_is_kept_and_the_legend_never_repeats(tmp_path):
    import matplotlib.pyplot as plt

    from src.runlog import curves

    a = timed(tmp_path / "a", gpt_config("cub4", label="mine", beta2=0.95))
    b = timed(tmp_path / "b", gpt_config("cub4", label="mine", beta2=0.99))
    seen = []
    original = plt.Axes.legend

    def legend(ax, *args, **kwargs):
        seen.extend(ax.get_legend_handles_labels()[1])
        return original(ax, *args, **kwargs)

    plt.Axes.legend = legend
    try:
        curves.plot_curves([load_run(a), load_run(b)], "step", tmp_path / "loss.png")
    finally:
        plt.Axes.legend = original
    assert seen == ["mine (optim.beta2=0.95) (train, EMA)", "mine (optim.beta2=0.99) (train, EMA)"]


def test_frames_of_hand_built_runs(tmp_path):
    match = {layer: 60.0 + i for i, layer in enumerate(GPT_LAYERS)}
    rows = [{"step": s, "loss": 5.0 - s / 100, **layer_keys("stats/match/sign", match),
             "stats/match/sign": 61.0} for s in (20, 40)]
    write_run(tmp_path / "a", gpt_config("cub4", beta2=0.95), rows, summary={"final_loss": 4.6})
    write_run(tmp_path / "b", gpt_config("cub4", beta2=0.99), rows, summary={"final_loss": 4.5})
    runs = load_runs([tmp_path])
    metrics = runs.metrics
    assert list(metrics.columns[:3]) == ["label", "path", "optim.beta2"] and len(metrics) == 4
    assert metrics.groupby("optim.beta2")["loss"].min().to_dict() == {0.95: 4.6, 0.99: 4.6}
    summary = runs.summary.set_index("optim.beta2")
    assert summary.loc[0.99, "final_loss"] == 4.5 and summary.loc[0.95, "variant"] == "cub4"
    stats = runs.stats
    assert len(stats) == 2 * 2 * len(GPT_LAYERS) and "match/sign" in stats.columns
    one = stats[(stats.step == 40) & (stats.layer == GPT_LAYERS[2]) & (stats.label == told_apart(runs)[0])]
    assert one["match/sign"].tolist() == [62.0]
    assert isinstance(runs.config, pd.DataFrame) and runs.config.loc[1, "optim.beta2"] == 0.99
