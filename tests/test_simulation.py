"""The round loop: save/restore, per-method evaluation, communication, and learning on digits."""
import pytest
import torch

from fl_core.config import ConfigError
from fl_core.simulation import Simulation

from conftest import metrics, restore_mid_run, tiny


@pytest.mark.parametrize("overrides", [
    {"algorithm": "fedselect", "momentum": 0.5},
    {"algorithm": "fedselect", "fedselect_mode": "faithful", "mask_every": 2},
    {"algorithm": "fedavg_ft"},
    {"algorithm": "fedselect", "participation": 0.5, "eval_every": 2, "val_fraction": 0.2, "lr_schedule": "exp",
     "lr_decay": 0.9},
])
def test_restore_mid_run_continues_bit_identically(tmp_path, overrides):
    restore_mid_run(tiny(rounds=5, **overrides), tmp_path)


def test_restore_refuses_a_state_from_another_config(tmp_path):
    sim = Simulation(tiny(rounds=2))
    sim.run_round()
    sim.save(tmp_path / "state.pt")
    other = Simulation(tiny(rounds=2, pers_rate=0.5))
    with pytest.raises(ConfigError, match="belongs to config"):
        other.restore(tmp_path / "state.pt")


def test_runs_are_deterministic_by_seed():
    a = metrics(Simulation(tiny(rounds=2)).run())
    b = metrics(Simulation(tiny(rounds=2)).run())
    c = metrics(Simulation(tiny(rounds=2, seed=1)).run())
    assert a == b
    assert a != c


def test_each_method_reports_its_own_personalized_accuracy_and_communication():
    fedavg = list(Simulation(tiny(algorithm="fedavg")).run())[-1]
    local = list(Simulation(tiny(algorithm="local")).run())[-1]
    ft = list(Simulation(tiny(algorithm="fedavg_ft", ft_epochs=2)).run())[-1]
    fedsel = list(Simulation(tiny()).run())[-1]
    n_params = fedavg.clients[0].bytes_up // 4
    assert n_params > 1000
    for c in fedavg.clients:
        assert c.acc == c.acc_global and c.personal_fraction == 0.0
    for c in local.clients:
        assert c.acc == c.acc_local == c.acc_global and c.bytes_up == c.bytes_down == 0
        assert c.personal_fraction == 1.0  # nothing leaves a Local client
    for c in fedsel.clients:
        assert c.acc == c.acc_local and 0 < c.bytes_up < 4 * n_params and 0 < c.personal_fraction < 0.6
    # FedAvg+FT trains exactly as FedAvg; only its evaluated model (fine-tuned) differs.
    assert [c.acc_global for c in ft.clients] == [c.acc_global for c in fedavg.clients]
    assert [c.acc for c in ft.clients] != [c.acc_global for c in ft.clients]
    for r in (fedavg, local, ft, fedsel):
        for c in r.clients:
            assert 0 <= c.acc <= 1 and c.n_train > 0 and c.n_test > 0 and c.seconds > 0


def test_samples_weighting_changes_the_average_only_when_sizes_differ():
    uniform = list(Simulation(tiny(algorithm="fedavg", partition="dirichlet_class", dir_alpha=0.3, rounds=1)).run())
    weighted = list(Simulation(tiny(algorithm="fedavg", partition="dirichlet_class", dir_alpha=0.3, rounds=1,
                                    weighting="samples")).run())
    sizes = {c.n_train for c in uniform[0].clients}
    assert len(sizes) > 1
    assert metrics(uniform) != metrics(weighted)


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        Simulation(tiny(device="cuda"))


@pytest.mark.slow
def test_fedselect_and_local_beat_fedavg_on_digits_with_two_shards():
    """The paper's qualitative claim on the offline dataset: pathological non-IID hurts FedAvg."""
    from fl_core.config import RunConfig
    final = {}
    for algorithm in ("fedselect", "local", "fedavg"):
        knobs = {"pers_rate": 0.25, "pers_limit": 0.8} if algorithm == "fedselect" else {}
        config = RunConfig(algorithm=algorithm, dataset="digits", partition="shards", shards_per_client=2,
                           num_clients=10, rounds=20, seed=0, threads=1, **knobs)
        final[algorithm] = list(Simulation(config).run())[-1].mean("acc")
    assert final["fedselect"] > final["fedavg"] + 0.25, final
    assert final["local"] > final["fedavg"] + 0.25, final
    assert final["fedselect"] > 0.9 and final["local"] > 0.9, final


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,bound", [("fedavg", 0.5), ("fedavg_ft", 0.75)])
def test_fedavg_and_fedavg_ft_learn_on_digits(algorithm, bound):
    """FedAvg's one global model must serve all ten classes (chance 0.1); FedAvg+FT then adapts
    it to each client's two classes (chance within them about 0.5). Measured (2026-11, AVX-512 CPU;
    the reproducible mode, the CPU's own kernels, ATen unvectorised with oneDNN at SSE4.1): FedAvg
    0.681, 0.683, 0.671, FedAvg+FT 0.987, 0.980, 0.981."""
    from fl_core.config import RunConfig
    config = RunConfig(algorithm=algorithm, dataset="digits", partition="shards", shards_per_client=2,
                       num_clients=10, rounds=8, local_epochs=5, seed=0, threads=1)
    final = list(Simulation(config).run())[-1].mean("acc")
    assert final > bound, final
