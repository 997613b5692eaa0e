"""FedL2P's components against the authors' code (github.com/royson/fedl2p), pinned.

The numbers below are what the authors' functions computed, run unmodified from commit
fe1944e98f4c60c9dd9f4e1b36d94cd13afc57ee on the tiny fixture of benchmarks/parity/fedl2p_setup.py
(LeNet-BN at width 0.5, 40 synthetic training and 16 validation images, seed 0, float64):

    .venv/bin/python -m benchmarks.parity.fedl2p --ref <checkout> --learn2learn <learn2learn-0.1.7 source> --pins

their KLDBatchNorm2d (BN mixing), precompute_kld / precompute_feat_stats (meta-net inputs), BNNet /
ClampLRNet (initial weights, forward, gradient), Hypergrad (IFT, Q = 3, psi = 0.1) and meta_train
(one meta step: A = LRNet only with beta = 0, B = BatchNorm on the input, both meta-nets, full
batches; IFT and FOMAML+). Per tensor: its sum and its sum of squares. These tests rerun ours on
the same inputs, with the authors' estimators and look-ahead where ours departs by design, and
need no checkout.
"""
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

REFERENCE = {
    'mixing batch': [
        9.857406397708361, 2.968143656638979, 0.09212688627338778, 0.07519407191084837
    ],
    'mixing client': [
        7.0768202642259475, 1.6198526476849047, -0.2552087351052682, 0.033312116987553486
    ],
    'features': [
        0.6417005032025083, 0.20597404665455038, 11.976429136927388, 14.047731937463888
    ],
    'metanets': [
        -0.14232592930598797, 0.041529047138780605, 50.0, 25.0, -0.012817812732715095, 1.0189319899798996, 50.0,
        25.0, 0.0145571086899811, 0.04032138756322812, 1.0, 0.5, 1.0086588268942935, 0.5510123961671578,
        2.2263809859621415, 9.008560705694983, 0.011565005662563934, 0.00048595986037037504, 40.64740075003219,
        22.279401185873635, 0.3947732301001021, 0.07881760339987759, 128.76006105769835, 111.74762427936007,
        2.6835586042582116, 4.330737474641472, 0.2590812750707253, 0.26906653503168537, 100.0, 100.0,
        -1.224723284760882, 1.0084638123939131, 100.0, 100.0, 0.6387988924355086, 0.23856693621784247, 14.0, 14.0,
        14.81748952201971, 16.361416451021352, -143.60833374621123, 1061.509361875504, -0.039969713872787554,
        0.0008396051773901296, 211.11942539734457, 1997.7490756272805, 0.3105090206547246, 0.14622285262529258,
        0.5004332257549207, 2743.626165790613, 0.004552787311056683, 11.819890282428995
    ],
    'hypergradient': [
        0.00020210111131794065, 6.103763305486483e-05, 0.0003149461630609987, 0.00029633652417012583,
        0.40773514427514207, 0.7131194176265371, 0.008166487580361842, 0.028603268763258666, 85.88659142375027,
        37.248863410317, 1.7057268906427088, 1.4549483639406102, -0.0005671115902720519, 1.5704306459034404e-07,
        -4.735231042477046e-05, 1.1179246962388691e-08, 0.09900326794699404, 0.0001638383005219111,
        0.0009895688779811762, 1.632598247772231e-06, -1.9351551334926849, 0.007435507673014175,
        -0.019365395544004894, 7.370735224273039e-05, -1.842560232063498, 0.64467574084554
    ],
    'meta step A ift': [
        -2.152207763448597e-05, 2.6669635824772813e-10, -1.7970362777841586e-06, 1.8985011916768796e-11,
        0.005249921325398863, 2.1986286617255515e-07, 5.234765020734056e-05, 2.17958222812656e-09,
        0.03371284283756168, 1.227269569620333e-05, 0.0003365146993244972, 1.2115500682915277e-07,
        -7.2560762878447205e-06, 5.259003928186702e-08, 2.2397104726945525
    ],
    'meta step A fomaml': [
        -1.3838136844010238e-06, 1.7665306765341616e-13, -1.1554476497810384e-07, 1.25752020688849e-14,
        0.00021975726154299896, 1.57777468858427e-10, 2.1912283149072564e-06, 1.5641066321677134e-12,
        0.001273686264875084, 9.887967770139721e-09, 1.2713675691555792e-05, 9.761317581710004e-11,
        0.00012721698954333907, 1.0282879510488096e-08, 2.2397104726945525
    ],
    'meta step B ift': [
        3.6537131975509845e-06, 1.1604835770807469e-11, 1.2378088855458103e-05, 1.3319173702693088e-10,
        -0.008986873070174952, 2.8576387996448786e-07, -0.00017992981230918748, 1.145406696794064e-08,
        -0.035779147249312575, 1.2946304579970323e-05, -0.0007271886921256243, 5.28803393955376e-07,
        9.072583837273812e-07, 1.1529321086022557e-11, 1.7799208851254633e-07, 2.010051906585114e-12,
        0.0005992561662330949, 1.7883413117196555e-08, 5.978932893335731e-06, 1.778140511134757e-10,
        -0.009915760035364509, 8.885037634788094e-07, -9.866124341839644e-05, 8.716475255694644e-09,
        -0.00015277233020527525, 1.0811107943652405e-08, 2.3905455391809136
    ],
    'meta step B fomaml': [
        -2.7099951784939646e-07, 6.384209459522567e-14, -9.180950805709465e-07, 7.327324265837816e-13,
        0.0006665652549132854, 1.5720829675554828e-09, 1.3345571954981317e-05, 6.301266483292847e-11,
        0.002653774702345412, 7.122196453059383e-08, 5.3936303779034134e-05, 2.909124865344252e-09,
        -1.0789681761406167e-07, 1.2623883981133535e-13, -2.1167927410914444e-08, 2.2008808589649715e-14,
        -6.420205016148891e-05, 1.953239798601734e-10, -6.405603661940873e-07, 1.9420984076342662e-12,
        0.0010568368944194534, 9.679375812902223e-09, 1.0515466461580303e-05, 9.495743657138451e-11,
        9.852233589366724e-05, 8.294017835634594e-09, 2.3905455391809136
    ],
}


