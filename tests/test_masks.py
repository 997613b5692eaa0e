"""The masked-averaging primitive, GradSelect's entry selection (against hand computations and
against its plain definition), and bit-packed masks."""
import numpy as np
import pytest
import torch

from fl_core import client_state, masks
from fl_core.masks import (Inverted, PackedMask, grow_count, mask_iou, masked_average, pack_bits, personal_fraction,
                            select_largest, select_largest_reference, unpack_bits, zero_where)


def test_masked_average_matches_hand_computation():
    previous = {"w": torch.tensor([10.0, 20.0, 30.0, 40.0])}
    states = [{"w": torch.tensor([1.0, 2.0, 3.0, 4.0])},
              {"w": torch.tensor([5.0, 6.0, 7.0, 8.0])},
              {"w": torch.tensor([9.0, 10.0, 11.0, 12.0])}]
    # True = the client sends that entry. Entry 3 is sent by nobody.
    contributes = [{"w": torch.tensor([True, True, False, False])},
                   {"w": torch.tensor([True, False, True, False])},
                   None]  # client 2 sends all... except it is overridden below for entry 3
    contributes[2] = {"w": torch.tensor([True, False, False, False])}
    weights = [0.5, 0.25, 0.25]
    out = masked_average(previous, states, contributes, weights, ["w"])["w"]
    expected = torch.tensor([
        (0.5 * 1 + 0.25 * 5 + 0.25 * 9) / 1.0,   # everyone
        2.0,                                      # only client 0
        7.0,                                      # only client 1
        40.0,                                     # nobody: previous value stays
    ])
    assert torch.allclose(out, expected)


def test_masked_average_none_means_whole_tensor_and_weights_normalise():
    previous = {"a": torch.zeros(2), "b": torch.zeros(1)}
    states = [{"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([2.0])},
              {"a": torch.tensor([3.0, 5.0]), "b": torch.tensor([4.0])}]
    out = masked_average(previous, states, [None, {"a": torch.tensor([True, False])}], [1.0, 3.0], ["a", "b"])
    assert torch.allclose(out["a"], torch.tensor([(1 + 9) / 4, 3.0]))
    assert torch.allclose(out["b"], torch.tensor([(2 + 12) / 4]))


@pytest.mark.parametrize("clients", [1, 2, 3, 5, 7, 13])
def test_sparse_states_average_by_counts_bit_for_bit(clients):
    """With states zero outside their masks and equal weights, `zero_outside=True` reads the weight
    sum from a count of contributors; it must be the general path's float sums to the last bit
    (and where nobody contributes, the previous value)."""
    g = torch.Generator().manual_seed(clients)
    shape = (37, 29)
    sent = [torch.rand(shape, generator=g) < 0.6 for _ in range(clients)]
    states = [{"w": torch.randn(shape, generator=g) * m} for m in sent]
    previous = {"w": torch.randn(shape, generator=g)}
    weights = [1.0 / clients] * clients
    general = masked_average(previous, states, [{"w": m} for m in sent], weights, ["w"])["w"]
    counted = masked_average(previous, states, [{"w": m} for m in sent], weights, ["w"], zero_outside=True)["w"]
    assert torch.equal(general.view(torch.int32), counted.view(torch.int32))
    nobody = ~torch.stack(sent).any(0)
    assert torch.equal(counted[nobody], previous["w"][nobody])
    if clients > 1:  # unequal weights take the general path, with the same result
        uneven = [float(k + 1) for k in range(clients)]
        assert torch.equal(masked_average(previous, states, [{"w": m} for m in sent], uneven, ["w"],
                                          zero_outside=True)["w"],
                           masked_average(previous, states, [{"w": m} for m in sent], uneven, ["w"])["w"])


def test_select_largest_takes_exactly_count_of_the_largest_free_entries():
    delta = torch.tensor([[0.1, -0.9, 0.5], [0.7, 0.0, -0.3]])
    personal = torch.tensor([[False, True, False], [False, False, False]])  # -0.9 is already personal
    new = select_largest(delta, personal, 2)
    assert new.tolist() == [[False, True, True], [True, False, False]]
    assert personal.tolist() == [[False, True, False], [False, False, False]]  # input untouched


def test_select_largest_breaks_ties_by_index_and_never_overshoots():
    delta = torch.zeros(10)  # e.g. taps that got no gradient: all tied at 0
    new = select_largest(delta, torch.zeros(10, dtype=torch.bool), 3)
    assert new.tolist() == [True] * 3 + [False] * 7
    again = select_largest(delta, new, 2)
    assert again.tolist() == [True] * 5 + [False] * 5


def test_select_largest_with_ties_included_takes_the_whole_tied_block():
    delta = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2])
    new = select_largest(delta, torch.zeros(5, dtype=torch.bool), 2, include_ties=True)
    assert new.tolist() == [True, True, True, True, True]


