"""The masked-averaging primitive and GradSelect's entry selection, against hand computations."""
import pytest
import torch

from fl_core.masks import grow_count, mask_iou, masked_average, personal_fraction, select_largest


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
