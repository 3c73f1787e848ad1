"""How strong a new passphrase is (issue 17, "Polish"): estimated with zxcvbn, a warning
and a confirmation below MIN_SCORE, `--force` to keep a weak one without asking (scripts).

The passphrase derives the vault's keys (PROTOCOL §2), so a weak one is a weak vault: the
relay holds ciphertext anyone who guesses the passphrase can read. Only the estimate is
shown, never the passphrase.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

import typer
from zxcvbn import zxcvbn

from .support import CliError, ask_passphrase, err

#: zxcvbn's score: 0 (too guessable) .. 4 (very unguessable); 3 is "safely unguessable:
#: moderate protection from an offline slow-hash scenario" (about 10^8 guesses and more).
MIN_SCORE: Final = 3
#: zxcvbn's time grows with the length; a passphrase longer than this is judged by its start
#: (which only underestimates it).
MAX_CHECKED_CHARS: Final = 100
#: Words a guesser would try first for this tool.
_CONTEXT: Final = ["engram", "engram-sync", "sync", "vault", "memory", "memories", "passphrase"]


@dataclass(frozen=True)
class Strength:
    """zxcvbn's estimate of a passphrase: score 0-4 and what to do about it."""

    score: int
    guesses_log10: float
    warning: str
    suggestions: tuple[str, ...]

    @property
    def weak(self) -> bool:
        return self.score < MIN_SCORE

    def describe(self) -> str:
        """One line: the score and zxcvbn's advice."""
        advice = [text for text in (self.warning, *self.suggestions) if text]
        about = f" ({' '.join(advice)})" if advice else ""
        return f"strength {self.score}/4, about 10^{self.guesses_log10:.0f} guesses to find{about}"


def strength(passphrase: str) -> Strength:
    """zxcvbn's estimate of `passphrase` (its first MAX_CHECKED_CHARS characters)."""
    result = zxcvbn(passphrase[:MAX_CHECKED_CHARS], user_inputs=_CONTEXT)
    feedback = result.get("feedback") or {}
    return Strength(
        score=int(result["score"]),
        guesses_log10=float(result["guesses_log10"]),
        warning=str(feedback.get("warning") or ""),
        suggestions=tuple(str(s) for s in feedback.get("suggestions") or ()),
    )


def check_new_passphrase(
    passphrase: str,
    *,
    force: bool,
    declined: str = "no vault created: run `engram-sync init` again with a stronger passphrase",
) -> None:
    """Warn about a weak new passphrase and ask to confirm it (on a terminal); without a
    terminal a weak one is refused unless `force`. Returns when the passphrase is kept;
    `declined` is the error when the person says no."""
    estimate = strength(passphrase)
    if not estimate.weak:
        return
    err.print(
        f"warning: the passphrase is weak: {estimate.describe()}; it protects every memory "
        "in the vault, on this device and on the relay",
        markup=False,
        highlight=False,
    )
    if force:
        err.print("--force: kept anyway", markup=False, highlight=False)
        return
    if not sys.stdin.isatty():
        raise CliError(
            "refused a weak passphrase: choose a stronger one (several unusual words), or "
            "pass --force to keep it"
        )
    if not typer.confirm("Use this weak passphrase anyway?", default=False, err=True):
        raise CliError(declined)


def ask_new_passphrase(*, force: bool) -> str:
    """A new vault passphrase (ENGRAM_PASSPHRASE, or asked twice on a terminal), checked by
    check_new_passphrase."""
    passphrase = ask_passphrase(confirm=True)
    check_new_passphrase(passphrase, force=force)
    return passphrase
