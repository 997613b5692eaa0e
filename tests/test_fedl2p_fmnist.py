"""The FedL2P study on Fashion-MNIST (`python -m sweeps.run fedl2p_fmnist`, the file studies/fedl2p_fmnist.toml)
plans what its file says: every method tuned alike (FT's rate, FedL2P's rate and meta rates) on
both settings, both FT (BN C) modes and both meta-gradients; the ablations add one change each; a
FedL2P run reports the initial λ's policy beside the learned one. Planning reads no data."""
from __future__ import annotations

import pytest

from fl_core.checkpoints import save_model
from fl_core.config import RunConfig
from fl_core.simulation import Simulation
from sweeps import fedl2p
from sweeps.spec import STUDIES
from sweeps.study import build_parser, plan_sweep

SETTINGS = 2
METHODS = ["FT (BN C)", "FT (BN C, authors')", "FT (BN G)", "FT (BN I)", "FedL2P", "FedL2P (IFT)"]


def plan_of(argv, tmp_path):
    return plan_sweep(fedl2p.STUDY, build_parser(fedl2p.STUDY).parse_args([*argv, "--results", str(tmp_path)]))[0]


def test_the_fmnist_preset_tunes_every_method_alike_on_two_settings_with_six_unseen_clients(tmp_path):
    plan = plan_of(["--preset", "fmnist"], tmp_path)
    assert fedl2p.STUDY.presets["fmnist"] == STUDIES / "fedl2p_fmnist.toml"
    assert plan.folder.name.startswith("fedl2p_fmnist-")
    pretrain, *selects = plan.stages
    pre = [c for _, c in pretrain.configs]    # one pretraining per setting and seed, the search seed's too
    assert len(pre) == SETTINGS * 6 and {c.algorithm for c in pre} == {"fedavg"} and {c.rounds for c in pre} == {50}
    assert sorted({c.seed for c in pre}) == [0, 1, 2, 3, 4, 1000]
    assert [s.kind for s in selects] == ["select"] * SETTINGS * len(METHODS)
    assert [s.group.split(" / ")[1] for s in selects] == METHODS * SETTINGS     # both FT (BN C) modes, both meta-grads
    base = [c for s in selects for _, c in s.configs]
    assert {c.seed for c in base} == {1000} and {(c.num_clients, c.unseen_clients) for c in base} == {(16, 6)}
    assert {c.corruptions for c in base} == {"clean", ""}  # "" = the four default corruptions
    meta = [s for s in selects if s.configs[0][1].algorithm == "fedl2p"]
    assert {c.rounds for s in meta for _, c in s.configs} == {40}
    assert all(set(s.domains) == {"lr", "meta_lr_bn", "meta_lr_lr", "meta_lr_post"} for s in meta)
    assert all(set(s.domains) == {"lr"} and s.domains["lr"].low == 1e-5 for s in selects if s not in meta)
    assert plan.spec.num_samples == 4


def test_the_ablations_change_one_thing_each(tmp_path):
    plan = plan_of(["--preset", "fmnist", "--ablations", "--seeds", "0", "1", "2", "3", "4"], tmp_path)
    labels = [s.group.split(" / ")[1] for s in plan.stages if s.kind == "select" and "(clean)" not in s.group]
    assert labels == [*METHODS, "FedL2P (BNNet)", "FedL2P (LRNet, β = 1)", "FedL2P (LRNet, β = 0)"]  # IFT: in the file
    default = plan_of(["--ablations", "--seeds", "0"], tmp_path)  # the MNIST study, untuned: the paper's rates
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
