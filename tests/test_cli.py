"""`python -m fl_core`: output files, printed progress, --help, and clear errors before any work."""
import dataclasses
import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fl_core.__main__ import main
from fl_core.algorithms import ALGORITHMS, params_class
from fl_core.config import COMMON_KNOBS

from conftest import REPO

TINY = ["--dataset", "synthetic", "--num-clients", "4", "--shards-per-client", "3", "--rounds", "2",
        "--batch-size", "16", "--threads", "1"]


def test_cli_reports_seen_and_unseen_clients_apart(tmp_path, capsys):
    assert main(TINY + ["--unseen-clients", "1", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rounds = pd.read_parquet(tmp_path / "rounds.parquet")
    last = rounds[rounds["round"] == 2]
    seen, unseen = last[last.pool == "seen"], last[last.pool == "unseen"]
    assert len(seen) == 3 and len(unseen) == 1
    assert f"final: acc {seen.acc.mean():.4f}" in out and "over 3 seen clients" in out
    assert f"unseen: acc {unseen.acc.mean():.4f} over 1 held-out clients" in out


def test_cli_writes_rounds_and_clients_parquet(tmp_path, capsys):
    assert main(TINY + ["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "round   1/2" in out and "round   2/2" in out and "final: acc" in out
    rounds = pd.read_parquet(tmp_path / "rounds.parquet")
    assert len(rounds) == 2 * 4
    assert sorted(rounds.groupby("round").client.apply(sorted).tolist()) == [[0, 1, 2, 3]] * 2
    for column in ("algorithm", "dataset", "model", "num_clients", "partition", "shards_per_client", "dir_alpha",
                   "samples_per_client", "rounds", "local_epochs", "batch_size", "lr", "pers_rate", "pers_limit",
                   "seed", "acc_local", "acc_global", "acc", "loss", "n_train", "n_test", "personal_fraction",
                   "bytes_up", "bytes_down", "seconds", "config_hash", "version"):
        assert column in rounds.columns, column
    assert rounds.model.unique().tolist() == ["lenet"]
    assert rounds.config_hash.nunique() == 1
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    assert len(clients) == 4
    for row in clients.itertuples():
        assert sum(row.train_label_hist) == row.n_train
        assert sum(1 for c in row.train_label_hist if c > 0) == 3  # 3 shards (classes) per client
    merged = rounds[rounds["round"] == 1].merge(clients[["client", "n_train", "n_test"]], on="client")
    assert (merged.n_train_x == merged.n_train_y).all() and (merged.n_test_x == merged.n_test_y).all()


@pytest.mark.parametrize("args,needle", [
    (["--pers-rate", "1.5"], "pers_rate=1.5 is outside the allowed range [0, 1]"),
    (["--pers-limit", "-0.1"], "pers_limit=-0.1 is outside the allowed range [0, 1]"),
    (["--dir-alpha", "0"], "dir_alpha=0.0 is outside the allowed range (0, inf)"),
    (["--dataset", "imagenet"],
     "dataset='imagenet' is not allowed; choose one of digits, mnist, fmnist, cifar10, synthetic"),
    (["--model", "vgg"], "model='vgg' is not allowed"),
    (["--algorithm", "fedsgd"], "algorithm='fedsgd' is not allowed"),
    (["--shards-per-client", "11"], "11"),
    (["--dataset", "mnist", "--data-root", "/nonexistent/data"], "/nonexistent/data"),
])
def test_bad_values_exit_2_with_one_clear_error_before_any_work(tmp_path, capsys, args, needle):
    out_dir = tmp_path / "out"
    assert main(TINY + args + ["--results", str(out_dir)]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err
    assert captured.err.count("error:") == 1
    assert "round" not in captured.out
    assert not out_dir.exists()


@pytest.mark.parametrize("args,needle", [
    (["--rounds", "abc"], "argument --rounds: invalid int value: 'abc'"),
    (["--roundz", "3"], "unrecognized arguments: --roundz 3 (did you mean --rounds?)"),
])
def test_a_flag_error_is_one_line_with_a_guess_and_no_usage(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as stop:
        main(TINY + args + ["--results", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and needle in err and err.count("\n") == 1 and "usage" not in err
    assert err.rstrip().endswith("(all flags: python -m fl_core --help)")


def help_of(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "fl_core", *args], capture_output=True, text=True, cwd=REPO,
                          check=True).stdout


def test_help_is_a_summary_under_80_lines_with_each_method_on_request():
    summary = help_of("--help")
    assert len(summary.splitlines()) < 80
    for name in COMMON_KNOBS:  # one line per common knob, with its default where it has one
        assert "--" + name.replace("_", "-") in summary, name
    assert "--pers-rate" not in summary and "(default: 20)" in summary  # rounds
    assert "--help METHOD, METHOD one of fedselect, fedavg," in summary
    fedbabu = help_of("--help", "fedbabu")
    assert {"--ft-epochs", "--weak-epochs", "--slim-ratios"} <= set(re.findall(r"--[a-z-]+", fedbabu))
    assert "--pers-rate" not in fedbabu and len(fedbabu.splitlines()) < 20


def test_help_all_documents_every_knob_of_every_method_with_its_default():
    help_text = help_of("--help", "all")
    flat = " ".join(help_text.split())  # argparse wraps lines
    for name in COMMON_KNOBS:
        assert "--" + name.replace("_", "-") in help_text, name
    for algorithm in ALGORITHMS:
        for f in dataclasses.fields(params_class(algorithm)):
            assert "--" + f.name.replace("_", "-") in help_text, (algorithm, f.name)
    assert "fedselect knobs" in help_text and "fedavg_ft knobs (also used by fedbabu, " in help_text
    assert "(default: 0.25)" in flat and "(default: 20)" in flat  # pers_rate, rounds
    assert "--results" in help_text and "example:" in help_text


def test_a_knob_of_another_method_is_refused_naming_its_owner(tmp_path, capsys):
    assert main(TINY + ["--algorithm", "fedavg", "--pers-rate", "0.3", "--results", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "pers_rate is a knob of fedselect, not of fedavg" in err
    assert not (tmp_path / "x").exists()


def test_a_results_path_that_is_a_file_or_unwritable_is_one_error_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    assert main(TINY + ["--results", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: --results {blocker / 'run'}: {blocker} is a file, not a folder"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root may write anywhere: nothing to test then
        assert main(TINY + ["--results", str(locked / "run")]) == 2
        assert f"cannot write in {locked} (permission denied)" in capsys.readouterr().err


def test_a_full_disk_mid_run_is_one_error_and_keeps_the_rounds_written(tmp_path, capsys, monkeypatch):
    from fl_core import results

    real, calls = results.write_parquet, []

    def fills_up(frame, path):
        calls.append(path)
        if len(calls) == 4:  # clients.parquet, round 1, round 2: then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(frame, path)

    monkeypatch.setattr(results, "write_parquet", fills_up)
    assert main(TINY + ["--rounds", "4", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "No space left on device" in err and "Traceback" not in err
    kept = pd.read_parquet(tmp_path / "rounds.parquet")
    assert sorted(kept["round"].unique()) == [1, 2]  # the last complete write, intact
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("command, args, code, needle", [
    ("fl-run", ["--help"], 0, "usage: python -m fl_core"),
    ("fl-tables", ["--help"], 0, "usage: python -m analysis.tables"),
    ("fl-study", ["--help"], 0, "  fedselect_grid_paper     (fedselect_grid --preset paper) FedSelect grid"),
    ("fl-study", ["fedl2p", "--help"], 0, "usage: python -m sweeps.run fedl2p [--FLAG VALUE ...]"),
    ("fl-study", [], 2, "error: name the study first"),
    ("fl-study", ["studies/fedselect_grid.toml", "--dry-run"], 0, "anchor"),
    ("fl-study", ["fedselect_grid", "--dry-run"], 0, "anchor"),
])
def test_console_scripts_are_the_module_commands(command, args, code, needle, tmp_path):
    """`pip install -e .` puts the engine, the study runner and the tables on PATH (pyproject's
    [project.scripts]); each is the `python -m` command of the same name. Help and results go to
    stdout (`fl-study --help | less` shows them), errors to stderr."""
    script = Path(sys.executable).parent / command
    assert script.exists(), f"{script}: run scripts/setup.sh (pyproject.toml changed)"
    done = subprocess.run([str(script), *args, *(["--results", str(tmp_path)] if "--dry-run" in args else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr[-2000:]
    assert needle in (done.stdout if code == 0 else done.stderr)
    if "--dry-run" not in args:  # nothing on the other stream
        assert (done.stdout if code else done.stderr) == ""


def test_a_single_run_of_a_small_cnn_takes_one_thread_unless_told(tmp_path, capsys):
    import torch

    from fl_core.__main__ import single_run_threads
    from fl_core.config import RunConfig

    assert single_run_threads(RunConfig(dataset="digits")) == 1                   # auto = lenet: one thread
    assert single_run_threads(RunConfig(dataset="cifar10")) == 1                  # auto = cnn2
    assert single_run_threads(RunConfig(dataset="cifar10", model="resnet18_cifar")) is None   # torch's default
    assert single_run_threads(RunConfig(dataset="digits", threads=2)) == 2        # --threads wins
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        args = [a for a in TINY if a not in ("--threads", "1")]
        assert main(args + ["--results", str(tmp_path)]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_study_starts_by_its_name_its_presets_name_or_its_file(tmp_path, capsys):
    """`python -m sweeps.run STUDY`, the one way every study starts (sweeps/run.py): a name in
    studies/, with the flags of its own of a module sweeps/<stem>.py (a sibling file is that
    study's preset), or a file; an unknown name is one error listing the studies."""
    from sweeps.errors import SweepError
    from sweeps.run import resolve, run
    from sweeps.spec import STUDIES

    study, implied = resolve("fedl2p_fmnist")
    assert study.spec == STUDIES / "fedl2p.toml" and implied == ["--preset", "fmnist"] and study.customize
    study, implied = resolve("fedselect_grid_paper")
    assert study.spec == STUDIES / "fedselect_grid.toml" and implied == ["--preset", "paper"]
    study, implied = resolve("baselines_fmnist")  # no module of its own: the file, as it is
    assert study.spec == STUDIES / "baselines_fmnist.toml" and implied == [] and study.customize is None
    assert study.script == "-m sweeps.run baselines_fmnist"
    own = tmp_path / "mine.toml"
    own.write_text((STUDIES / "tuned_digits.toml").read_text())
    assert resolve(str(own))[0].spec == own
    with pytest.raises(SweepError, match=r"no study 'baselines_fmnst' \(did you mean baselines_fmnist\?\): give a "
                                         ".toml file or one of the studies in .*baselines_fmnist"):
        resolve("baselines_fmnst")
    assert run(["ablation", "--variants", "gradselect", "--dry-run", "--results", str(tmp_path)]) == 0
    assert "gradselect" in capsys.readouterr().out


# ---------------------------------------------------------------------------- the commands' help and names
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_study_command_help_lists_the_studies_on_stdout_and_exits_0(flag, capsys):
    from sweeps.run import run, study_names

    assert run([flag]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("usage: python -m sweeps.run STUDY")
    names = study_names()
    assert {"fedselect_grid", "fedl2p", "fedl2p_fmnist", "ablation"} <= set(names)
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()[0] in names]
    assert listed == names  # one line each, in order
    assert "  fedl2p_fmnist            (fedl2p --preset fmnist) FedL2P" in out


def test_the_study_command_without_a_study_is_usage_and_one_error_on_stderr(capsys):
    from sweeps.run import run

    for argv in ([], ["--dry-run"]):
        assert run(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 2 and err.startswith("usage: python -m sweeps.run STUDY")
        assert "error: name the study first" in err


def test_help_before_a_study_is_that_studys_help_on_stdout(capsys):
    from sweeps.run import run

    with pytest.raises(SystemExit) as stop:
        run(["--help", "ablation"])
    out, err = capsys.readouterr()
    assert stop.value.code == 0 and err == "" and out.startswith("usage: python -m sweeps.run ablation ")
    assert "--variants" in out


def test_a_misspelt_study_is_one_line_with_a_guess(capsys):
    from sweeps.run import run

    assert run(["fedselect_gird"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: no study 'fedselect_gird' (did you mean fedselect_grid?): give a .toml file")
    assert run(["zzz_nothing"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "fedselect_grid, fedselect_grid_fmnist" in err  # the list, no guess


def summaries() -> dict[str, str]:
    """The one-line summaries `--help` prints: two studies (one with flags of its own), the
    engine, and every method's `--help METHOD` of the engine."""
    from fl_core.__main__ import build_parser
    from sweeps.run import study_named
    from sweeps.study import build_parser as study_parser

    engine = build_parser()
    shown = {"fl-run": engine.help_text(""),
             **{f"fl-study {name}": study_parser(study_named(name)).help_text("") for name in ("fedselect_grid",
                                                                                             "fedl2p")}}
    return shown | {f"fl-run --help {m}": engine.help_text(m) for m in engine.method_knobs}


def test_every_summary_line_fits_and_is_never_cut_inside_brackets():
    for command, text in summaries().items():
        assert "==SUPPRESS==" not in text and "--inject-crash-at-round" not in text, command
        for line in (line for line in text.splitlines() if line.startswith("  -")):
            assert len(line) <= 118, (command, line)
            assert "(default default" not in line and "(default: )" not in line, (command, line)
            assert re.search(r"e\.g(?!\.)|i\.e(?!\.)", line) is None, (command, line)  # "(e.g" cut
            for part in line.split(" (default: "):
                assert part.count("(") == part.count(")") or part.endswith(")"), (command, line)
                if "…" in part:  # cut after a word, at no open bracket
                    before = part[:part.index("…")]
                    assert before.count("(") == before.count(")") and before.count("[") <= before.count("]"), line


def test_summary_lines_read_right():
    shown = summaries()
    grid, fedl2p, engine = shown["fl-study fedselect_grid"], shown["fl-study fedl2p"], shown["fl-run"]
    line = {text: {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  --")} for text in shown.values()}
    assert line[grid]["--preset"].endswith("the study file to use: default, fmnist or paper "
                                           "(default: default, the file itself)")
    assert line[fedl2p]["--preset"].endswith("default, fmnist or table1 (default: default, the file itself)")
    assert line[grid]["--address"].endswith("join a running Ray cluster: auto, or HEAD:PORT "
                                            "(default: none, start a local one)")
    assert line[grid]["--seeds"].endswith("(default: 0 1 2)")  # the study file's values, no parser default
    assert line[grid]["--corruptions"].endswith("(default: empty)")
    assert line[grid]["--momentum"].endswith("(default: 0.0)")  # a zero is a default too
    assert line[fedl2p]["--pretraining-rounds"].endswith("rounds of the pretraining (default: the study file's, 15)")
    assert line[engine]["--rounds"].endswith("communication rounds (default: 20)")
    assert line[engine]["--weight-decay"].endswith("local SGD weight decay (default: 0.0)")
    assert line[engine]["--algorithm"].endswith("federated algorithm… (default: fedselect)")
    assert "(default" not in line[engine]["--no-reproducible"]  # a switch


def test_a_flag_summary_is_the_first_sentence_cut_at_a_word_outside_brackets():
    import argparse

    from fl_core.knobs import shorten, summary_help

    action = argparse.Action(["--x"], "x", default=None,
                             help="join a cluster (e.g. auto, or HEAD:6379). More (default: none, start one)")
    assert summary_help(action) == ("join a cluster (e.g. auto, or HEAD:6379)", "none, start one")
    assert shorten("join a cluster (e.g. auto, or HEAD:6379)", 30) == "join a cluster…"
    assert shorten("a b (see c d e f g h)", 12) == "a b…"
    assert shorten("(see c d e f g h) x", 10) == "(see c d…)"  # every word in brackets: closed after the cut
    assert shorten("short", 5) == "short"
    for room in range(2, 40):
        assert len(shorten("join a cluster (e.g. auto, or HEAD:6379) now", room)) <= room
    plain = argparse.Action(["--y"], "y", default=["a", "b"], help="values; one of a, b, c")
    assert summary_help(plain) == ("values", "a b")


def sweeps_modules() -> list[str]:
    return sorted(p.name for p in (REPO / "sweeps").glob("*.py"))


@pytest.mark.parametrize("module", [m for m in sweeps_modules()
                                    if re.search(r"^STUDY = ", (REPO / "sweeps" / m).read_text(), re.M)])
def test_a_study_module_run_as_a_script_runs_its_study(module, tmp_path):
    done = subprocess.run([sys.executable, f"sweeps/{module}", "--seeds", "0", "--dry-run", "--results",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"study {module.removesuffix('.py')} (") and "trials in all" in done.stdout


def test_portable_names_have_no_character_an_os_refuses():
    from fl_core.knobs import portable_name

    assert portable_name("my_methods.fedavgm:FedAvgM") == "my_methods.fedavgm.FedAvgM"
    assert portable_name("fedselect") == "fedselect"
    assert portable_name('a b/c\\d<e>|f?g*h"') == "a_b_c_d_e__f_g_h_"
    assert portable_name(".hidden.") == "hidden"


def test_an_external_methods_run_folder_has_a_portable_name(tmp_path, monkeypatch, capsys):
    package = tmp_path / "my_ext"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plain.py").write_text("from fl_core.algorithms.fedavg import FedAvg\n\n\n"
                                      "class Plain(FedAvg):\n    name = 'plain'\n    display = 'Plain'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        assert main(TINY + ["--algorithm", "my_ext.plain:Plain"]) == 0
    finally:
        for name in [m for m in sys.modules if m == "my_ext" or m.startswith("my_ext.")]:
            del sys.modules[name]
    runs = list((tmp_path / "results" / "runs").iterdir())
    assert len(runs) == 1 and re.fullmatch(r"my_ext\.plain\.Plain-[0-9a-f]+", runs[0].name), runs
    rounds = pd.read_parquet(runs[0] / "rounds.parquet")
    assert rounds.algorithm.unique().tolist() == ["my_ext.plain:Plain"]  # the rows keep the method's own name
    assert runs[0].name.endswith(rounds.config_hash.iloc[0])
    assert f"wrote results/runs/{runs[0].name}/rounds.parquet" in capsys.readouterr().out
