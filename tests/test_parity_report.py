"""benchmarks/parity/report.py: the summary over seeds the parity table is made from, its file
format, and the loader that lets a reference replay our trainer's batch orders."""
import json

import pytest
import torch

from benchmarks.parity.report import (ReplayLoader, Round, converged, load, markdown, save, summarise)
from fl_core.models import build_model
from fl_core.training import LocalTrainer, SGDSettings, derive_seed, read_state


def curve(values, seconds=(1.0, 1.5)):
    return [Round(i + 1, a, b, *seconds) for i, (a, b) in enumerate(values)]


def test_the_summary_compares_final_rounds_with_a_paired_test_over_seeds():
    runs = {0: curve([(0.5, 0.5), (0.80, 0.82)]), 1: curve([(0.5, 0.5), (0.70, 0.73)]),
            2: curve([(0.5, 0.5), (0.75, 0.76)], seconds=(2.0, 2.0))}
    s = summarise(runs)
    assert s.seeds == [0, 1, 2] and s.rounds == 2
    assert s.ours_mean == pytest.approx(0.75) and s.theirs_mean == pytest.approx(0.77)
    assert s.ours_std == pytest.approx(0.05)  # the sample std (ddof 1), not the population one
    assert s.diff == pytest.approx(-0.02)
    from scipy.stats import ttest_rel
    assert s.p_value == pytest.approx(ttest_rel([0.80, 0.70, 0.75], [0.82, 0.73, 0.76]).pvalue)
    assert s.speed_ratio == pytest.approx((4 * 1.5 + 2 * 2.0) / (4 * 1.0 + 2 * 2.0))
    assert s.verdict() == ("ours lower" if s.p_value < 0.05 else "no significant difference")


def test_identical_runs_are_called_equal_and_one_seed_is_not_tested():
    same = summarise({0: curve([(0.9, 0.9)]), 1: curve([(0.8, 0.8)])})
    assert same.diff == 0 and same.verdict() == "equal in every seed"
    one = summarise({0: curve([(0.9, 0.8)])})
    assert one.verdict() == "too few seeds for a test"
    with pytest.raises(ValueError, match="at least one round"):
        summarise({0: []})


def test_converged_needs_ten_rounds_and_a_flat_last_five():
    assert not converged([0.9] * 9)
    assert converged([0.80] * 5 + [0.805] * 5)
    assert not converged([0.70] * 5 + [0.72] * 5)


def test_saved_runs_load_back_into_the_markdown_table_and_damage_is_reported(tmp_path):
    runs = {0: curve([(0.6, 0.6)] * 9 + [(0.61, 0.62)]), 1: curve([(0.6, 0.6)] * 9 + [(0.63, 0.60)])}
    path = tmp_path / "run.json"
    save(path, "DisPFL", "rong-dai/DisPFL @ e2f47d4", "accuracy after local training", runs, {"rounds": 10})
    payload, back = load(path)
    assert back == runs and payload["settings"] == {"rounds": 10} and not (tmp_path / "run.json.tmp").exists()
    row = markdown([path]).splitlines()[-1]
    assert row.startswith("| DisPFL (rong-dai/DisPFL @ e2f47d4) | accuracy after local training | 2 × 10 "
                          "| 62.0 ± 1.4 | 61.0 ± 1.4 | +1.00 |")
    assert "| yes, yes | 1.50 |" in row
    path.write_text(json.dumps({"runs": {"0": [{"rnd": 1}]}}))
    with pytest.raises(SystemExit, match="is not a parity run"):
        load(path)


def test_the_replay_loader_yields_the_batches_our_trainer_draws():
    """If the engine's batch order changed, the references would no longer see our batches."""
    torch.manual_seed(0)
    x, y = torch.randn(23, 1, 8, 8), torch.arange(23) % 10
    model = build_model("lenet", (1, 8, 8), 10)
    trainer = LocalTrainer(model, SGDSettings(lr=0.01, momentum=0.0, weight_decay=0.0, batch_size=5))
    seen = []

    def recording_loss(m, xb, yb):
        seen.append(yb.clone())
        return torch.nn.functional.cross_entropy(m(xb), yb)

    for epoch, purpose in ((0, "personal"), (0, "global"), (1, "personal")):
        trainer.train_pass(read_state(model), x, y, {n: None for n in trainer.params},
                           derive_seed(7, 3, 2, epoch, purpose), loss_fn=recording_loss)
    loader = ReplayLoader(x, y, k=2, rnd=3, seed=7, batch_size=5, purposes=("personal", "global"))
    assert len(loader) == 5
    replayed = [yb for _ in range(3) for _, yb in loader]
    assert len(replayed) == len(seen) == 15
    assert all(torch.equal(a, b) for a, b in zip(replayed, seen))


def test_the_docs_parity_table_is_the_report_of_the_measured_runs():
    """The docs' whole-run parity table (docs/results/parity/whole_runs.md, included by
    docs/parity.md) is `report --markdown` over benchmarks/parity/measured, not numbers typed by
    hand: `python -m benchmarks.parity.report benchmarks/parity/measured/*.json --markdown --out
    docs/results/parity/whole_runs.md` rewrites it when a run is redone."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    runs = sorted((root / "benchmarks" / "parity" / "measured").glob("*.json"))
    assert {p.stem for p in runs} >= {"dispfl", "pfm", "fs_own", "fs_shared"}
    assert (root / "docs" / "results" / "parity" / "whole_runs.md").read_text() == markdown(runs).rstrip("\n") + "\n"
    assert '--8<-- "results/parity/whole_runs.md"' in (root / "docs" / "parity.md").read_text()
