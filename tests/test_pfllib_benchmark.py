"""benchmarks/pfllib.py without PFLlib (its checkout is never downloaded in tests): bad input is
one clear error before any work; the measurement itself runs where a checkout is at hand."""
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
