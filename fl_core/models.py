"""Model registry: small CNNs for fast sweeps and ResNet-18 with either stem.

| name            | what                                                            |
|-----------------|-----------------------------------------------------------------|
| lenet           | LeNet-5 style: 2 conv (6, 16 channels) + 3 linear; default for 8x8 and 28x28 |
| cnn2            | the FedAvg paper's CNN: 2 conv (32, 64) + 512-unit linear; default for 32x32 |
| resnet18_cifar  | torchvision ResNet-18 with a 3x3 stride-1 stem and no max-pool (CIFAR stem) |
| resnet18        | torchvision ResNet-18 as is (ImageNet stem: 7x7 stride 2 + max-pool)        |

Parameter groups, defined here once for every method that needs them:
- head: the classifier (`head` in the small CNNs, `fc` in the ResNets); body: everything else.
  FedPer, FedRep, FedBABU and FedPAC personalize or freeze the head; LG-FedAvg keeps the body
  ("lower layers", the local representation) personal and averages the head.
- blocks A-D, for FedSelect's layer ablation: the four residual stages `layer1`..`layer4` of
  ResNet-18; for the small CNNs, conv1 (A), conv2 (B), the hidden linear layers (C), the head (D).
"""
from __future__ import annotations

import torch
from torch import nn

from .config import ConfigError

HEAD_PREFIX = {"lenet": "head.", "cnn2": "head.", "resnet18_cifar": "fc.", "resnet18": "fc."}
_SMALL_BLOCKS = {"A": ("features.0.",), "B": ("features.3.",), "C": ("fc.",), "D": ("head.",)}
_RESNET_BLOCKS = {"A": ("layer1.",), "B": ("layer2.",), "C": ("layer3.",), "D": ("layer4.",)}
BLOCKS = {"lenet": _SMALL_BLOCKS, "cnn2": _SMALL_BLOCKS, "resnet18_cifar": _RESNET_BLOCKS, "resnet18": _RESNET_BLOCKS}


def is_head(model_name: str, param_name: str) -> bool:
    """Whether a parameter belongs to the classifier head of a registered model."""
    return param_name.startswith(HEAD_PREFIX[model_name])


def block_of(model_name: str, param_name: str) -> str | None:
    """The block (A-D) a parameter belongs to, or None (e.g. a ResNet's stem)."""
    for block, prefixes in BLOCKS[model_name].items():
        if param_name.startswith(prefixes):
            return block
    return None


def head_module(model: nn.Module, model_name: str) -> nn.Module:
    """The classifier module; its input is the model's feature vector (used by FedPAC)."""
    return getattr(model, HEAD_PREFIX[model_name].rstrip("."))


def resolve_model_name(name: str, input_shape: tuple[int, int, int]) -> str:
    """Map `auto` to the default model for an input shape."""
    if name != "auto":
        return name
    return "cnn2" if input_shape[1] >= 32 else "lenet"


class LeNet(nn.Module):
    """LeNet-5 style CNN; same-padded convolutions so that 8x8 inputs work too."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = 16 * (image_size // 4) ** 2
        self.fc = nn.Sequential(nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.head = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.features(x)))


class CNN2(nn.Module):
    """The 2-conv CNN of McMahan et al. (2017), used by FedAvg and many PFL papers."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(64 * (image_size // 4) ** 2, 512), nn.ReLU())
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.features(x)))


def _resnet18(in_channels: int, num_classes: int, cifar_stem: bool) -> nn.Module:
    from torchvision.models import resnet18  # local import: torchvision is slow to import

    model = resnet18(weights=None, num_classes=num_classes)
    if cifar_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Instantiate a registered model for inputs of shape (C, H, W)."""
    channels, height, width = input_shape
    name = resolve_model_name(name, input_shape)
    if height != width:
        raise ConfigError(f"input shape {input_shape} is not square; the registry's models expect square images")
    if name == "lenet":
        return LeNet(channels, num_classes, height)
    if name == "cnn2":
        return CNN2(channels, num_classes, height)
    if name == "resnet18_cifar":
        return _resnet18(channels, num_classes, cifar_stem=True)
    if name == "resnet18":
        return _resnet18(channels, num_classes, cifar_stem=False)
    raise ConfigError(f"model={name!r} is not registered; choose one of {', '.join(HEAD_PREFIX)}")
