"""benchmarks/gpu_packing.py on the CPU: the path a GPU run takes (spawned trial processes, the
engine on a device, data moved once), checked for its table and its errors; on a GPU machine the
same command measures the packing (docs/performance.md)."""
import pytest

from benchmarks.gpu_packing import main


def test_the_packing_benchmark_runs_packs_of_trials_through_the_engine(capsys):
    assert main(["--device", "cpu", "--packs", "1", "2", "--rounds", "1", "--clients", "2", "--samples", "10",
                 "--model", "lenet", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    one, two = (line.strip("| ").split(" | ") for line in lines[-2:])
    assert one[:3] == ["1", "1", "cpu"] and one[-1] == "1.00"          # alone: the slowdown's base
    assert two[:3] == ["2", "1/2", "cpu"] and float(two[-1]) > 0
    assert float(two[5]) > 0 and float(two[4]) >= float(two[3])         # throughput; slowest >= mean


@pytest.mark.parametrize("argv, error", [
    (["--device", "cpu", "--packs", "2", "4"], "--packs 2 4: ascending, starting at 1"),
    (["--device", "cpu", "--packs", "1", "4", "2"], "--packs 1 4 2: ascending, starting at 1"),
])
def test_bad_packs_are_refused_before_any_trial_starts(argv, error, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert error in capsys.readouterr().err
