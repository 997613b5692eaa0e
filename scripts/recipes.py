"""The recipes of scripts/reproduce.py: for each results folder of the docs (docs/results/NAME), the
sweep commands that made it and how to tabulate them. A recipe is the exact command a researcher
runs (`python -m sweeps.run STUDY ARGS --name SWEEP`); reproduce.py adds --results and --data-root."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """Sweeps to run (the study `python -m sweeps.run` starts, its arguments; `--name` is added) and
    how to tabulate them."""

    about: str
    sweeps: tuple[tuple[str, str, tuple[str, ...]], ...]   # (sweep name, study, arguments)
    table: str = "auto"                                      # analysis.tables --table
    needs_data: bool = False
    figures: bool = True
    reports: tuple[tuple[str, str, str | None], ...] = ()     # (analysis module, report .md, plot .png)
    claims_per_sweep: bool = False   # each sweep its own data (FedL2P's pretrainings), not seeds of one table


def _fmnist(study: str, name: str, *args: str) -> tuple[str, str, tuple[str, ...]]:
    return (name, f"{study}_fmnist", args)


RECIPES: dict[str, Recipe] = {
    "default": Recipe("the default FedSelect grid on digits (bash scripts/main.sh)",
                      (("fedselect-grid", "fedselect_grid", ()),)),
    "fedselect-grid-fmnist": Recipe("the FedSelect grid on Fashion-MNIST",
                                    (_fmnist("fedselect_grid", "fedselect-grid-fmnist"),), needs_data=True),
    "baselines-fmnist": Recipe("FedSelect's Table 1 on Fashion-MNIST",
                               (_fmnist("baselines", "baselines-fmnist"),), needs_data=True),
    "ablation-fmnist": Recipe("FedSelect's Table 3 on Fashion-MNIST",
                              (_fmnist("ablation", "ablation-fmnist"),), needs_data=True),
    "dispfl-fmnist": Recipe("DisPFL against D-PSGD, FedAvg and Local on Fashion-MNIST",
                            (_fmnist("dispfl", "dispfl-fmnist"),), needs_data=True),
    "feature-shift-fmnist": Recipe("feature shift on fmnist_c", (_fmnist("feature_shift", "feature-shift-fmnist"),),
                                   needs_data=True),
    "feature-shift-fmnist-domain80": Recipe(
        "feature shift, a client per domain, 80 rounds",
        (_fmnist("feature_shift", "feature-shift-fmnist-domain80", "--partition", "domain", "--algorithms",
                 "fedselect", "fedavg", "local", "fedavg_ft", "fedbn", "--rounds", "80", "--eval-every", "8"),),
        needs_data=True),
    "feature-shift-fmnist-lg80": Recipe(
        "feature shift, LG-FedAvg at Dir(0.5) per domain, 80 rounds",
        (_fmnist("feature_shift", "feature-shift-fmnist-lg80", "--partition", "domain_dirichlet", "--algorithms",
                 "lg_fedavg", "--rounds", "80", "--eval-every", "8"),), needs_data=True),
    "perfedmask-fmnist": Recipe(
        "PerFedMask and its baselines as the authors run them, c = 0.1 (10 of 100 devices a round)",
        (_fmnist("perfedmask", "perfedmask-fmnist"),), needs_data=True),
    "perfedmask-fmnist-c1": Recipe(
        "PerFedMask and its baselines as the authors run them, c = 1 (every device every round)",
        (("perfedmask-fmnist-c1", "perfedmask_fmnist_c1", ()),), needs_data=True),
    "fedl2p-fmnist": Recipe("FedL2P's two stages on fmnist_c", (_fmnist("fedl2p", "fedl2p-fmnist"),),
                            needs_data=True, reports=(("analysis.fedl2p_learning", "learning.md", "val_loss.png"),)),
    "fedl2p-table1": Recipe(
        "FedL2P's Table 1 in kind: three pretrainings, Dir(1000) and Dir(0.1), tuned alike",
        tuple(("t1-" + p, "fedl2p_table1", ("--pretraining", p))
              for p in ("fedavg", "fedbabu", "perfedavg_hf")),
        table="fedl2p", needs_data=True, figures=False, claims_per_sweep=True),
    "baselines-pfl": Recipe(
        "the ten further personalized baselines on Fashion-MNIST Dir(0.3)",
        (("pfl-fmnist", "baselines_pfl", ("--seeds", "0")),
         ("pfl-fmnist-s12", "baselines_pfl", ("--seeds", "1", "2")),
         ("pfl-scaffold", "baselines_pfl", ("--algorithms", "scaffold"))),
        table="methods", needs_data=True, figures=False),
    "tuned-digits": Recipe("five methods tuned alike on validation data, then confirmed on 5 seeds (the fair protocol)",
                           (("tuned-digits", "tuned_digits", ()),), table="methods"),
    "claims": Recipe("the papers' claims, checked on every Fashion-MNIST sweep above that is in --results "
                     "(python -m analysis.claims)", (), figures=False),
}
CLAIMS_FROM = ("fedselect-grid-fmnist", "baselines-fmnist", "ablation-fmnist", "dispfl-fmnist",
               "feature-shift-fmnist", "feature-shift-fmnist-domain80", "perfedmask-fmnist", "perfedmask-fmnist-c1",
               "fedl2p-fmnist", "fedl2p-table1")
