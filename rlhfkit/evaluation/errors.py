"""Errors of `rlhfkit eval`: ValueError subclasses whose messages name the flag at fault and the fix."""


class EvalError(ValueError):
    """The evaluation cannot run as asked (a path, a flag value, the prompts)."""


class JudgeError(EvalError):
    """The judge cannot be built or cannot answer (unknown judge, missing API key, unreachable server)."""
