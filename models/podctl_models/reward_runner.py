"""Runs a GRPO job's Python reward functions for a podctl worker (crates/rewards/src/pool.rs),
which starts a few of these processes beside itself with the project's Python and talks to each
over its stdin and stdout, one JSON object per line. Only the standard library is imported here;
the reward modules import what they need.

A reward function has TRL's signature, so one written for TRL's GRPOTrainer works unchanged:

    def f(prompts, completions, **kwargs) -> list[float | None]

`prompts` and `completions` are strings, or (for chat-templated jobs) lists of
{"role", "content"} messages and [{"role": "assistant", "content": ...}]; `kwargs` holds the data
row's other columns (one list per column), `completion_ids` (token ids), `trainer_state`
(`global_step`, `max_steps`) and TRL's `log_extra` and `log_metric` hooks (which record nothing
here). `None` means the function does not apply to that completion.

The conversation:

    worker: {"load": [{"module": "/abs/rewards.py", "function": "brevity"}, ...]}
    runner: {"loaded": 2}   or   {"error": {"kind": "load", "function": 1, "message": "..."}}
    worker: {"call": 0, "prompts": [...], "completions": [...], "kwargs": {...},
             "trainer_state": {"global_step": 3, "max_steps": 40}}
    runner: {"rewards": [0.5, null, ...]}
        or  {"error": {"kind": "raised" | "length" | "value", "message": "...", "row": 3}}

Anything the functions print goes to stderr, which the worker logs; stdout is the conversation's.
"""

import collections.abc
import importlib.util
import json
import math
import numbers
import os
import sys
import traceback
import types


def load(spec):
    """The function `spec` names, imported from its file (whose directory goes on sys.path, so
    the module can import its neighbours)."""
    path = os.path.abspath(spec["module"])
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = "podctl_reward_" + os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(name)
    if module is None:
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None:
            raise ImportError(f"{path} is not a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    function = getattr(module, spec["function"], None)
    if function is None:
        raise AttributeError(f"{path} defines no `{spec['function']}`")
    if not callable(function):
        raise TypeError(f"`{spec['function']}` in {path} is not callable")
    return function


def check(values, rows):
    """The rewards as JSON values: numbers (finite) or None, one per row; else the error."""
    if isinstance(values, (str, bytes, collections.abc.Mapping)) or not hasattr(values, "__len__"):
        return None, {"kind": "value", "message": f"returned {type(values).__name__}, not a list of rewards"}
    values = list(values)
    if len(values) != rows:
        return None, {"kind": "length", "message": f"returned {len(values)} rewards for {rows} completions",
                      "row": len(values)}
    out = []
    for row, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None, {"kind": "value", "row": row,
                          "message": f"returned {value!r} ({type(value).__name__}) for completion {row}; "
                                     "a reward is a number, or None when the function does not apply"}
        value = float(value)
        if not math.isfinite(value):
            return None, {"kind": "value", "row": row,
                          "message": f"returned {value} for completion {row}; a reward is a finite number, "
                                     "or None when the function does not apply"}
        out.append(value)
    return out, None


# The conversation's stream: the process's stdout, which nothing else may write to.
_conversation = sys.stdout


def reply(message):
    _conversation.write(json.dumps(message) + "\n")
    _conversation.flush()


def main():
    functions = []
    for line in sys.stdin:
        request = json.loads(line)
        if "load" in request:
            for index, spec in enumerate(request["load"]):
                try:
                    functions.append(load(spec))
                except BaseException:
                    reply({"error": {"kind": "load", "function": index, "message": traceback.format_exc()}})
                    return
            reply({"loaded": len(functions)})
            continue
        function = functions[request["call"]]
        kwargs = dict(request["kwargs"])
        kwargs["trainer_state"] = types.SimpleNamespace(**request["trainer_state"])
        # TRL also hands over hooks to log extra columns and metrics; accepted, not recorded here.
        kwargs.setdefault("log_extra", lambda column, values: None)
        kwargs.setdefault("log_metric", lambda name, value: None)
        try:
            values = function(prompts=request["prompts"], completions=request["completions"], **kwargs)
        except BaseException:
            reply({"error": {"kind": "raised", "message": traceback.format_exc()}})
            continue
        rewards, error = check(values, len(request["completions"]))
        reply({"error": error} if error else {"rewards": rewards})


if __name__ == "__main__":
    # What the functions print goes to stderr, the worker's log, not into the conversation.
    _conversation, sys.stdout = sys.stdout, sys.stderr
    main()
