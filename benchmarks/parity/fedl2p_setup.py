"""The inputs both sides of benchmarks/parity/fedl2p.py are given, and the authors' modules, loaded
unmodified from a checkout of github.com/royson/fedl2p (see that script's docstring for why and how
their package is entered file by file, with flwr and ray stubbed)."""
from __future__ import annotations

import copy
import importlib.util
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fl_core.models import build_model


# ------------------------------------------------------------------ the fixture (both sides)
@dataclass
class Fixture:
    model: nn.Module          # pretrained, with running BN statistics
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    batch_size: int
    epochs: int
    lr: float                 # eta~'s initial value (their start_inner_lr)
    seed: int


def pretrain_bn(model: nn.Module, x: Tensor, y: Tensor, seed: int, steps: int = 30, lr: float = 0.05) -> nn.Module:
    """A few seeded SGD steps in train mode: weights and running statistics of 'another' population."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (32,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return model.eval()


def tiny_fixture(seed: int = 0) -> Fixture:
    """LeNet-BN at width 0.5 on seeded synthetic 28x28 images: pretrained on N(0, 1) images, the
    client's are shifted and scaled (a feature shift, so that its BN statistics differ)."""
    torch.manual_seed(seed)
    model = build_model("lenet_bn", (1, 28, 28), 10, width=0.5)
    gen = torch.Generator().manual_seed(seed + 100)
    x_pre, y_pre = torch.randn(256, 1, 28, 28, generator=gen), torch.randint(0, 10, (256,), generator=gen)
    pretrain_bn(model, x_pre, y_pre, seed)
    x = 0.4 + 1.6 * torch.randn(56, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (56,), generator=gen)
    return Fixture(model, x[:40], y[:40], x[40:], y[40:], batch_size=16, epochs=2, lr=0.01, seed=seed)


def fmnist_fixture(data_root: str, seed: int, client: int = 0) -> Fixture:
    """One client of Fashion-MNIST Dir(0.1) (10 clients, 150 images, 20 % validation); LeNet-BN
    pretrained on the other nine clients' training images (centralised SGD)."""
    from fl_core.data import build_federated_data
    data = build_federated_data(dataset="fmnist", num_clients=10, partition="dirichlet", dir_alpha=0.1, seed=seed,
                                samples_per_client=150, val_fraction=0.2, data_root=data_root)
    others = [c for k, c in enumerate(data.clients) if k != client]
    pool_x = torch.cat([c.x_train for c in others]).to(torch.get_default_dtype())
    torch.manual_seed(seed)
    model = build_model("lenet_bn", (1, 28, 28), 10)
    pretrain_bn(model, pool_x, torch.cat([c.y_train for c in others]), seed, steps=100)
    c, dtype = data.clients[client], torch.get_default_dtype()
    return Fixture(model, c.x_train.to(dtype), c.y_train, c.x_val.to(dtype), c.y_val, batch_size=32, epochs=5,
                   lr=0.01, seed=seed)


def input_bn_fixture(fix: Fixture) -> Fixture:
    """Setting B: BatchNorm on the input only, then conv, pool, linear; full-batch steps."""
    torch.manual_seed(fix.seed)
    model = nn.Sequential(nn.BatchNorm2d(1), nn.Conv2d(1, 4, 5, padding=2), nn.ReLU(), nn.MaxPool2d(4),
                          nn.Flatten(), nn.Linear(4 * 7 * 7, 10))
    pretrain_bn(model, torch.randn(256, 1, 28, 28, generator=torch.Generator().manual_seed(fix.seed)),
                torch.randint(0, 10, (256,), generator=torch.Generator().manual_seed(fix.seed + 1)), fix.seed)
    return replace(fix, model=model, batch_size=fix.x_train.shape[0])


def rel(ours: Tensor, theirs: Tensor) -> float:
    """max |ours - theirs| / max |theirs| (0 when both are 0)."""
    ours, theirs = ours.detach().double().reshape(-1), theirs.detach().double().reshape(-1)
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    return diff / scale if scale > 0 else diff


