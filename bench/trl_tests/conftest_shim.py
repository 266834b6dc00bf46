"""pytest's root conftest for a run of TRL's test file (copied there as conftest.py by bench/trl_tests/run.py).

Serves ``load_dataset("trl-internal-testing/zen", config, ...)`` from the stand-ins standins.py saved: a split, all
splits as a DatasetDict, and ``streaming=True`` as the matching IterableDataset / IterableDatasetDict. Every other
call goes to datasets unchanged. Models load from the offline hub cache run.py points at.

A snapshot's ``testing_utils.py`` may import ``is_<package>_available`` helpers that the installed TRL does not have
(a test file a little newer than the release): those names answer whether the package is importable.
"""

import importlib.util
import os
from pathlib import Path

import datasets


def _availability(name: str):
    if name.startswith("is_") and name.endswith("_available"):
        package = name[3 : -len("_available")]
        return lambda: importlib.util.find_spec(package) is not None
    raise AttributeError(name)


importlib.import_module("trl.import_utils").__getattr__ = _availability

ZEN = Path(os.environ["TRL_TESTS_ZEN"])
_load_dataset = datasets.load_dataset


def _zen(path, name=None, split=None, streaming=False, **kwargs):
    if path != "trl-internal-testing/zen":
        return _load_dataset(path, name, split=split, streaming=streaming, **kwargs)
    folder = ZEN / name
    splits = {s.name: datasets.load_from_disk(str(s)) for s in sorted(folder.iterdir())}
    if split is not None:
        return splits[split].to_iterable_dataset() if streaming else splits[split]
    if streaming:
        return datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in splits.items()})
    return datasets.DatasetDict(splits)


datasets.load_dataset = _zen
