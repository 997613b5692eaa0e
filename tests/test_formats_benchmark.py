"""benchmarks/formats.py (channels-last, bf16 autocast and torch.compile against the default
format): each side runs in the format it names, the table's verdicts follow from the numbers,
and bad input is one error before any work. Timings themselves are never asserted."""
import pytest
import torch

from benchmarks.formats import Side, main, payback, table
from fl_core.models import build_model


def test_each_side_runs_in_the_format_it_names():
    x, y = torch.randn(40, 1, 28, 28), torch.arange(40) % 10
    outputs = {}
    for variant in ("default", "channels-last", "bf16"):
        torch.manual_seed(0)  # the same initial weights on every side
        side = Side(build_model("lenet", (1, 28, 28), 10), variant)
        seen = []
        side.model.features[3].register_forward_hook(lambda m, i, o: seen.append((i[0], o)))
        side.train(x, y)
        side.score(x, y)
        weight = side.model.features[3].weight  # the second conv: a 1-channel one is both formats at once
        assert weight.dtype == torch.float32  # autocast leaves the parameters in float32
        assert weight.is_contiguous(memory_format=torch.channels_last) == (variant == "channels-last")
        assert all(inp.is_contiguous(memory_format=torch.channels_last) for inp, _ in seen) == \
            (variant == "channels-last")
        assert {o.dtype for _, o in seen} == ({torch.bfloat16} if variant == "bf16" else {torch.float32})
        assert len(seen) == 3  # two training batches of 32 and 8, one scoring batch
        outputs[variant] = side.model.eval()(x.contiguous()).float()
    # the same training from the same weights: the formats round differently, not much
    assert torch.allclose(outputs["channels-last"], outputs["default"], atol=1e-4)
    assert torch.allclose(outputs["bf16"], outputs["default"], atol=0.1)


def test_compiling_pays_back_only_when_the_compiled_pass_is_faster():
    faster = {"model": "cnn2", "work": "scoring", "variant": "compiled", "default": 0.5, "variant_s": 0.3,
              "compile": 20.0}
    slower = faster | {"work": "training", "variant_s": 0.6}
    assert payback(faster) == "20 s; 100 passes"
    assert payback(slower) == "20 s; never"
    assert payback(faster | {"variant": "channels-last"}) == ""
    lines = table([faster, slower])
    assert lines[2] == "| cnn2 | scoring | compiled | 0.500 | 0.300 | 1.67 | 20 s; 100 passes | not used |"
    assert lines[3].split(" | ")[5] == "0.83"


def test_no_repeats_is_one_error_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
    assert "--repeats 0: at least 1" in capsys.readouterr().err
