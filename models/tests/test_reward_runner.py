"""The reward runner's conversation (podctl_models/reward_runner.py), as the worker holds it."""

import json
import os
import subprocess
import sys

import pytest

RUNNER = os.path.join(os.path.dirname(__file__), "..", "podctl_models", "reward_runner.py")

MODULE = '''
import math

def lengths(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
    print("printed output goes to stderr")
    return [len(c) + trainer_state.global_step if a else None for c, a in zip(completions, answer)]

class Real(float):
    """Like numpy.float64: a subclass of float."""

def numpy_like(prompts, completions, **kwargs):
    return tuple(Real(0.5) for _ in completions)

def bad(prompts, completions, **kwargs):
    return {"x": 1}

def flag(prompts, completions, **kwargs):
    return [True for _ in completions]

def inf(prompts, completions, **kwargs):
    return [math.inf for _ in completions]
'''


@pytest.fixture
def runner(tmp_path):
    (tmp_path / "rewards.py").write_text(MODULE)
    process = subprocess.Popen([sys.executable, "-u", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)

    def talk(message):
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())

    names = ["lengths", "numpy_like", "bad", "flag", "inf"]
    loaded = talk({"load": [{"module": str(tmp_path / "rewards.py"), "function": n} for n in names]})
    assert loaded == {"loaded": len(names)}
    yield talk, process
    process.kill()
    process.wait(timeout=10)


def call(talk, index, completions, answers):
    return talk({"call": index, "prompts": ["p"] * len(completions), "completions": completions,
                 "kwargs": {"answer": answers, "completion_ids": [[1, 2]] * len(completions)},
                 "trainer_state": {"global_step": 3, "max_steps": 10}})


def test_rewards_come_back_as_numbers_or_none(runner):
    talk, process = runner
    assert call(talk, 0, ["ab", "abcd"], ["x", None]) == {"rewards": [5.0, None]}
    assert call(talk, 1, ["a", "b"], ["x", "y"]) == {"rewards": [0.5, 0.5]}
    process.stdin.close()
    assert "printed output goes to stderr" in process.stderr.read(), "prints go to the log"


def test_what_is_not_a_reward_is_an_error_naming_the_row(runner):
    runner, _ = runner
    error = call(runner, 2, ["a"], ["x"])["error"]
    assert error["kind"] == "value" and "returned dict, not a list of rewards" in error["message"]
    error = call(runner, 3, ["a"], ["x"])["error"]
    assert error["kind"] == "value" and error["row"] == 0 and "True (bool)" in error["message"]
    error = call(runner, 4, ["a", "b"], ["x", "y"])["error"]
    assert error["kind"] == "value" and "returned inf for completion 0" in error["message"]
    # The runner goes on after an error.
    assert call(runner, 0, ["abc"], ["x"]) == {"rewards": [6.0]}


def test_a_module_that_does_not_load_names_the_function(tmp_path):
    process = subprocess.run([sys.executable, "-u", RUNNER], input=json.dumps(
        {"load": [{"module": str(tmp_path / "missing.py"), "function": "f"}]}) + "\n",
        capture_output=True, text=True, timeout=60)
    error = json.loads(process.stdout)["error"]
    assert error["kind"] == "load" and error["function"] == 0 and "missing.py" in error["message"]
