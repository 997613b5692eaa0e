"""analysis.claims: typed claims judged by paired tests over seeds, on hand-built sweeps (trials.parquet
and the study file, as a sweep writes them): each verdict, the fair-protocol gate, too few seeds,
Holm within one paper, best as an intersection–union test, and the committed claims page."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import paired
from analysis.claims import (BEST, CLAIMS, EQUIVALENCE, EQUIVALENT, HOLDS, LESS_MB, NBSP, NONINFERIORITY, NOT_RUN,
                             OPPOSITE, SUPERIORITY, UNSURE, Claim, check_claims, main, to_markdown)
from conftest import REPO
from scripts import reproduce
from sweeps.errors import SweepError
from sweeps.spec import load_spec

STUDY = "baselines_fmnist"
SETTING = "fmnist, 2 shards"
BASE = np.array([0.80, 0.82, 0.79, 0.85, 0.81])                # B's accuracy on seeds 1-5
BETTER = np.array([0.05, 0.06, 0.04, 0.05, 0.055])              # far above: every test rejects
NEAR = np.array([0.02, 0.01, 0.03, -0.005, 0.015])              # one-sided p = 0.036 alone
SAME = np.array([0.001, -0.001, 0.002, -0.002, 0.0])            # within ±1 pp, no difference
NOISE = np.array([0.03, -0.02, 0.04, -0.03, 0.01])              # neither


def trial(method: str, seed: int, acc: float, stage: str, setting: str = SETTING) -> dict:
    return {"algorithm": "fedavg", "method": method, "setting": setting, "dataset": "fmnist", "model": "auto",
            "num_clients": 10, "samples_per_client": 100, "partition": "shards",
            "shards_per_client": 2, "dir_alpha": math.nan, "lr": 0.05, "seed": seed, "acc_mean": acc,
            "acc_val_mean": acc, "status": "COMPLETED", "stage": stage, "config_hash": f"{method}|{seed}|{stage}"}


def write_sweep(folder, accuracy: dict[str, np.ndarray], study: str = STUDY, fair: bool = True, **columns):
    """A sweep of `study`: per method its confirmed accuracy on seeds 1..n; with `fair`, each
    method also has a selection-stage trial on seed 0 (accuracy 0.99, which must never count)."""
    rows = [trial(m, seed, acc, "confirm") for m, values in accuracy.items() for seed, acc in enumerate(values, 1)]
    rows += [trial(m, 0, 0.99, "select") for m in accuracy] if fair else []
    folder.mkdir(parents=True)
    pd.DataFrame(rows).assign(**columns).to_parquet(folder / "trials.parquet", index=False)
    (folder / "study.toml").write_text((REPO / "studies" / f"{study}.toml").read_text())
    return folder


def superiority(paper: str = "P", a: str = "A", b: str = "B") -> Claim:
    return Claim(paper, f"{a} outperforms {b}", "", (STUDY,), SUPERIORITY, a, b)


def judged(tmp_path, accuracy, claims, **kw) -> pd.DataFrame:
    return check_claims([write_sweep(tmp_path / "s", accuracy, **kw)], claims)


def test_superiority_holds_is_opposite_or_equivalent_within_its_margin(tmp_path):
    cases = {"holds": (BASE + BETTER, HOLDS), "opposite": (BASE - BETTER, OPPOSITE), "same": (BASE + SAME, EQUIVALENT)}
    for name, (a, verdict) in cases.items():
        row = judged(tmp_path / name, {"A": a, "B": BASE}, [superiority()]).iloc[0]
        assert row["verdict"] == verdict and row["seeds"] == 5, name   # the selection seed 0 never counts
        assert row["ours"] == f"{100 * a.mean():.1f} vs {100 * BASE.mean():.1f}"
    row = judged(tmp_path / "again", {"A": BASE + SAME, "B": BASE}, [superiority()]).iloc[0]
    assert row["note"] == "within ±1 pp" and row["test"].startswith("TOST ±1 pp")
    assert row["holm_p"] == pytest.approx(paired.equivalence(paired.difference(pd.Series(BASE + SAME),
                                                                                pd.Series(BASE)), 0.01))


def test_a_row_names_its_source_the_scale_it_ran_at_and_what_differs_from_the_paper(tmp_path):
    claim = next(c for c in CLAIMS if c.kind == BEST and c.studies == (STUDY,))
    row = judged(tmp_path, {"FedSelect": BASE + BETTER, "FedAvg": BASE}, [claim]).iloc[0]
    assert row["source"] == "FedSelect (CVPR 2024), Table 1"
    assert row["scale"] == "fmnist, lenet, 10 clients x 100 images"  # `auto` resolved for 28x28 images
    wide = judged(tmp_path / "wide", {"FedSelect": BASE + BETTER, "FedAvg": BASE}, [claim], model_width=2.0).iloc[0]
    assert wide["scale"] == "fmnist, lenet at width 2, 10 clients x 100 images"
    assert row["differs"].startswith("Fashion-MNIST and LeNet for CIFAR-10 and ResNet-18")
    page = to_markdown(pd.DataFrame([row]))
    assert "| Source |" in page and "| FedSelect (CVPR 2024), Table 1 |" in page and row["differs"] in page
    assert all(c.source for c in CLAIMS)  # every claim says where it is made
    assert next(c for c in CLAIMS if c.reference == "D-PSGD").source.startswith(
        "DisPFL (Dai et al., ICML 2022), not in our copy")


def test_the_page_puts_the_verdict_table_first_and_each_caption_above_its_table(tmp_path):
    claims = [superiority(), Claim("P", "A is comparable to B", "12 vs 11", (STUDY,), EQUIVALENCE, "A", "B",
                                   source="P, Table 2")]
    rows = judged(tmp_path, {"A": BASE + BETTER, "B": BASE}, claims)
    page = to_markdown(rows)
    blocks = page.rstrip("\n").split("\n\n")
    tables = [i for i, b in enumerate(blocks) if b.startswith("|")]
    assert tables[0] == 1 and all(blocks[i - 1].startswith("**") for i in tables)  # a caption above every table
    verdicts, details = (blocks[i].splitlines() for i in tables[:2])
    assert verdicts[0] == "| # | Claim | Sweep | Setting | Verdict | A − B, 95 % CI (pp) | Holm p | Seeds |"
    first = rows.iloc[0]
    interval = first["difference"].replace(" ", NBSP)  # one unit: never broken across lines
    assert NBSP in interval and verdicts[2] == (f"| 1 | A outperforms B | s | {SETTING} | **holds** | {interval} | "
                                                f"{first['holm_p']:.2g} | 5 |")
    assert verdicts[3].startswith("| 2 | A is comparable to B | s |")
    # the rest by the row's number: ours, the test, the type, the scale; sources once per claim
    assert details[0] == "| # | Ours, A vs B (%) | Test | Type | Scale |"
    assert details[2] == f"| 1 | {first['ours']} | {first['test']} | {first['type']} | {first['scale']} |"
    assert "| A is comparable to B | P, Table 2 | 12 vs 11 |" in page
    assert f"| s | {first['differs']} | {first['selection']} |" in page
    assert len(page.splitlines()[2].split(" | ")) == 8   # eight narrow columns, the verdict's among them


def test_inconclusive_prints_the_difference_the_seeds_could_have_detected(tmp_path):
    row = judged(tmp_path, {"A": BASE + NOISE, "B": BASE}, [superiority()]).iloc[0]
    d = paired.difference(pd.Series(BASE + NOISE), pd.Series(BASE))
    assert row["verdict"] == UNSURE and row["seeds"] == 5
    assert row["note"] == f"(detectable at 80 % power: ≥ {100 * paired.detectable(d.sd, 5):.1f} pp)"
    assert row["difference"] == f"{100 * d.mean:+.1f} [{100 * d.ci_low:+.1f}, {100 * d.ci_high:+.1f}]"
    assert row["holm_p"] == pytest.approx(paired.noninferior(d, 0.0))


def test_noninferiority_and_equivalence_claims_use_their_margins(tmp_path):
    ni = Claim("P", "A is as accurate as B or better", "", (STUDY,), NONINFERIORITY, "A", "B")
    eq = Claim("P", "A is comparable to B", "", (STUDY,), EQUIVALENCE, "A", "B")
    # half a point below: not inferior by 1 pp, and comparable within ±1 pp
    rows = judged(tmp_path / "near", {"A": BASE - 0.005 + SAME, "B": BASE}, [ni, eq])
    assert list(rows["verdict"]) == [HOLDS, HOLDS] and list(rows["type"]) == ["non-inferiority, m = 1 pp",
                                                                               "equivalence, ±1 pp"]
    rows = judged(tmp_path / "far", {"A": BASE - BETTER, "B": BASE}, [ni, eq])   # 5 points below
    assert list(rows["verdict"]) == [OPPOSITE, OPPOSITE]
    # 0.4 pp below on every seed: a significant difference, but inside ±1 pp: never "opposite" to comparable
    steady = BASE - 0.004 + np.array([0.0005, -0.0005, 0.0, 0.0005, -0.0005])
    row = judged(tmp_path / "steady", {"A": steady, "B": BASE}, [eq]).iloc[0]
    assert paired.difference(pd.Series(steady), pd.Series(BASE)).p < 0.001 and row["verdict"] == HOLDS
    with pytest.raises(ValueError, match="margin"):
        Claim("P", "x", "", (STUDY,), EQUIVALENCE, "A", "B", margin=0)
    with pytest.raises(ValueError, match="unknown kind"):
        Claim("P", "x", "", (STUDY,), "better", "A", "B")
    with pytest.raises(ValueError, match="no reference"):
        Claim("P", "x", "", (STUDY,), BEST, "A", "B")


def test_a_margin_the_study_file_declares_replaces_the_claims_own(tmp_path):
    eq = Claim("P", "A is comparable to B", "", (STUDY,), EQUIVALENCE, "A", "B")
    half_below = {"A": BASE - 0.005 + SAME, "B": BASE}    # comparable within 1 pp, not within 0.25 pp
    sweep = write_sweep(tmp_path / "s", half_below)
    assert check_claims([sweep], [eq]).iloc[0]["verdict"] == HOLDS
    study = sweep / "study.toml"
    study.write_text(study.read_text().replace('seeds = [', 'margin = 0.0025\nseeds = [', 1))
    row = check_claims([sweep], [eq]).iloc[0]
    assert row["verdict"] == OPPOSITE and row["margin"] == 0.0025 and row["type"] == "equivalence, ±0.25 pp"
    study.write_text(study.read_text().replace("margin = 0.0025", "margin = 2"))
    with pytest.raises(SweepError, match=r"margin=2; the claims' margin is accuracy as a fraction in \(0, 1\)"):
        load_spec(study)


def test_a_diverged_seed_is_left_out_and_said(tmp_path):
    folder = write_sweep(tmp_path / "s", {"A": np.append(BASE + BETTER, 0.99), "B": np.append(BASE, 0.80)})
    trials = pd.read_parquet(folder / "trials.parquet")
    trials["diverged"] = trials["config_hash"] == "A|6|confirm"     # A's sixth seed: the best number, diverged
    trials.to_parquet(folder / "trials.parquet", index=False)
    row = check_claims([folder], [superiority()]).iloc[0]
    assert row["seeds"] == 5 and row["verdict"] == HOLDS
    assert row["ours"] == (f"{100 * (BASE + BETTER).mean():.1f} vs {100 * BASE.mean():.1f}; A: 1 of 6 seeds diverged "
                           f"(left out)")


def test_fewer_than_five_common_seeds_is_inconclusive_without_a_test(tmp_path):
    row = judged(tmp_path, {"A": (BASE + BETTER)[:4], "B": BASE}, [superiority()]).iloc[0]
    assert row["verdict"] == UNSURE and row["note"] == "(fewer than 5 seeds)" and row["test"] == "no test"
    assert row["seeds"] == 4 and math.isnan(row["holm_p"]) and math.isnan(row["p_claim"])


def test_a_claim_without_its_sweep_or_with_an_unfair_sweep_is_not_rerun_yet(tmp_path):
    table = check_claims()
    assert len(table) == len(CLAIMS) and set(table["verdict"]) == {NOT_RUN}
    assert {"FedSelect", "DisPFL", "PerFedMask", "FedL2P"} == set(table["paper"])
    assert table["test"].iloc[0] == "no sweep of study fedselect_grid_fmnist or baselines_fmnist at hand"
    row = judged(tmp_path, {"A": BASE + BETTER, "B": BASE}, [superiority()], fair=False).iloc[0]
    assert row["verdict"] == NOT_RUN and row["study"] == "s" and "not run under the fair protocol" in row["test"]
    other = check_claims([write_sweep(tmp_path / "o", {"A": BASE}, study="dispfl_fmnist")], [superiority()])
    assert other.iloc[0]["verdict"] == NOT_RUN and "no sweep of study" in other.iloc[0]["test"]


def test_holm_runs_over_one_papers_tested_rows_only(tmp_path):
    sweep = write_sweep(tmp_path / "s", {"A": BASE + NEAR, "B": BASE, "C": BASE + NOISE})
    alone = check_claims([sweep], [superiority()])
    assert alone.iloc[0]["verdict"] == HOLDS and alone.iloc[0]["holm_p"] == pytest.approx(0.0364, abs=1e-4)
    family = check_claims([sweep], [superiority(), superiority(a="C")])      # p = 0.036 × 2 > 0.05
    assert list(family["verdict"]) == [UNSURE, UNSURE] and family.iloc[0]["holm_p"] == pytest.approx(0.0729, abs=1e-4)
    assert "Holm over P's 2 tests" in family.iloc[0]["test"]
    others = check_claims([sweep], [superiority(), superiority(paper="Q", a="C")])   # another paper's claim
    assert others.iloc[0]["verdict"] == HOLDS and others.iloc[0]["holm_p"] == alone.iloc[0]["holm_p"]
    untested = check_claims([sweep], [superiority(), superiority(a="D")])    # no D trials: no test, not counted
    assert untested.iloc[0]["verdict"] == HOLDS and untested.iloc[1]["test"] == "no D trials in this setting"


def test_best_is_an_intersection_union_test_over_every_opponent_but_the_comparable_ones(tmp_path):
    best = Claim("P", "A is best", "", (STUDY,), BEST, "A")
    row = judged(tmp_path / "wins", {"A": BASE + BETTER, "C": BASE, "D": BASE + NEAR}, [best]).iloc[0]
    a = pd.Series(BASE + BETTER, index=range(1, 6))
    pvalues = {m: paired.noninferior(paired.difference(a, pd.Series(v, index=range(1, 6))), 0.0)
               for m, v in {"C": BASE, "D": BASE + NEAR}.items()}
    assert row["verdict"] == HOLDS and row["p_claim"] == pytest.approx(max(pvalues.values()))
    assert "(D, the least beaten of 2)" in row["ours"]
    tie = judged(tmp_path / "tie", {"A": BASE + BETTER, "C": BASE, "D": BASE + BETTER + SAME}, [best]).iloc[0]
    assert tie["verdict"] == UNSURE and "D, the least beaten" in tie["ours"]      # beats C, not D
    behind = judged(tmp_path / "behind", {"A": BASE, "C": BASE - BETTER, "D": BASE + BETTER}, [best]).iloc[0]
    assert behind["verdict"] == OPPOSITE and "Bonferroni" in behind["test"]      # D is significantly better
    tied = Claim("P", "A is best, D comparable", "", (STUDY,), BEST, "A", tied=("D",))
    assert judged(tmp_path / "tied", {"A": BASE, "C": BASE - BETTER, "D": BASE + BETTER},
                  [tied]).iloc[0]["verdict"] == HOLDS
    alone = judged(tmp_path / "alone", {"A": BASE, "D": BASE}, [tied]).iloc[0]
    assert alone["verdict"] == UNSURE and alone["test"] == "no other method to beat in this setting"


def test_a_traffic_claim_compares_the_chosen_trials_busiest_node_without_a_test(tmp_path):
    from table_helpers import write_sweep as write_round_sweep

    sweep = write_round_sweep(tmp_path / "d")
    trials = pd.read_parquet(sweep / "trials.parquet")
    trials["stage"] = np.where((trials["algorithm"] == "fedselect") & (trials["seed"] == 1), "select", "confirm")
    trials.to_parquet(sweep / "trials.parquet", index=False)
    (sweep / "study.toml").write_text((REPO / "studies" / "dispfl_fmnist.toml").read_text())
    claims = [Claim("D", "Local carries less than FedAvg's server", "", ("dispfl_fmnist",), LESS_MB, "Local", "FedAvg"),
              Claim("D", "FedAvg's server carries less than Local", "", ("dispfl_fmnist",), LESS_MB, "FedAvg", "Local")]
    rows = check_claims([sweep], claims)
    # 5 rounds x 2000 bytes per client; FedAvg's server carries its 3 clients'
    assert list(rows["verdict"]) == [HOLDS, OPPOSITE] and rows.iloc[0]["ours"] == "0.0 vs 0.0 MB"
    assert rows.iloc[0]["test"] == "traffic is deterministic: no test" and rows.iloc[0]["difference"] == "-0.0 MB"


def test_the_command_writes_the_page_of_the_sweeps_it_is_given(tmp_path, capsys):
    assert main(["--markdown", "--out", str(tmp_path / "claims.md")]) == 0
    assert (tmp_path / "claims.md").read_text() == to_markdown(check_claims())
    assert main([str(tmp_path / "nothing-here")]) == 2 and "no results at" in capsys.readouterr().err


def test_the_claims_page_regenerates_from_the_committed_data(capsys):
    """The claims page recomputed from the Parquet committed beside the studies' tables
    (docs/results/<recipe>/data/<sweep>/, `reproduce.keep_data`) equals the committed page: no
    sweep runs. Until the study issues rerun the Fashion-MNIST studies under the fair protocol no
    such data exist, and every row reads not rerun yet."""
    assert reproduce.main(["claims", "--check", "--from-data"]) == 0, capsys.readouterr().out
    assert "1 tables regenerated, identical to docs/results/claims" in capsys.readouterr().out
