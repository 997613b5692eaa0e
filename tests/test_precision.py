"""The `precision` knob: bf16 runs a round's forward passes under bfloat16 autocast while the
parameters, their updates and the averaging stay float32; fp32 (the default) changes nothing."""
import pytest
import torch
from conftest import tiny

from fl_core.config import ConfigError, RunConfig
from fl_core.simulation import Simulation


def _output_dtypes(model: torch.nn.Module, seen: list) -> list:
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    return [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype)) for m in layers]


@pytest.mark.filterwarnings("ignore:precision=bf16 runs emulated")
@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_a_rounds_training_and_scoring_run_in_the_chosen_format_on_float32_weights(precision, dtype):
    sim = Simulation(tiny(algorithm="fedavg", dataset="digits", model="lenet", rounds=2, precision=precision))
    trained, scored = [], []
    _output_dtypes(sim.trainer.model, trained)
    sim.run_round()          # makes the scoring copy at its first scoring
    _output_dtypes(sim.trainer.scoring_model(), scored)
    trained.clear()
    result = sim.run_round()
    assert trained and set(trained) == {dtype}     # every conv and linear output of local training
    assert scored and set(scored) == {dtype}       # and of scoring
    assert {t.dtype for c in sim.clients for t in c.state.values() if t.is_floating_point()} == {torch.float32}
    assert 0.0 < result.mean("acc") <= 1.0


def test_precision_enters_the_hash_only_when_set_and_is_checked_before_work():
    assert RunConfig(algorithm="fedavg", precision="fp32").config_hash() == "0a25d3dd1866"  # the hash before the knob
    assert RunConfig(algorithm="fedavg", precision="bf16").config_hash() != "0a25d3dd1866"
    with pytest.raises(ConfigError, match="precision='fp16' is not allowed; choose one of fp32, bf16"):
        RunConfig(algorithm="fedavg", precision="fp16")


@pytest.mark.filterwarnings("ignore:precision=bf16 runs emulated")
def test_bf16_learns_as_fp32_does():
    """Same seed, same batches: bf16's accuracies follow fp32's round by round. (With autocast's
    weight cache on, every batch of a round saw the weights of the round's first: 0.15 at the end.)"""
    sims = {p: Simulation(tiny(algorithm="fedavg", dataset="digits", model="lenet", rounds=5, lr=0.05, local_epochs=3,
                               partition="iid", precision=p)) for p in ("fp32", "bf16")}
    acc = {p: [r.mean("acc") for r in sim.run()] for p, sim in sims.items()}
    assert acc["fp32"][-1] > 0.75, acc
    assert max(abs(a - b) for a, b in zip(acc["fp32"], acc["bf16"])) < 0.05, acc


@pytest.mark.parametrize("flags, why", [({"avx2", "fma"}, "has no bfloat16 arithmetic"),
                                        ({"avx2", "fma", "avx512f", "avx512_bf16"}, "holds oneDNN to AVX2")])
def test_bf16_on_a_cpu_that_would_emulate_it_warns_before_the_run(monkeypatch, flags, why):
    """The tests run in the reproducible mode, so a CPU with AVX-512 BF16 is held to AVX2 here too."""
    from fl_core import kernels
    monkeypatch.setattr(kernels, "cpu_flags", lambda: flags)
    with pytest.warns(UserWarning, match=f"precision=bf16 runs emulated here, several times slower than fp32: .*{why}"):
        Simulation(tiny(algorithm="fedavg", rounds=1, precision="bf16"))
    assert kernels.slow_bf16("cuda") is None
