"""`rlvr ablate`: the ladder's configs, and the whole ladder with a tiny budget on a tiny model."""

import json
import time
from dataclasses import asdict

import pytest

from rlvr.cli.ablate import RUNGS, rung_config
from rlvr.cli.main import main
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError

SMALL = [
    "--rollout.prompts_per_step=4",
    "--rollout.group_size=4",
    "--rollout.max_new_tokens=12",
    "--train.eval_size=8",
    "--data.train_size=64",
    "--no-progress",
]


def _diff(a, b):
    return {
        (section, k)
        for section in ("algo", "reward")
        for k, v in asdict(getattr(a, section)).items()
        if asdict(getattr(b, section))[k] != v
    }


def test_each_rung_adds_exactly_its_component(tmp_path):
    cfgs = [rung_config(i, 0, tmp_path / str(i), steps=10) for i in range(len(RUNGS))]
    assert cfgs[0].preset == "grpo" and cfgs[0].algo.kl_coef == 0.0
    assert cfgs[0].algo.clip_high == 0.2 and cfgs[0].algo.agg == "sample_mean"
    for cfg in cfgs:
        assert cfg.reward.wrong_score == -1.0  # the same on every rung
        assert cfg.train.eval_every == 1 and cfg.data.task == "arithmetic"
    for prev, cfg, rung in zip(cfgs, cfgs[1:], RUNGS[1:]):
        assert _diff(prev, cfg) == {("algo", k) for k in rung.changes["algo"]}
    dapo = load_config(None, {}, preset="dapo")
    assert cfgs[-1].algo == dapo.algo and cfgs[-1].reward == dapo.reward  # the top rung is DAPO


def test_overriding_a_ladder_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"algo.clip_high"):
        rung_config(0, 0, tmp_path, overrides={"algo": {"clip_high": "0.3"}})
    with pytest.raises(ConfigError, match=r"train.seed"):
        rung_config(0, 0, tmp_path, overrides={"train": {"seed": "3"}})
    cfg = rung_config(0, 0, tmp_path, task="sort", overrides={"train": {"eval_every": "5"}})
    assert cfg.train.eval_every == 5 and cfg.data.task == "sort"


def test_tiny_ablation_writes_table_and_figures(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "ablation"
    argv = ["ablate", "--seeds", "1", "--steps", "2", "--output-dir", str(out)]
    argv += [f"--model.name_or_path={tiny_model_dir}", *SMALL]
    t0 = time.perf_counter()
    assert main(argv) == 0
    elapsed = time.perf_counter() - t0

    report = (out / "ablation.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]  # no header
    assert [row.split(" | ")[0][2:] for row in rows] == [r.label for r in RUNGS]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[5:7] == ["1", "2"]  # seeds, steps
        assert 0.0 <= float(cells[3]) <= 1.0  # final held-out accuracy (one seed: no ±)
    for name in ("reward_accuracy", "entropy", "length", "clipping", "groups"):
        assert (out / f"{name}.png").stat().st_size > 5000
        assert f"]({name}.png)" in report
    assert (out / "entropy_clip_higher.png").stat().st_size > 5000
    assert "](entropy_clip_higher.png)" in report

    results = json.loads((out / "ablation.json").read_text())
    assert [(r["rung"], r["seed"], r["steps"]) for r in results] == [(r.key, 0, 2) for r in RUNGS]
    metrics = (out / "runs" / "0-grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert all("eval/accuracy" in json.loads(line) for line in metrics)  # eval_every 1

    # the same command again resumes: every run is done, so only the report is rewritten
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.count("done already") == len(RUNGS)
    assert (out / "ablation.md").read_text() == report
    # a different budget in the same directory would mix runs: refused before any training
    assert main([*argv[:4], "3", *argv[5:]]) == 2
    assert "holds a run with a different config" in capsys.readouterr().err
    print(f"tiny ablation: {elapsed:.1f} s")
