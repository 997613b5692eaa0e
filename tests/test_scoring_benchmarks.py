"""The scoring benchmarks' bad input, one clear error before any work: benchmarks/pfllib.py without
PFLlib (its checkout is never downloaded in tests; the measurement runs where one is at hand) and
benchmarks/scoring.py."""
import pytest

from benchmarks.pfllib import main


@pytest.mark.parametrize("argv, error", [
    (["--rounds", "5"], "--rounds 5: give an even number, at least 4"),
    (["--rounds", "2"], "--rounds 2: give an even number, at least 4"),
    ([], "is not a PFLlib checkout (no system/flcore/clients/clientavg.py)"),
])
def test_bad_input_is_one_error_before_any_work(argv, error, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--ref", str(tmp_path), "--data-root", str(tmp_path), *argv])
    assert stop.value.code != 0
    captured = capsys.readouterr()
    assert error in captured.err + str(stop.value.code)


def test_the_scoring_benchmark_refuses_no_repeats(tmp_path, capsys):
    """benchmarks/scoring.py (ours against the plain batched-inference loop): bad input first."""
    from benchmarks.scoring import main as scoring

    with pytest.raises(SystemExit):
        scoring(["--data-root", str(tmp_path), "--repeats", "0"])
    assert "--repeats 0: give at least 1" in capsys.readouterr().err


def test_the_plain_loop_counts_what_the_engine_counts():
    """benchmarks/scoring.py's floor scores the same models on the same images as ours: the counts
    agree, also after a batch boundary, and no prediction flips (the benchmark prints the count)."""
    import copy

    from benchmarks.scoring import flipped, plain_loop
    from conftest import tiny
    from fl_core.simulation import Simulation

    sim = Simulation(tiny(algorithm="fedavg", rounds=1))
    sim.run_round()
    state, clients = sim.algorithm.global_state, sim.data.clients
    ours = sum(sim.trainer.evaluate(state, d.x_test, d.y_test) for d in clients)
    model = copy.deepcopy(sim.trainer.model)
    assert plain_loop(model, state, clients) == ours == plain_loop(model, state, clients, batch=3)
    assert 0 < ours <= sum(d.n_test for d in clients)
    assert flipped(sim.trainer, model, state, clients) == 0


def test_a_report_file_holds_the_printed_table_and_where_it_ran(tmp_path):
    """The docs include these files: the table as printed, then a caption naming the machine."""
    from benchmarks.fixtures import machine_caption, write_report

    caption = f"One turn; {machine_caption()}."
    write_report(tmp_path / "deep" / "report.md", ["| a |", "|---|", "| 1.00 |"], caption)
    text = (tmp_path / "deep" / "report.md").read_text()
    assert text.startswith("| a |\n|---|\n| 1.00 |\n\nOne turn; CPU: ") and "kernels: aten=" in text
    assert "torch thread(s)." in text
    write_report(None, ["| a |"], caption)  # printing only: nothing written
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["report.md"]
