"""ResNet-18 is built in fl_core.models, not imported from torchvision (whose import costs every
process ~160 MB of resident memory): it must stay the very model torchvision builds, parameter for
parameter, random draw for random draw, so that no run's numbers move."""
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fl_core.models import build_model


def torchvision_model(in_channels: int, num_classes: int, cifar_stem: bool) -> nn.Module:
    """What `build_model` returned before: torchvision's ResNet-18, its stem replaced afterwards."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    if cifar_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


@pytest.mark.parametrize("seed", [0, 11])
@pytest.mark.parametrize("name,shape,classes", [("resnet18_cifar", (3, 32, 32), 10),
                                                ("resnet18_cifar", (1, 28, 28), 10),
                                                ("resnet18", (3, 64, 64), 100), ("resnet18", (1, 64, 64), 7)])
def test_resnet18_is_torchvisions_bit_for_bit(seed, name, shape, classes):
    torch.manual_seed(seed)
    theirs = torchvision_model(shape[0], classes, cifar_stem=name == "resnet18_cifar")
    after_theirs = torch.rand(4)  # the generator must also end where theirs left it
    torch.manual_seed(seed)
    ours = build_model(name, shape, classes)
    assert torch.equal(torch.rand(4), after_theirs)
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    x, y = torch.randn(5, *shape), torch.arange(5) % classes
    loss_a, loss_b = F.cross_entropy(theirs(x), y), F.cross_entropy(ours(x), y)
    loss_a.backward()
    loss_b.backward()
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(theirs.parameters(), ours.parameters()))
    assert torch.equal(theirs.eval()(x), ours.eval()(x))  # and the running statistics the pass left


def test_a_run_imports_neither_torchvision_nor_scipy():
    """The memory target's saving: a ResNet-18 run loads neither (scipy only for corrupted data)."""
    code = ("import sys; from fl_core.config import RunConfig; from fl_core.simulation import Simulation; "
            "sim = Simulation(RunConfig(algorithm='fedselect', dataset='synthetic', model='resnet18_cifar', "
            "num_clients=2, samples_per_client=8, rounds=1, threads=1)); sim.run_round(); "
            "print(sorted(m for m in ('torchvision', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
