"""Cost model (pure functions) and the "auto" draft-length controller."""
import pytest

from ortspec.controller import AutoController
from ortspec.costmodel import best_gamma, expected_tokens, predicted_speedup, target_cost


def test_expected_tokens():
    assert expected_tokens([], 0) == 1.0
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.8], 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)  # unmeasured positions reuse the last


def test_target_cost_extrapolates_linearly():
    assert target_cost([1.0, 1.2], 1) == 1.0
    assert target_cost([1.0, 1.2], 4) == pytest.approx(1.6)


def test_speedup_and_best_gamma():
    costs = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]
    # perfect free draft: gamma tokens + bonus per pass
    assert predicted_speedup([1.0] * 4, 4, 0.0, costs) == pytest.approx(5 / 1.2)
    g, s = best_gamma([0.9] * 8, 0.1, costs, 8)
    assert 3 <= g <= 8 and s > 1.5
    assert best_gamma([0.2] * 8, 0.9, costs, 8) == (0, 1.0)  # nothing pays: target only


class FakeLM:
    def __init__(self):
        self.run_time_s = 0.0


def test_auto_controller_learns_and_pauses():
    target, draft = FakeLM(), FakeLM()
    ctl = AutoController(8, {"target_costs": [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4],
                             "draft_cost": 0.1, "alphas": [0.95] * 8}, target, draft)
    first = ctl.choose()
    assert first >= 4
    choices = []
    for _ in range(120):  # drafts keep failing at the first position and each draft step costs 0.9 target steps
        g = ctl.choose()
        choices.append(g)
        target.run_time_s += 1.0
        draft.run_time_s += 0.9 * g
        ctl.update(g, 0)
    late = choices[40:]
    assert late.count(0) > 0.7 * len(late)     # mostly target-only once it has learned
    assert any(g > 0 for g in late)            # but it probes again now and then
