"""analysis.claims: each verdict follows from the table statistics (summary.parquet rows) exactly as
the module docstring says; a claim whose study is absent is "not run"."""
from pathlib import Path

import pandas as pd

from analysis.claims import CLAIMS, FAILS, HOLDS, NOT_RUN, UNSURE, Claim, check_claims, judge

COLUMN = "fmnist, Dir(0.3)"


def summary(cells: dict[str, tuple[float, bool]], marks: dict[str, str], reference: str = "B",
            table: str = "methods") -> pd.DataFrame:
    """Rows as analysis.stats writes them: per cell (mean, bold), one row against `reference`."""
    rows = []
    for row, (mean, bold) in cells.items():
        rows.append(dict(table=table, row=row, column=COLUMN, mean=mean, std=0.01, n=5, reference=reference,
                         p_value=0.01, p_adjusted=0.02 if marks.get(row) else 0.4, test="paired t-test", pairs=5,
                         marked=marks.get(row, ""), bold=bold))
    return pd.DataFrame(rows)


def test_better_is_the_significance_mark_against_the_reference():
    claim = Claim("P", "A beats B", "1 vs 0", ("s",), "methods", "better", "A", "B")
    for mark, verdict in (("better", HOLDS), ("worse", FAILS), ("", UNSURE)):
        got = judge(claim, summary({"A": (0.9, True), "B": (0.8, False)}, {"A": mark}), COLUMN)
        assert got["verdict"] == verdict
    got = judge(claim, summary({"A": (0.9, True), "B": (0.8, False)}, {"A": "better"}), COLUMN)
    assert got["ours"] == "90.0 ± 1.0 (n=5) vs 80.0" and "p = 0.02" in got["test"]
    assert judge(claim, summary({"A": (0.9, True)}, {}), COLUMN)["verdict"] == NOT_RUN  # no B in the table


def test_best_needs_the_only_bold_cell():
    claim = Claim("P", "A is best", "", ("s",), "methods", "best", "A")
    assert judge(claim, summary({"A": (0.9, True), "C": (0.8, False)}, {}), COLUMN)["verdict"] == HOLDS
    tie = judge(claim, summary({"A": (0.9, True), "C": (0.89, True)}, {}), COLUMN)
    assert tie["verdict"] == UNSURE and "also bold: C" in tie["test"]
    assert judge(claim, summary({"A": (0.8, False), "C": (0.9, True)}, {}), COLUMN)["verdict"] == FAILS
    comparable = Claim("P", "A is best, T comparable", "", ("s",), "methods", "best", "A", tied=("T",))
    got = judge(comparable, summary({"A": (0.9, True), "T": (0.9, True), "C": (0.8, False)}, {}), COLUMN)
    assert got["verdict"] == HOLDS and "comparable: T" in got["test"]
    assert judge(comparable, summary({"A": (0.9, True), "T": (0.9, True), "C": (0.89, True)}, {}),
                 COLUMN)["verdict"] == UNSURE
    alone = judge(comparable, summary({"A": (0.9, True), "T": (0.8, False)}, {}), COLUMN)   # no other baseline ran
    assert alone["verdict"] == NOT_RUN and alone["test"] == "nothing else to beat in the table (only T)"
    ref = Claim("P", "ref is best", "", ("s",), "ablation", "ref_best", reference="G")
    cells = summary({"G": (0.9, True), "L": (0.7, False)}, {}, reference="G", table="ablation")
    assert judge(ref, cells, COLUMN)["verdict"] == HOLDS


def test_claims_without_their_study_are_not_run(tmp_path):
    (tmp_path / "some-sweep" / "rounds").mkdir(parents=True)  # a sweep of no claimed study
    table = check_claims([tmp_path])
    assert len(table) == len(CLAIMS) and set(table["verdict"]) == {NOT_RUN}
    assert {"FedSelect", "DisPFL", "PerFedMask", "FedL2P"} == set(table["paper"])


def test_a_claim_about_fine_tuned_models_is_judged_in_the_after_ft_columns_only(tmp_path):
    sweep = tmp_path / "pfm"
    (sweep / "rounds").mkdir(parents=True)
    (sweep / "tables").mkdir()
    (sweep / "study.toml").write_text((Path(__file__).resolve().parents[1] / "studies" / "perfedmask_fmnist.toml").read_text())
    cells = {"PerFedMask": (0.9, True), "FedAvg+FT": (0.8, False)}
    parts = [summary(cells, {"PerFedMask": "better"}, reference="FedAvg+FT", table="cost").assign(column=c)
             for c in ("fmnist / c = 1 / Before FT", "fmnist / c = 1 / After FT")]
    pd.concat(parts).to_parquet(sweep / "tables" / "summary.parquet")
    table = check_claims([tmp_path])
    rows = table[table["claim"] == "PerFedMask beats FedAvg+FT after fine-tuning"]
    assert list(rows["setting"]) == ["fmnist / c = 1 / After FT"] and list(rows["verdict"]) == [HOLDS]


def test_a_transposed_table_is_judged_per_row(tmp_path):
    """FedL2P's table has the methods as columns and (setting / clients / e) as rows."""
    sweep = tmp_path / "f"
    (sweep / "rounds").mkdir(parents=True)
    (sweep / "tables").mkdir()
    (sweep / "study.toml").write_text((Path(__file__).resolve().parents[1] / "studies" / "fedl2p_fmnist.toml").read_text())
    cells = summary({"FedL2P": (0.9, True), "FT (BN C)": (0.8, False)}, {"FedL2P": "better"}, reference="FT (BN C)",
                    table="fedl2p")
    flipped = cells.rename(columns={"row": "column", "column": "row"}).assign(row="S / seen / 5")
    flipped.to_parquet(sweep / "tables" / "summary.parquet")
    rows = check_claims([tmp_path])
    rows = rows[rows["paper"] == "FedL2P"]
    assert list(rows["setting"]) == ["S / seen / 5"] and list(rows["verdict"]) == [HOLDS]
