"""Ours and ONNX Runtime on the same inputs: the common start of the tests that compare them."""

import numpy as np

import autofusion_cli as afc
from ort_node import ort_outputs


def ours(af_bin, path, feeds, tmp_path, names):
    """{name: our output} for the outputs `names` of one run of model `path` on feeds
    {name: array}, which must exit 0. Files go under tmp_path (the feeds, ours/)."""
    files = {}
    for name, v in feeds.items():
        files[name] = str(tmp_path / (name + ".npy"))
        np.save(files[name], v)
    r = afc.run(af_bin, path, inputs=files, output_dir=str(tmp_path / "ours"))
    assert r.returncode == 0, r.stderr
    return afc.load_outputs(str(tmp_path / "ours"), list(names))


def ours_and_ort(af_bin, path, feeds, tmp_path):
    """({name: our output}, {name: ONNX Runtime's}) of one run each of model `path` on feeds
    {name: array}; ours must exit 0. Files go under tmp_path (ours/, ort/)."""
    (tmp_path / "ort").mkdir()
    want = ort_outputs(path, feeds, str(tmp_path / "ort"))
    return ours(af_bin, path, feeds, tmp_path, want), want
