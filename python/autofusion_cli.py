"""Drive the autofusion command line from Python: run a model, collect its .npy outputs.

Invariant: mirrors the CLI contract of docs/cli.md and nothing more; in particular
output_file_name() is the one place that knows how `run --output_dir` names its files.
"""

import os
import re
import subprocess

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def default_binary():
    """$AF_BIN, else <repo>/build/autofusion."""
    return os.environ.get("AF_BIN") or os.path.join(REPO, "build", "autofusion")


def output_file_name(name):
    """The file `run --output_dir` writes for output `name`: unsafe characters become '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npy"


def run(binary, model, inputs=None, output_dir=None, input_shape=None, extra=(), timeout=300):
    """Run `autofusion run MODEL` and return the subprocess.CompletedProcess (text mode).

    inputs: {input name: path of .npy}; input_shape: the --input_shape string ("name:1,3,8,8;...").
    Does not raise on a non-zero exit: callers check returncode, stdout and stderr themselves.
    """
    cmd = [binary, "run", str(model)]
    for name, path in (inputs or {}).items():
        cmd += ["--input", f"{name}={path}"]
    if output_dir is not None:
        cmd += ["--output_dir", str(output_dir)]
    if input_shape is not None:
        cmd.append(f"--input_shape={input_shape}")
    cmd += list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def load_outputs(output_dir, names):
    """{name: array} read from the files `run --output_dir` wrote for `names`."""
    return {n: np.load(os.path.join(output_dir, output_file_name(n)), allow_pickle=False)
            for n in names}
