"""HeteroFL — Diao, Ding, Tarokh, "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021 (authors' code github.com/dem123456789/HeteroFL-
Computation-and-Communication-Efficient-Federated-Learning-for-Heterogeneous-Clients); a baseline
of PerFedMask's poster, compared after fine-tuning.

Evaluated per client: its own width-r_k sub-model of the broadcast global model (`acc_global`).
`acc` is that same sub-model by default (`ft_epochs` 0); a study that sets `ft_epochs`
(PerFedMask's personalisation: 5 epochs, `ft_momentum` 0.9) gets `acc` after fine-tuning a copy
of the sub-model (its slice only) on the client's data, with `acc_global` the accuracy before.
By default the full-width global model is never evaluated: each device runs only what it can.
`score_width = "full"` scores it as the PerFedMask authors do (`acc`: the full-width global
model fine-tuned whole; the device's fine-tuned slice is then `acc_device`; fedavg_ft.py
`WidthScoring`).

Device k has a width ratio r_k (fl_core/devices.py: `slim_ratios`, `full_share`, or a profile's
`ratio`) and trains a sub-model cut from the global one: of every hidden layer it keeps the first
⌈r_k·C⌉ of the C output channels or units (the authors' `int(np.ceil(rate * channels))`), and of
the layer after it the matching input channels. The layer that reads the image keeps every image
channel, the classifier every class (its input is sliced). A linear layer fed by a flattened C-
channel feature map keeps the inputs of the first ⌈r_k·C⌉ channels (flattening is channel-major,
so that is a prefix of ⌈r_k·C⌉·H·W inputs); a depthwise convolution, one input per group, keeps
its input dimension whole; biases and BatchNorm weights and biases keep their first ⌈r_k·C⌉
entries. Who feeds whom is read off the model's forward graph (torch.fx), so every registered
model is sliced the same way, residual streams included (all layers adding into one stream have
its channel count, hence the same prefix).

The sub-model is run on the full-size model, its entries outside the slice held at zero: a dead
channel then has zero weights and zero bias, so its convolution or linear output is exactly 0;
its BatchNorm has γ = β = 0, so it outputs 0 whatever its running statistics (hence they do not
matter); ReLU, pooling and residual additions keep 0 at 0; and the next layer's weights for that
channel are zero too. The live channels therefore compute exactly what the narrow network would,
and the logits are the sub-model's. A client's state is zero outside its slice at all times:
`init_client` and `receive` write the global values and zero the rest; local training and
fine-tuning multiply every gradient step by the slice mask, so an entry outside it never moves
(weight decay of a zero entry is zero, and momentum is masked with the step).

The server averages each entry over the participants whose slice holds it (the one masked-
averaging primitive with the slices as what each client sends: "aggregation by slice"); an entry
no participant trained keeps its global value. A client sends its slice and receives it back.
Per client, the Parquet rows carry `width` (r_k) and, as every fine-tuned method here,
`trainable_params` and per-sample `fwd_mflops` / `bwd_mflops` of the sub-model (each layer's
count scaled by the share of its weight in the slice).

Left out of the authors' HeteroFL: the `Scaler` module (during training each sliced layer's
output is divided by r_k, so that a sub-model's activations match the full model's in scale);
static BatchNorm (sBN: no running statistics in training, statistics gathered from the clients'
data after training for the global model; here BN keeps running statistics, each client's own as
in FedAvg here); and the label-split masking of the classifier (each client's head restricted to
the classes in its data, in training and in aggregation).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..devices import WidthScoringParams
from ..masks import Mask
from ..models import is_head
from ..training import State, UpdateSpec
from .base import ClientInfo, LocalStats
from .fedavg_ft import FineTuneParams, FineTuneProtocol, WidthScoring


@dataclass(frozen=True)
class HeteroFLParams(FineTuneParams, WidthScoringParams):
    """HeteroFL's knobs: fine-tuning before evaluation, the devices' width ratios, the scored width."""


# ---------------------------------------------------------------------------- slicing
@dataclass(frozen=True)
class SliceRule:
    """How one parameter is cut at width r: dim 0 keeps ⌈r·out⌉ entries (None: whole), dim 1 keeps
    ⌈r·inp⌉·per_channel (inp None: whole). 1-D tensors only use `out`."""

    out: int | None
    inp: int | None = None
    per_channel: int = 1

    def mask(self, shape: torch.Size, ratio: float, device: torch.device) -> Tensor | None:
        """Bool mask of the kept entries, or None when the slice is the whole tensor."""
        keep_out = shape[0] if self.out is None else math.ceil(ratio * self.out)
        keep_in = None
        if len(shape) > 1:
            keep_in = shape[1] if self.inp is None else math.ceil(ratio * self.inp) * self.per_channel
            if keep_out == shape[0] and keep_in == shape[1]:
                return None
        elif keep_out == shape[0]:
            return None
        mask = torch.zeros(shape, dtype=torch.bool, device=device)
        if keep_in is None:
            mask[:keep_out] = True
        else:
            mask[:keep_out, :keep_in] = True
        return mask


_SLICED = (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.BatchNorm1d)
_FLATTENING_METHODS = ("flatten", "view", "reshape")


def _channels_out(module: nn.Module) -> int | None:
    if isinstance(module, nn.Conv2d):
        return module.out_channels
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, (nn.BatchNorm2d, nn.BatchNorm1d)):
        return module.num_features
    return None


def _source(node: fx.Node, modules: Mapping[str, nn.Module]) -> tuple[int | None, bool]:
    """Walk back from a layer's input to the nearest layer with channels: (its channel count, or
    None when the input is the model's own; whether a flatten lies in between). Element-wise ops,
    pooling and additions keep the channel layout, so the walk follows their first tensor input."""
    flattened = False
    while True:
        if node.op == "placeholder":
            return None, flattened
        if node.op == "call_module":
            module = modules[node.target]
            if isinstance(module, nn.Flatten):
                flattened = True
            elif (channels := _channels_out(module)) is not None:
                return channels, flattened
        elif node.op == "call_method" and node.target in _FLATTENING_METHODS:
            flattened = True
        elif node.op == "call_function" and node.target in (torch.flatten, torch.reshape):
            flattened = True
        inputs = [a for a in node.args if isinstance(a, fx.Node)]
        if not inputs:
            raise ValueError(f"HeteroFL slicing: cannot trace the input of node {node.name!r} back to a layer")
        node = inputs[0]


def slice_rules(model: nn.Module, model_name: str) -> dict[str, SliceRule]:
    """Every parameter's `SliceRule`, from the model's forward graph (see the module docstring)."""
    modules = dict(model.named_modules())
    rules: dict[str, SliceRule] = {}
    for node in fx.Tracer().trace(model).nodes:
        if node.op != "call_module" or not isinstance(module := modules[node.target], _SLICED):
            continue
        prefix = f"{node.target}."
        if isinstance(module, (nn.BatchNorm2d, nn.BatchNorm1d)):
            rule = SliceRule(out=module.num_features)
            rules.update({prefix + n: rule for n, _ in module.named_parameters(recurse=False)})
            continue
        head = is_head(model_name, prefix + "weight")
        out = None if head else _channels_out(module)
        channels, flattened = _source(node.args[0], modules)
        fan_in = module.in_features if isinstance(module, nn.Linear) else module.in_channels
        inp, per_channel = channels, 1
        if isinstance(module, nn.Conv2d) and module.groups != 1:
            if module.groups != module.in_channels:
                raise NotImplementedError(f"HeteroFL slicing: grouped convolution {node.target!r} "
                                          f"({module.groups} groups) is neither plain nor depthwise")
            inp = None  # depthwise: one input per group, dim 1 has size 1
        elif channels is not None:
            if flattened and fan_in % channels == 0:
                per_channel = fan_in // channels
            elif channels != fan_in:
                raise ValueError(f"HeteroFL slicing: {node.target!r} takes {fan_in} inputs from a layer "
                                 f"of {channels} channels")
        rules[prefix + "weight"] = SliceRule(out=out, inp=inp, per_channel=per_channel)
        if module.bias is not None:
            rules[prefix + "bias"] = SliceRule(out=out)
    missing = [n for n, _ in model.named_parameters() if n not in rules]
    if missing:
        raise ValueError(f"HeteroFL slicing: parameters outside any conv/linear/BatchNorm layer: {missing[:5]}")
    return rules


def width_slices(model: nn.Module, model_name: str, ratio: float,
                 rules: Mapping[str, SliceRule] | None = None) -> Mask:
    """The width-`ratio` sub-model as bool masks (True = in the slice) over the parameters it
    cuts; a parameter kept whole has no entry (so ratio 1 gives {})."""
    rules = slice_rules(model, model_name) if rules is None else rules
    out = {}
    for name, p in model.named_parameters():
        mask = rules[name].mask(p.shape, ratio, p.device)
        if mask is not None:
            out[name] = mask
    return out


# ---------------------------------------------------------------------------- the method
@dataclass(slots=True, eq=False)
class HeteroFLExtras(ClientExtras):
    width: float | None = None  # the device's width ratio


class HeteroFL(WidthScoring):
    name = "heterofl"
    display = "HeteroFL"
    Params = HeteroFLParams
    Extras = HeteroFLExtras
    protocol = FineTuneProtocol(epochs=0)  # acc = the (sub-)model unless a study sets ft_epochs
    evaluates = "the client's width slice of the broadcast model, fine-tuned when ft_epochs > 0 " \
                "(acc_global: before fine-tuning)"

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        self.widths = self.params.ratios(len(clients), [info.profile for info in clients])
        self._rules = slice_rules(self.trainer.model, self.model_name)
        self._slices: dict[float, tuple[Mask, Mask, dict[str, Tensor]]] = {}
        return super().setup(init, clients)

    def slices(self, ratio: float) -> tuple[Mask, Mask, dict[str, Tensor]]:
        """(inside, outside, inside as float 0/1) masks of the width-`ratio` slice, per cut
        parameter; computed once per ratio."""
        if ratio not in self._slices:
            inside = width_slices(self.trainer.model, self.model_name, ratio, self._rules)
            self._slices[ratio] = (inside, {n: ~m for n, m in inside.items()},
                                   {n: m.float() for n, m in inside.items()})
        return self._slices[ratio]

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)  # fresh copies of the initial model
        client.extra.width = self.widths[k]
        self._zero_outside(client)
        return client

    def receive(self, client: ClientState) -> None:
        super().receive(client)  # fresh copies of the global parameters
        self._zero_outside(client)

    def _zero_outside(self, client: ClientState) -> None:
        """Zero the client's entries outside its slice (in place: its tensors are its own copies)."""
        _, outside, _ = self.slices(client.extra.width)
        for n, m in outside.items():
            client.state[n].masked_fill_(m, 0)

    def trained_entries(self, k: int) -> UpdateSpec:
        """Client k's slice: the gradient step of each cut parameter multiplied by its 0/1 mask."""
        _, _, spec = self.slices(self.widths[k])
        return {n: spec.get(n) for n in self.param_names}

    def fine_tuned_entries(self, k: int) -> UpdateSpec:
        return self.trained_entries(k)

    def full_width(self, client: ClientState) -> tuple[ClientState, dict, dict]:
        """`score_width = "full"`: the whole global model, every entry fine-tuned."""
        whole = dict(client.state) | {n: self.global_state[n].clone() for n in self.shared_names()}
        return ClientState(state=whole), self.full_update(), {}

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.trained_entries(k))
        stats.metrics = {"width": self.widths[k]}
        return stats

    def contribution(self, client: ClientState) -> Mask | None:
        """The client's slice (None for a full-width client, which sends everything)."""
        inside, _, _ = self.slices(client.extra.width)
        return inside or None
