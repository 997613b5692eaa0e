"""FedL2P, L2P and FT (BN C/G/I) on a pretrained model: the properties that define them, and the
checkpoint that links the two stages."""
from __future__ import annotations

import pytest
import torch

from fl_core.checkpoints import save_model
from fl_core.config import ConfigError, RunConfig
from fl_core.fedl2p.personalize import Policy, fine_tune, fine_tune_tracking, meta_step
from fl_core.functional import batch_order
from fl_core.simulation import Simulation
from fl_core.training import derive_seed

DATA = dict(dataset="synthetic", num_clients=4, partition="dirichlet_class", dir_alpha=0.5, model="lenet_bn",
            val_fraction=0.25, batch_size=16, threads=1, seed=0)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A FedAvg pretraining's checkpoint: (its config, the checkpoint folder)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    config = RunConfig(algorithm="fedavg", rounds=2, lr=0.05, checkpoint_dir=str(folder), **DATA)
    sim = Simulation(config)
    list(sim.run())
    save_model(config, sim.model_name, sim.final_model())
    return config, folder


def stage2(stage1, algorithm: str, **knobs) -> RunConfig:
    config, folder = stage1
    values = DATA | dict(algorithm=algorithm, pretrained=config.config_hash(), checkpoint_dir=str(folder), rounds=2,
                         lr=0.02, ft_epochs=2) | knobs
    return RunConfig(**values)


def fix_policy(sim: Simulation, beta: float) -> None:
    """Make FedL2P's meta-nets output β = `beta` and η = lr for every client (last layers: zero
    weights, constant biases) and freeze them (meta learning rates 0)."""
    nets = sim.algorithm.nets
    nets.load_state_dict(sim.algorithm.meta_state)
    with torch.no_grad():
        for net, bias in ((nets.bnnet, beta), (nets.lrnet, 1.0)):
            net.net[-1].weight.zero_()
            net.net[-1].bias.fill_(bias)
    sim.algorithm.meta_state = sim.algorithm.best_state = sim.algorithm.lambda_state()


def test_fedl2p_with_beta_one_and_base_rates_is_ft_bn_c_bit_for_bit(pretrained):
    frozen = dict(meta_lr_bn=0.0, meta_lr_lr=0.0, meta_lr_post=0.0)
    learner = Simulation(stage2(pretrained, "fedl2p", **frozen))
    fix_policy(learner, beta=1.0)
    ours = list(learner.run())[-1]
    ft = list(Simulation(stage2(pretrained, "ft", bn_mode="C")).run())[-1]
    assert [c.acc for c in ours.clients] == [c.acc for c in ft.clients]
    assert [c.acc_val for c in ours.clients] == [c.acc_val for c in ft.clients]
    assert all(c.metrics["beta_mean"] == 1.0 and c.metrics["eta_mean"] == pytest.approx(0.02, rel=1e-6)
               for c in ours.clients)
    # and β = 0 is FT (BN G): a different policy, equal to its own baseline
    learner = Simulation(stage2(pretrained, "fedl2p", **frozen))
    fix_policy(learner, beta=0.0)
    ft_g = list(Simulation(stage2(pretrained, "ft", bn_mode="G")).run())[-1]
    assert [c.acc for c in list(learner.run())[-1].clients] == [c.acc for c in ft_g.clients]


def test_ft_variants_differ_and_acc_global_is_the_pretrained_model(pretrained):
    finals = {m: list(Simulation(stage2(pretrained, "ft", bn_mode=m)).run())[-1] for m in "CGI"}
    globals_ = {m: [c.acc_global for c in r.clients] for m, r in finals.items()}
    assert globals_["C"] == globals_["G"] == globals_["I"]
    assert len({tuple(c.acc for c in r.clients) for r in finals.values()}) == 3
    assert all(c.bytes_up == c.bytes_down == 0 for r in finals.values() for c in r.clients)


def tiny_bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 3))


