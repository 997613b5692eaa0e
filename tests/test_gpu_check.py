"""benchmarks/gpu_check.py on the CPU with the smallest sizes: every section's rows come out (the
sweep's as skipped), two runs of the same configuration are identical, a spent time budget leaves
the rows out and says which, and bad flags are refused before any work; on a GPU machine the same
command writes docs/results/performance/gpu.md (docs/performance.md)."""
import pytest

from benchmarks.gpu_check import main, sweep_detail

SMALL = ["--device", "cpu", "--packs", "1", "2", "--models", "lenet", "--rounds", "1", "--clients", "2",
         "--samples", "10", "--skip-sweep"]


def section_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the table after the bold title that starts with `title` (header and rule left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"**{title}"))
    table = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[2:]


def test_the_cpu_path_writes_every_section_with_rows(tmp_path, capsys):
    out = tmp_path / "perf" / "gpu.md"
    assert main([*SMALL, "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert "CPU only: " in text and "torch 2.14.1" in text and "command: `python -m benchmarks.gpu_check --device cpu" \
        in text
    sweep = section_rows(text, "1. The default sweep")
    assert [r[0] for r in sweep] == ["auto", "0"] and all(r[3] == "skipped: --skip-sweep" for r in sweep)
    packing = section_rows(text, "2. Trials packed")
    assert [r[:3] for r in packing] == [["lenet", "time-slice", "1"], ["lenet", "time-slice", "2"],
                                        ["lenet", "MPS", "1"], ["lenet", "MPS", "2"]]
    alone, two = packing[0], packing[1]
    assert alone[6] == "1.00" and float(two[6]) > 0 and float(two[4]) >= float(two[3]) > 0   # slowest >= mean
    assert all(r[3] == "MPS not available: --device cpu" for r in packing[2:])
    (one,) = section_rows(text, "3. One round")
    assert one[:3] == ["lenet", "lenet-8x8", "2"] and float(one[3]) > 0 and float(one[4]) > 0
    assert float(one[6]) < 1e-2                     # the two sides trained the same clients (float32 rounding)
    (det,) = section_rows(text, "4. Determinism")
    assert det[0] == "lenet" and det[4] == "identical" and len(det[3]) == 16
    assert len(det[2].split(", ")) == 2 and all(0 <= float(a) <= 1 for a in det[2].split(", "))
    assert "Skipped for the time budget" not in text


def test_a_spent_budget_leaves_every_row_out_and_names_them(capsys):
    assert main([*SMALL, "--budget-s", "0"]) == 0
    text = capsys.readouterr().out
    for title in ("2. Trials packed", "3. One round", "4. Determinism"):
        rows = section_rows(text, title)
        assert rows and all("skipped: the time budget was spent" in r or "MPS not available: --device cpu" in r
                            for r in rows), (title, rows)
    assert ("Skipped for the time budget (4 row(s)): determinism, lenet; one round, lenet; "
            "packing, lenet, time-slice, 1 trial(s); packing, lenet, time-slice, 2 trial(s).") in text


def test_the_sweep_row_quotes_the_sweeps_own_resource_lines():
    out = ("[sweep] kernels: aten=AVX2\n[sweep] each trial: 1 CPU, 0.25 GPU; cluster: 16 CPUs, 1 GPU\n"
           "[sweep] GPU sharing: mps (own daemon, pipes in /tmp/x)\n")
    assert sweep_detail(out) == ("each trial: 1 CPU, 0.25 GPU; cluster: 16 CPUs, 1 GPU; "
                                 "GPU sharing: mps (own daemon, pipes in /tmp/x)")
    assert sweep_detail("") == "(the sweep printed no resources line)"


@pytest.mark.parametrize("extra, error", [
    (["--packs", "2", "4"], "--packs 2 4: ascending, starting at 1"),
    (["--packs", "1", "4", "2"], "--packs 1 4 2: ascending, starting at 1"),
    (["--rounds", "0"], "--rounds 0: give at least 1"),
    (["--models", "vgg"], "invalid choice: 'vgg'"),
])
def test_bad_flags_are_refused_before_any_work(extra, error, capsys):
    with pytest.raises(SystemExit):
        main([*SMALL, *extra])
    assert error in capsys.readouterr().err
