"""analysis.fedl2p and analysis.fedl2p_plots: FedL2P's accuracy and policy tables and its policy
figures, on small hand-made study folders (pretraining trials, then FT / L2P / FedL2P trials
started from them; no Ray, no training)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import tables
from analysis.fedl2p import fedl2p_table, final_scores, policy_table, study_trials
from analysis.fedl2p_plots import (build_fedl2p_plots, client_groups, group_distances, normalized_log_distance,
                                   pairwise_distances)
from analysis.load import find_sweeps, load_rounds, load_trials
from analysis.plots import build_plots
from fl_core.results import write_parquet

from latex_check import check_latex

SETTING = "digits, Dir(0.5), 1 unseen clients"
DATA = {"dataset": "digits", "partition": "dirichlet", "shards_per_client": 2, "dir_alpha": 0.5, "num_clients": 3,
        "unseen_clients": 1, "rounds": 2, "local_epochs": 1, "val_fraction": 0.2, "setting": SETTING}
# Pretraining trial -> (algorithm, method, seed); each seed's pretrained model scores these
# (`acc_global`): seen clients 0, 1 at g -/+ 0.05, the unseen client 2 at gu.
PRETRAININGS = {"pre0": ("fedavg", "FedAvg", 0), "pre1": ("fedavg", "FedAvg", 1)}
GLOBAL = {0: (0.30, 0.20), 1: (0.40, 0.10)}  # seed -> (g, gu)
# Personalization trial -> (algorithm, method, knobs, seed, e, final seen-client mean m, unseen acc u, status).
# Seen clients score m -/+ 0.05 at the final round (round 2), 0.2 less in round 1; the unseen client
# is scored in round 2 only. A STOPPED trial wrote round 1 only.
STUDY = {
    "ftc0": ("ft", "FT (BN C)", {"bn_mode": "C"}, 0, 1, 0.50, 0.40, "COMPLETED"),
    "ftc1": ("ft", "FT (BN C)", {"bn_mode": "C"}, 1, 1, 0.60, 0.50, "COMPLETED"),
    "ftclr0": ("ft", "FT (BN C)", {"bn_mode": "C", "lr": 0.1}, 0, 1, 0.10, 0.10, "COMPLETED"),  # a worse config
    "ftclr1": ("ft", "FT (BN C)", {"bn_mode": "C", "lr": 0.1}, 1, 1, 0.10, 0.10, "COMPLETED"),
    "ftg0": ("ft", "FT (BN G)", {"bn_mode": "G"}, 0, 1, 0.40, 0.30, "COMPLETED"),
    "ftg1": ("ft", "FT (BN G)", {"bn_mode": "G"}, 1, 1, 0.44, 0.30, "COMPLETED"),
    "fti0": ("ft", "FT (BN I)", {"bn_mode": "I"}, 0, 1, 0.45, 0.20, "COMPLETED"),           # one seed only
    "l2p0": ("l2p", "L2P", {}, 0, 1, 0.52, 0.50, "COMPLETED"),
    "l2p1": ("l2p", "L2P", {}, 1, 1, 0.58, 0.60, "COMPLETED"),
    "fl0": ("fedl2p", "FedL2P", {}, 0, 1, 0.60, 0.55, "COMPLETED"),
    "fl1": ("fedl2p", "FedL2P", {}, 1, 1, 0.70, 0.65, "COMPLETED"),
    "flstop": ("fedl2p", "FedL2P", {}, 2, 1, 0.99, 0.99, "STOPPED"),                          # unfinished
    "ftc0e5": ("ft", "FT (BN C)", {"bn_mode": "C"}, 0, 5, 0.70, 0.10, "COMPLETED"),
    "ftc1e5": ("ft", "FT (BN C)", {"bn_mode": "C"}, 1, 5, 0.80, 0.10, "COMPLETED"),
    "fl0e5": ("fedl2p", "FedL2P", {}, 0, 5, 0.60, 0.30, "COMPLETED"),
    "fl1e5": ("fedl2p", "FedL2P", {}, 1, 5, 0.64, 0.50, "COMPLETED"),
}
BNNET = {  # FedL2P (BNNet), e = 1: ties FedL2P's 65.0 as printed
    "bn0": ("fedl2p", "FedL2P (BNNet)", {"meta_nets": "bnnet"}, 0, 1, 0.62, 0.50, "COMPLETED"),
    "bn1": ("fedl2p", "FedL2P (BNNet)", {"meta_nets": "bnnet"}, 1, 1, 0.68, 0.50, "COMPLETED"),
}
FEDBABU = {  # a second pretraining method, and FT (BN I) started from it
    "babu0": ("ft", "FT (BN I)", {"bn_mode": "I", "pretrained": "preb0"}, 0, 1, 0.90, 0.90, "COMPLETED"),
    "babu1": ("ft", "FT (BN I)", {"bn_mode": "I", "pretrained": "preb1"}, 1, 1, 0.80, 0.90, "COMPLETED"),
}
BN_LAYERS, TENSORS = ("bn1", "bn2"), ("conv.weight", "conv.bias", "fc.weight")


def policy(client: int, seed: int, rnd: int, same: bool = False) -> dict[str, float]:
    """A client's policy columns: β of both BN layers 0.2 + 0.2 k + 0.4 seed (0.9 in round 1); η of
    conv.weight 0.01 (k + 1), of conv.bias 0 (sparsity 1/3), of fc.weight 0.02. `same`: every
    client the policy of client 0."""
    k = 0 if same else client
    beta = 0.9 if rnd == 1 else 0.2 + 0.2 * k + 0.4 * seed
    etas = [0.01 * (k + 1), 0.0, 0.02]
    return ({f"beta:{n}": beta for n in BN_LAYERS} | {f"eta:{n}": v for n, v in zip(TENSORS, etas)}
            | {"beta_mean": beta, "eta_mean": sum(etas) / 3, "sparsity": 1 / 3})


def trial_rows(key, algorithm, method, knobs, seed, e, m, u, status, unseen=True, same=False):
    pretrained = knobs.pop("pretrained", f"pre{seed}")
    config = DATA | {"algorithm": algorithm, "method": method, "seed": seed, "ft_epochs": e, "lr": 0.01,
                     "pretrained": pretrained, "config_hash": key, "stage": "personalize"} | knobs
    g, gu = GLOBAL[seed % 2]
    rows = []
    for rnd in range(1, (1 if status == "STOPPED" else 2) + 1):
        shift = 0.0 if rnd == 2 else -0.2
        for k in range(3 if unseen else 2):
            seen = k < 2
            row = config | {"round": rnd, "client": k, "pool": "seen" if seen else "unseen", "participated": seen,
                            "acc_local": np.nan,
                            "acc": m + shift + (0.1 * k - 0.05) if seen else (u if rnd == 2 else np.nan),
                            "acc_global": g + (0.1 * k - 0.05) if seen else (gu if rnd == 2 else np.nan),
                            "loss": 0.5, "n_train": 40, "n_test": 10, "personal_fraction": 1.0,
                            "bytes_up": 5000 if algorithm == "fedl2p" and seen else 0,
                            "bytes_down": 5000 if algorithm == "fedl2p" and seen else 0}
            if algorithm in ("l2p", "fedl2p") and (seen or rnd == 2):
                row |= policy(k, seed, rnd, same)
                if seen:
                    row["hypergrad_seconds"] = (1.0 + seed) if algorithm == "fedl2p" else 0.5
            rows.append(row)
    acc_mean = m if status == "COMPLETED" else m - 0.2
    return config, rows, {"status": status, "rounds_done": 2 if status == "COMPLETED" else 1, "acc_mean": acc_mean}


def write_study(folder, study=STUDY, unseen=True, same_policy=False, domains=None, pretrainings=PRETRAININGS):
    """The study's folder: rounds/, clients/ (with `domains`, each client's domain) and trials.parquet."""
    trials = []
    for key, (algorithm, method, seed) in pretrainings.items():
        config = DATA | {"algorithm": algorithm, "method": method, "seed": seed, "lr": 0.05, "config_hash": key,
                         "stage": "pretrain"}
        rows = [config | {"round": rnd, "client": k, "pool": "seen", "participated": True, "acc": 0.3,
                          "acc_local": 0.3, "acc_global": 0.3, "loss": 0.5, "n_train": 40, "n_test": 10,
                          "personal_fraction": 0.0, "bytes_up": 100, "bytes_down": 100}
                for rnd in (1, 2) for k in range(2)]
        write_parquet(pd.DataFrame(rows), folder / "rounds" / f"{key}.parquet")
        trials.append(config | {"status": "COMPLETED", "rounds_done": 2, "acc_mean": 0.3})
    for key, spec in study.items():
        algorithm, method, knobs, *rest = spec
        config, rows, info = trial_rows(key, algorithm, method, dict(knobs), *rest, unseen=unseen, same=same_policy)
        write_parquet(pd.DataFrame(rows), folder / "rounds" / f"{key}.parquet")
        clients = [config | {"client": k, "pool": "seen" if k < 2 else "unseen", "train_label_hist": [4, 1]}
                   | ({"domain": domains[k]} if domains else {}) for k in range(3 if unseen else 2)]
        write_parquet(pd.DataFrame(clients), folder / "clients" / f"{key}.parquet")
        trials.append(config | info)
    write_parquet(pd.DataFrame(trials), folder / "trials.parquet")
    return folder


@pytest.fixture
def study(tmp_path):
    return write_study(tmp_path / "fedl2p")


def _table(folder):
    cells, bold, caption, _ = fedl2p_table(find_sweeps(folder), load_trials(folder))
    return cells, bold, caption


# ---------------------------------------------------------------- the accuracy table

def test_table_cells_are_hand_computed_means_over_seeds(study):
    cells, bold, caption = _table(study)
    assert list(cells.columns) == ["Global Acc", "FT (BN C)", "FT (BN G)", "FT (BN I)", "L2P", "FedL2P"]
    assert list(cells.index.names) == ["Data setting", "Clients", "e"]
    assert list(cells.index) == [(SETTING, "seen", 1), (SETTING, "seen", 5), (SETTING, "unseen", 1),
                                 (SETTING, "unseen", 5)]
    seen = cells.loc[(SETTING, "seen", 1)]
    # Global Acc: per seed the client mean of acc_global (0.30, 0.40); FT (BN C) at lr 0.01, not the
    # worse lr 0.1; the final round (2), never round 1; the STOPPED FedL2P trial (0.99) left out
    assert seen.tolist() == ["35.0 ± 7.1", "55.0 ± 7.1", "42.0 ± 2.8", "45.0 (n=1)", "55.0 ± 4.2", "65.0 ± 7.1"]
    assert cells.loc[(SETTING, "seen", 5)].tolist() == ["35.0 ± 7.1", "75.0 ± 7.1", None, None, None, "62.0 ± 2.8"]
    assert "2 seeds per cell unless marked (n=k)" in caption
    assert "Left out: 1 run that did not finish (reached round 1 of 2)." in caption
    assert "Pretraining: FedAvg." in caption


def test_seen_and_unseen_clients_are_separate_rows(study):
    cells, _, _ = _table(study)
    unseen = cells.loc[(SETTING, "unseen", 1)]
    assert unseen.tolist() == ["15.0 ± 7.1", "45.0 ± 7.1", "30.0 ± 0.0", "20.0 (n=1)", "55.0 ± 7.1", "60.0 ± 7.1"]
    assert cells.loc[(SETTING, "unseen", 5), "FedL2P"] == "40.0 ± 14.1"
    scores = final_scores(load_rounds(study, trials=["fl0"])).set_index("pool")
    assert scores.loc["seen", "acc"] == pytest.approx(0.60) and scores.loc["unseen", "acc"] == pytest.approx(0.55)
    assert scores["round"].tolist() == [2, 2]


def test_no_clients_level_without_unseen_clients(tmp_path):
    folder = write_study(tmp_path / "seen_only", unseen=False)
    cells, _, caption = _table(folder)
    assert list(cells.index.names) == ["Data setting", "e"]
    assert list(cells.index) == [(SETTING, 1), (SETTING, 5)]
    assert "unseen" not in caption


def test_best_of_each_row_is_bold_global_acc_never(study):
    """2 seeds: no paired test (fewer than 5 common seeds), so no mark, and bold is the best value
    of its row as printed (FedL2P's 65.0 beside FT (BN C)'s 55.0, FT (BN C)'s 75.0 at e = 5)."""
    cells, bold, caption = _table(study)
    expected = {(SETTING, "seen", 1): ["FedL2P"], (SETTING, "seen", 5): ["FT (BN C)"],
                (SETTING, "unseen", 1): ["FedL2P"], (SETTING, "unseen", 5): ["FedL2P"]}
    assert {row: bold.columns[bold.loc[row]].tolist() for row in bold.index} == expected
    assert not bold["Global Acc"].any()
    assert not any(m in "".join(cells.fillna("").to_numpy().ravel()) for m in "▲▼")
    assert "significantly better/worse than FT (BN C), in the same row" in caption
    assert "Cells share fewer than 5 seeds (1–2 in common): no test and no mark" in caption
    assert "t-test" not in caption


def test_marks_against_ft_bn_c_with_five_seeds(tmp_path):
    """5 seeds: a paired t-test over seeds in each row; FedL2P 10 points above FT (BN C) on every
    seed (±1 of noise) is marked better, L2P, equal to FT (BN C), is not; FT (BN C) is then
    significantly worse than the best, so not bold."""
    noise = [0.01, -0.01, 0.0, 0.005, -0.005]
    study = {f"{name}{s}": (algorithm, method, knobs, s, 1, base + 0.02 * s + extra, base, "COMPLETED")
             for s in range(5) for name, algorithm, method, knobs, base, extra in [
                 ("ftc", "ft", "FT (BN C)", {"bn_mode": "C"}, 0.5, 0.0), ("l2p", "l2p", "L2P", {}, 0.5, 0.0),
                 ("fl", "fedl2p", "FedL2P", {}, 0.6, noise[s])]}
    pretrainings = {f"pre{s}": ("fedavg", "FedAvg", s) for s in range(5)}
    folder = write_study(tmp_path / "five", study, unseen=False, pretrainings=pretrainings)
    cells, bold, caption, summary = fedl2p_table(find_sweeps(folder), load_trials(folder))
    row = cells.loc[(SETTING, 1)]
    assert row["FedL2P"].endswith("▲") and not row["L2P"].endswith(("▲", "▼"))
    assert bold.loc[(SETTING, 1)].tolist() == [False, False, False, True]
    assert "paired t-test on the per-seed mean accuracies over 5 common seeds" in caption
    marked = summary.set_index("column").loc["FedL2P"]
    assert marked["marked"] == "better" and marked["test"] == "paired t-test" and marked["p_adjusted"] < 0.05


def test_a_diverged_run_is_counted_in_its_cells_and_left_out_of_the_rest(study):
    """FedL2P's seed 1 diverged: its cells (seen and unseen, e = 1) hold seed 0 alone, say so and
    are not bold, though still the best of their rows; Global Acc keeps seed 1 from its other runs."""
    trials = load_trials(study)
    trials["diverged"] = trials["config_hash"] == "fl1"
    cells, bold, caption, summary = fedl2p_table(find_sweeps(study), trials)
    seen, unseen = cells.loc[(SETTING, "seen", 1)], cells.loc[(SETTING, "unseen", 1)]
    assert (seen["FedL2P"], unseen["FedL2P"]) == ("60.0 (1 of 2 seeds diverged)", "55.0 (1 of 2 seeds diverged)")
    assert seen["Global Acc"] == "35.0 ± 7.1" and cells.loc[(SETTING, "seen", 5), "FedL2P"] == "62.0 ± 2.8"
    assert not bold["FedL2P"].loc[[(SETTING, "seen", 1), (SETTING, "unseen", 1)]].any()
    assert bold.loc[(SETTING, "seen", 1)].tolist() == [False, True, False, False, True, False]  # 55.0 twice
    assert "k of n seeds diverged" in caption and "2 seeds per cell unless marked (n=k)" in caption
    assert summary.groupby("column")["diverged"].sum().to_dict()["FedL2P"] == 2       # two of its cells


def test_a_best_val_study_scores_the_seen_clients_at_the_reported_round(study):
    trials = load_trials(study)
    best = trials["algorithm"].isin(["ft", "l2p", "fedl2p"])
    trials.loc[best, "report_round"], trials.loc[best, "reported_round"] = "best_val", 2
    trials.loc[trials["config_hash"].isin(["fl0", "fl1"]), "reported_round"] = 1
    cells, _, caption, _ = fedl2p_table(find_sweeps(study), trials)
    assert cells.loc[(SETTING, "seen", 1), "FedL2P"] == "45.0 ± 7.1"                  # round 1: 0.2 below
    assert cells.loc[(SETTING, "unseen", 1), "FedL2P"] == "60.0 ± 7.1"                # scored after the last round
    assert cells.loc[(SETTING, "seen", 1), "FT (BN C)"] == "55.0 ± 7.1"
    assert ("after fine-tuning the pretrained model for e epochs, at each run's round with the best mean validation "
            "accuracy (report_round = best_val), mean over clients") in caption
    scores = final_scores(load_rounds(study, trials=["fl0"]), {"fl0": 1}).set_index("pool")
    assert scores.loc["seen", ["acc", "round"]].tolist() == pytest.approx([0.40, 1])
    assert scores.loc["unseen", ["acc", "round"]].tolist() == pytest.approx([0.55, 2])
    assert "at the final round, mean over clients" in _table(study)[2]


def test_ablation_columns_only_when_present_and_ties_both_bold(study, tmp_path):
    cells, _, _ = _table(study)
    assert not any("BNNet" in c for c in cells.columns)
    folder = write_study(tmp_path / "ablation", STUDY | BNNET)
    cells, bold, _ = _table(folder)
    assert cells.columns[-2:].tolist() == ["FedL2P", "FedL2P (BNNet)"]
    assert cells.loc[(SETTING, "seen", 1), "FedL2P (BNNet)"] == "65.0 ± 4.2"
    assert cells.loc[(SETTING, "seen", 5), "FedL2P (BNNet)"] is None
    assert bold.loc[(SETTING, "seen", 1)].tolist() == [False] * 5 + [True] * 2  # 65.0 and 65.0 as printed: a tie


def test_missing_method_gives_no_column(tmp_path):
    only = {k: v for k, v in STUDY.items() if v[1] in ("FT (BN C)", "FedL2P")}
    cells, _, _ = _table(write_study(tmp_path / "two", only))
    assert list(cells.columns) == ["Global Acc", "FT (BN C)", "FedL2P"]


def test_pretraining_methods_are_separate_rows(tmp_path):
    pretrainings = PRETRAININGS | {"preb0": ("fedbabu", "FedBABU", 0), "preb1": ("fedbabu", "FedBABU", 1)}
    folder = write_study(tmp_path / "two_pretrainings", STUDY | FEDBABU, pretrainings=pretrainings)
    chosen, late = study_trials(load_trials(folder))
    assert set(chosen.loc[chosen["config_hash"].isin(["babu0", "babu1"]), "pretraining"]) == {"FedBABU"}
    assert list(late["config_hash"]) == ["flstop"]
    cells, _, caption = _table(folder)
    assert list(cells.index.names) == ["Data setting", "Pretraining", "Clients", "e"]
    assert cells.loc[(SETTING, "FedAvg", "seen", 1), "FT (BN I)"] == "45.0 (n=1)"   # not pooled with FedBABU's
    assert cells.loc[(SETTING, "FedBABU", "seen", 1)].tolist() == ["35.0 ± 7.1", None, None, "85.0 ± 7.1", None, None]
    assert "Pretraining:" not in caption


def test_tables_cli_writes_fedl2p_tables_and_keeps_them_out_of_methods(study, tmp_path, capsys):
    out = tmp_path / "tables"
    assert tables.main([str(study), "--out", str(out), "--markdown"]) == 0
    latex = (out / "fedl2p.tex").read_text()
    assert "\\begin{tabular}{llcccccc}" in latex                  # the setting: a header row over its rows
    assert f"\\multicolumn{{8}}{{l}}{{\\itshape {SETTING}}} \\\\" in latex
    assert "Clients & e & Global Acc & FT (BN C)" in latex
    assert r"\bfseries 65.0 $\pm$ 7.1" in latex
    markdown = (out / "fedl2p.md").read_text()
    cells = "35.0 ± 7.1 | 55.0 ± 7.1 | 42.0 ± 2.8 | 45.0 (n=1) | 55.0 ± 4.2 | **65.0 ± 7.1**"  # 2 seeds: no test
    assert f"| {SETTING} | seen | 1 | {cells} |" in markdown
    methods = (out / "methods.tex").read_text()  # the pretrainings alone: FT's e would be pooled there
    assert "FedAvg" in methods and "FT" not in methods and "FedL2P" not in methods
    assert (out / "fedl2p_policy.tex").exists() and (out / "fedl2p_policy.md").exists()
    for name in ("fedl2p", "fedl2p_policy", "methods"):  # compiles in the documented preamble
        check_latex(out / f"{name}.tex", tmp_path / "latex" / name)
    assert "wrote" in capsys.readouterr().out
    assert set(tables.build_tables([study], "fedl2p", tmp_path / "only")) == {"fedl2p", "fedl2p_policy"}


# ---------------------------------------------------------------- the policy table

def test_policy_table_by_hand(study):
    cells, bold, caption = policy_table(find_sweeps(study), load_trials(study))
    assert list(cells.index) == [(SETTING, 1, "L2P"), (SETTING, 1, "FedL2P"), (SETTING, 5, "FedL2P")]
    fedl2p = cells.loc[(SETTING, 1, "FedL2P")]
    # β: seen clients at the final round, seed 0 (0.2, 0.4), seed 1 (0.6, 0.8); η: (0.03/3 + 0.04/3) / 2;
    # hypergradient: seed 0 1 s, seed 1 2 s per client-round; λ: 5000 B up + 5000 B down
    assert fedl2p.tolist() == ["0.500", "33.3", "0.0117", "1.50", "10.0"]
    assert cells.loc[(SETTING, 1, "L2P")].tolist() == ["0.500", "33.3", "0.0117", "0.50", "0.0"]
    assert not bold.to_numpy().any()


# ---------------------------------------------------------------- distances and figures

def test_distance_matrices_by_hand():
    vectors = [[0, 0], [3, 4], [0, 8]]
    np.testing.assert_allclose(pairwise_distances(vectors), [[0, 5, 8], [5, 0, 5], [8, 5, 0]])
    names, d = group_distances(vectors, ["a", "a", "b"])
    assert names == ["a", "b"]
    np.testing.assert_allclose(d, [[5, 6.5], [6.5, np.nan]])     # d(b, b): one client, undefined
    assert normalized_log_distance(d) is None
    four = [[0, 0], [3, 4], [10, 0], [10, 8]]
    names, d = group_distances(four, ["a", "a", "b", "b"])
    between = np.mean([10, np.hypot(10, 8), np.hypot(7, 4), np.hypot(7, 4)])
    np.testing.assert_allclose(d, [[5, between], [between, 8]])
    np.testing.assert_allclose(normalized_log_distance(d), [[0, np.log(between / np.sqrt(40))],
                                                            [np.log(between / np.sqrt(40)), 0]])
    assert normalized_log_distance(np.zeros((2, 2))) is None


def _written(paths):
    return {p.name for p in paths if p.exists() and p.stat().st_size > 0}


def test_figures_written_and_hooked_into_build_plots(study, tmp_path):
    paths = build_fedl2p_plots(find_sweeps(study), load_trials(study), tmp_path / "figures")
    assert _written(paths) == {f"{n}.{e}" for n in ("fedl2p_policy", "fedl2p_policy_distance") for e in ("png", "pdf")}
    assert {"fedl2p_policy.png", "fedl2p_policy_distance.png"} <= _written(build_plots([study], tmp_path / "all"))


def test_distance_figure_groups_by_domain(tmp_path, capsys):
    folder = write_study(tmp_path / "domains", domains=["clean", "clean", "fog"])
    clients = pd.read_parquet(folder / "clients" / "fl0.parquet")
    assert client_groups(clients, "fl0", [0, 1, 2]) == ["clean", "clean", "fog"]
    assert client_groups(clients.assign(domain="mixed"), "fl0", [0, 1, 2]) is None
    paths = build_fedl2p_plots(find_sweeps(folder), load_trials(folder), tmp_path / "figures")
    assert "fedl2p_policy_distance.png" in _written(paths)  # fog has one client: not normalised, still drawn


def test_identical_policies_skip_the_distance_figure(tmp_path, capsys):
    folder = write_study(tmp_path / "same", same_policy=True)
    paths = build_fedl2p_plots(find_sweeps(folder), load_trials(folder), tmp_path / "figures")
    assert _written(paths) == {"fedl2p_policy.png", "fedl2p_policy.pdf"}
    printed = capsys.readouterr().out
    assert "every client has the same policy" in printed and "skipping FedL2P policy distance heatmap" in printed


def test_no_policy_figures_without_fedl2p(tmp_path, capsys):
    only_ft = {k: v for k, v in STUDY.items() if v[0] == "ft"}
    folder = write_study(tmp_path / "ft", only_ft)
    assert build_fedl2p_plots(find_sweeps(folder), load_trials(folder), tmp_path / "figures") == []
    assert "skipping FedL2P policy figures" in capsys.readouterr().out
