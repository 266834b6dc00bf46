"""Model-written code, run where it cannot reach anything: a fresh bubblewrap sandbox per program (docs/sandbox.md).

run_code runs one program; SandboxPool and run_many a batch on a bounded number of workers; code_reward scores
completions against unit tests (a reward function with TRL's signature: ``--reward_funcs rlhfkit.sandbox:code_reward``);
python is the tool an agent calls to run code. All of them go through run_code.
"""

from .limits import SandboxLimits
from .pool import SandboxPool, run_many
from .result import STATUSES, SandboxResult
from .reward import code_reward, extract_code, make_code_reward
from .run import run_code
from .tool import make_python_tool, python

__all__ = [
    "STATUSES",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "code_reward",
    "extract_code",
    "make_code_reward",
    "make_python_tool",
    "python",
    "run_code",
    "run_many",
]
