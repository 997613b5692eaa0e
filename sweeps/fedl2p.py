"""FedL2P study, two stages: FedAvg (or FedBABU, or Per-FedAvg (HF)) pretrains one model per data
setting and seed, then FT (BN C), FT (BN G), FT (BN I), L2P and FedL2P personalize it (the paper's Tables 2-4), on MNIST
label skew and mnist_c feature shift, Dir(α) with α in {1000, 1, 0.5, 0.1}, seen and unseen
clients, 3 seeds. The study is studies/fedl2p.toml; this module gives it flags of its own
(`python -m sweeps.run` finds them here; `python sweeps/fedl2p.py` is the same command).

    python -m sweeps.run fedl2p --data-root ../shared/data               # the README's table, ~15 min
    python -m sweeps.run fedl2p --data-root ../shared/data --ablations   # + Table 5/8's ablations
    python -m sweeps.run fedl2p --dataset digits_c --corruptions clean   # offline, no MNIST files
    python -m sweeps.run fedl2p --data-root ../shared/data --pretraining fedbabu --ft-epochs 5 15
    python -m sweeps.run fedl2p_fmnist --data-root ../shared/data --pretraining perfedavg_hf

Outputs as every study, plus tables/fedl2p.tex (rows: data setting, seen/unseen clients, e;
columns: Global Acc, FT (BN C/G/I), L2P, FedL2P and the ablations run; mean ± std over seeds),
tables/fedl2p_policy.tex (the learned β, sparsity, η, hypergradient time and λ bytes) and
figures/fedl2p_policy.png, fedl2p_policy_distance.png (analysis/fedl2p*.py). The pretrained
models are <sweep>/checkpoints/<config hash>.pt; a resumed sweep never pretrains twice.
"""
from __future__ import annotations

import sys

if __name__ == "__main__":  # `python sweeps/fedl2p.py` is `python -m sweeps.run fedl2p`
    from sweeps.run import start
    sys.exit(start(["fedl2p", *sys.argv[1:]]))

import argparse
from dataclasses import replace

from sweeps.spec import STUDIES, Method, StudySpec
from sweeps.study import Study

# the paper's Table 1 pretrainings: FedAvg, FedBABU, Per-FedAvg (HF) (fl_core/algorithms/perfedavg.py: the
# [pretraining] table's lr is its β, its momentum acts on the meta-update; α and δ at their defaults)
PRETRAININGS = ("fedavg", "fedbabu", "perfedavg_hf")
# Table 5 (BNNet only; LRNet only with β fixed at 1 and at 0) and Table 8 in reverse: FedL2P's
# meta-gradient here is FOMAML+ (the one that lowers the validation loss at this scale:
# benchmarks/fedl2p_neumann.py), so the ablation is the paper's IFT hypergradient.
ABLATIONS = (Method("fedl2p", {"meta_nets": "bnnet"}), Method("fedl2p", {"meta_nets": "lrnet", "fixed_beta": 1.0}),
             Method("fedl2p", {"meta_nets": "lrnet", "fixed_beta": 0.0}), Method("fedl2p", {"meta_grad": "ift"}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("FedL2P study")
    group.add_argument("--ablations", action="store_true",
                       help="also run FedL2P's ablations: BNNet only, LRNet only with beta = 1 and beta = 0, the "
                            "paper's IFT hypergradient instead of FOMAML+ "
                            "(4 more methods per data setting and seed) (default: off)")
    group.add_argument("--pretraining", choices=PRETRAININGS, default=None,
                       help="the first stage's method, which pretrains the personalized model: FedAvg, FedBABU or "
                            "Per-FedAvg (HF) (default: the study file's, fedavg)")
    group.add_argument("--pretraining-rounds", type=int, default=None,
                       help="rounds of the pretraining (default: the study file's, 15)")


def customize(spec: StudySpec, args: argparse.Namespace) -> StudySpec:
    if args.pretraining_rounds is not None and args.pretraining_rounds < 1:
        raise SystemExit(f"error: --pretraining-rounds {args.pretraining_rounds} must be >= 1")
    # the ablations change one thing each: every other knob is the file's FedL2P entry's (its meta rates)
    base = next((m.knobs for m in spec.methods if m.algorithm == "fedl2p"), {})
    extra = [Method(a.algorithm, base | a.knobs) for a in ABLATIONS] if args.ablations else []
    methods = spec.methods + tuple(m for m in extra if m not in spec.methods)  # the file may run one already
    pre = spec.pretraining
    if args.pretraining is not None and args.pretraining != pre.algorithm:
        pre = Method(args.pretraining, {k: v for k, v in pre.knobs.items()})  # the common knobs carry over
    if args.pretraining_rounds is not None:
        pre = Method(pre.algorithm, pre.knobs | {"rounds": args.pretraining_rounds})
    return replace(spec, methods=methods, pretraining=pre)


STUDY = Study(STUDIES / "fedl2p.toml", "-m sweeps.run fedl2p", add_arguments, customize)