@pytest.fixture(scope="module")
def parity():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "parity" / "fedl2p.py"
    spec = importlib.util.spec_from_file_location("parity_fedl2p", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["parity_fedl2p"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield module, module.tiny_fixture(0)
    finally:
        torch.set_default_dtype(dtype)


def assert_close_to_reference(name: str, ours: list[float], tol: float = 1e-6):
    """Per tensor (sum, sum of squares): within `tol` of the reference, relative to the tensor's
    norm (a sum may cancel to near 0); a trailing odd value (a loss) relative to itself."""
    theirs = REFERENCE[name]
    assert len(ours) == len(theirs), name
    for i in range(0, len(theirs) - 1, 2):
        total, squares = theirs[i], theirs[i + 1]
        assert abs(ours[i] - total) <= tol * max(abs(total), math.sqrt(squares), 1e-300), (name, i)
        assert abs(ours[i + 1] - squares) <= tol * max(squares, 1e-300), (name, i + 1)
    if len(theirs) % 2:
        assert ours[-1] == pytest.approx(theirs[-1], rel=tol), name


def test_bn_mixing_matches_their_kld_batchnorm(parity):
    module, fix = parity
    for source in ("batch", "client"):
        name = f"mixing {source}"
        assert_close_to_reference(name, [v for t in module.mixing(fix, source)
                                         for v in (float(t.sum()), float((t * t).sum()))])


def test_meta_net_inputs_match_theirs_with_their_estimators_and_differ_slightly_with_ours(parity):
    module, fix = parity
    kl, stats = module.features(fix)
    assert_close_to_reference("features", [float(kl.sum()), float((kl * kl).sum()),
                                           float(stats.sum()), float((stats * stats).sum())])
    # ours by default: population variances, no eps in the SD (a documented departure of ~1/n)
    kl_pop, stats_pop = module.features(fix, estimators="ours")
    for ref, pop in ((kl, kl_pop), (stats, stats_pop)):
        gap = float((ref - pop).abs().max() / ref.abs().max())
        assert 1e-6 < gap < 5e-4


def test_meta_nets_init_forward_and_gradient_match_theirs(parity):
    module, fix = parity
    tensors = module.metanet_forwards(fix, scale=300.0)  # past the clamps: their STE gradient too
    assert_close_to_reference("metanets", [v for t in tensors for v in (float(t.sum()), float((t * t).sum()))])


def test_ift_hypergradient_matches_their_hypergrad(parity):
    module, fix = parity
    tensors = module.hypergradient(fix)
    assert_close_to_reference("hypergradient", [v for t in tensors for v in (float(t.sum()), float((t * t).sum()))])


@pytest.mark.parametrize("setting,meta_grad", [("A", "ift"), ("A", "fomaml"), ("B", "ift"), ("B", "fomaml")])
def test_one_meta_step_matches_their_meta_train(parity, setting, meta_grad):
    module, fix = parity
    fix = module.fixture_for(fix, setting)
    delta, val_loss, _ = module.meta_step_of(fix, setting, meta_grad, "first_order")
    summary = [v for t in delta for v in (float(t.sum()), float((t * t).sum()))] + [val_loss]
    assert_close_to_reference(f"meta step {setting} {meta_grad}", summary)


def test_the_exact_look_ahead_departs_from_their_first_order_one_for_bnnet(parity):
    """Our default (the paper's Eq. 10, the look-ahead gradient differentiated) moves BNNet
    otherwise than the authors' first-order step: the reason `lookahead` exists."""
    module, fix = parity
    fix = module.fixture_for(fix, "B")
    exact, _, _ = module.meta_step_of(fix, "B", "ift", "exact")
    first, _, _ = module.meta_step_of(fix, "B", "ift", "first_order")
    bnnet = slice(0, 6)  # BNNet's three weights and biases come first
    assert max(module.rel(e, f) for e, f in zip(exact[bnnet], first[bnnet])) > 0.01