def test_authors_bn_c_normalises_each_batch_with_its_own_statistics_while_fine_tuning():
    model = tiny_bn_model()
    with torch.no_grad():  # pretrained running statistics far from any batch's
        model[1].running_mean.fill_(5.0), model[1].running_var.fill_(9.0)
    state = {n: t.clone() for n, t in model.state_dict().items()}
    x, y = torch.randn(8, 1, 6, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    tuned = fine_tune_tracking(model, state, x, y, 0.1, epochs=1, batch_size=8, seed=3)  # one batch, one step
    by_hand = tiny_bn_model()
    by_hand.load_state_dict(state)
    by_hand.train()  # batch statistics, as nn.BatchNorm2d in training mode
    loss = torch.nn.functional.cross_entropy(by_hand(x[batch_order(3, 8, x.device)]), y[batch_order(3, 8, x.device)])
    grads = torch.autograd.grad(loss, list(by_hand.parameters()))
    for (name, p), g in zip(by_hand.named_parameters(), grads):
        assert torch.allclose(tuned[name], p.detach() - 0.1 * g, rtol=0, atol=1e-6), name


def test_authors_bn_c_restarts_the_running_statistics_and_evaluates_with_their_estimates():
    model = tiny_bn_model()
    state = {n: t.clone() for n, t in model.state_dict().items()}
    state["1.running_mean"], state["1.running_var"] = torch.full((2,), 5.0), torch.full((2,), 9.0)
    x, y = torch.randn(12, 1, 6, 6), torch.randint(0, 3, (12,))
    tuned = fine_tune_tracking(model, state, x, y, 0.0, epochs=2, batch_size=4, seed=1)  # lr 0: stats only
    mean, var = torch.zeros(2), torch.ones(2)  # restarted at 0 and 1, then momentum 0.1 per batch
    for epoch in range(2):
        order = batch_order(1, 12, x.device)
        for start in range(0, 12, 4):
            h = model[0](x[order[start:start + 4]]).detach()
            mean = 0.9 * mean + 0.1 * h.mean(dim=(0, 2, 3))
            var = 0.9 * var + 0.1 * h.var(dim=(0, 2, 3), unbiased=True)
    assert torch.allclose(tuned["1.running_mean"], mean, atol=1e-6)
    assert torch.allclose(tuned["1.running_var"], var, atol=1e-6)
    assert int(tuned["1.num_batches_tracked"]) == 6
    evaluated = tiny_bn_model()
    evaluated.load_state_dict(tuned)
    evaluated.eval()  # what the run scores: the model in evaluation mode, normalising with those estimates
    h = model[0](x).detach()
    expected = (h - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + 1e-5)
    assert torch.allclose(evaluated[1](h), expected * tuned["1.weight"][None, :, None, None]
                          + tuned["1.bias"][None, :, None, None], atol=1e-5)


def test_authors_bn_c_is_its_own_row_and_scores_otherwise_than_ours(pretrained):
    ours, theirs = (list(Simulation(stage2(pretrained, "ft", bn_mode=m)).run())[-1] for m in ("C", "C_authors"))
    assert stage2(pretrained, "ft", bn_mode="C_authors").label() == "FT (BN C, authors')"
    assert [c.acc_global for c in ours.clients] == [c.acc_global for c in theirs.clients]
    assert [c.acc for c in ours.clients] != [c.acc for c in theirs.clients]


def test_a_tensor_at_rate_zero_is_bit_identical_after_fine_tuning(pretrained):
    sim = Simulation(stage2(pretrained, "ft"))
    state, data = sim.clients[0].state, sim.data.clients[0]
    frozen = ["conv1.weight", "fc3.bias"] if "conv1.weight" in state else list(sim.algorithm.param_names)[::3]
    lrs = {n: (0.0 if n in frozen else 0.05) for n in sim.algorithm.param_names}
    stats = sim.algorithm.client_inputs(0, sim.clients[0], data).bn_stats
    tuned = fine_tune(sim.trainer.model, state, data.x_train, data.y_train, Policy(0.5, lrs), stats, epochs=3,
                      batch_size=8, seed=1)
    for n in sim.algorithm.param_names:
        assert torch.equal(tuned[n], state[n]) == (n in frozen), n
    # the sparsity metric counts such tensors: an LRNet output clamped at 0 is exactly 0
    learner = Simulation(stage2(pretrained, "fedl2p"))
    nets = learner.algorithm.nets
    with torch.no_grad():
        nets.lrnet.net[-1].weight.zero_()
        nets.lrnet.net[-1].bias.copy_(torch.tensor([-1.0 if i % 2 else 1.0 for i in range(len(nets.tensor_names))]))
    learner.algorithm.meta_state = learner.algorithm.lambda_state()
    metrics_ = learner.algorithm.evaluation_metrics(0, learner.clients[0], learner.data.clients[0])
    assert metrics_["sparsity"] == pytest.approx(sum(i % 2 for i in range(len(nets.tensor_names)))
                                                 / len(nets.tensor_names))
    assert all(metrics_[f"eta:{n}"] == 0.0 for i, n in enumerate(nets.tensor_names) if i % 2)


def test_the_server_averages_the_meta_nets_by_training_samples_and_sends_only_them(pretrained):
    sim = Simulation(stage2(pretrained, "fedl2p", meta_steps=1, meta_lr_bn=0.05, meta_lr_lr=0.05))
    algo, start = sim.algorithm, dict(sim.algorithm.meta_state)
    sent = []
    for k in range(4):
        algo.local_update(k, sim.clients[k], sim.data.clients[k], 1)
        sent.append({n: t.clone() for n, t in sim.clients[k].extra.meta.items()})
    assert not all(torch.equal(sent[0][n], sent[1][n]) for n in start)  # clients learned different λ
    sizes = [d.n_train for d in sim.data.clients]
    assert len(set(sizes)) > 1
    traffic = algo.aggregate(sim.clients, sim.data.clients, 1)
    for n in start:
        by_hand = sum(s / sum(sizes) * lam[n] for s, lam in zip(sizes, sent))
        assert torch.allclose(algo.meta_state[n], by_hand, rtol=0, atol=1e-7), n
    numel = sum(t.numel() for t in start.values())
    assert traffic.up == traffic.down == [4 * numel] * 4
    # (here λ, with its 100-unit hidden layers, is larger than the tiny LeNet it tunes; with resnet18_cifar it is
    # 38,944 entries, 0.35 % of the model)


def test_the_papers_rule_keeps_the_lambda_of_the_round_with_the_lowest_mean_loss_and_patience_stops(pretrained):
    sim = Simulation(stage2(pretrained, "fedl2p", patience=2, keep="participants"))
    algo = sim.algorithm
    sizes = [d.n_train for d in sim.data.clients]
    history = []
    for rnd, losses in enumerate([[1.0, 1.0, 1.0, 1.0], [0.5, 0.7, 0.6, 0.4], [0.9, 0.9, 0.9, 0.9],
                                  [0.8, 0.8, 0.8, 0.8]], start=1):
        history.append(dict(algo.meta_state))
        for k, c in enumerate(sim.clients):
            c.extra.meta = {n: t + rnd for n, t in algo.meta_state.items()}
            c.extra.val_loss = torch.tensor(losses[k], dtype=torch.float64)
            c.extra.kept_loss = torch.tensor(9.0, dtype=torch.float64)  # ignored by this rule
        algo.aggregate(sim.clients, sim.data.clients, rnd)
    expected = sum(s * v for s, v in zip(sizes, [0.5, 0.7, 0.6, 0.4])) / sum(sizes)
    assert algo.best_loss == pytest.approx(expected)
    assert all(torch.equal(algo.best_state[n], history[1][n]) for n in history[1])  # the λ round 2 received
    assert algo.stale_rounds == 2 and algo.meta_stopped()
    stats = algo.local_update(0, sim.clients[0], sim.data.clients[0], 5)
    assert stats.metrics == {} and sim.clients[0].extra.meta is None


def test_paired_keep_compares_the_received_and_the_kept_lambda_on_the_same_clients(pretrained):
    sim = Simulation(stage2(pretrained, "fedl2p", patience=5))  # keep = "paired", the default
    algo = sim.algorithm
    history = []
    # (received λ's losses, kept λ's losses on the same batches) per round
    for rnd, (received, kept) in enumerate([([1.0] * 4, [1.0] * 4),                      # the first λ is kept
                                            ([0.9, 0.8, 0.9, 0.8], [1.0, 0.9, 1.0, 0.9]),  # lower on the same clients
                                            ([0.5, 0.5, 0.5, 0.5], [0.4, 0.4, 0.4, 0.4])],  # below every earlier mean,
                                           start=1):                                        # but not below the kept λ
        history.append(dict(algo.meta_state))
        for k, c in enumerate(sim.clients):
            c.extra.meta = {n: t + rnd for n, t in algo.meta_state.items()}
            c.extra.val_loss = torch.tensor(received[k], dtype=torch.float64)
            c.extra.kept_loss = torch.tensor(kept[k], dtype=torch.float64)
        algo.aggregate(sim.clients, sim.data.clients, rnd)
    assert all(torch.equal(algo.best_state[n], history[1][n]) for n in history[1])  # round 2's, not round 3's
    assert algo.stale_rounds == 1
    # the paper's rule would have kept round 3's λ: its participants' mean (0.5) is the lowest seen
    assert algo.improves(0.5, 0.4, 0.85) is False
    assert Simulation(stage2(pretrained, "fedl2p", keep="participants")).algorithm.improves(0.5, 0.4, 0.85) is True


def test_a_client_scores_the_kept_lambda_on_the_batches_of_its_first_meta_step(pretrained):
    sim = Simulation(stage2(pretrained, "fedl2p", meta_lr_bn=0.05, meta_lr_lr=0.05))
    algo, k = sim.algorithm, 1
    client, data = sim.clients[k], sim.data.clients[k]
    algo.local_update(k, client, data, 1)
    assert float(client.extra.kept_loss) == float(client.extra.val_loss)  # round 1: kept = received
    algo.aggregate(sim.clients, sim.data.clients, 1)
    algo.local_update(k, client, data, 2)
    algo.nets.load_state_dict(algo.best_state)
    again = algo.validation_loss(k, client, data, derive_seed(0, 2, k, 0, "meta"))
    assert float(client.extra.kept_loss) == again != float(client.extra.val_loss)
    # validation_loss is what meta_step reports for the same λ and seed
    algo.nets.load_state_dict(algo.best_state)
    out = meta_step(algo.trainer.model, algo.nets, client.state, algo.client_inputs(k, client, data), data.x_train,
                    data.y_train, data.x_val, data.y_val, algo.settings(), derive_seed(0, 2, k, 0, "meta"))
    assert out["val_loss"] == pytest.approx(again, rel=1e-6)


def test_the_learned_and_initial_lambda_are_scored_on_the_same_batches(pretrained):
    frozen = list(Simulation(stage2(pretrained, "fedl2p", meta_lr_bn=0.0, meta_lr_lr=0.0, meta_lr_post=0.0)).run())
    for c in frozen[-1].clients:  # λ never moved: the same loss to the last digit
        assert c.metrics["val_loss_learned"] == c.metrics["val_loss_init"]
    learned = list(Simulation(stage2(pretrained, "fedl2p", meta_lr_bn=0.05, meta_lr_lr=0.05)).run())
    assert any(c.metrics["val_loss_learned"] != c.metrics["val_loss_init"] for c in learned[-1].clients)
    assert [c.metrics["val_loss_init"] for c in learned[-1].clients] == \
        [c.metrics["val_loss_init"] for c in frozen[-1].clients]


def test_ift_and_fomaml_differ_and_the_meta_nets_move(pretrained):
    finals = {}
    for grad in ("ift", "fomaml"):
        sim = Simulation(stage2(pretrained, "fedl2p", meta_grad=grad, meta_lr_bn=0.05, meta_lr_lr=0.05))
        start = dict(sim.algorithm.meta_state)
        list(sim.run())
        finals[grad] = sim.algorithm.meta_state
        assert any(not torch.equal(start[n], finals[grad][n]) for n in start)
    assert any(not torch.allclose(finals["ift"][n], finals["fomaml"][n]) for n in finals["ift"])


def test_l2p_learns_alone_and_sends_nothing(pretrained):
    sim = Simulation(stage2(pretrained, "l2p", meta_lr_bn=0.05, meta_lr_lr=0.05))
    final = list(sim.run())[-1]
    assert all(c.bytes_up == c.bytes_down == 0 for c in final.clients)
    own = [c.extra.own for c in sim.clients]
    assert any(not torch.equal(own[0][n], own[1][n]) for n in own[0])
    assert all("beta_mean" in c.metrics for c in final.clients)


@pytest.mark.parametrize("keep, replaced", [("paired", True), ("participants", False)])
def test_an_l2p_client_compares_its_lambda_with_its_kept_one_by_the_keep_rule(pretrained, keep, replaced):
    sim = Simulation(stage2(pretrained, "l2p", keep=keep, meta_lr_bn=0.05, meta_lr_lr=0.05))
    algo, k = sim.algorithm, 0
    client, data = sim.clients[k], sim.data.clients[k]
    algo.local_update(k, client, data, 1)  # round 1: the initial λ is kept
    kept = client.extra.best
    client.extra.best_loss = torch.tensor(0.0, dtype=torch.float64)  # no loss is below the lowest seen
    algo.validation_loss = lambda *args: 99.0  # the kept λ, scored on this round's batches: far worse
    received = client.extra.own
    algo.local_update(k, client, data, 2)
    # paired: the λ it received beats the kept one on the same batches; participants: not below 0.0
    assert (client.extra.best is received) is replaced and (client.extra.best is kept) is not replaced


def test_unseen_clients_never_meta_train_and_are_scored_with_the_kept_lambda(pretrained, tmp_path):
    config, _ = pretrained
    folder = tmp_path / "ck"
    pre = config.replace(unseen_clients=1, checkpoint_dir=str(folder))
    sim = Simulation(pre)
    list(sim.run())
    save_model(pre, sim.model_name, sim.final_model())
    learner = Simulation(stage2((pre, folder), "fedl2p", unseen_clients=1))
    unseen = next(iter(learner.data.unseen))
    final = list(learner.run())[-1]
    row = next(c for c in final.clients if c.client == unseen)
    assert row.pool == "unseen" and row.acc == row.acc and "val_loss" not in row.metrics
    assert "beta_mean" in row.metrics


def test_stage_two_refuses_a_missing_or_mismatched_checkpoint(pretrained, tmp_path):
    config, folder = pretrained
    missing = stage2(pretrained, "ft", pretrained="0123456789ab")
    with pytest.raises(ConfigError,
                       match=r"pretrained=0123456789ab: no checkpoint .*0123456789ab\.pt; run the pretraining"):
        Simulation(missing)
    other_seed = stage2(pretrained, "ft", seed=1)  # the seed-0 pretraining is another data draw
    with pytest.raises(ConfigError, match=r"trained on other data \(seed=0 there, 1 here\)"):
        Simulation(other_seed)
    other_model = stage2(pretrained, "ft", model="cnn_bn")
    with pytest.raises(ConfigError, match="the checkpoint is a lenet_bn and this run trains a cnn_bn"):
        Simulation(other_model)
    renamed = tmp_path / f"{'f' * 12}.pt"
    renamed.write_bytes((folder / f"{config.config_hash()}.pt").read_bytes())
    with pytest.raises(ConfigError, match=f"holds the model of run {config.config_hash()}, not of {'f' * 12}"):
        Simulation(stage2(pretrained, "ft", pretrained="f" * 12, checkpoint_dir=str(tmp_path)))
    # checked before any data is read: a missing dataset does not mask the missing checkpoint
    with pytest.raises(ConfigError, match="no checkpoint"):
        Simulation(stage2(pretrained, "ft", dataset="mnist", data_root=str(tmp_path / "nowhere"),
                          pretrained="0123456789ab"))


def test_bad_personalization_setups_are_one_clear_error(pretrained, tmp_path):
    with pytest.raises(ConfigError, match="ft personalizes a pretrained model: give pretrained="):
        Simulation(RunConfig(algorithm="ft", **DATA))
    weights = tmp_path / "weights.pt"
    config, folder = pretrained
    torch.save(torch.load(folder / f"{config.config_hash()}.pt", weights_only=True)["state"], weights)
    with pytest.raises(ConfigError, match="validation split: give val_fraction > 0"):
        Simulation(RunConfig(algorithm="fedl2p", init_weights=str(weights), **(DATA | {"val_fraction": 0.0})))
    with pytest.raises(ConfigError, match="model=lenet has no BatchNorm layer"):
        Simulation(RunConfig(algorithm="ft", init_weights=str(weights), **(DATA | {"model": "lenet"})))
    with pytest.raises(ConfigError, match="not a config hash"):
        stage2(pretrained, "ft", pretrained="fedavg-run")
    with pytest.raises(ConfigError, match="fixed_beta=0.0 applies to meta_nets=lrnet only"):
        stage2(pretrained, "fedl2p", fixed_beta=0.0)
    with pytest.raises(ConfigError, match="bn_mode"):
        stage2(pretrained, "ft", bn_mode="X")
    assert stage2(pretrained, "fedl2p", meta_nets="lrnet", fixed_beta=0.0).label() == "FedL2P (LRNet, β = 0)"
    assert stage2(pretrained, "fedl2p").label() == "FedL2P"  # FOMAML+ is FedL2P's default here
    assert stage2(pretrained, "fedl2p").method.meta_grad == "fomaml"
    assert stage2(pretrained, "fedl2p", meta_grad="ift").label() == "FedL2P (IFT)"
    assert stage2(pretrained, "ft", bn_mode="I").label() == "FT (BN I)"
    assert (stage2(pretrained, "fedl2p", meta_grad="ift", ift_direct="all").label()
            == "FedL2P (IFT + LRNet's direct term)")
    with pytest.raises(ConfigError, match="ift_direct applies to meta_grad=ift only"):
        stage2(pretrained, "fedl2p", meta_grad="fomaml", ift_direct="all")


def test_the_cli_hands_a_model_from_one_stage_to_the_next(tmp_path, capsys):
    from fl_core.__main__ import main

    common = ["--dataset", "synthetic", "--num-clients", "4", "--partition", "dirichlet_class", "--model", "lenet_bn",
              "--val-fraction", "0.25", "--rounds", "1", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(["--algorithm", "fedavg", *common, "--results", str(tmp_path / "pre")]) == 0
    written = list((tmp_path / "ck").glob("*.pt"))
    assert len(written) == 1
    key = written[0].stem
    assert f"--pretrained {key}" in capsys.readouterr().out
    assert main(["--algorithm", "fedl2p", *common, "--pretrained", key, "--ft-epochs", "1", "--meta-steps", "1",
                 "--results", str(tmp_path / "s2")]) == 0
    assert [p.stem for p in (tmp_path / "ck").glob("*.pt")] == [key]  # personalizing never writes a model
    assert main(["--algorithm", "ft", *common, "--pretrained", key, "--seed", "1"]) == 2
    assert "trained on other data (seed=0 there, 1 here)" in capsys.readouterr().err
