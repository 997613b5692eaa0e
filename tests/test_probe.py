"""`--gpus-per-trial auto` decided by measurement (sweeps/probe.py): the rule on numbers, the record
and its reuse on --resume, the probe on the CPU, and the wiring (no GPU needed)."""
from __future__ import annotations

import json
import types

import pytest
import torch

from sweeps import gpu_sharing, launch, probe, resources
from sweeps.errors import SweepError
from conftest import tiny

CLUSTER = {"CPU": 16.0, "GPU": 1.0}


# ---------------------------------------------------------------------------- the rule
def test_a_fast_cpu_takes_the_cpus_and_the_line_gives_both_figures():
    gpus, text = probe.decide(cpu_s=0.33, gpu_s=0.52, cpus=16, gpus=1, cpus_per_trial=1)
    assert gpus == 0.0
    # CPUs: 16 trials / 0.33 s = 48.5 rounds/s; GPU: 4 packed trials / 0.52 s x 0.5 = 3.85 rounds/s
    assert "CPUs 16 trials x 1 CPU at 0.33 s/round = 48.5 rounds/s" in text
    assert "GPU 4 trials at 0.52 s/round x 0.5 packing = 3.85 rounds/s" in text
    assert text.endswith("taking the CPUs (0 GPU per trial)")


def test_a_gpu_much_faster_per_round_takes_the_gpu():
    # CPUs: 4 / 1.0 = 4 rounds/s; GPU: 4 / 0.1 x 0.5 = 20 rounds/s
    gpus, text = probe.decide(cpu_s=1.0, gpu_s=0.1, cpus=4, gpus=1, cpus_per_trial=1)
    assert gpus == resources.AUTO_GPU_FRACTION == 0.25
    assert "= 4 rounds/s" in text and "= 20 rounds/s" in text and text.endswith("taking the GPU (0.25 GPU per trial)")


def test_the_packing_discount_decides_a_close_call():
    # linear packing: 4 / 0.5 = 8 rounds/s > 7 on the CPUs; discounted by half: 4 < 7
    assert probe.decide(cpu_s=1.0, gpu_s=0.5, cpus=7, gpus=1, cpus_per_trial=1, efficiency=1.0)[0] == 0.25
    assert probe.decide(cpu_s=1.0, gpu_s=0.5, cpus=7, gpus=1, cpus_per_trial=1)[0] == 0.0


def test_gpu_trials_hold_their_cpus_too():
    # 8 CPUs at 4 per trial: 2 CPU trials (2 rounds/s), and only 2 of the 4 GPU slots can run (2 / 0.2 x 0.5 = 5)
    gpus, text = probe.decide(cpu_s=1.0, gpu_s=0.2, cpus=8, gpus=1, cpus_per_trial=4)
    assert gpus == 0.25 and "CPUs 2 trials x 4 CPU" in text and "GPU 2 trials at 0.2 s/round" in text
    # 4 CPUs at 4 per trial: one trial on each side (1 rounds/s on the CPUs, 1 / 0.6 x 0.5 = 0.83 on the GPU)
    gpus, text = probe.decide(cpu_s=1.0, gpu_s=0.6, cpus=4, gpus=1, cpus_per_trial=4)
    assert gpus == 0.0 and "GPU 1 trials at 0.6 s/round x 0.5 packing = 0.833 rounds/s" in text


def test_more_gpus_pack_more_trials():
    _, text = probe.decide(cpu_s=1.0, gpu_s=1.0, cpus=64, gpus=2, cpus_per_trial=1)
    assert "GPU 8 trials" in text and "CPUs 64 trials" in text


# ---------------------------------------------------------------------------- the record and --resume
def _measured(cpu_s=1.0, gpu_s=0.1):
    calls = []

    def measured():
        calls.append(1)
        return cpu_s, gpu_s
    return measured, calls


