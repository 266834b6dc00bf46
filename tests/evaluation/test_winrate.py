"""Win-rate arithmetic and its confidence interval against hand-computed numbers."""

import math

import pytest

from rlhfkit.evaluation import Outcome, Verdict, WinRate, format_report, tally, win_rate_interval

Z = 1.959963984540054  # NormalDist().inv_cdf(0.975)


def verdicts(wins=0, ties=0, losses=0, malformed=()):
    return (
        [Verdict(Outcome.A)] * wins
        + [Verdict(Outcome.TIE)] * ties
        + [Verdict(Outcome.B)] * losses
        + [Verdict(Outcome.MALFORMED, raw) for raw in malformed]
    )


def test_rates_count_ties_as_half_and_exclude_malformed():
    w = tally(verdicts(wins=6, ties=2, losses=2, malformed=["?", "maybe", "2", "x"]), "j")
    assert (w.wins, w.ties, w.losses, w.malformed, w.judged, w.total) == (6, 2, 2, 4, 10, 14)
    assert w.rate == pytest.approx((6 + 2 / 2) / 10)  # 0.7: malformed are not in the denominator
    assert w.baseline_rate == pytest.approx((2 + 2 / 2) / 10)  # 0.3
    assert w.rate + w.baseline_rate == pytest.approx(1.0)
    assert w.decisive_rate == pytest.approx(6 / 8)
    assert w.malformed_examples == ("?", "maybe", "2")  # the first three, in order


def test_interval_without_ties_is_agresti_coull():
    # 7 wins of 10: n~ = 10 + z^2 = 13.8415, p~ = (7 + z^2/2) / n~ = 8.9207 / 13.8415 = 0.64449,
    # half = z * sqrt(p~ (1 - p~) / n~) = 1.96 * sqrt(0.64449 * 0.35551 / 13.8415) = 0.25217.
    low, high = win_rate_interval(7, 0, 3)
    assert low == pytest.approx(0.64449 - 0.25217, abs=1e-4)  # 0.3923, as in Agresti & Coull's tables
    assert high == pytest.approx(0.64449 + 0.25217, abs=1e-4)  # 0.8967
    # The textbook formula at full precision.
    n_aug = 10 + Z**2
    p_aug = (7 + Z**2 / 2) / n_aug
    half = Z * math.sqrt(p_aug * (1 - p_aug) / n_aug)
    assert (low, high) == pytest.approx((p_aug - half, p_aug + half))


def test_interval_of_all_ties_is_centred_and_not_degenerate():
    # 32 ties: pseudo-counts c = z^2/2 = 1.92073 win and loss, n~ = 35.8415, mean 0.5,
    # var = 2c * 0.25 / n~ = 0.026795, half = z * sqrt(var / n~) = 1.96 * 0.027342 = 0.053589.
    low, high = win_rate_interval(0, 32, 0)
    assert low == pytest.approx(0.5 - 0.053589, abs=1e-5)
    assert high == pytest.approx(0.5 + 0.053589, abs=1e-5)


def test_interval_with_ties_uses_the_scores_variance():
    # 2 wins, 1 tie, 1 loss: c = 1.92073, n~ = 7.84146, up = 3.92073, down = 2.92073,
    # mean = (3.92073 + 0.5) / 7.84146 = 0.56376,
    # var = (3.92073 * 0.43624^2 + 1 * 0.06376^2 + 2.92073 * 0.56376^2) / 7.84146 = (0.74615 + 0.00407 + 0.92828) / 7.84146
    #     = 0.21406, half = 1.96 * sqrt(0.21406 / 7.84146) = 1.96 * 0.16522 = 0.32383.
    low, high = win_rate_interval(2, 1, 1)
    assert low == pytest.approx(0.56376 - 0.32383, abs=1e-4)
    assert high == pytest.approx(0.56376 + 0.32383, abs=1e-4)
    # Many ties shrink the interval compared with the same rate from decisive verdicts only.
    assert win_rate_interval(38, 211, 7)[1] - win_rate_interval(38, 211, 7)[0] < 0.06
    assert win_rate_interval(143, 0, 113)[1] - win_rate_interval(143, 0, 113)[0] > 0.11  # 143.5/256 ~ same rate


def test_interval_is_clipped_at_the_bounds_and_nan_when_empty():
    assert win_rate_interval(10, 0, 0) == pytest.approx((0.67911, 1.0), abs=1e-5)
    low, high = win_rate_interval(0, 0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.67911, abs=1e-5)
    assert all(math.isnan(x) for x in win_rate_interval(0, 0, 0))
    assert win_rate_interval(7, 0, 3, confidence=0.99)[0] < win_rate_interval(7, 0, 3)[0]


def test_position_bias_counts_only_decisive_ordered_verdicts():
    vs = [
        Verdict(Outcome.A, "0", a_shown_first=True),  # picked the first shown
        Verdict(Outcome.B, "0", a_shown_first=False),  # picked the first shown (B)
        Verdict(Outcome.A, "1", a_shown_first=False),  # picked the second shown
        Verdict(Outcome.MALFORMED, "?", a_shown_first=True),
        Verdict(Outcome.TIE, "identical"),
    ]
    w = tally(vs, "j")
    assert (w.first_shown_picks, w.first_shown_decisive) == (2, 3)


def test_report_says_what_the_rate_is_over():
    text = format_report(tally(verdicts(wins=6, ties=2, losses=2, malformed=["the second one"]), "openai:m"))
    assert text.splitlines()[0] == "Model win rate: 70.00%"  # TRL's judge_tldr.py line
    assert "wins 6, ties 2, losses 2" in text
    assert "baseline win rate: 30.00%" in text
    assert "decisive-only win rate: 75.00% of 8" in text
    assert "malformed verdicts: 1 of 11" in text and "'the second one'" in text
    assert "10 well-formed" in text


def test_report_when_every_verdict_is_malformed_or_a_tie():
    empty = format_report(tally(verdicts(malformed=["??"]), "openai:m"))
    assert empty.startswith("Model win rate: n/a") and "'??'" in empty
    ties = format_report(tally(verdicts(ties=4), "task"))
    assert "Model win rate: 50.00%" in ties and "n/a (every verdict was a tie)" in ties
    assert math.isnan(WinRate("j", 0, 0, 4).decisive_rate)
