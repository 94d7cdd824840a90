#!/usr/bin/python3
"""Batch inference over a data set on a Dask cluster with autofusion.

    /usr/bin/python3 examples/dask_batch.py MODEL(.afm|.onnx) DATA.npy OUT.npy
        [--scheduler tcp://host:8786 | --workers 2] [--batch 64]

DATA.npy holds the samples along its first axis (one model input); the scores go to OUT.npy in
the same order. Compile the model first (`autofusion compile model.onnx --output model.afm`, or
autofusion.compile): each worker process then loads it once, and the .afm is memory-mapped, so
the workers on one host share its pages rather than holding a copy each.

The pattern, which maps one to one onto other engines:
- Dask (here): the data set is cut into batches along axis 0; client.map runs score() on each
  batch on some worker, and gather returns the scores in order; the session is cached per
  worker process (the module global below), made on the first batch that worker scores.
- Spark: pyspark.ml.functions.predict_batch_udf(make_predict_fn, return_type, batch_size): the
  make_predict_fn loads the InferenceSession once per Python worker and returns a function of
  a numpy batch, which is score() below.
- Ray Data: ds.map_batches(Scorer, batch_size=..., compute=ActorPoolStrategy(size=N)): the
  Scorer class loads the session in __init__ (once per actor) and its __call__ is score().
"""

import argparse
import os
import sys

import numpy as np

_SESSIONS = {}  # per worker process: model path -> InferenceSession


def session(model, threads=1):
    """The worker's session of `model`, made on first use (once per process)."""
    import autofusion
    key = (model, threads)
    if key not in _SESSIONS:
        so = autofusion.SessionOptions()
        so.intra_op_num_threads = threads
        _SESSIONS[key] = autofusion.InferenceSession(model, so)
    return _SESSIONS[key]


def score(batch, model, threads=1):
    """The model's first output for a batch of samples (the model's first input)."""
    s = session(model, threads)
    return s.run(None, {s.get_inputs()[0].name: np.ascontiguousarray(batch)})[0]


def run(model, data, batch=64, client=None, threads=1):
    """Scores of every sample of `data` (an array), in order: on the cluster of `client`, or in
    this process when client is None."""
    if client is None:
        return np.concatenate([score(data[i:i + batch], model, threads)
                               for i in range(0, len(data), batch)])
    # one task per batch; the worker that runs it scores with its cached session
    batches = [np.ascontiguousarray(data[i:i + batch]) for i in range(0, len(data), batch)]
    futures = client.map(score, batches, model=model, threads=threads, pure=False)
    return np.concatenate(client.gather(futures))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--scheduler", help="address of a running Dask scheduler")
    ap.add_argument("--workers", type=int, default=2, help="local worker processes")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker's session")
    a = ap.parse_args(argv)
    from dask.distributed import Client, LocalCluster
    data = np.load(a.data, mmap_mode="r")
    if a.scheduler:
        client = Client(a.scheduler)
    else:
        client = Client(LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True,
                                     dashboard_address=None))
    with client:
        scores = run(os.path.abspath(a.model), data, a.batch, client, a.threads)
    np.save(a.out, scores)
    print(f"scored {len(scores)} samples into {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