def test_the_choice_is_recorded_and_reused_on_resume(tmp_path):
    lines = []
    measured, calls = _measured()
    gpus = probe.auto_gpus(tmp_path, False, {"CPU": 2.0, "GPU": 1.0}, 1.0, measured, say=lines.append)
    assert gpus == 0.25 and len(calls) == 1 and lines[0].endswith("taking the GPU (0.25 GPU per trial)")
    record = json.loads((tmp_path / probe.RECORD).read_text())
    assert record["gpus_per_trial"] == 0.25 and record["cpu_s_per_round"] == 1.0 and record["gpu_s_per_round"] == 0.1
    assert record["rule"] == probe.RULE and record["text"] == lines[0] and record["packing_efficiency"] == 0.5
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temp file left

    again, calls_again = _measured(cpu_s=0.01)  # figures that would now take the CPUs
    assert probe.auto_gpus(tmp_path, True, {"CPU": 2.0, "GPU": 1.0}, 1.0, again, say=lines.append) == 0.25
    assert not calls_again and "the choice this sweep recorded in gpu_choice.json" in lines[1]


@pytest.mark.parametrize("content", [None, "{not json", '{"gpus_per_trial": "many"}', '{"gpus_per_trial": -1}', "[]"])
def test_an_absent_or_damaged_record_probes_again(tmp_path, content):
    if content is not None:
        (tmp_path / probe.RECORD).write_text(content)
    assert probe.load_choice(tmp_path) is None
    measured, calls = _measured(cpu_s=0.01)
    assert probe.auto_gpus(tmp_path, True, CLUSTER, 1.0, measured, say=lambda _: None) == 0.0
    assert len(calls) == 1 and probe.load_choice(tmp_path)["gpus_per_trial"] == 0.0


def test_a_new_sweep_probes_even_where_a_record_exists(tmp_path):
    probe.save_choice(tmp_path, {"gpus_per_trial": 0.25})
    measured, calls = _measured(cpu_s=0.01)
    assert probe.auto_gpus(tmp_path, False, CLUSTER, 1.0, measured, say=lambda _: None) == 0.0 and calls


def test_without_a_gpu_in_the_cluster_nothing_is_probed_said_or_written(tmp_path):
    lines = []
    measured, calls = _measured()
    assert probe.auto_gpus(tmp_path, False, {"CPU": 4.0}, 1.0, measured, say=lines.append) == 0.0
    assert not calls and not lines and not (tmp_path / probe.RECORD).exists()


def test_a_failed_probe_takes_the_cpus_and_says_why(tmp_path):
    lines = []
    failed = probe._failed("RuntimeError: CUDA error: out of memory")
    assert probe.auto_gpus(tmp_path, False, CLUSTER, 1.0, failed, say=lines.append) == 0.0
    assert lines == ["[sweep] --gpus-per-trial auto: the GPU probe failed (RuntimeError: CUDA error: out of memory); "
                     "taking the CPUs (0 GPU per trial)"]
    assert probe.load_choice(tmp_path)["probe_error"] == "RuntimeError: CUDA error: out of memory"


# ---------------------------------------------------------------------------- the probe itself
def test_probe_config_on_the_cpu_gives_seconds_per_round():
    seconds = probe.probe_config(tiny(), "cpu")
    assert isinstance(seconds, float) and seconds > 0


def test_probe_config_needs_a_measured_round():
    with pytest.raises(ValueError, match="rounds=1"):
        probe.probe_config(tiny(), "cpu", rounds=1)


