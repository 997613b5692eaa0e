"""The FedL2P study on Fashion-MNIST (`python -m sweeps.run fedl2p_fmnist`, studies/fedl2p_fmnist.toml)
plans what its file says, FedL2P's meta-gradient is FOMAML+ by default (IFT is the ablation), the
ablations keep the file's meta rates, and a FedL2P run reports the initial λ's policy beside the
learned one. Planning reads no data."""
from __future__ import annotations

import pytest

from fl_core.checkpoints import save_model
from fl_core.config import RunConfig
from fl_core.simulation import Simulation
from sweeps import fedl2p
from sweeps.spec import STUDIES
from sweeps.study import build_parser, plan_sweep

RATES = (0.03, 0.03, 0.003)


def plan_of(argv, tmp_path):
    return plan_sweep(fedl2p.STUDY, build_parser(fedl2p.STUDY).parse_args([*argv, "--results", str(tmp_path)]))[0]


def test_the_fmnist_preset_plans_two_settings_five_seeds_and_forty_meta_rounds(tmp_path):
    plan = plan_of(["--preset", "fmnist"], tmp_path)
    assert fedl2p.STUDY.presets["fmnist"] == STUDIES / "fedl2p_fmnist.toml"
    assert plan.folder.name.startswith("fedl2p_fmnist-")
    pretrain, tune = ([c for _, c in stage.configs] for stage in plan.stages)
    assert len(pretrain) == 2 * 5 and len(tune) == 2 * 5 * 5
    assert {c.algorithm for c in pretrain} == {"fedavg"} and {c.rounds for c in pretrain} == {50}
    assert {c.dataset for c in tune} == {"fmnist_c"} and {c.dir_alpha for c in tune} == {0.1}
    assert {c.corruptions for c in tune} == {"clean", ""}  # "" = the four default corruptions
    assert sorted({c.seed for c in tune}) == [0, 1, 2, 3, 4]
    meta = [c for c in tune if c.algorithm in ("fedl2p", "l2p")]
    assert len(meta) == 20 and {c.rounds for c in meta} == {40}
    assert {(c.meta_grad, c.meta_lr_bn, c.meta_lr_lr, c.meta_lr_post) for c in meta} == {("fomaml", *RATES)}


def test_the_ablations_change_one_thing_and_keep_the_files_meta_rates(tmp_path):
    plan = plan_of(["--preset", "fmnist", "--ablations", "--seeds", "0"], tmp_path)
    ours = [c for _, c in plan.stages[-1].configs if c.algorithm == "fedl2p" and c.corruptions == ""]
    labels = sorted(c.label() for c in ours)
    assert labels == ["FedL2P", "FedL2P (BNNet)", "FedL2P (IFT)", "FedL2P (LRNet, β = 0)", "FedL2P (LRNet, β = 1)"]
    assert {(c.meta_lr_bn, c.meta_lr_lr, c.meta_lr_post) for c in ours} == {RATES}
    default = plan_of(["--ablations", "--seeds", "0"], tmp_path)  # the MNIST study: the paper's rates
    assert {c.meta_lr_bn for _, c in default.stages[-1].configs if c.algorithm == "fedl2p"} == {1e-3}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    data = dict(dataset="synthetic", num_clients=4, partition="dirichlet_class", dir_alpha=0.5, model="lenet_bn",
                val_fraction=0.25, batch_size=16, threads=1, seed=0, checkpoint_dir=str(folder))
    config = RunConfig(algorithm="fedavg", rounds=2, lr=0.05, **data)
    sim = Simulation(config)
    list(sim.run())
    save_model(config, sim.model_name, sim.final_model())
    return data | dict(pretrained=config.config_hash(), rounds=2, lr=0.02, ft_epochs=1, meta_steps=1)


@pytest.mark.parametrize("algorithm", ["fedl2p", "l2p"])
def test_the_initial_policy_is_reported_beside_the_learned_one(pretrained, algorithm):
    frozen = list(Simulation(RunConfig(algorithm=algorithm, meta_lr_bn=0.0, meta_lr_lr=0.0, meta_lr_post=0.0,
                                       **pretrained)).run())[-1]
    moved = list(Simulation(RunConfig(algorithm=algorithm, meta_lr_bn=0.05, meta_lr_lr=0.05, meta_lr_post=0.005,
                                      **pretrained)).run())[-1]
    for client in frozen.clients:  # nothing learned: the evaluated policy is the initial one (up to the
        learned = {n: v for n, v in client.metrics.items() if n.startswith(("beta:", "eta:"))}  # server's mean)
        assert learned and {n.replace(":", "_init:", 1): v for n, v in learned.items()} == pytest.approx(
            {n: v for n, v in client.metrics.items() if "_init:" in n}, rel=1e-6)
    assert RunConfig(algorithm=algorithm, **pretrained).meta_grad == "fomaml"
    initial = [{n: v for n, v in c.metrics.items() if "_init:" in n} for c in frozen.clients]
    assert initial == [{n: v for n, v in c.metrics.items() if "_init:" in n} for c in moved.clients]
    assert len({tuple(i.values()) for i in initial}) > 1  # the initial λ already reads each client's statistics
