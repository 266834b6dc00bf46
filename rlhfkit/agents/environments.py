"""Environments (TRL 1.16's ``GRPOTrainer(environment_factory=...)``): stateful tools, one instance per episode.

An environment is a class (or any callable returning an instance) with:

- ``reset(**columns) -> str | None``, required, called at the start of every episode with the dataset row's columns
  other than the prompt (and, for a dict of factories, other than ``environment``) as keyword arguments. A string it
  returns is appended to the prompt's last message (TRL's rule): with no dataset, the row is one empty user message,
  so the string *is* the prompt;
- ``get_reward() -> float``, optional (sync or ``async def``): the environment scores its episode from its own state.
  It becomes a reward source named after the class, weight 1 (``reward_weights`` covers ``reward_funcs`` only);
- every other public method (on the class; names starting with ``_`` are private) is a tool of that episode, called
  through a ToolBox of its bound methods exactly as ``tools=`` functions are (tools.py: by name only, JSON arguments
  checked against the signature, failures and timeouts into the conversation).
  An environment may have none (with no ``tools=`` either, its episodes are one turn: reset writes the prompt,
  get_reward scores the answer).

A dict of factories routes each row by its ``environment`` column and shows each prompt its own environment's tools
only. Instances are pooled: the pool of an environment grows only when one round needs more instances of it than were
made so far, and each is reset before every episode (construct once, reset often, as TRL). Reward functions get the
episodes' instances as ``environments=`` (one per completion, in order).

Checkpoints: an environment whose class has ``state_dict() -> dict`` and ``load_state_dict(state)`` (plain data: dicts,
lists, strings, numbers, tensors; what ``torch.load(weights_only=True)`` reads) is saved with every checkpoint, each
pooled instance's state in pool order, and restored on resume, so a resumed run's episodes are the uninterrupted run's.
Which instance serves which row needs no saving: each round draws its pool in row order. One without them is resumed
as fresh instances, and the resume says so once.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from transformers import PreTrainedTokenizerBase

from rlhfkit.agents.tools import ToolBox
from rlhfkit.data import is_conversational, prompt_text
from rlhfkit.errors import ConfigError, DataError

RESERVED = ("reset", "get_reward", "state_dict", "load_state_dict")  # not tools
ROUTE_COLUMN = "environment"  # a dict of factories: the row's environment name
ENVIRONMENTS_KWARG = "environments"  # what reward functions get the episodes' instances as


def environment_methods(instance: Any) -> list[Callable]:
    """The tools an environment offers: its public methods other than RESERVED's (reset, get_reward, and the
    checkpoint's state_dict and load_state_dict), bound to `instance`.
    Listed on the class (listing the instance would evaluate its properties), in name order as TRL lists them."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in RESERVED and not name.startswith("_")
    ]


class Started(NamedTuple):
    """A round's episodes, begun: each one's prompt token ids (its prompt with reset's text, rendered with its
    environment's tools), its row (prompt replaced, the instance under ``environments``) and its ToolBox."""

    prompt_ids: list[list[int]]
    rows: list[dict]
    toolboxes: list[ToolBox]


