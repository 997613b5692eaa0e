"""The contract every registered method meets, checked for each name in
`fl_core.algorithms.ALGORITHMS`: a new method is covered the moment it is registered.

- **Resume.** Interrupted after 2 of 4 rounds and resumed from its saved state, a run continues
  exactly as the uninterrupted one: the same numbers every round, the same client states, masks
  and extras (value by value), and the same server state (`Algorithm.state_dict`). Half the clients take part
  each round, so a method whose server state is not saved (a momentum, a control variate, a
  hypernetwork, a mask schedule) diverges after the resume.
- **Partial participation.** With `participation=0.5`, two of the four clients take part in each
  round (a method that samples clients itself, D-PSGD and DisPFL with `active`, refuses
  `participation` and runs with `active=0.5`); the rows mark exactly the clients the method sampled;
  a client that sits out a round has no training loss (NaN), no traffic, and keeps its model and
  mask.
- **An unseen client.** With `unseen_clients=1` the run completes; the held-out client is in pool
  "unseen" in every round, never takes part, sends nothing, keeps its stored state, and has a
  finite accuracy after the last round (NaN before).
- **No metric clashes.** The per-client metrics a method reports are named apart from the
  standard result columns, every knob and the rows' other columns (a clash would overwrite a
  column in the results, or hide the metric from the round summaries).
- **Reused scores are fresh ones.** The loop scores each distinct model once: it reuses the scores
  after local training where the communication step says it left a client's model as it was, and
  the scores of the state just scored where the personalized model is that very state. Scoring
  every model afresh (`Simulation.reuse_scores = False`) gives every number again, in both runs
  above (so the newcomer's path too).
- **A bad knob is named.** A value outside a knob's declared range or choices is a ConfigError
  naming the knob, the value and what is allowed.

The runs are the smallest that exercise each method (synthetic data, 4 clients, batch 16, one
thread); FT, L2P and FedL2P start from a FedAvg pretraining's checkpoint. Known bugs are strict
xfails naming the bug: fixing one turns its xfail into a failure that asks to drop the mark.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from fl_core import simulation
from fl_core.client_state import ClientExtras
from fl_core.algorithms import ALGORITHMS, get_algorithm, params_class
from fl_core.algorithms.fedavg import FedAvg
from fl_core.checkpoints import save_model
from fl_core.config import ConfigError, RunConfig
from fl_core.knobs import base_type, describe_range, knob_fields
from fl_core.results import CONFIG_EXTRA_COLUMNS, ROW_CONTEXT_COLUMNS, STANDARD_CLIENT_COLUMNS, known_config_columns
from fl_core.simulation import Simulation

from conftest import metrics, restore_mid_run, same, tiny

PERSONALIZING = ("ft", "l2p", "fedl2p")  # they start from a pretraining's checkpoint
OVERRIDES = {  # the smallest settings that exercise each method (its own tests use the same)
    "pfedhn": dict(pfedhn_hidden=6, pfedhn_layers=1, pfedhn_embed_dim=2, pfedhn_inner_steps=3),
    "fedl2p": dict(meta_steps=1, ft_epochs=1),
    "l2p": dict(meta_steps=1, ft_epochs=1),
    "ft": dict(ft_epochs=1),
}
SCENARIOS = {"half": dict(rounds=3, participation=0.5), "unseen": dict(rounds=2, unseen_clients=1)}


# ---------------------------------------------------------------------------- shared runs
@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """`pretrain(unseen_clients)`: a FedAvg run on a BatchNorm LeNet, saved as the checkpoint the
    personalizing methods start from (one per hold-out: it is a data knob, which must match)."""
    folder = tmp_path_factory.mktemp("checkpoints")

    @functools.cache
    def pretrain(unseen_clients: int = 0) -> tuple[RunConfig, str]:
        config = RunConfig(algorithm="fedavg", dataset="synthetic", num_clients=4, partition="shards",
                           shards_per_client=3, model="lenet_bn", rounds=1, batch_size=16, lr=0.05, threads=1,
                           val_fraction=0.25, unseen_clients=unseen_clients, checkpoint_dir=str(folder))
        sim = Simulation(config)
        list(sim.run())
        save_model(config, sim.model_name, sim.final_model())
        return config, str(folder)

    return pretrain


def config_of(algorithm: str, pretrain, **knobs) -> RunConfig:
    """The method's smallest run with `knobs` (from its pretraining where it personalizes one); a
    method that samples clients with a knob of its own (D-PSGD, DisPFL: `active`) gets that knob
    in place of `participation`."""
    sampled_by = get_algorithm(algorithm).sampled_by
    if "participation" in knobs and sampled_by != "participation":
        knobs[sampled_by] = knobs.pop("participation")
    knobs = dict(algorithm=algorithm, val_fraction=0.25) | knobs | OVERRIDES.get(algorithm, {})
    if algorithm in PERSONALIZING:
        config, folder = pretrain(knobs.get("unseen_clients", 0))
        knobs |= dict(model="lenet_bn", pretrained=config.config_hash(), checkpoint_dir=folder)
    return tiny(**knobs)


def stored(client) -> dict[str, torch.Tensor]:
    """A copy of what a client keeps between rounds: its model state and its mask."""
    mask = {} if client.mask is None else {f"mask:{n}": m.clone() for n, m in client.mask.items()}
    return {n: t.clone() for n, t in client.state.items()} | mask


def unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return before.keys() == after.keys() and all(torch.equal(t, after[n]) for n, t in before.items())


def run_recording(config: RunConfig):
    """Run round by round: (the simulation, its results, per round the clients whose model or mask moved)."""
    sim = Simulation(config)
    results, moved = [], []
    for _ in range(config.rounds):
        before = [stored(c) for c in sim.clients]
        results.append(sim.run_round())
        moved.append({k for k, c in enumerate(sim.clients) if not unchanged(before[k], stored(c))})
    return sim, results, moved


@pytest.fixture(scope="module")
def runs(pretraining):
    """`runs(algorithm, scenario)`: `run_recording` of a SCENARIOS run, made once for every test."""
    return functools.cache(lambda algorithm, scenario: run_recording(config_of(algorithm, pretraining,
                                                                               **SCENARIOS[scenario])))


# ---------------------------------------------------------------------------- resume
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_method_resumes_bit_identically_server_state_included(algorithm, pretraining, tmp_path):
    config = config_of(algorithm, pretraining, rounds=4, participation=0.5, momentum=0.5)
    straight, resumed, _ = restore_mid_run(config, tmp_path)
    assert same(straight.algorithm.state_dict(), resumed.algorithm.state_dict())
    extras = get_algorithm(algorithm).Extras
    assert all(type(c.extra) is extras for c in straight.clients + resumed.clients)  # typed, also after a restore


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_methods_client_state_is_declared_fields_unset_at_first(algorithm):
    """What a client keeps besides its model and mask is its method's `Extras` dataclass
    (fl_core/client_state.py): slotted (an undeclared name is an error), every field None until set."""
    extras = get_algorithm(algorithm).Extras
    assert issubclass(extras, ClientExtras) and "__dict__" not in dir(extras())
    assert all(f.default is None for f in dataclasses.fields(extras)), extras


# ---------------------------------------------------------------------------- partial participation
SAMPLED = [a for a in ALGORITHMS if get_algorithm(a).sampled_by == "participation"]
OWN_SAMPLING = [a for a in ALGORITHMS if a not in SAMPLED]


@pytest.mark.parametrize("algorithm", SAMPLED)
def test_half_participation_takes_two_of_four_clients_each_round(algorithm, runs):
    _, results, _ = runs(algorithm, "half")
    assert [sum(c.participated for c in r.clients) for r in results] == [2] * len(results)


@pytest.mark.parametrize("algorithm", OWN_SAMPLING)
def test_a_method_that_samples_clients_itself_refuses_participation(algorithm):
    """D-PSGD and DisPFL have no server to sample clients: `participation` below 1 would change the
    config hash and nothing else (it did), so it is one error naming their own knob."""
    sampled_by = get_algorithm(algorithm).sampled_by
    with pytest.raises(ConfigError, match=rf"participation=0.5: {algorithm} has no server .* `{sampled_by}`"):
        RunConfig(algorithm=algorithm, participation=0.5)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rows_mark_the_sampled_clients_and_the_others_sit_the_round_out(algorithm, runs):
    sim, results, moved = runs(algorithm, "half")
    for result, changed in zip(results, moved):
        sampled = set(sim.algorithm.participants(result.round))
        assert {c.client for c in result.clients if c.participated} == sampled, result.round
        for c in result.clients:
            if c.client not in sampled:
                assert math.isnan(c.loss) and (c.bytes_up, c.bytes_down) == (0, 0), (result.round, c)
        assert changed <= sampled, (result.round, changed)  # the others keep their model and mask


# ---------------------------------------------------------------------------- an unseen client
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_unseen_client_never_trains_and_is_scored_after_the_last_round(algorithm, runs):
    sim, results, moved = runs(algorithm, "unseen")
    (k,) = sim.data.unseen
    assert all(c.pool == ("unseen" if c.client == k else "seen") for r in results for c in r.clients)
    mine = [r.clients[k] for r in results]
    assert not any(row.participated or row.bytes_up for row in mine)
    assert not any(k in changed for changed in moved)  # nothing was trained into its stored state
    assert all(math.isnan(row.acc) for row in mine[:-1]) and math.isfinite(mine[-1].acc), [row.acc for row in mine]


# ---------------------------------------------------------------------------- reused scores
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reused_scores_equal_fresh_ones(algorithm, scenario, runs, pretraining, monkeypatch):
    _, reused, _ = runs(algorithm, scenario)
    monkeypatch.setattr(Simulation, "reuse_scores", False)
    _, fresh, _ = run_recording(config_of(algorithm, pretraining, **SCENARIOS[scenario]))
    assert metrics(reused) == metrics(fresh)


class SilentFedAvg(FedAvg):
    """FedAvg claiming that its broadcast leaves the clients' models as they were (it does not)."""

    broadcasts_model = False


