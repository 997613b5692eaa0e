"""Model registry: small CNNs for fast sweeps, ResNet-18 with either stem, and models with
BatchNorm for feature shift (FedBN, PerFedMask).

| name            | what                                                            |
|-----------------|-----------------------------------------------------------------|
| lenet           | LeNet-5 style: 2 conv (6, 16 channels) + 3 linear; default for 8x8 and 28x28 |
| cnn2            | the FedAvg paper's CNN: 2 conv (32, 64) + 512-unit linear; default for 32x32 |
| resnet18_cifar  | ResNet-18 (torchvision's, built here) with a 3x3 stride-1 stem and no max-pool (CIFAR stem) |
| resnet18        | ResNet-18 as torchvision's (ImageNet stem: 7x7 stride 2 + max-pool)         |
| cnn_bn          | cnn2 with BatchNorm after each conv (8x8, 28x28, 32x32)                     |
| lenet_bn        | lenet with BatchNorm after each conv: the fastest BN model (feature-shift study) |
| preresnet18     | pre-activation ResNet-18 of PerFedMask's CIFAR experiments (after HeteroFL) |
| mobilenet_cifar | MobileNet (v1) for 32x32 inputs, PerFedMask's CIFAR-100 model               |

The small CNNs (`WIDTH_MODELS`) can be built at a width w ∈ (0, 4]: every hidden layer's C channels
or units become ⌈w·C⌉ (image channels and classes unchanged; at w = 1 the very same model).

Every model with BatchNorm keeps running statistics (buffers), so that a method may keep them
local (FedBN) and evaluation uses them. `load_init_weights` initialises a built model from a
local state-dict file (the `init_weights` knob; nothing is downloaded).

Parameter groups, defined here once for every method that needs them:
- head: the classifier (`head` in the small CNNs, `fc` in the ResNets, `linear` in the PerFedMask
  authors' PreResNet-18 and MobileNet); body: everything else.
  FedPer, FedRep, FedBABU and FedPAC personalize or freeze the head; LG-FedAvg keeps the body
  ("lower layers", the local representation) personal and averages the head.
- blocks A-D, for FedSelect's layer ablation: the four residual stages `layer1`..`layer4` of
  ResNet-18 and PreResNet-18; for the small CNNs, conv1 (A), conv2 (B), the hidden linear layers
  (C), the head (D), each conv with its BatchNorm in cnn_bn and lenet_bn; for MobileNet, its widths 64-128 (A),
  256 (B), 512 (C) and 1024 (D). Stems, PreResNet's final BatchNorm and MobileNet's head belong to
  no block.
- layer groups (`LAYER_GROUPS`, `layer_groups`): PerFedMask's units of freezing, covering the body.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .knobs import ConfigError

HEAD_PREFIX = {"lenet": "head.", "cnn2": "head.", "resnet18_cifar": "fc.", "resnet18": "fc.",
               "cnn_bn": "head.", "lenet_bn": "head.", "preresnet18": "linear.", "mobilenet_cifar": "linear."}
_SMALL_BLOCKS = {"A": ("features.0.",), "B": ("features.3.",), "C": ("fc.",), "D": ("head.",)}
_CNN_BN_BLOCKS = {"A": ("features.0.", "features.1."), "B": ("features.4.", "features.5."), "C": ("fc.",),
                  "D": ("head.",)}
_RESNET_BLOCKS = {"A": ("layer1.",), "B": ("layer2.",), "C": ("layer3.",), "D": ("layer4.",)}
_MOBILENET_BLOCKS = {b: tuple(f"layers.{i}." for i in idx)
                     for b, idx in (("A", range(0, 3)), ("B", range(3, 5)), ("C", range(5, 11)), ("D", range(11, 13)))}
BLOCKS = {"lenet": _SMALL_BLOCKS, "cnn2": _SMALL_BLOCKS, "resnet18_cifar": _RESNET_BLOCKS, "resnet18": _RESNET_BLOCKS,
          "cnn_bn": _CNN_BN_BLOCKS, "lenet_bn": _CNN_BN_BLOCKS, "preresnet18": _RESNET_BLOCKS,
          "mobilenet_cifar": _MOBILENET_BLOCKS}


# Layer groups (PerFedMask's Λ): the units a device trains or freezes whole, in forward order,
# covering the body exactly (the head is never a group). As the authors group PreResNet-18 (stem
# conv, 8 residual blocks, final BatchNorm) and MobileNet (stem, 13 separable blocks); the small
# CNNs' groups are their layers, each conv with its BatchNorm.
_RESNET_UNITS = tuple((f"layer{i}.{b}", (f"layer{i}.{b}.",)) for i in range(1, 5) for b in range(2))
LAYER_GROUPS = {
    "lenet": (("conv1", ("features.0.",)), ("conv2", ("features.3.",)), ("fc1", ("fc.0.",)), ("fc2", ("fc.2.",))),
    "cnn2": (("conv1", ("features.0.",)), ("conv2", ("features.3.",)), ("fc1", ("fc.0.",))),
    "cnn_bn": (("conv1", ("features.0.", "features.1.")), ("conv2", ("features.4.", "features.5.")),
               ("fc1", ("fc.0.",))),
    "lenet_bn": (("conv1", ("features.0.", "features.1.")), ("conv2", ("features.4.", "features.5.")),
                 ("fc1", ("fc.0.",)), ("fc2", ("fc.2.",))),
    "resnet18_cifar": (("stem", ("conv1.", "bn1.")),) + _RESNET_UNITS,
    "resnet18": (("stem", ("conv1.", "bn1.")),) + _RESNET_UNITS,
    "preresnet18": (("stem", ("conv1.",)),) + _RESNET_UNITS + (("final", ("bn4.",)),),
    "mobilenet_cifar": (("stem", ("conv1.", "bn1.")),) + tuple((f"block{i}", (f"layers.{i}.",)) for i in range(13)),
}


def layer_groups(model_name: str, param_names: list[str]) -> list[tuple[str, list[str]]]:
    """(group name, its parameter names) in forward order, over the body's parameters; raises if a
    body parameter is in no group or in two (a registry error, caught by the tests)."""
    groups = [(name, [p for p in param_names if p.startswith(prefixes)]) for name, prefixes in LAYER_GROUPS[model_name]]
    body = [p for p in param_names if not is_head(model_name, p)]
    placed = [p for _, members in groups for p in members]
    if sorted(placed) != sorted(body):
        missing, twice = set(body) - set(placed), {p for p in placed if placed.count(p) > 1}
        raise ValueError(f"layer groups of {model_name} do not cover its body: missing {sorted(missing)}, "
                         f"in two groups {sorted(twice)}")
    return groups


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
    """The classifier module; its input is the model's feature vector (FedPAC, MOON, FedRoD)."""
    return getattr(model, HEAD_PREFIX[model_name].rstrip("."))


