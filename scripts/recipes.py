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
        "PerFedMask and the seven methods of its table on Fashion-MNIST",
        (_fmnist("perfedmask", "perfedmask-fmnist", "--algorithms", "perfedmask", "fedbabu", "fedprox", "fednova",
                 "heterofl", "splitmix", "fedavg_ft"),), needs_data=True),
    "perfedmask-fmnist-c01": Recipe(
        "PerFedMask's study at c = 0.1 to 200 rounds",
        (_fmnist("perfedmask", "perfedmask-fmnist-c01", "--participation", "0.1", "--rounds", "200",
                 "--eval-every", "40"),), needs_data=True),
    "perfedmask-fmnist-c1-100": Recipe(
        "FedBABU and PerFedMask at c = 1 to 100 rounds",
        (_fmnist("perfedmask", "perfedmask-fmnist-c1-100", "--participation", "1.0", "--algorithms", "fedbabu",
                 "perfedmask", "--rounds", "100", "--eval-every", "20"),), needs_data=True),
    "fedl2p-fmnist": Recipe("FedL2P's two stages on fmnist_c", (_fmnist("fedl2p", "fedl2p-fmnist"),),
                            needs_data=True, reports=(("analysis.fedl2p_learning", "learning.md", "val_loss.png"),)),
    "fedl2p-table1": Recipe(
        "FedL2P's Table 1 in kind: three pretrainings x Dir alpha",
        tuple(_fmnist("fedl2p", f"t1-{p}", "--corruptions", "clean", "--dir-alpha", "1000", "1.0", "0.5", "0.1",
                      "--algorithms", "ft", "fedl2p", "--bn-mode", "C", "--seeds", "0", "1", "2", "--pretraining", p)
              for p in ("fedavg", "fedbabu", "perfedavg_hf")),
        table="fedl2p", needs_data=True, figures=False),
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
               "feature-shift-fmnist", "feature-shift-fmnist-domain80", "perfedmask-fmnist", "perfedmask-fmnist-c01",
               "perfedmask-fmnist-c1-100", "fedl2p-fmnist")
