"""scripts/reproduce.py NAME --from-data without --check: after a change to how analysis prints a
table, the committed tables are rewritten from the Parquet kept beside them (no sweep runs, no
figure is redrawn), provenance.md names the commit that wrote them, and the default's README block
follows its methods table."""
from __future__ import annotations

from scripts import reproduce
from table_helpers import docs_sandbox, write_sweep


def test_from_data_rewrites_the_tables_that_read_otherwise(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    write_sweep(results / "fedselect-grid")
    docs, readme = docs_sandbox(tmp_path, monkeypatch)
    assert reproduce.main(["default", "--tables-only", "--results", str(results), "--ran-at", "abc1234"]) == 0
    folder = docs / "default"
    methods = (folder / "methods.md").read_text()
    (folder / "methods.md").write_text("| Method | an older layout |\n")
    (folder / "accuracy_vs_round.png").write_bytes(b"an older figure")
    capsys.readouterr()

    assert reproduce.main(["default", "--from-data"]) == 0
    out = capsys.readouterr().out
    assert (folder / "methods.md").read_text() == methods and "rewrote" in out and "1 tables of 'default'" in out
    assert (folder / "accuracy_vs_round.png").read_bytes() == b"an older figure"   # figures stay as they are
    assert methods.strip() in readme.read_text()
    provenance = (folder / "provenance.md").read_text()
    assert "from the Parquet under `data/`; figures at commit" in provenance and "Sweeps run: abc1234." in provenance
    assert "Tables and figures written" not in provenance
    assert reproduce.main(["default", "--from-data"]) == 0          # nothing reads otherwise now
    assert "0 tables of 'default'" in capsys.readouterr().out
    assert (folder / "provenance.md").read_text() == provenance                # and provenance.md stays


def test_from_data_needs_the_data_and_no_other_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "DOCS_RESULTS", tmp_path)
    (tmp_path / "default").mkdir()
    assert reproduce.main(["default", "--from-data"]) == 2
    assert "docs/results/default keeps no data/ to recompute its tables from" in capsys.readouterr().err
    assert reproduce.main(["default", "--from-data", "--tables-only"]) == 2
    assert "--from-data reads the Parquet committed" in capsys.readouterr().err
