// ONNX Runtime side of the benchmarks: latency of one model with onnxruntime-node (CPU).
//   node bench/ort_bench.js MODEL.onnx --threads=N --iterations=N --warmup=N --opt=all|disabled [--samples]
// Inputs: random floats in [-1, 1) and integers in [0, 10) (an attention_mask is all ones),
// fixed seed, shapes from the model (symbolic dims are 1). Prints one JSON object with the
// latency statistics in the shape `autofusion bench --json` uses (--samples: every run too).
'use strict';
const path = require('path');
const ortDir = process.env.ORT_NODE_DIR || path.join(__dirname, '..', 'node_modules', 'onnxruntime-node');
const ort = require(ortDir);

function arg(name, dflt) {
  const a = process.argv.find((s) => s.startsWith(`--${name}=`));
  return a ? a.slice(name.length + 3) : dflt;
}

function rng(seed) {
  let s = seed >>> 0;
  return () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s / 4294967296; };
}

function stats(ms) {
  const v = ms.slice().sort((a, b) => a - b);
  const q = (p) => v[Math.min(v.length - 1, Math.floor(p * v.length))];
  const mean = v.reduce((a, b) => a + b, 0) / v.length;
  const median = v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  return { min_ms: v[0], median_ms: median, mean_ms: mean, p90_ms: q(0.9), p99_ms: q(0.99),
           max_ms: v[v.length - 1], throughput: 1000 / mean };
}

async function main() {
  const model = process.argv[2];
  const threads = parseInt(arg('threads', '1'), 10);
  const iterations = parseInt(arg('iterations', '20'), 10);
  const warmup = parseInt(arg('warmup', '3'), 10);
  const opt = arg('opt', 'all');
  const sess = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'], graphOptimizationLevel: opt,
    intraOpNumThreads: threads, interOpNumThreads: 1, executionMode: 'sequential',
  });
  const rand = rng(1);
  const feeds = {};
  for (const name of sess.inputNames) {
    const meta = sess.inputMetadata.find((m) => m.name === name);
    const dims = meta.shape.map((d) => (typeof d === 'number' && d > 0 ? d : 1));
    const n = dims.reduce((a, b) => a * b, 1);
    const t = meta.type;
    if (t === 'float32') {
      const a = new Float32Array(n);
      for (let i = 0; i < n; i++) a[i] = rand() * 2 - 1;
      feeds[name] = new ort.Tensor('float32', a, dims);
    } else if (t === 'int64') {
      const a = new BigInt64Array(n);
      for (let i = 0; i < n; i++) a[i] = BigInt(name.includes('mask') ? 1 : Math.floor(rand() * 10));
      feeds[name] = new ort.Tensor('int64', a, dims);
    } else {
      throw new Error(`${model}: input '${name}' has type ${t}, not supported here`);
    }
  }
  for (let i = 0; i < warmup; i++) await sess.run(feeds);
  const ms = [];
  for (let i = 0; i < iterations; i++) {
    const t0 = process.hrtime.bigint();
    await sess.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const out = { model, runtime: `onnxruntime-node ${require(path.join(ortDir, 'package.json')).version}`,
                opt, threads, ...stats(ms) };
  if (process.argv.includes('--samples')) out.samples_ms = ms;
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(`ort_bench: ${e.message}`); process.exit(1); });