def test_select_largest_caps_at_the_free_entries():
    personal = torch.tensor([True, False, True])
    assert select_largest(torch.ones(3), personal, 5).all()


@pytest.mark.parametrize("numel,fraction,expected", [(10, 0.25, 2), (10, 0.35, 4), (3, 1.0, 3), (7, 0.0, 0)])
def test_grow_count_rounds(numel, fraction, expected):
    assert grow_count(numel, fraction) == expected


def test_iou_and_fraction():
    a = {"w": torch.tensor([True, True, False, False])}
    b = {"w": torch.tensor([True, False, True, False])}
    assert mask_iou(a, b) == pytest.approx(1 / 3)
    assert mask_iou(a, a) == 1.0
    assert personal_fraction(a, {"w": 4, "bias": 4}) == pytest.approx(2 / 8)


# ---------------------------------------------------------------------- the fast selection path
def _random_case(seed: int, shape, tie_heavy: bool):
    g = torch.Generator().manual_seed(seed)
    delta = torch.randn(shape, generator=g)
    if tie_heavy:  # many exact zeros (taps without gradient) and a few repeated magnitudes
        delta = torch.where(torch.rand(shape, generator=g) < 0.6, torch.zeros(shape), delta)
        delta = torch.where(torch.rand(shape, generator=g) < 0.2, torch.full(shape, -0.5), delta)
        delta = torch.round(delta * 4) / 4
    personal = torch.rand(shape, generator=g) < torch.rand((), generator=g) * 0.8
    return delta, personal


@pytest.fixture(params=["radix everywhere", "radix above the size cut"])
def radix_min(request, monkeypatch):
    """Run a test with the radix path for every tensor size, and with the shipped size cut."""
    if request.param == "radix everywhere":
        monkeypatch.setattr(masks, "RADIX_MIN_NUMEL", 0)


@pytest.mark.parametrize("tie_heavy", [False, True])
@pytest.mark.parametrize("include_ties", [False, True])
def test_fast_selection_equals_the_reference(tie_heavy, include_ties, radix_min):
    shapes = [(7,), (3, 5), (64, 3, 3, 3), (300, 700), (70001,)]  # 70001: several blocks, ragged tail
    for seed, shape in enumerate(shapes * 3):
        delta, personal = _random_case(seed, shape, tie_heavy)
        free = int((~personal).sum())
        for count in sorted({0, 1, 2, free // 7, free // 2, max(free - 1, 0), free, free + 3}):
            fast = select_largest(delta, personal, count, include_ties=include_ties)
            ref = select_largest_reference(delta, personal, count, include_ties=include_ties)
            assert fast.dtype == torch.bool and fast.shape == personal.shape
            assert torch.equal(fast, ref), (shape, count, tie_heavy)
            if not include_ties:
                assert int(fast.sum()) == int(personal.sum()) + min(count, free)


def test_fast_selection_on_extreme_values(radix_min):
    delta = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 3.4e38, 0.0, 2.0, -2.0])
    personal = torch.zeros(10, dtype=torch.bool)
    for count in range(11):
        assert torch.equal(select_largest(delta, personal, count), select_largest_reference(delta, personal, count))
    # float64 scores take the reference path and give its answer
    d64 = delta.to(torch.float64)
    assert torch.equal(select_largest(d64, personal, 4), select_largest_reference(d64, personal, 4))


# ---------------------------------------------------------------------- bit-packed masks at rest
def test_pack_bits_is_numpy_packbits_and_round_trips():
    g = torch.Generator().manual_seed(0)
    for shape in [(1,), (8,), (13,), (4, 3, 3), (0,), (2, 0)]:
        m = torch.rand(shape, generator=g) < 0.5
        packed = pack_bits(m)
        assert packed.dtype == torch.uint8
        assert packed.numpy().tobytes() == np.packbits(m.numpy().reshape(-1)).tobytes()
        back = unpack_bits(packed, shape)
        assert back.dtype == torch.bool and torch.equal(back, m)
        # the tensor-op versions (used on GPUs) give the same bytes and bools
        assert torch.equal(client_state._pack_torch(m.reshape(-1)), packed)
        assert torch.equal(client_state._unpack_torch(packed, m.numel()).reshape(shape), m)
        assert client_state._popcount(packed) == int(m.sum())