def test_a_method_that_misstates_what_its_broadcast_changes_fails_the_reuse_check(monkeypatch):
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: SilentFedAvg)
    config = tiny(algorithm="fedavg", **SCENARIOS["half"])
    reused = run_recording(config)[1]
    monkeypatch.setattr(Simulation, "reuse_scores", False)
    fresh = run_recording(config)[1]
    assert metrics(reused) != metrics(fresh)
    assert [c.acc_global for c in reused[-1].clients] == [c.acc_local for c in reused[-1].clients]


# ---------------------------------------------------------------------------- metric names
RESERVED = STANDARD_CLIENT_COLUMNS | known_config_columns() | CONFIG_EXTRA_COLUMNS | ROW_CONTEXT_COLUMNS


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reported_metrics_clash_with_no_column_or_knob(algorithm, runs):
    names = {name for scenario in SCENARIOS for r in runs(algorithm, scenario)[1] for c in r.clients
             for name in c.metrics}
    assert not names & RESERVED, sorted(names & RESERVED)


# ---------------------------------------------------------------------------- bad knob values
def out_of_bounds(params: type) -> list[tuple[str, object, str]]:
    """(knob, a value its declaration rules out, what the error must say is allowed) for each knob
    of `params` with a range or choices: a value outside the choices; past each closed bound by
    one, or the bound itself where it is open."""
    cases = []
    for f in knob_fields(params):
        meta, (kind, _) = f.metadata, base_type(params, f)
        if meta["choices"]:
            bad = "no-such-choice" if kind is str else kind(max(meta["choices"]) + 1)
            cases.append((f.name, bad, ", ".join(map(str, meta["choices"]))))
        for bound, step, is_open in ((meta["low"], -1, meta["low_open"]), (meta["high"], 1, meta["high_open"])):
            if bound is not None:
                cases.append((f.name, kind(bound if is_open else bound + step), describe_range(meta)))
    return cases


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_knob_outside_its_declaration_is_refused_naming_it_the_value_and_what_is_allowed(algorithm):
    cases = out_of_bounds(params_class(algorithm))
    if not cases:
        pytest.skip(f"{algorithm} declares no knob with a range or choices")
    for name, bad, allowed in cases:
        with pytest.raises(ConfigError) as refused:
            RunConfig(algorithm=algorithm, **{name: bad})
        message = str(refused.value)
        assert f"{name}={bad!r}" in message and allowed in message, message


