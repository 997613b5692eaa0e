"""benchmarks/method_overhead.py: the trace of a round holds every forward pass (with and without
gradients, which parameters were trained), its replay runs them, and a repeated evaluation of the
same model on the same inputs is counted."""
import math

import torch

from benchmarks.method_overhead import Trace, replay, targets
from fl_core.models import build_model
from fl_core.simulation import Simulation

from conftest import tiny


def test_a_fedavg_round_traces_its_training_batches_and_two_scorings_per_client():
    sim = Simulation(tiny(algorithm="fedavg", batch_size=16, rounds=2))
    trace = Trace(sim.trainer.model, scorer=sim.trainer.scoring_model())
    sim.run_round()
    trace.close()
    batches = sum(sim.config.local_epochs * math.ceil(d.n_train / 16) for d in sim.data.clients)
    trained = [e for e in trace.events if e[1]]
    scored = [e for e in trace.events if not e[1]]
    assert len(trained) == batches
    assert all(len(e[2]) == len(list(sim.trainer.model.parameters())) for e in trained)  # everything trains
    assert len(scored) == 2 * len(sim.clients)   # after local training and after the broadcast
    assert sorted(e[0][0] for e in scored) == sorted(2 * [d.n_test for d in sim.data.clients])
    seconds = replay(build_model(sim.model_name, sim.data.input_shape, sim.data.num_classes), trace.events,
                     {sim.data.input_shape: torch.randn(64, *sim.data.input_shape)})
    assert seconds > 0


def test_scoring_the_same_model_twice_is_counted_as_a_repeat():
    sim = Simulation(tiny(algorithm="fedavg", rounds=1))
    d, state = sim.data.clients[0], sim.clients[0].state
    trace = Trace(sim.trainer.model, fingerprint=True, scorer=sim.trainer.scoring_model())
    sim.trainer.evaluate(state, d.x_test, d.y_test)
    assert trace.repeats() == 0
    sim.trainer.evaluate(dict(state), d.x_test, d.y_test)  # the same values again
    assert trace.repeats() == 1
    other = {n: t + 1 if t.is_floating_point() else t for n, t in state.items()}
    sim.trainer.evaluate(other, d.x_test, d.y_test)       # another model: not a repeat
    trace.close()
    assert trace.repeats() == 1


def test_targets_name_every_method_over_the_limit_and_judge_dispfl_against_dpsgd():
    rows = [dict(model="cnn2", method="fedavg", ratio=1.02, round_s=3.0),
            dict(model="cnn2", method="dpsgd", ratio=1.00, round_s=3.0),
            dict(model="cnn2", method="dispfl", ratio=1.19, round_s=3.9),
            dict(model="lenet", method="fedavg", ratio=1.10, round_s=0.4)]
    lines = targets(rows)
    assert lines[0] == "cnn2: every method's round <= 1.15x its limit: NOT met for dispfl 1.19"
    assert lines[1] == "cnn2: DisPFL round / D-PSGD round = 1.30 (target <= 1.2): NOT met"
    assert lines[2] == "lenet: every method's round <= 1.15x its limit: met (1 methods; highest fedavg 1.10)"
