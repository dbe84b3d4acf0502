"""A local emulator of the Kaggle API, so the kit is tested with the real `kaggle` client.

`KaggleEmulator` (core) holds the state and answers the calls; datasets, kernels and sessions
are its parts; `server` speaks HTTP; `cli` is the command people run
(`scripts/kaggle-emulator`, or `python -m kaggle_emulator`).
"""

from kaggle_emulator.core import KaggleEmulator
from kaggle_emulator.model import EmulatedAccount, SessionInfo

__all__ = ["KaggleEmulator", "EmulatedAccount", "SessionInfo"]