# ---------------------------------------------------------------------------- what the resume test catches
class ServerMomentum(FedAvg):
    """FedAvg with server momentum (FedAvgM, β = 0.9): v ← βv + (x − average), x ← x − v."""

    def setup(self, init, clients):
        self.velocity = {}
        return super().setup(init, clients)

    def aggregate(self, clients, data, rnd):
        before = {n: self.global_state[n].clone() for n in self.shared_names()}
        traffic = super().aggregate(clients, data, rnd)  # global_state := the participants' average
        for n, x in before.items():
            step = x - self.global_state[n]
            self.velocity[n] = step if n not in self.velocity else 0.9 * self.velocity[n] + step
            self.global_state[n] = x - self.velocity[n]
        for client in clients:
            self.receive(client)  # the momentum step's model, not the plain average
        return traffic


class SavesItsMomentum(ServerMomentum):
    def state_dict(self):
        return super().state_dict() | {"velocity": self.velocity}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.velocity = d["velocity"]


def test_a_method_that_does_not_save_its_server_state_fails_the_resume_check(monkeypatch, tmp_path):
    config = tiny(algorithm="fedavg", rounds=4, participation=0.5)
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: ServerMomentum)
    with pytest.raises(AssertionError):
        restore_mid_run(config, tmp_path / "forgets")
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: SavesItsMomentum)
    straight, resumed, _ = restore_mid_run(config, tmp_path / "saves")
    assert same(straight.algorithm.state_dict(), resumed.algorithm.state_dict())


# ---------------------------------------------------------------------------- declarations
def test_what_a_method_is_is_declared_and_a_wrong_declaration_fails_at_once():
    """`acc_from` is one of `Scored` (a plain string is read as it) and `server` a bool, for every
    registered method; a misspelt `acc_from` fails when the class is defined, naming what is allowed."""
    from fl_core.algorithms.base import Scored

    for name in ALGORITHMS:
        cls = get_algorithm(name)
        assert isinstance(cls.acc_from, Scored) and isinstance(cls.server, bool), name
    assert [a for a in ALGORITHMS if not get_algorithm(a).has_server()] == ["local", "dispfl", "dpsgd", "ft", "l2p"]
    with pytest.raises(TypeError, match=r"Typo.acc_from = 'globl': choose one of local, global, custom"):
        type("Typo", (FedAvg,), {"acc_from": "globl"})
    assert type("Plain", (FedAvg,), {"acc_from": "custom"}).acc_from is Scored.CUSTOM