class Environments:
    """The factories of an environment_factory (one callable, or a dict name -> callable), their pooled instances,
    the ToolBox of each instance (``tools``, the standalone functions, first), and their get_reward sources.

    ``toolbox``: every tool any episode may be offered (the standalone tools, then each environment's methods, first
    of a name kept): what the chat template is checked with and what the per-tool metrics are named after."""

    def __init__(self, environment_factory, tools: Sequence[Callable] = ()):
        self.multi = isinstance(environment_factory, Mapping)
        factories = dict(environment_factory) if self.multi else {None: environment_factory}
        if self.multi and not factories:
            raise ConfigError("environment_factory is an empty dict: give at least one name -> factory.")
        for name, factory in factories.items():
            if self.multi and not isinstance(name, str):
                raise ConfigError(f"environment_factory's keys are the names rows route by: {name!r} is not a string.")
            if not callable(factory):
                raise ConfigError(
                    f"environment_factory{_label(name)} must be a class or a function returning an environment, got "
                    f"{type(factory).__name__}."
                )
        self.factories = factories
        self.standalone = list(tools)
        self.pool: dict[str | None, list[Any]] = {}
        self._boxes: dict[int, tuple[Any, ToolBox]] = {}  # id(instance) -> (the instance, kept alive; its ToolBox)
        self.reward_classes: list[type] = []
        union: dict[str, Callable] = {}
        for fn in self.standalone:
            union.setdefault(getattr(fn, "__name__", repr(fn)), fn)
        for name in factories:
            instance = self._make(name)  # the probe: validated, then the first of its pool
            if not callable(getattr(type(instance), "reset", None)):
                raise ConfigError(
                    f"environment_factory{_label(name)} made a {type(instance).__name__}, which has no reset method: "
                    "an environment needs reset(**columns) -> str | None, called at the start of every episode."
                )
            self.pool[name] = [instance]
            for method in self.box(instance).functions[len(self.standalone) :]:
                union.setdefault(method.__name__, method)
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))
        self.toolbox = ToolBox(list(union.values()))  # empty for environments without tools: one-turn episodes

    def _make(self, name: str | None) -> Any:
        try:
            return self.factories[name]()
        except Exception as e:
            raise ConfigError(
                f"environment_factory{_label(name)}() raised {type(e).__name__}: {e}. It must build an environment "
                "without arguments (a class whose __init__ takes none, or a function returning an instance)."
            ) from e

    def box(self, instance: Any) -> ToolBox:
        """The ToolBox of `instance`'s episode: the standalone tools, then its methods (schemas read once per
        instance; two tools of one name exit 2, as ToolBox does)."""
        entry = self._boxes.get(id(instance))
        if entry is None or entry[0] is not instance:
            try:
                entry = (instance, ToolBox(self.standalone + environment_methods(instance)))
            except ConfigError as e:
                raise ConfigError(f"environment {type(instance).__name__}: {e}") from None
            self._boxes[id(instance)] = entry
        return entry[1]

    def state_dict(self) -> dict:
        """Each pool's instances' states, in pool order (None for an instance whose class cannot save its state)."""
        return {
            "pools": {
                "" if name is None else name: [_saved(instance) for instance in pool]
                for name, pool in self.pool.items()
            }
        }

    def load_state_dict(self, state: dict) -> None:
        """Grow each pool to the saved size and give every instance its saved state; an environment that cannot load
        one is resumed as fresh instances, said once."""
        fresh = set()
        for key, states in state["pools"].items():
            name = None if key == "" and not self.multi else key
            if name not in self.factories:
                continue  # an environment this run no longer has
            pool = self.pool[name]
            while len(pool) < len(states):
                pool.append(self._make(name))
            for instance, saved in zip(pool, states):
                if saved is not None and callable(getattr(type(instance), "load_state_dict", None)):
                    instance.load_state_dict(saved)
                else:
                    fresh.add(type(instance).__name__)
        for cls in sorted(fresh):
            warnings.warn(
                f"environment {cls} has no state_dict() / load_state_dict(): the resumed run starts fresh instances of "
                "it (what reset() does not set is not the interrupted run's). Give the class both methods to resume "
                "it exactly (docs/agents.md).",
                stacklevel=2,
            )

    # TRL 1.16's trainer.environments is a list: instance i plays the i-th episode of each generation. So is one
    # factory's pool here (start() draws it in row order); a dict of factories keeps a pool per name. An Environments
    # object is true however many instances it holds (code tests `if environments`).
    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._instances())

    def __getitem__(self, index: int) -> Any:
        return self._instances()[index]

    def __iter__(self):
        return iter(self._instances())

    def _instances(self) -> list[Any]:
        if self.multi:
            raise TypeError(
                "trainer.environments holds a pool per environment name with a dict environment_factory: read "
                "trainer.environments.pool[name][i], the instance of that environment's i-th episode of a generation."
            )
        return self.pool[None]

    def adopt(self, pool: dict[str | None, list[Any]]) -> None:
        """Take `pool` (the generation worker's instances after a generation, copies) as this object's pool: what the
        trainer's checkpoints save and its evaluations draw under async_generation. The old instances' ToolBoxes go
        with them."""
        self.pool, self._boxes = pool, {}

    def check_routes(self, names: Sequence) -> None:
        """A dict of factories: every row's ``environment`` must be one of its names."""
        unknown = sorted({repr(n) for n in names if n not in self.factories})
        if unknown:
            raise DataError(
                f"The dataset's {ROUTE_COLUMN!r} column names {', '.join(unknown[:5])}, not among the environments "
                f"passed to environment_factory ({', '.join(map(repr, self.factories))})."
            )

    def start(
        self,
        rows: list[dict],
        tokenizer: PreTrainedTokenizerBase,
        text_field: str,
        max_prompt_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> Started:
        """Begin one episode per row: draw an instance of the row's environment from its pool (one per episode of the
        round), reset it with the row's other columns, and render the prompt with reset's text appended and that
        environment's tools (its last max_prompt_length tokens when longer)."""
        cursor: dict[str | None, int] = {}
        prompt_ids, started_rows, boxes = [], [], []
        skip = {text_field, "input_ids", ENVIRONMENTS_KWARG} | ({ROUTE_COLUMN} if self.multi else set())
        for row in rows:
            name = row.get(ROUTE_COLUMN) if self.multi else None
            if name not in self.factories:
                self.check_routes([name])
            pool, index = self.pool[name], cursor.get(name, 0)
            if index == len(pool):
                pool.append(self._make(name))
            cursor[name] = index + 1
            instance = pool[index]
            observation = instance.reset(**{k: v for k, v in row.items() if k not in skip})
            prompt = _with_observation(row[text_field], observation, type(instance).__name__)
            box = self.box(instance)
            text = prompt_text(prompt, tokenizer, chat_template_kwargs, box.functions)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if max_prompt_length is not None:
                ids = ids[-max_prompt_length:]
            prompt_ids.append(ids)
            started_rows.append({**row, text_field: prompt, "input_ids": ids, ENVIRONMENTS_KWARG: instance})
            boxes.append(box)
        return Started(prompt_ids, started_rows, boxes)

    def reward_functions(self) -> list[Callable]:
        """One reward function per environment class with get_reward, named after the class: each episode of that
        very class (not a subclass) gets its instance's get_reward(), any other None (no reward from this source)."""
        return [_get_reward_source(cls) for cls in self.reward_classes]


def _get_reward_source(cls: type) -> Callable:
    if inspect.iscoroutinefunction(cls.get_reward):

        async def get_reward(environments, **kwargs):
            mine = [i for i, e in enumerate(environments) if type(e) is cls]
            values = await asyncio.gather(*(environments[i].get_reward() for i in mine))
            out: list = [None] * len(environments)
            for i, value in zip(mine, values):
                out[i] = value
            return out

    else:

        def get_reward(environments, **kwargs):
            return [e.get_reward() if type(e) is cls else None for e in environments]

    get_reward.__name__ = get_reward.__qualname__ = cls.__name__
    return get_reward


def _with_observation(prompt, observation, environment: str):
    """The prompt with reset's return appended to its last message's text (None: the prompt as it is)."""
    if observation is None:
        return prompt
    if not isinstance(observation, str):
        raise DataError(
            f"{environment}.reset returned a {type(observation).__name__}: it must return the text to append to the "
            "prompt (a str) or None."
        )
    if not is_conversational(prompt) or not isinstance(prompt[-1]["content"], str):
        raise DataError(
            f"{environment}.reset returned text to append to the prompt, but the prompt is not a conversation whose "
            "last message is text: give prompts as lists of {'role', 'content'} messages."
        )
    return [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]


def _label(name: str | None) -> str:
    return "" if name is None else f"[{name!r}]"


def _saved(instance: Any) -> Any:
    """An instance's state to checkpoint (its state_dict()), or None when its class cannot save and load one."""
    cls = type(instance)
    if callable(getattr(cls, "state_dict", None)) and callable(getattr(cls, "load_state_dict", None)):
        return instance.state_dict()
    return None
