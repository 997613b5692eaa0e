"""The method guide works as written: docs/writing-a-method.md's FedAvgM and its test, extracted
from the page into a package outside the repository, run as an external method
(`algorithm = "my_methods.fedavgm:FedAvgM"`): the page's own tests pass, the method resumes
bit-identically, and a study names it. Bad external names are one clear error."""
from __future__ import annotations

import importlib
import re
import sys

import pandas as pd
import pytest

from fl_core.algorithms import is_external
from fl_core.config import ConfigError, RunConfig
from sweeps.spec import load_spec

from conftest import REPO, restore_mid_run, run_one, tiny

PAGE = REPO / "docs" / "writing-a-method.md"
FEDAVGM = "my_methods.fedavgm:FedAvgM"


@pytest.fixture
def guide(tmp_path, monkeypatch):
    """The page's files (each ```python block that starts with `# my_methods/<file>.py`) written
    under tmp_path, which goes on sys.path; yields the package's folder."""
    blocks = re.findall(r"```python\n# (my_methods/\w+\.py)\n(.*?)```", PAGE.read_text(), re.S)
    assert {path for path, _ in blocks} == {"my_methods/fedavgm.py", "my_methods/test_fedavgm.py"}
    (tmp_path / "my_methods").mkdir()
    (tmp_path / "my_methods" / "__init__.py").write_text("")
    for path, code in blocks:
        (tmp_path / path).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "my_methods"
    for name in [m for m in sys.modules if m == "my_methods" or m.startswith("my_methods.")]:
        del sys.modules[name]


def test_the_pages_own_tests_pass(guide):
    tests = importlib.import_module("my_methods.test_fedavgm")
    names = [n for n in dir(tests) if n.startswith("test_")]
    assert names == ["test_momentum_moves_it_away_from_fedavg", "test_without_momentum_it_is_fedavg"]
    for name in names:
        getattr(tests, name)()


def test_the_external_method_resumes_bit_identically_server_state_included(guide, tmp_path):
    straight, resumed, _ = restore_mid_run(tiny(algorithm=FEDAVGM, rounds=4, participation=0.5), tmp_path)
    for n, v in straight.algorithm.velocity.items():
        assert resumed.algorithm.velocity[n].equal(v)


def test_it_is_named_labelled_and_hashed_like_a_registered_method(guide):
    config = RunConfig(algorithm=FEDAVGM, server_momentum=0.5)
    assert config.label() == "FedAvgM" and config.server_momentum == 0.5
    assert config.config_hash() != RunConfig(algorithm=FEDAVGM).config_hash()
    with pytest.raises(ConfigError, match="server_momentum=1.0 is outside"):
        RunConfig(algorithm=FEDAVGM, server_momentum=1.0)
    with pytest.raises(ConfigError, match="pers_rate is a knob of fedselect, not of my_methods.fedavgm:FedAvgM"):
        RunConfig(algorithm=FEDAVGM, pers_rate=0.2)


def test_a_study_names_it_and_sets_its_knobs(guide, tmp_path):
    study = tmp_path / "study.toml"
    study.write_text(f'name = "m"\nseeds = [0]\n[knobs]\ndataset = "synthetic"\n[[methods]]\nalgorithm = "{FEDAVGM}"\n'
                     f'server_momentum = [0.5, 0.9]\n')
    spec = load_spec(study)
    assert [m.algorithm for m in spec.methods] == [FEDAVGM] and spec.methods[0].knobs["server_momentum"] == [0.5, 0.9]


def guide_sweep(folder):
    """The page's study, run trial by trial outside Tune into one sweep folder: FedAvgM at
    server_momentum 0.5 and 0.9 (the page's [[methods]] entry) and FedAvg, seeds 0 and 1."""
    for seed in (0, 1):
        run_one(folder, {"algorithm": "fedavg", "seed": seed, "rounds": 4, "lr": 0.1})
        for beta in (0.5, 0.9):
            run_one(folder, {"algorithm": FEDAVGM, "server_momentum": beta, "seed": seed, "rounds": 4, "lr": 0.1})
    return folder