def worst(pairs) -> float:
    return max(rel(a, b) for a, b in pairs)


# ------------------------------------------------------------------ their code, imported as is
def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _package(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def load_reference(ref: str, learn2learn: str | None) -> types.SimpleNamespace:
    """Their model_utils, weight_net, client_utils and FedL2P client modules (see the docstring)."""
    root = Path(ref).resolve()
    if not (root / "src" / "apps" / "clients" / "fedl2p_classification_client.py").exists():
        raise SystemExit(f"{root} is not a checkout of royson/fedl2p")
    try:
        import learn2learn.algorithms.base_learner  # noqa: F401  (an installed learn2learn works as well)
    except ImportError:
        if learn2learn is None:
            raise SystemExit("learn2learn is not importable: pass --learn2learn <its source tree> "
                             "(e.g. the unpacked learn2learn-0.1.7 sdist)")
        l2l = Path(learn2learn).resolve()
        l2l = l2l / "learn2learn" if (l2l / "learn2learn").is_dir() else l2l
        _package("learn2learn", l2l)
        _package("learn2learn.algorithms", l2l / "algorithms")
        _load_file("learn2learn.utils", l2l / "utils" / "__init__.py")
        _load_file("learn2learn.algorithms.base_learner", l2l / "algorithms" / "base_learner.py")
    common = types.ModuleType("flwr.common")
    common.Weights = list                      # only in annotations
    common.parameters_to_weights = None        # used by their client's fit/evaluate, not by meta_train
    sys.modules.setdefault("flwr", types.ModuleType("flwr")).common = common
    sys.modules.setdefault("flwr.common", common)
    sys.modules.setdefault("ray", types.ModuleType("ray"))
    sys.path.insert(0, str(root))              # their `config.py`
    src = root / "src"
    _package("src", src)
    _package("src.models", src / "models")
    _package("src.apps", src / "apps")
    clients = _package("src.apps.clients", src / "apps" / "clients")
    data = _package("src.data", src / "data")
    _load_file("src.utils", src / "utils.py")
    model_utils = _load_file("src.models.model_utils", src / "models" / "model_utils.py")
    weight_net = _load_file("src.models.weight_net", src / "models" / "weight_net.py")
    client_utils = _load_file("src.apps.clients.client_utils", src / "apps" / "clients" / "client_utils.py")
    data.cycle = _load_file("src.data.utils", src / "data" / "utils.py").cycle
    clients.test, clients.epochs_to_batches = client_utils.test, client_utils.epochs_to_batches
    clients.ClassificationClient = type("ClassificationClient", (), {})  # never instantiated here
    client = _load_file("src.apps.clients.fedl2p_classification_client",
                        src / "apps" / "clients" / "fedl2p_classification_client.py")
    return types.SimpleNamespace(mu=model_utils, wn=weight_net, cu=client_utils, client=client)


def kld_twin(ref, model: nn.Module, momentum: float = 0.1) -> nn.Module:
    """`model` with each BatchNorm replaced by their KLDBatchNorm, loaded by their
    `copy_pretrain_to_kld` (pretrained running statistics -> init_running_*, running reset)."""
    twin = copy.deepcopy(model)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, ref.mu.KLDBatchNorm2d(child.num_features, child.eps, momentum))
            elif isinstance(child, nn.BatchNorm1d):
                setattr(parent, name, ref.mu.KLDBatchNorm1d(child.num_features, child.eps, momentum))
    ref.mu.copy_pretrain_to_kld([t.numpy() for t in model.state_dict().values()], twin)
    return twin


def set_running(ref, twin: nn.Module, stats) -> None:
    """Their eval-mode statistics := `stats` ({layer: (mean, var)}, our client statistics)."""
    kld = [m for m in twin.modules() if isinstance(m, (ref.mu.KLDBatchNorm1d, ref.mu.KLDBatchNorm2d))]
    for m, (mean, var) in zip(kld, stats.values()):
        m.running_mean, m.running_var = mean.clone(), var.clone()
