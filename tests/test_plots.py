"""`rlvr plot` on small synthetic run directories written here: files, labels, bands, errors."""

import json

import pytest
import yaml

from rlvr.cli.main import main
from rlvr.cli.plot import TITLES, PlotError, aggregate, build_figures, group_runs, load_run


def write_run(path, *, seed=0, clip_high=0.2, steps=6, offset=0.0, summary=True):
    path.mkdir(parents=True)
    config = {
        "preset": "grpo",
        "algo": {"clip_low": 0.2, "clip_high": clip_high, "kl_coef": 0.0},
        "train": {"seed": seed, "output_dir": str(path), "max_steps": 6, "eval_every": 2},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": -1 + 0.1 * step + offset,
            "accuracy": 0.05 * step,
            "entropy": 2.0 - 0.1 * step + offset,
            "response/length_mean": 10 + step,
            "response/truncation_rate": 0.5 - 0.05 * step,
            "clip_frac_low": 0.01,
            "clip_frac_high": 0.02 if step != 3 else "nan",  # non-finite values are strings
            "groups/all_correct_frac": 0.1,
            "groups/all_wrong_frac": 0.6 - 0.05 * step,
        }
        if step % 2 == 0:
            row["eval/accuracy"] = 0.1 * step + offset
        rows.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    if summary:
        s = {"eval_before": {"accuracy": 0.05}, "eval_after": {"accuracy": 0.7}, "steps": steps}
        (path / "summary.json").write_text(json.dumps(s))
    return path


def test_one_run_writes_labelled_pngs(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    out = tmp_path / "plots"
    assert main(["plot", str(run), "--output-dir", str(out)]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"{name}.png" for name in TITLES)
    for path in out.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5000
    assert capsys.readouterr().out.split() == [str(out / f"{n}.png") for n in TITLES]

    figs = build_figures(group_runs([load_run(run)]))
    assert set(figs) == set(TITLES)
    for name, fig in figs.items():
        assert fig.get_suptitle() == TITLES[name]
        for ax in fig.axes:
            assert ax.get_xlabel() == "rollout step"
            assert ax.get_ylabel() and ax.get_title()
            assert [t.get_text() for t in ax.get_legend().get_texts()] == ["run"]
    ylabels = {ax.get_title(): ax.get_ylabel() for f in figs.values() for ax in f.axes}
    assert ylabels["held-out accuracy"] == "accuracy"
    assert ylabels["entropy of the sampled tokens"] == "mean token entropy (nats)"


def test_held_out_accuracy_uses_summary_and_skips_nan(tmp_path):
    run = load_run(write_run(tmp_path / "run"))
    # eval_before at step 0, periodic evaluations; the final one (step 6) was logged already
    assert run.series("eval/accuracy") == pytest.approx({0: 0.05, 2: 0.2, 4: 0.4, 6: 0.6})
    assert sorted(run.series("clip_frac_high")) == [1, 2, 4, 5, 6]


def test_shared_config_is_a_band_other_config_a_line(tmp_path):
    dirs = [
        write_run(tmp_path / "a-s0", seed=0, offset=0.0),
        write_run(tmp_path / "b", clip_high=0.28),
        write_run(tmp_path / "a-s1", seed=1, offset=0.2, steps=4),  # e.g. still running
    ]
    groups = group_runs([load_run(d) for d in dirs])
    assert [len(g.runs) for g in groups] == [2, 1]
    assert groups[0].label == "clip_high=0.2 (mean of 2, min-max band)"
    assert groups[1].label == "b"

    steps, mean, lo, hi = aggregate(groups[0].runs, "entropy")
    assert list(steps) == [1, 2, 3, 4, 5, 6]
    assert mean[0] == pytest.approx(2.0) and lo[0] == pytest.approx(1.9)
    assert hi[0] == pytest.approx(2.1)
    assert mean[5] == pytest.approx(1.4)  # only the longer run reached step 6

    ax = build_figures(groups, ["entropy"])["entropy"].axes[0]
    assert len(ax.lines) == 2 and len(ax.collections) == 1  # one band: the shared pair
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [groups[0].label, "b"]

    out = tmp_path / "plots"
    assert main(["plot", *map(str, dirs), "--output-dir", str(out), "--label", "x"]) == 2
    labels = ["--label=A", "--label=B", "--label=A"]
    assert main(["plot", *map(str, dirs), "--output-dir", str(out), *labels]) == 0
    assert (out / "entropy.png").stat().st_size > 5000


def test_same_directory_names_get_their_parent(tmp_path):
    runs = [
        load_run(write_run(tmp_path / k / "seed0", clip_high=c)) for k, c in zip("xy", (0.2, 0.3))
    ]
    assert [g.label for g in group_runs(runs)] == ["x/seed0", "y/seed0"]


def test_bad_input_errors_name_the_place(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plot", str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "no metrics.jsonl" in err

    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no such run directory" in capsys.readouterr().err

    bad = write_run(tmp_path / "bad")
    lines = (bad / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-5]  # a line cut short, as by a crash
    (bad / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["plot", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'metrics.jsonl'}, line 3: not valid JSON" in err

    (bad / "metrics.jsonl").write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(PlotError, match=r"line 2: expected a JSON object"):
        load_run(bad)
    (bad / "metrics.jsonl").write_text("\n")
    with pytest.raises(PlotError, match="no steps logged"):
        load_run(bad)
    with pytest.raises(PlotError, match="unknown figure"):
        build_figures([], ["nope"])
