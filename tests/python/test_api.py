"""The Python package (python/autofusion): ONNX Runtime's inference API, our own tools, the
binding's promises (zero-copy inputs, owned outputs, threads, errors) and the Dask example."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest

import autofusion as ort
from conftest import REPO, mlp_reference, ort_available, ort_outputs

HERE = os.path.dirname(os.path.abspath(__file__))


def x_of(batch=3, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)


def cli(*args):
    return subprocess.run([os.environ.get("AF_BIN", os.path.join(REPO, "build", "autofusion")), *args],
                          capture_output=True, text=True, check=True).stdout


# ---- the ONNX Runtime surface ------------------------------------------------------------------

def test_version_is_the_library_s():
    assert ort.__version__ == cli("--version").split()[-1]


def test_inputs_outputs_and_types(models):
    s = ort.InferenceSession(models["mlp"])
    (x,) = s.get_inputs()
    assert (x.name, x.shape, x.type) == ("x", ["batch", 8], "tensor(float)")
    assert [(o.name, o.shape, o.type) for o in s.get_outputs()] == [
        ("y", ["batch", 4], "tensor(float)"), ("h", ["batch", 16], "tensor(float)")]
    e = ort.InferenceSession(models["emb"])
    assert [(i.name, i.shape, i.type) for i in e.get_inputs()] == [("ids", ["batch", "seq"], "tensor(int64)")]
    assert e.get_overridable_initializers() == []


def test_run_matches_numpy_and_orders_outputs(models):
    s = ort.InferenceSession(models["mlp"])
    x = x_of()
    y, h = mlp_reference(x)
    got_y, got_h = s.run(None, {"x": x})
    np.testing.assert_allclose(got_y, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_h, h, rtol=1e-5, atol=1e-5)
    got_h2, got_y2 = s.run(["h", "y"], {"x": x})
    assert np.array_equal(got_h2, got_h) and np.array_equal(got_y2, got_y)
    assert len(s.run([], {"x": x})) == 2
    ids = np.array([[1, 2, 9]], dtype=np.int64)
    (emb,) = ort.InferenceSession(models["emb"]).run(None, {"ids": ids})
    assert np.array_equal(emb, np.arange(40, dtype=np.float32).reshape(10, 4)[ids])


def test_outputs_own_their_memory(models):
    s = ort.InferenceSession(models["mlp"])
    y, _ = s.run(None, {"x": x_of()})
    expect = y.copy()
    s.close()
    del s
    assert y.flags.writeable and np.array_equal(y, expect)  # alive after the session is gone
    y += 1  # and ours to write


def test_inputs_are_not_copied_unless_they_must_be(models, monkeypatch):
    s = ort.InferenceSession(models["mlp"])
    calls = []
    real = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = x_of()
    want = s.run(["y"], {"x": x})[0]
    assert calls == []  # contiguous, float32: read in place
    wide = np.zeros((3, 16), np.float32)
    wide[:, ::2] = x
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    assert np.array_equal(s.run(["y"], {"x": view})[0], want)
    assert calls == [1]  # converted once
    swapped = x.astype(">f4")
    assert np.array_equal(s.run(["y"], {"x": swapped})[0], want)


def test_bad_inputs_raise_onnx_runtime_exceptions(models, tmp_path):
    s = ort.InferenceSession(models["mlp"])
    x = x_of()
    with pytest.raises(ort.InvalidArgument, match="no input 'z'"):
        s.run(None, {"z": x})
    with pytest.raises(ort.InvalidArgument, match=r"tensor\(double\)"):
        s.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(ort.InvalidArgument, match="rank|shape"):
        s.run(None, {"x": x.reshape(3, 2, 4)})
    with pytest.raises(ort.InvalidArgument, match="dim|shape"):
        s.run(None, {"x": np.zeros((3, 7), np.float32)})
    with pytest.raises(ort.InvalidArgument, match="'x'"):
        s.run(None, {})
    with pytest.raises(ort.InvalidArgument, match="no output 'q'"):
        s.run(["q"], {"x": x})
    with pytest.raises(ort.InvalidArgument):
        s.run(None, [x])
    with pytest.raises(ort.InvalidArgument):
        s.run(None, {"x": np.array(["a", "b"], dtype=object)})
    s.close()
    with pytest.raises(ort.InvalidArgument, match="closed"):
        s.run(None, {"x": x})
    with pytest.raises(ort.InvalidArgument, match="closed"):
        s.get_inputs()
    with pytest.raises(ort.NoSuchFile):
        ort.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(ort.InvalidProtobuf):
        ort.InferenceSession(b"\xff\xff\xff\xff not a model")
    with pytest.raises(ort.AutofusionError):
        ort.InferenceSession(b"")
    with pytest.raises(TypeError):
        ort.InferenceSession(42)


def test_providers(models):
    s = ort.InferenceSession(models["mlp"], providers=["CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    ort.InferenceSession(models["mlp"], providers=[("CPUExecutionProvider", {})])
    ort.InferenceSession(models["mlp"], providers=[])
    with pytest.raises(ValueError, match="CUDAExecutionProvider"):
        ort.InferenceSession(models["mlp"], providers=["CUDAExecutionProvider"])
    assert ort.get_available_providers() == ["CPUExecutionProvider"] and ort.get_device() == "CPU"


def test_bytes_and_modelmeta(models):
    with open(models["mlp"], "rb") as f:
        s = ort.InferenceSession(f.read())
    m = s.get_modelmeta()
    assert (m.producer_name, m.graph_name, m.domain, m.description, m.version) == (
        "autofusion-tests", "mlp", "test.autofusion", "a tiny MLP", 7)
    assert m.custom_metadata_map == {"author": "tests", "license": "MIT"}
    assert s.run(["y"], {"x": x_of()})[0].shape == (3, 4)


def test_optimization_levels_and_report(models):
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(models["cnn"], so)
    fused = ort.InferenceSession(models["cnn"])
    assert plain.fusion_report() is None
    rep = fused.fusion_report()
    assert rep["graph_fusion"]["ConvBNReluFusionOp"]["effect_times"] == 2
    assert rep["ops_after"] < rep["ops_before"]
    np.testing.assert_allclose(fused.run(None, {"image": x})[0], plain.run(None, {"image": x})[0],
                               rtol=1e-4, atol=1e-5)


def test_session_options(models, tmp_path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 4
    so.log_severity_level = 0
    so.add_session_config_entry("session.load_model_format", "ONNX")
    assert so.get_session_config_entry("session.load_model_format") == "ONNX"
    with pytest.raises(ort.Fail):
        so.get_session_config_entry("nope")
    so.add_session_config_entry("autofusion.disable_fusion", "MatMulBiasActFusionOp")
    s = ort.InferenceSession(models["mlp"], so)
    assert s.get_session_options() is so
    assert s.fusion_report()["graph_fusion"]["MatMulBiasActFusionOp"]["disabled"] is True
    so2 = ort.SessionOptions()
    so2.add_free_dimension_override_by_name("batch", 5)
    fixed = ort.InferenceSession(models["mlp"], so2)
    assert fixed.get_inputs()[0].shape == [5, 8]


def test_optimized_model_filepath(models, tmp_path):
    x = x_of()
    want = ort.InferenceSession(models["mlp"]).run(None, {"x": x})
    for name in ("opt.afm", "opt.onnx"):
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / name)
        ort.InferenceSession(models["mlp"], so)
        got = ort.InferenceSession(str(tmp_path / name)).run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    m = onnx.load(str(tmp_path / "opt.onnx"))
    assert any(n.domain == "ai.autofusion" for n in m.graph.node)  # the fused graph


def test_profiling(models, tmp_path):
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    s = ort.InferenceSession(models["mlp"], so)
    s.run(None, {"x": x_of()})
    path = s.end_profiling()
    assert path.startswith(str(tmp_path / "prof")) and path.endswith(".json")
    with open(path) as f:
        events = json.load(f)
    assert any(e.get("name") == "model_run" for e in events)
    assert ort.InferenceSession(models["mlp"]).end_profiling() == ""


def test_io_binding(models):
    s = ort.InferenceSession(models["mlp"])
    x = x_of()
    want_y, want_h = s.run(None, {"x": x})
    b = s.io_binding()
    b.bind_cpu_input("x", x)
    b.bind_output("y")
    out = np.zeros((3, 16), np.float32)
    b.bind_output("h", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    s.run_with_iobinding(b)
    assert np.array_equal(b.get_outputs()[0].numpy(), want_y)
    assert np.array_equal(out, want_h)  # written into the bound buffer
    assert np.array_equal(b.copy_outputs_to_cpu()[0], want_y)
    v = ort.OrtValue.ortvalue_from_numpy(x)
    assert v.shape() == [3, 8] and v.data_type() == "tensor(float)" and v.device_name() == "cpu"
    b2 = s.io_binding()
    b2.bind_ortvalue_input("x", v)
    b2.bind_output("y")
    s.run_with_iobinding(b2)
    assert np.array_equal(b2.copy_outputs_to_cpu()[0], want_y)
    with pytest.raises(ort.InvalidArgument, match="CPU"):
        b.bind_output("y", "cuda")
    bad = s.io_binding()
    bad.bind_cpu_input("x", x)
    wrong = np.zeros((3, 5), np.float32)
    bad.bind_output("y", "cpu", 0, np.float32, wrong.shape, wrong.ctypes.data)
    with pytest.raises(ort.InvalidArgument, match="bound buffer"):
        s.run_with_iobinding(bad)


def test_four_threads_share_a_session(models):
    s = ort.InferenceSession(models["cnn"])
    xs = [np.random.default_rng(i).standard_normal((1 + i % 2, 3, 16, 16)).astype(np.float32) for i in range(4)]
    alone = [s.run(None, {"image": x})[0] for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(25):
                got = s.run(None, {"image": xs[i]})[0]
                if not np.array_equal(got, alone[i]):
                    errors.append(f"thread {i}: different result")
        except Exception as e:  # reported below, not lost in the thread
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_script_runs_unchanged_with_the_import_swapped(models, tmp_path):
    """The same ONNX Runtime-style script with `autofusion` as its module; where onnxruntime's
    reference (onnxruntime-node) runs here, the outputs are also compared with it."""
    out = tmp_path / "out.npz"
    r = subprocess.run([sys.executable, os.path.join(HERE, "ort_style_script.py"), "autofusion",
                        models["cnn"], str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    got = np.load(out)
    if not ort_available():
        pytest.skip("onnxruntime-node is not installed (tools/install-deps.sh installs it)")
    ref = ort_outputs(models["cnn"], {"image": got["x"]}, str(tmp_path))
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_outputs_match_onnx_runtime(models, tmp_path):
    for name, feed in (("mlp", {"x": x_of(5)}), ("emb", {"ids": np.array([[0, 9, 3], [4, 4, 1]], np.int64)})):
        ours = ort.InferenceSession(models[name])
        got = dict(zip([o.name for o in ours.get_outputs()], ours.run(None, feed)))
        d = tmp_path / name
        d.mkdir()
        ref = ort_outputs(models[name], feed, str(d))
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)


# ---- our own API -------------------------------------------------------------------------------

def test_compile_report_and_rules(models, tmp_path):
    rep = ort.compile(models["cnn"], str(tmp_path / "cnn"), input_shape={"image": [2, 3, 16, 16]},
                      disable_fusion=["ConvPoolFcFusionOp"])
    assert os.path.exists(tmp_path / "cnn.afm")
    assert rep["graph_fusion"]["ConvBNReluFusionOp"]["effect_times"] == 2
    assert rep["graph_fusion"]["ConvPoolFcFusionOp"]["disabled"] is True
    s = ort.InferenceSession(str(tmp_path / "cnn.afm"))
    assert s.get_inputs()[0].shape == [2, 3, 16, 16]
    assert s.get_modelmeta().producer_name == "autofusion"
    assert ort.report(models["cnn"])["graph_fusion"]["ConvPoolFcFusionOp"]["effect_times"] == 1
    rules = ort.fusion_rules()
    listed = [line for line in cli("--list-fusions").splitlines() if line and not line.startswith(" ")]
    assert [r["name"] for r in rules] == listed
    assert all(r["pattern"] and r["conditions"] for r in rules)
    ort.compile(models["mlp"], str(tmp_path / "mlp.afm"), export_onnx=str(tmp_path / "mlp_fused.onnx"))
    onnx.checker.check_model(onnx.load(str(tmp_path / "mlp_fused.onnx")))


def test_verify(models):
    ok = ort.verify(models["cnn"])
    assert ok["ok"] and ok["culprits"] is None and [o["name"] for o in ok["outputs"]] == ["logits"]
    assert ok["outputs"][0]["cosine"] > 0.99999
    # fp16 (half-precision weights and inputs) against tolerances meant for fp32: over, and the
    # culprit is an op that runs fp16, as `autofusion verify` finds it (the same search)
    strict = ort.verify(models["cnn"], precision_mode="fp16", rtol=1e-5, atol=1e-6)
    assert not strict["ok"] and strict["outputs"][0]["over"] > 0
    low = [e["node"] for e in ort.report(models["cnn"], precision_mode="fp16")["precision"]["ops"]
           if e["precision"] == "fp16"]
    c = strict["culprits"]
    assert c["fixed"] and c["keep_fp32"] and set(c["keep_fp32"]) <= set(low), c


def test_dask_batch_matches_one_process(models, tmp_path):
    pytest.importorskip("distributed")
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import dask_batch
    afm = str(tmp_path / "cnn.afm")
    ort.compile(models["cnn"], afm)
    data = np.random.default_rng(3).standard_normal((100, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "data.npy", data)
    one = dask_batch.run(afm, data, batch=16)
    assert one.shape == (100, 10)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "examples"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "dask_batch.py"), afm,
                        str(tmp_path / "data.npy"), str(tmp_path / "out.npy"), "--workers", "2",
                        "--batch", "16"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert np.array_equal(np.load(tmp_path / "out.npy"), one)


def test_install_component(tmp_path):
    """`cmake --install build --component python` (into a staging root here) gives a package
    that imports and runs from site-packages."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ort.__file__))))
    subprocess.run(["cmake", "--install", build, "--component", "python"], check=True,
                   capture_output=True, env=dict(os.environ, DESTDIR=str(tmp_path)))
    libs = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if f == "libautofusion.so"]
    assert len(libs) == 1
    pkg = os.path.dirname(libs[0])
    assert os.path.exists(os.path.join(pkg, "__init__.py"))
    assert os.path.exists(os.path.join(pkg, "capi", "onnxruntime_pybind11_state.py"))
    site = os.path.dirname(pkg)
    r = subprocess.run([sys.executable, "-c", "import autofusion; print(autofusion.__file__, autofusion.__version__)"],
                       capture_output=True, text=True, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=site))
    assert r.returncode == 0 and r.stdout.startswith(site) and r.stdout.split()[-1] == ort.__version__, r.stderr
