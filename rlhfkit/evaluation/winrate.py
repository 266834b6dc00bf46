"""Win rates from pairwise verdicts, with a confidence interval, and their text report.

Convention: win rate = (wins + ties / 2) / judged, where judged = wins + ties + losses (malformed verdicts are
counted and reported but excluded). A tie is half a win, so 50% means "no better than the baseline" and the model's
and the baseline's rates add up to 100%. TRL's judges never tie, so there the two conventions agree. The
decisive-only rate wins / (wins + losses) is reported too: it says who wins when the judge tells them apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from .judges import Outcome, Verdict

MAX_MALFORMED_EXAMPLES = 3


def win_rate_interval(wins: int, ties: int, losses: int, confidence: float = 0.95) -> tuple[float, float]:
    """Confidence interval of (wins + ties/2) / n, n = wins + ties + losses; (nan, nan) when n == 0.

    Agresti-Coull, extended to ties: add z^2/2 pseudo-wins and z^2/2 pseudo-losses, then take the normal interval
    m +- z * sqrt(var / n~) of the mean score m of the n~ = n + z^2 augmented verdicts (win 1, tie 1/2, loss 0),
    var being their variance. Without ties this is exactly the Agresti-Coull interval for a proportion.
    Why: the pseudo-counts keep the interval from collapsing to zero width at 0%, 50%-all-ties or 100% on small
    evaluations; and using the scores' own variance keeps it honest when most verdicts are ties, where a binomial
    interval on wins + ties/2 (variance p(1-p)) overstates the variance several-fold (README, "Evaluation").
    """
    n = wins + ties + losses
    if n == 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    pseudo = z * z / 2
    up, down, n_aug = wins + pseudo, losses + pseudo, n + 2 * pseudo
    mean = (up + ties / 2) / n_aug
    var = (up * (1 - mean) ** 2 + ties * (0.5 - mean) ** 2 + down * mean**2) / n_aug
    half = z * math.sqrt(var / n_aug)
    return max(0.0, mean - half), min(1.0, mean + half)


@dataclass(frozen=True)
class WinRate:
    """Counts of one judge's verdicts on model (A) vs baseline (B), and the rates derived from them.

    first_shown_picks / first_shown_decisive: among decisive verdicts of judges that show the completions in an
    order (LLMs), how often the judge picked the one shown first (position bias; 50% = none).
    """

    judge: str
    wins: int
    losses: int
    ties: int
    malformed: int = 0
    malformed_examples: tuple[str, ...] = ()
    first_shown_picks: int = 0
    first_shown_decisive: int = 0
    confidence: float = 0.95

    @property
    def judged(self) -> int:
        """Well-formed verdicts: the win rate's denominator."""
        return self.wins + self.losses + self.ties

    @property
    def total(self) -> int:
        return self.judged + self.malformed

    @property
    def rate(self) -> float:
        """The model's win rate, (wins + ties/2) / judged; nan when nothing was judged."""
        return (self.wins + self.ties / 2) / self.judged if self.judged else math.nan

    @property
    def baseline_rate(self) -> float:
        return (self.losses + self.ties / 2) / self.judged if self.judged else math.nan

    @property
    def decisive_rate(self) -> float:
        """wins / (wins + losses); nan when every verdict was a tie."""
        decisive = self.wins + self.losses
        return self.wins / decisive if decisive else math.nan

    @property
    def ci(self) -> tuple[float, float]:
        """Confidence interval of `rate` (`win_rate_interval`)."""
        return win_rate_interval(self.wins, self.ties, self.losses, self.confidence)

    @property
    def decisive_ci(self) -> tuple[float, float]:
        """Confidence interval of `decisive_rate` (Agresti-Coull)."""
        return win_rate_interval(self.wins, 0, self.losses, self.confidence)

    def to_dict(self) -> dict:
        """Plain numbers for JSON logs and trackers."""
        low, high = self.ci
        return {
            "judge": self.judge,
            "win_rate": self.rate,
            "baseline_win_rate": self.baseline_rate,
            "ci_low": low,
            "ci_high": high,
            "confidence": self.confidence,
            "decisive_win_rate": self.decisive_rate,
            "wins": self.wins,
            "losses": self.losses,
            "ties": self.ties,
            "judged": self.judged,
            "malformed": self.malformed,
            "malformed_examples": list(self.malformed_examples),
        }


def tally(verdicts: Sequence[Verdict], judge: str, confidence: float = 0.95) -> WinRate:
    """Count verdicts (A = model wins) into a WinRate; keeps the first few malformed answers as examples."""
    counts = {outcome: 0 for outcome in Outcome}
    for verdict in verdicts:
        counts[verdict.outcome] += 1
    malformed = [v.raw for v in verdicts if v.outcome is Outcome.MALFORMED]
    ordered = [v for v in verdicts if v.outcome in (Outcome.A, Outcome.B) and v.a_shown_first is not None]
    picks_first = sum((v.outcome is Outcome.A) == v.a_shown_first for v in ordered)
    return WinRate(
        judge=judge,
        wins=counts[Outcome.A],
        losses=counts[Outcome.B],
        ties=counts[Outcome.TIE],
        malformed=counts[Outcome.MALFORMED],
        malformed_examples=tuple(malformed[:MAX_MALFORMED_EXAMPLES]),
        first_shown_picks=picks_first,
        first_shown_decisive=len(ordered),
        confidence=confidence,
    )


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.2f}%"


def format_report(w: WinRate) -> str:
    """Text report; the first line is TRL's judge_tldr.py line, "Model win rate: X%"."""
    if w.judged == 0:
        return (
            f"Model win rate: n/a (judge {w.judge}: no well-formed verdict among {w.total})\n" + _malformed_lines(w)
        ).rstrip()
    low, high = w.ci
    dec_low, dec_high = w.decisive_ci
    decisive = w.wins + w.losses
    lines = [
        f"Model win rate: {_pct(w.rate)}",
        f"  judge: {w.judge}; {w.judged} verdicts (wins {w.wins}, ties {w.ties}, losses {w.losses})",
        f"  {round(100 * w.confidence)}% confidence interval: {_pct(low)} to {_pct(high)} (Agresti-Coull, ties as half wins)",
        f"  baseline win rate: {_pct(w.baseline_rate)}",
        f"  ties: {w.ties} ({_pct(w.ties / w.judged)})",
        "  decisive-only win rate: "
        + (
            f"{_pct(w.decisive_rate)} of {decisive} (CI {_pct(dec_low)} to {_pct(dec_high)})"
            if decisive
            else "n/a (every verdict was a tie)"
        ),
    ]
    if w.first_shown_decisive:
        lines.append(
            f"  position bias: the judge picked the completion shown first in {w.first_shown_picks} of "
            f"{w.first_shown_decisive} decisive verdicts "
            f"({_pct(w.first_shown_picks / w.first_shown_decisive)}; order randomised, so this cancels)"
        )
    lines.append("  win rate = (wins + ties/2) / judged: 50% means no better than the baseline")
    return "\n".join(lines + [_malformed_lines(w)]).rstrip()


def _malformed_lines(w: WinRate) -> str:
    if not w.malformed:
        return "  malformed verdicts: 0"
    examples = "; ".join(repr(_clip(raw)) for raw in w.malformed_examples)
    return (
        f"  malformed verdicts: {w.malformed} of {w.total} (excluded from the win rate, which is over the "
        f"{w.judged} well-formed ones); e.g. {examples}"
    )


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
