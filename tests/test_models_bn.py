"""Models with BatchNorm (cnn_bn, lenet_bn, preresnet18, mobilenet_cifar): shapes, the registry's head/body
split and blocks A-D, and initialising a run from a state-dict file (`init_weights`)."""
import pytest
import torch
from torch import nn

from fl_core.config import MODELS, ConfigError, RunConfig
from fl_core.models import BLOCKS, HEAD_PREFIX, block_of, build_model, head_module, is_head, load_init_weights
from fl_core.simulation import Simulation

from conftest import tiny

BN_MODELS = ("cnn_bn", "lenet_bn", "preresnet18", "mobilenet_cifar")
# what belongs to no block: stems, PreResNet's final BN, MobileNet's stem BN and head
OUTSIDE_BLOCKS = {"cnn_bn": (), "lenet_bn": (), "preresnet18": ("conv1.", "bn4.", "linear."),
                  "mobilenet_cifar": ("conv1.", "bn1.", "linear.")}


@pytest.fixture(scope="module")
def built():
    torch.manual_seed(0)
    return {(name, shape): build_model(name, shape, 7)
            for name in BN_MODELS for shape in ((1, 28, 28), (3, 32, 32))}


def test_every_new_model_is_registered_and_selectable():
    for name in BN_MODELS:
        assert name in MODELS and name in HEAD_PREFIX and name in BLOCKS
        RunConfig(model=name)  # an allowed value


@pytest.mark.parametrize("name", BN_MODELS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_output_shape_in_training_and_eval_mode(built, name, shape):
    model = built[name, shape]
    x = torch.randn(3, *shape)
    assert model.train()(x).shape == (3, 7)
    assert model.eval()(x).shape == (3, 7)
    assert any(isinstance(m, nn.BatchNorm2d) and m.track_running_stats for m in model.modules())


@pytest.mark.parametrize("name", ["cnn_bn", "lenet_bn"])
def test_small_bn_models_run_on_8x8_inputs_and_train_on_a_batch_of_one(name):
    model = build_model(name, (1, 8, 8), 10).train()
    assert model(torch.randn(1, 1, 8, 8)).shape == (1, 10)  # the trainer's last batch may hold one sample


@pytest.mark.parametrize("name", BN_MODELS)
def test_head_and_body_split_every_parameter(built, name):
    model = built[name, (3, 32, 32)]
    names = [n for n, _ in model.named_parameters()]
    head = [n for n in names if is_head(name, n)]
    body = [n for n in names if not is_head(name, n)]
    assert head and body and len(head) + len(body) == len(names)
    own = {f"{HEAD_PREFIX[name]}{n}" for n, _ in head_module(model, name).named_parameters()}
    assert set(head) == own and isinstance(head_module(model, name), nn.Linear)


@pytest.mark.parametrize("name", BN_MODELS)
def test_blocks_cover_every_parameter_outside_stem_and_head_once(built, name):
    model = built[name, (3, 32, 32)]
    entries = list(model.state_dict())  # parameters and BN buffers alike
    of = {n: block_of(name, n) for n in entries}
    for n, block in of.items():
        assert (block is None) == n.startswith(OUTSIDE_BLOCKS[name]), n
        matching = [b for b, prefixes in BLOCKS[name].items() if n.startswith(prefixes)]
        assert len(matching) <= 1, n  # no entry in two blocks
    assert {b for b in of.values() if b} == {"A", "B", "C", "D"}
    # each BN layer sits in the same block as the conv it normalises
    if name in ("cnn_bn", "lenet_bn"):
        assert of["features.1.running_mean"] == "A" and of["features.5.weight"] == "B"
        assert of["fc.0.weight"] == "C" and of["head.weight"] == "D"


def test_preresnet18_follows_the_authors_structure():
    model = build_model("preresnet18", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 11_172_170  # as the authors' resnet18
    block = model.layer2[0]
    assert block.conv1.stride == (2, 2) and block.shortcut is not None and model.layer1[0].shortcut is None
    assert torch.all(model.linear.bias == 0)


def _saved(tmp_path, state, name="init.pt"):
    path = tmp_path / name
    torch.save(state, path)
    return str(path)


def test_init_weights_round_trip(tmp_path):
    torch.manual_seed(5)
    source = build_model("cnn_bn", (1, 8, 8), 10)
    with torch.no_grad():
        source.features[1].running_mean.add_(0.5)  # buffers travel too
    path = _saved(tmp_path, source.state_dict())
    sim = Simulation(tiny(algorithm="fedavg", model="cnn_bn", init_weights=path))
    expected = source.state_dict()
    for c in sim.clients:
        assert set(c.state) == set(expected)
        assert all(torch.equal(c.state[n], expected[n]) for n in expected)
    assert all(torch.equal(sim.algorithm.global_state[n], expected[n]) for n in expected)
    random = Simulation(tiny(algorithm="fedavg", model="cnn_bn"))
    assert not torch.equal(random.clients[0].state["head.weight"], expected["head.weight"])


def test_init_weights_with_wrong_keys_names_them_and_the_file(tmp_path):
    state = build_model("cnn_bn", (1, 8, 8), 10).state_dict()
    state["extra.weight"] = state.pop("head.weight")
    path = _saved(tmp_path, state)
    with pytest.raises(ConfigError,
                       match=r"(?s)init\.pt.*missing keys \['head\.weight'\].*unexpected keys \['extra\.weight'\]"):
        load_init_weights(build_model("cnn_bn", (1, 8, 8), 10), path)
    with pytest.raises(ConfigError, match="missing keys"):
        Simulation(tiny(algorithm="fedavg", model="cnn_bn", init_weights=path))


def test_init_weights_with_a_wrong_shape_or_no_file_is_a_clear_error(tmp_path):
    other = _saved(tmp_path, build_model("cnn_bn", (1, 8, 8), 5).state_dict(), "five.pt")
    with pytest.raises(ConfigError, match=r"five\.pt.*head\.weight \(5, 256\) vs \(10, 256\)"):
        load_init_weights(build_model("cnn_bn", (1, 8, 8), 10), other)
    missing = str(tmp_path / "absent.pt")
    with pytest.raises(ConfigError, match=r"absent\.pt.*no such file"):
        Simulation(tiny(algorithm="fedavg", model="cnn_bn", init_weights=missing))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="could not be read"):
        load_init_weights(build_model("cnn_bn", (1, 8, 8), 10), str(tmp_path / "junk.pt"))


def test_init_weights_leaves_earlier_hashes_alone_and_its_path_enters_the_hash():
    plain = RunConfig(algorithm="fedavg")
    assert "init_weights" not in plain.__dict__ or plain.init_weights is None
    # the hash of a default run before the knob existed (fl_core at 7d26879)
    assert plain.config_hash() == "0a25d3dd1866"
    assert RunConfig(algorithm="fedavg", init_weights="a.pt").config_hash() not in (
        plain.config_hash(), RunConfig(algorithm="fedavg", init_weights="b.pt").config_hash())