def test_without_cuda_the_probe_reports_it_instead_of_running(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(probe, "probe_config", lambda *a, **k: pytest.fail("probed without CUDA"))
    with pytest.raises(probe.ProbeError, match="CUDA is not available to the driver"):
        probe.measure_now(tiny())()


def test_a_probe_that_raises_becomes_a_probe_error(monkeypatch):
    def probe_config(config, device, **_):
        if device == "cuda":
            raise RuntimeError("CUDA error: no kernel image is available")
        return 0.5
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(probe, "probe_config", probe_config)
    with pytest.raises(probe.ProbeError, match="RuntimeError: CUDA error: no kernel image"):
        probe.measure_now(tiny())()


def test_both_devices_are_probed_with_the_drivers_data(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(probe, "probe_config", lambda config, device, data=None: seen.append((device, data)) or 0.5)
    assert probe.measure_now(tiny(), data="the data")() == (0.5, 0.5)
    assert seen == [("cpu", "the data"), ("cuda", "the data")]


# ---------------------------------------------------------------------------- the wiring
def _plan(tmp_path, resume=False):
    config = tiny()
    stage = types.SimpleNamespace(configs=[("first", config), ("second", tiny(seed=1))])
    args = types.SimpleNamespace(resume=resume, cpus_per_trial=1.0)
    return types.SimpleNamespace(stages=[stage], folder=tmp_path, args=args), config


def test_launch_probes_the_first_config_of_the_first_stage_only_for_auto(tmp_path, monkeypatch):
    plan, config = _plan(tmp_path)
    seen = []
    monkeypatch.setattr(probe, "measure_now", lambda c, data: seen.append((c, data)) or (lambda: (1.0, 1.0)))
    assert launch.auto_probe(plan, 0.5, {}) is None and not seen
    measured = launch.auto_probe(plan, "auto", {config.data_key(): "loaded"})
    assert seen == [(config, "loaded")] and measured() == (1.0, 1.0)


def test_launch_reuses_a_recorded_choice_on_resume_without_probing(tmp_path, monkeypatch):
    plan, _ = _plan(tmp_path, resume=True)
    monkeypatch.setattr(probe, "measure_now", lambda *a: pytest.fail("probed on resume"))
    probe.save_choice(tmp_path, {"gpus_per_trial": 0.0})
    assert launch.auto_probe(plan, "auto", {}) is None
    assert probe.auto_gpus(tmp_path, True, CLUSTER, 1.0, None, say=lambda _: None) == 0.0


def test_gpu_sharing_uses_no_gpu_when_the_probe_takes_the_cpus(tmp_path):
    # before Ray, auto is assumed to pack (a daemon may start); once the probe took the CPUs, nothing is shared
    choose = gpu_sharing.chooser("auto", own_ray=True)
    gpus = probe.auto_gpus(tmp_path, False, CLUSTER, 1.0, _measured(cpu_s=0.01)[0], say=lambda _: None)
    request = resources.resolve(1.0, gpus, CLUSTER)
    sharing = choose(request.gpus, has_gpus=True)
    assert request.gpus == 0.0 and sharing.mode == "" and not sharing.own_daemon
    with pytest.raises(SweepError, match="the trials use no GPU"):  # an explicit mps then has nothing to share
        gpu_sharing.chooser("mps", own_ray=True)(request.gpus, has_gpus=True)


def test_resolve_takes_a_decided_number():
    with pytest.raises(TypeError, match="decide auto first"):
        resources.resolve(1.0, "auto", CLUSTER)
    assert resources.resolve(1.0, 0.25, CLUSTER).gpus == 0.25
    with pytest.raises(SweepError, match="has no GPU"):
        resources.resolve(1.0, 0.25, {"CPU": 4.0})


def test_launch_resolves_auto_through_the_probe_and_numbers_as_given(tmp_path, capsys):
    plan, _ = _plan(tmp_path)
    fast_gpu = _measured(cpu_s=1.0, gpu_s=0.01)[0]
    assert launch.trial_resources(plan, "auto", fast_gpu, CLUSTER).gpus == 0.25
    assert "taking the GPU (0.25 GPU per trial)" in capsys.readouterr().out
    assert launch.trial_resources(plan, "auto", fast_gpu, {"CPU": 4.0}).gpus == 0.0  # no GPU: no probe, no line
    assert launch.trial_resources(plan, 0.5, None, CLUSTER).gpus == 0.5
    assert capsys.readouterr().out == ""
