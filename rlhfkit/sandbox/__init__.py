"""Model-written code, run where it cannot reach anything: a fresh bubblewrap sandbox per program (docs/sandbox.md).

run_code runs one program; run_many a batch on a bounded pool; code_reward scores completions against unit tests (a
reward function with TRL's signature); python is the tool an agent calls to run code. All go through run_code.
"""

from .limits import SandboxLimits
from .result import STATUSES, SandboxResult
from .run import run_code

__all__ = ["STATUSES", "SandboxLimits", "SandboxResult", "run_code"]
