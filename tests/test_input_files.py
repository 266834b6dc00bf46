"""Every input file rlhfkit reads gives exit status 2 with the file, the place where the parser knows it, and the
cause; never a traceback: --config YAML, datasets, reward-function files, task.json."""

import pytest

from rlhfkit.cli import main


def run(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "content, needles",
    [
        (
            b"learning_rate: 1.0e-5\nreport_to: [none\nseed: 3\n",
            ["is not valid YAML: at line 3, column", "flow sequence"],
        ),
        (
            b"learning_rate: 1.0e-5\n  kl_coef: 0.1\n",
            ["is not valid YAML: at line 2", "mapping values are not allowed"],
        ),
        (b"learning_rate: 1.0e-5\nexp_name: caf\xe9\n", ["is not UTF-8 text: byte b'\\xe9' at line 2"]),
    ],
    ids=["unclosed-list", "bad-indent", "latin-1"],
)
def test_a_broken_yaml_config_names_file_line_and_cause(tmp_path, capsys, content, needles):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    err = run(capsys, "ppo", "--config", str(path), "--output_dir", str(tmp_path / "out"))
    assert str(path) in err
    for needle in needles:
        assert needle in err, err


def test_a_data_file_path_that_does_not_exist_is_called_a_missing_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = run(capsys, "grpo", "--model_name_or_path", "x", "--dataset_name", "nowhere/data.jsonl",
              "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert f"no file exists at {tmp_path / 'nowhere' / 'data.jsonl'}" in err
    assert "datasets cache" not in err and "hub dataset id" not in err


def test_a_malformed_data_file_is_named_with_the_parser_s_reason(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    err = run(capsys, "grpo", "--model_name_or_path", "x", "--dataset_name", str(path), "--output_dir",
              str(tmp_path / "out"))  # fmt: skip
    assert f"The file at --dataset_name '{path}' cannot be read as json data" in err
    assert "JSON parse error" in err and "does not exist" not in err


@pytest.mark.parametrize(
    "source, needle",
    [
        ("def f(prompts, completions, **kw):\n    return [1.0 for c in completions\n",
         "rewards.py, line 2: SyntaxError: '[' was never closed"),
        ("raise RuntimeError('no API key')\n", "raised RuntimeError: no API key ({path}, line 1)"),
    ],
    ids=["syntax-error", "raises-on-import"],
)  # fmt: skip
def test_a_broken_reward_function_file_names_file_and_line(tiny_assets, tmp_path, capsys, source, needle):
    path = tmp_path / "rewards.py"
    path.write_text(source)
    err = run(capsys, "grpo", "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name",
              str(tiny_assets / "prompts"), "--reward_funcs", f"{path}:f", "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert needle.format(path=path) in err, err


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "no task file at"),
        ('{"name": "sort",\n "check": }', "is not valid JSON: line 2, column 11: Expecting value"),
        ('{"name": "chess"}', "must name one of the built-in tasks"),
    ],
    ids=["missing", "bad-json", "unknown-task"],
)
def test_a_broken_task_file_is_named(tiny_assets, tmp_path, capsys, content, needle):
    task = tmp_path / "task.json"
    if content is not None:
        task.write_text(content)
    err = run(capsys, "grpo", "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name",
              str(tiny_assets / "prompts"), "--task", str(task), "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert needle in err, err