class FeatureTap:
    """While entered, records the input of `head` (the feature vector, flattened per sample) at
    every forward pass through it: `features` in call order, `z` the latest."""

    def __init__(self, head: nn.Module) -> None:
        self.head = head
        self.features: list[torch.Tensor] = []

    @property
    def z(self) -> torch.Tensor:
        if not self.features:
            raise RuntimeError("FeatureTap: no forward pass went through the head yet")
        return self.features[-1]

    def __enter__(self) -> "FeatureTap":
        self.handle = self.head.register_forward_pre_hook(lambda module, args: self.features.append(args[0].flatten(1)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def resolve_model_name(name: str, input_shape: tuple[int, int, int]) -> str:
    """Map `auto` to the default model for an input shape."""
    if name != "auto":
        return name
    return "cnn2" if input_shape[1] >= 32 else "lenet"


# The models that can be built at another width (< 1: Split-Mix's base models; > 1: spare capacity,
# the `model_width` knob).
WIDTH_MODELS = ("lenet", "cnn2", "cnn_bn", "lenet_bn")
MAX_WIDTH = 4.0
# The models whose state holds running statistics (BatchNorm's running mean and variance), the
# entries `bn_stats` is about; `tests/test_bn_stats.py` checks this against the built models.
RUNNING_STATS_MODELS = ("resnet18_cifar", "resnet18", "cnn_bn", "lenet_bn", "preresnet18", "mobilenet_cifar")


def scaled(channels: int, width: float) -> int:
    """A hidden layer's channel or unit count at `width`: ⌈width·C⌉ (C itself at width 1)."""
    return channels if width == 1.0 else math.ceil(width * channels)


class LeNet(nn.Module):
    """LeNet-5 style CNN; same-padded convolutions so that 8x8 inputs work too. `width` scales
    every hidden channel and unit count (`scaled`)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h1, h2 = (scaled(c, width) for c in (6, 16, 120, 84))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = c2 * (image_size // 4) ** 2
        self.fc = nn.Sequential(nn.Linear(flat, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU())
        self.head = nn.Linear(h2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.features(x)))


class CNN2(nn.Module):
    """The 2-conv CNN of McMahan et al. (2017), used by FedAvg and many PFL papers (`width` as
    in LeNet)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h = (scaled(c, width) for c in (32, 64, 512))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(c2 * (image_size // 4) ** 2, h), nn.ReLU())
        self.head = nn.Linear(h, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.features(x)))


class CNNBN(nn.Module):
    """CNN2 (same convolutions, pooling and head) with a BatchNorm2d after each convolution and a
    256-unit hidden linear layer instead of 512, to stay fast on CPU. Unlike the FedBN paper's
    digit model, the hidden linear layer has no BatchNorm1d: the trainer's last mini-batch of a
    pass may hold one sample, on which BatchNorm1d cannot train. `width` as in LeNet."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h = (scaled(c, width) for c in (32, 64, 256))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(c2 * (image_size // 4) ** 2, h), nn.ReLU())
        self.head = nn.Linear(h, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.features(x)))


class LeNetBN(LeNet):
    """LeNet with a BatchNorm2d after each convolution (no BatchNorm1d, as cnn_bn): about 7x
    faster than cnn_bn on CPU at 28x28, so a feature-shift sweep of several methods fits minutes."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0) -> None:
        super().__init__(in_channels, num_classes, image_size, width)
        c1, c2 = scaled(6, width), scaled(16, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )


class PreActBlock(nn.Module):
    """BN-ReLU-conv3x3, BN-ReLU-conv3x3; the 1x1 projection shortcut (where the shape changes)
    takes the pre-activated input, as in the authors' HeteroFL-derived code."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut = (nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)
                         if stride != 1 or in_planes != planes else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(out)
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        return out + skip


class PreResNet18(nn.Module):
    """Pre-activation ResNet-18 as PerFedMask uses it on CIFAR (github.com/MehdiSet/PerFedMask,
    nets/HeteFL/preresne.py, from HeteroFL): a 3x3 stride-1 stem conv without BN, four stages of
    two pre-activation blocks (64, 128, 256, 512 channels; strides 1, 2, 2, 2), a final BN + ReLU,
    global average pooling and `linear`. BN weights start at 1, biases and the linear bias at 0.
    Differences: BN tracks running statistics here (their runs may pass track_running_stats=False)
    and the width scaler (identity at full width) is left out."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        stages, planes = [], 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(PreActBlock(planes, width, stride), PreActBlock(width, width, 1)))
            planes = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.bn4 = nn.BatchNorm2d(512)
        self.linear = nn.Linear(512, num_classes)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        out = F.adaptive_avg_pool2d(F.relu(self.bn4(out)), 1).flatten(1)
        return self.linear(out)


class MobileNetCIFAR(nn.Module):
    """MobileNet v1 for CIFAR, PerFedMask's CIFAR-100 model (nets/Nets.py there): a 3x3 stem with
    32 channels, then 13 depthwise-separable blocks (depthwise 3x3 + BN + ReLU, pointwise 1x1 + BN
    + ReLU), global average pooling and `linear`. Their BN layers keep no running statistics;
    here they do (as every model in this registry, for FedBN)."""

    WIDTHS = (64, (128, 2), 128, (256, 2), 256, (512, 2), 512, 512, 512, 512, 512, (1024, 2), 1024)

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        layers, planes = [], 32
        for spec in self.WIDTHS:
            width, stride = spec if isinstance(spec, tuple) else (spec, 1)
            layers.append(nn.Sequential(
                nn.Conv2d(planes, planes, 3, stride=stride, padding=1, groups=planes, bias=False),
                nn.BatchNorm2d(planes), nn.ReLU(),
                nn.Conv2d(planes, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()))
            planes = width
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


class BasicBlock(nn.Module):
    """He et al. 2016's basic residual block: 3x3 conv, BN, ReLU, 3x3 conv, BN, plus the block's
    input (through `downsample`, a strided 1x1 conv + BN, where the shape changes), then ReLU.
    Module names as torchvision's, so that state dicts of the two are interchangeable."""

    def __init__(self, in_planes: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016), built here rather than imported: importing torchvision costs
    every process that builds it ~160 MB of resident memory (its C++ operators and the libraries
    they load), the largest part of the gap to the 10-client memory target in
    docs/performance.md. Identical to `torchvision.models.resnet18(weights=None)` for the same
    random state, parameter for parameter and bit for bit (tests/test_resnet.py checks it): the
    same modules in the same order, each constructed when torchvision constructs it (a stage's
    shortcut before its first block), so that every random draw lands where torchvision's does;
    then the convolutions re-drawn by Kaiming's normal rule (fan-out, ReLU gain) and BatchNorm at
    weight 1, bias 0. The CIFAR stem (a 3x3 stride-1 conv, no max-pool) and a stem for other than
    3 input channels replace `conv1` afterwards with a freshly drawn default-initialised conv, as
    the torchvision-based model before it did."""

    def __init__(self, in_channels: int, num_classes: int, cifar_stem: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        planes = 64
        for i, (width, stride) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2)), start=1):
            shortcut = (nn.Sequential(nn.Conv2d(planes, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width))
                        if stride != 1 or planes != width else None)
            first = BasicBlock(planes, width, stride, shortcut)
            setattr(self, f"layer{i}", nn.Sequential(first, BasicBlock(width, width, 1, None)))
            planes = width
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if cifar_stem:
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif in_channels != 3:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(torch.flatten(self.avgpool(out), 1))


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, width: float = 1.0) -> nn.Module:
    """Instantiate a registered model for inputs of shape (C, H, W); a `width` other than 1 builds
    one of `WIDTH_MODELS` with ⌈width·C⌉ of every hidden layer's C channels or units."""
    channels, height, image_width = input_shape
    name = resolve_model_name(name, input_shape)
    if height != image_width:
        raise ConfigError(f"input shape {input_shape} is not square; the registry's models expect square images")
    if not 0 < width <= MAX_WIDTH:
        raise ConfigError(f"model width {width!r} is outside (0, {MAX_WIDTH:g}]")
    if width != 1.0 and name not in WIDTH_MODELS:
        raise ConfigError(f"model {name!r} cannot be built at width {width:g}; models with a width: "
                          f"{', '.join(WIDTH_MODELS)}")
    if name == "lenet":
        return LeNet(channels, num_classes, height, width)
    if name == "cnn2":
        return CNN2(channels, num_classes, height, width)
    if name == "resnet18_cifar":
        return ResNet18(channels, num_classes, cifar_stem=True)
    if name == "resnet18":
        return ResNet18(channels, num_classes, cifar_stem=False)
    if name == "cnn_bn":
        return CNNBN(channels, num_classes, height, width)
    if name == "lenet_bn":
        return LeNetBN(channels, num_classes, height, width)
    if name == "preresnet18":
        return PreResNet18(channels, num_classes)
    if name == "mobilenet_cifar":
        return MobileNetCIFAR(channels, num_classes)
    raise ConfigError(f"model={name!r} is not registered; choose one of {', '.join(HEAD_PREFIX)}")


def load_init_weights(model: nn.Module, path: str) -> None:
    """Initialise `model` from the state dict saved at `path` (the `init_weights` knob), loaded
    with `weights_only=True`. Every key must match the model's, shapes included; anything else is
    a ConfigError naming the file and the keys."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"init_weights={path!r}: no such file")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"init_weights={path!r} could not be read as a state dict: {err}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"init_weights={path!r} does not hold a state dict (a mapping of names to tensors)")
    own = model.state_dict()
    missing, unexpected = [k for k in own if k not in state], [k for k in state if k not in own]
    if missing or unexpected:
        raise ConfigError(f"init_weights={path!r} does not fit the model: missing keys {missing[:10]}"
                          f"{' ...' if len(missing) > 10 else ''}, unexpected keys {unexpected[:10]}"
                          f"{' ...' if len(unexpected) > 10 else ''}")
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(t.shape)}" for k, t in own.items() if state[k].shape != t.shape]
    if wrong:
        raise ConfigError(f"init_weights={path!r}: shapes differ from the model's: {', '.join(wrong[:10])}")
    model.load_state_dict(state, strict=True)