def test_packed_mask_behaves_like_a_dict_of_bool_tensors():
    g = torch.Generator().manual_seed(1)
    plain = {"a.weight": torch.rand(5, 3, generator=g) < 0.3, "b.weight": torch.rand(17, generator=g) < 0.5}
    mask = PackedMask(plain)
    assert list(mask) == list(plain) and len(mask) == 2 and "a.weight" in mask and "x" not in mask
    assert mask.get("x") is None
    assert all(torch.equal(mask[n], m) and mask[n].dtype == torch.bool for n, m in plain.items())
    assert mask == plain and mask == PackedMask(plain) and mask != {"a.weight": plain["a.weight"]}
    inverted = {n: ~m for n, m in mask.items()}
    assert torch.equal(inverted["b.weight"], ~plain["b.weight"])
    copy = mask.copy()
    mask["a.weight"] = torch.ones(5, 3, dtype=torch.bool)  # assignment packs; the copy is independent
    assert bool(mask["a.weight"].all()) and torch.equal(copy["a.weight"], plain["a.weight"])
    assert mask.count("b.weight") == int(plain["b.weight"].sum())
    # an in-place edit of a read tensor is folded back into the bits at the mask's next use ...
    mask["b.weight"].view(-1)[:3] = True
    edited = plain["b.weight"].clone()
    edited[:3] = True
    assert mask.count("b.weight") == int(edited.sum()) and torch.equal(mask["b.weight"], edited)
    # ... after which the mask has let go of it (at rest it holds bits only)
    late = mask["b.weight"]
    assert mask.count("b.weight") == int(edited.sum()) and not mask._out  # let go at this use
    late[:] = False  # too late: not seen
    assert torch.equal(mask["b.weight"], edited)
    mask["b.weight"] = plain["b.weight"]
    assert personal_fraction(mask, {"a.weight": 15, "b.weight": 17}) == pytest.approx(
        (15 + int(plain["b.weight"].sum())) / 32)
    del mask["a.weight"]
    assert list(mask) == ["b.weight"]


def test_client_state_packs_masks_and_round_trips_through_torch_save(tmp_path):
    from fl_core.algorithms.fedselect import FedSelectExtras
    from fl_core.client_state import ClientState

    state = {"w": torch.randn(4, 4)}
    plain = {"w": torch.randn(4, 4) > 0}
    client = ClientState(state=state, mask=plain, extra=FedSelectExtras(fraction=0.25))
    assert isinstance(client.mask, PackedMask) and client.mask == plain
    client.mask = {"w": torch.zeros(4, 4, dtype=torch.bool)}  # assignment after construction packs too
    assert isinstance(client.mask, PackedMask) and not client.mask["w"].any()
    client.mask = plain
    assert ClientState(state=state).mask is None
    torch.save(client.to_dict(), tmp_path / "c.pt")
    back = ClientState.from_dict(torch.load(tmp_path / "c.pt", weights_only=True), FedSelectExtras)
    assert back.mask == client.mask and torch.equal(back.state["w"], state["w"])
    assert isinstance(back.extra, FedSelectExtras) and back.extra.to_dict() == {"fraction": 0.25}
    # a state written with plain bool masks (before masks were packed) still loads
    legacy = ClientState.from_dict({"state": state, "mask": plain, "extra": {}})
    assert legacy.mask == plain


def test_a_method_keeps_its_client_state_in_declared_fields_only():
    """ClientExtras: a method's per-client state is a dataclass (Algorithm.Extras); a name it does
    not declare is an error, in code and in a saved state, and unset fields are not saved."""
    from fl_core.algorithms.fedselect import FedSelectExtras
    from fl_core.client_state import ClientState

    extra = FedSelectExtras(fraction=0.5)
    with pytest.raises(AttributeError):
        extra.fracton = 0.1  # a typo is not a new key
    assert extra.to_dict() == {"fraction": 0.5}  # next_mask unset: not written
    copy = extra.copy()
    copy.fraction = 0.75
    assert extra.fraction == 0.5
    with pytest.raises(ValueError, match=r"holds \['scaffold_c'\], which FedSelectExtras does not declare "
                                         r"\(fields: fraction, next_mask\)"):
        ClientState.from_dict({"state": {}, "mask": None, "extra": {"scaffold_c": {}}}, FedSelectExtras)


def test_zero_where_is_its_torch_definition_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(70000, generator=g)
    # NaN, infs, zeros, a subnormal
    values[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, -1e-40])
    mask = torch.rand(70000, generator=g) < 0.4
    zeroed, reference = zero_where(values, mask), values.masked_fill(mask, 0.0)
    assert torch.equal(zeroed.view(torch.int32), reference.view(torch.int32))  # the bits, signs of zero included
    assert values[0].isnan()  # the input is left as it was
    half = values.to(torch.float16)  # other dtypes take masked_fill itself
    assert torch.equal(zero_where(half, mask).view(torch.int16), half.masked_fill(mask, 0.0).view(torch.int16))


def test_inverted_reads_each_inverse_when_asked_from_a_packed_mask():
    mask = PackedMask({"a": torch.tensor([True, False, True]), "b": torch.zeros(2, 2, dtype=torch.bool)})
    sent = Inverted(mask)
    assert list(sent) == ["a", "b"] and len(sent) == 2 and "a" in sent and sent.get("c") is None
    assert torch.equal(sent["a"], torch.tensor([False, True, False])) and bool(sent["b"].all())
    mask["a"] = torch.tensor([False, False, True])  # read anew: it follows the mask
    assert torch.equal(sent["a"], torch.tensor([True, True, False]))