def test_the_guides_study_keeps_each_momentum_a_configuration_of_its_own(guide, tmp_path, outside_tune):
    """An out-of-tree method's knobs define its configurations as a registered method's do: the
    rows name them (`method_knobs`), so two momenta over two seeds are two configurations of two
    seeds each, never one cell of four 'seeds' (the bug: FedAvgM 23.2 ± 5.3 (n=4))."""
    import pandas as pd

    from analysis.common import chosen_trials, config_keys, config_knobs
    from analysis.load import load_rounds, load_trials
    from analysis.tables import build_tables
    from sweeps.summary import best_per_setting

    folder = guide_sweep(tmp_path / "sweep")
    rounds, trials = load_rounds(folder), load_trials(folder)
    assert len(trials) == 6 and trials["acc_mean"].notna().all()
    assert set(rounds.loc[rounds.algorithm == FEDAVGM, "method_knobs"]) == {"server_momentum server_lr"}
    assert "server_momentum" in config_knobs(trials) and "server_lr" in config_knobs(trials)
    fedavgm = trials[trials.algorithm == FEDAVGM]
    assert set(fedavgm["method_knobs"]) == {"server_momentum server_lr"}
    assert config_keys(fedavgm).nunique() == 2 and fedavgm.groupby(config_keys(fedavgm)).size().tolist() == [2, 2]
    chosen = chosen_trials(trials)
    assert chosen.groupby("method").size().to_dict() == {"FedAvg": 2, "FedAvgM": 2}
    assert set(chosen.loc[chosen.method == "FedAvgM", "server_momentum"]) == {0.5}  # the declared (first) one
    build_tables(folder, markdown=True)
    summary = pd.read_parquet(folder / "tables" / "summary.parquet")
    cells = summary[summary.table == "methods"].drop_duplicates(["row", "column"]).set_index("row")
    assert cells.loc["FedAvgM", "n"] == 2 and cells.loc["FedAvg", "n"] == 2
    means = fedavgm.groupby("server_momentum")["acc_mean"].mean()
    assert cells.loc["FedAvgM", "mean"] == pytest.approx(means[0.5])   # not the mean of both momenta
    assert means[0.5] != pytest.approx(means[0.9])
    convergence = (folder / "tables" / "convergence.md").read_text()
    lines = [line for line in convergence.splitlines() if "FedAvgM" in line]
    assert len(lines) == 2 and all("server_momentum=0.5" in line or "server_momentum=0.9" in line for line in lines)
    seeds = re.findall(r"(\d+) seeds?\b", convergence) + re.findall(r"\| (\d+) \|\s*$", convergence, re.M)
    assert seeds and set(seeds) == {"2"}   # 2 seeds per configuration, wherever the table states it
    printed = best_per_setting(trials, ["server_momentum"])
    assert printed.set_index("method").loc["FedAvgM", "seeds"] == 2


def test_its_knobs_are_command_line_flags_of_a_run_and_of_a_study(guide, tmp_path, capsys):
    from fl_core.__main__ import main as fl_run
    from sweeps.study import build_parser, plan_sweep, study_of_file

    folder = tmp_path / "run"
    assert fl_run(["--algorithm", FEDAVGM, "--server-momentum", "0.5", "--dataset", "synthetic", "--num-clients",
                   "3", "--rounds", "1", "--results", str(folder)]) == 0
    assert pd.read_parquet(folder / "rounds.parquet")["server_momentum"].unique().tolist() == [0.5]
    with pytest.raises(SystemExit) as refused:                 # not a flag of a run of a registered method
        fl_run(["--server-momentum", "0.5", "--rounds", "1"])
    assert refused.value.code == 2 and "--server-momentum" in capsys.readouterr().err
    study = tmp_path / "study.toml"
    study.write_text(f'name = "m"\nseeds = [0]\n[knobs]\ndataset = "synthetic"\n[[methods]]\nalgorithm = "{FEDAVGM}"\n'
                     f'server_momentum = [0.5, 0.9]\n')
    argv = ["--server-momentum", "0.7", "--server-lr", "0.5", "--results", str(tmp_path)]
    plan, _ = plan_sweep(study_of_file(study), build_parser(study_of_file(study), argv).parse_args(argv))
    configs = [c for stage in plan.stages for _, c in stage.configs]
    assert [(c.server_momentum, c.server_lr) for c in configs] == [(0.7, 0.5)]


def test_a_study_of_a_method_that_does_not_import_is_one_error(tmp_path, capsys):
    from sweeps.run import run as fl_study

    study = tmp_path / "study.toml"
    study.write_text('name = "m"\nseeds = [0]\n[[methods]]\nalgorithm = "no_such.pkg:Method"\n')
    assert fl_study([str(study), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import Method from no_such.pkg" in err


@pytest.mark.parametrize("name, needle", [
    ("no_such_package.methods:FedAvgM", "cannot import FedAvgM from no_such_package.methods"),
    ("fl_core.config:RunConfig", "RunConfig is not a subclass of fl_core.algorithms.base.Algorithm"),
    ("fedavgg", "is not allowed; choose one of"),
])
def test_a_bad_method_name_is_one_clear_error(name, needle):
    with pytest.raises(ConfigError, match=needle):
        RunConfig(algorithm=name)


def test_only_module_colon_class_is_external():
    assert is_external("pkg.mod:Cls") and is_external("mod:Cls")
    assert not is_external("fedavg") and not is_external("pkg.mod:") and not is_external("a b:C")
