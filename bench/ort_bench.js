// ONNX Runtime side of the benchmarks: latency of one model with onnxruntime-node (CPU).
//   node bench/ort_bench.js MODEL.onnx --threads=N --iterations=N --warmup=N --opt=all|disabled [--samples]
//        [--input=NAME=FILE.npy ...] [--shape=NAME:1x128 ...]
// Inputs: random floats in [-1, 1) and integers in [0, 10) (an attention_mask is all ones),
// fixed seed, shapes from the model (symbolic dims are 1). --shape=NAME:D1xD2x... (repeatable)
// gives the random input NAME that shape instead (for a dynamic export); --input=NAME=FILE.npy
// (repeatable) feeds NAME from a NumPy file (little-endian float32, float16, int64 or int32, C order) as
// `autofusion bench --input` does. Prints one JSON object with the latency statistics in the
// shape `autofusion bench --json` uses (--samples: every run too). --output_dir=DIR also writes
// the last run's outputs as DIR/<name>.npy (characters outside [A-Za-z0-9_.-] become '_', as
// `autofusion run --output_dir` names them). --profile=PREFIX turns on ONNX Runtime's profiler
// (a Chrome trace PREFIX_<date>.json with one event per node and run, as `bench --profile`
// writes ours), for per-node comparisons.
'use strict';
const path = require('path');
const ortDir = process.env.ORT_NODE_DIR || path.join(__dirname, '..', 'node_modules', 'onnxruntime-node');
const ort = require(ortDir);

function arg(name, dflt) {
  const a = process.argv.find((s) => s.startsWith(`--${name}=`));
  return a ? a.slice(name.length + 3) : dflt;
}

function args(name) {
  return process.argv.filter((s) => s.startsWith(`--${name}=`)).map((s) => s.slice(name.length + 3));
}

// A .npy file as { type, dims, data } (format versions 1 to 3, C order, little-endian).
function readNpy(file) {
  const fs = require('fs');
  const buf = fs.readFileSync(file);
  if (buf.length < 10 || buf.readUInt8(0) !== 0x93 || buf.toString('latin1', 1, 6) !== 'NUMPY') {
    throw new Error(`${file}: not a .npy file`);
  }
  const major = buf.readUInt8(6);
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + hlen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']*)'/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !shape || /'fortran_order':\s*True/.test(header)) {
    throw new Error(`${file}: unsupported .npy header ${header.trim()}`);
  }
  const dims = shape[1].split(',').map((x) => x.trim()).filter((x) => x).map(Number);
  const n = dims.reduce((a, b) => a * b, 1);
  const kinds = { '<f4': ['float32', Float32Array], '<i8': ['int64', BigInt64Array],
                  '<i4': ['int32', Int32Array], '<f2': ['float16', Uint16Array] };
  const kind = kinds[descr[1]];
  if (!kind) throw new Error(`${file}: dtype ${descr[1]} not supported here`);
  const bytes = n * kind[1].BYTES_PER_ELEMENT;
  if (buf.length - start < bytes) throw new Error(`${file}: truncated`);
  const ab = new ArrayBuffer(bytes);  // a copy: the file's data need not be aligned
  new Uint8Array(ab).set(buf.subarray(start, start + bytes));
  return { type: kind[0], dims, data: new kind[1](ab) };
}

// Writes a tensor as a .npy file (format 1.0, C order, little-endian).
function writeNpy(file, t) {
  const fs = require('fs');
  const kinds = { float32: '<f4', float64: '<f8', int64: '<i8', int32: '<i4', int8: '|i1',
                  uint8: '|u1', bool: '|b1', float16: '<f2' };
  const descr = kinds[t.type];
  if (!descr) throw new Error(`${file}: output type ${t.type} not supported here`);
  const shape = t.dims.length === 1 ? `(${t.dims[0]},)` : `(${t.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';
  const head = Buffer.alloc(10);
  head.writeUInt8(0x93, 0);
  head.write('NUMPY', 1, 'latin1');
  head.writeUInt8(1, 6);
  head.writeUInt8(0, 7);
  head.writeUInt16LE(header.length, 8);
  const data = t.type === 'bool' ? Buffer.from(Uint8Array.from(t.data, (b) => (b ? 1 : 0)))
    : Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), data]));
}

// The float16 bits of x (round to nearest even; no NaN inputs here).
function toHalf(x) {
  const f = new Float32Array([x]), u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000, exp = ((u >>> 23) & 0xff) - 127 + 15, man = u & 0x7fffff;
  if (exp >= 31) return sign | 0x7c00;
  if (exp <= 0) return sign | Math.round((man | 0x800000) / 2 ** (14 - exp)) ;
  let h = sign | (exp << 10) | (man >>> 13);
  const rest = man & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;
  return h;
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
  const profile = arg('profile', '');
  const sess = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'], graphOptimizationLevel: opt,
    intraOpNumThreads: threads, interOpNumThreads: 1, executionMode: 'sequential',
    ...(profile ? { enableProfiling: true, profileFilePrefix: profile } : {}),
  });
  const files = {};
  for (const a of args('input')) {
    const eq = a.indexOf('=');
    if (eq <= 0) throw new Error(`--input=${a}: expected NAME=FILE.npy`);
    files[a.slice(0, eq)] = a.slice(eq + 1);
  }
  const shapes = {};
  for (const a of args('shape')) {
    const colon = a.lastIndexOf(':');
    const dims = a.slice(colon + 1).split('x').map(Number);
    if (colon <= 0 || dims.some((d) => !Number.isInteger(d) || d < 0)) {
      throw new Error(`--shape=${a}: expected NAME:D1xD2x...`);
    }
    shapes[a.slice(0, colon)] = dims;
  }
  for (const name of [...Object.keys(files), ...Object.keys(shapes)]) {
    if (!sess.inputNames.includes(name)) throw new Error(`${model}: the model has no input '${name}'`);
  }
  const rand = rng(1);
  const feeds = {};
  for (const name of sess.inputNames) {
    const meta = sess.inputMetadata.find((m) => m.name === name);
    if (files[name]) {
      const t = readNpy(files[name]);
      if (t.type !== meta.type) throw new Error(`${files[name]}: ${t.type}, but input '${name}' is ${meta.type}`);
      feeds[name] = new ort.Tensor(t.type, t.data, t.dims);
      continue;
    }
    const dims = shapes[name] || meta.shape.map((d) => (typeof d === 'number' && d > 0 ? d : 1));
    const n = dims.reduce((a, b) => a * b, 1);
    const t = meta.type;
    if (t === 'float32') {
      const a = new Float32Array(n);
      for (let i = 0; i < n; i++) a[i] = rand() * 2 - 1;
      feeds[name] = new ort.Tensor('float32', a, dims);
    } else if (t === 'float16') {
      const a = new Uint16Array(n);
      for (let i = 0; i < n; i++) a[i] = toHalf(rand() * 2 - 1);
      feeds[name] = new ort.Tensor('float16', a, dims);
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
  let last = null;
  for (let i = 0; i < iterations; i++) {
    const t0 = process.hrtime.bigint();
    last = await sess.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  if (profile) sess.endProfiling();
  const outDir = arg('output_dir', '');
  if (outDir && last) {
    require('fs').mkdirSync(outDir, { recursive: true });
    for (const [name, t] of Object.entries(last)) {
      writeNpy(path.join(outDir, name.replace(/[^A-Za-z0-9_.-]/g, '_') + '.npy'), t);
    }
  }
  const out = { model, runtime: `onnxruntime-node ${require(path.join(ortDir, 'package.json')).version}`,
                opt, threads, ...stats(ms) };
  out.input_shapes = Object.fromEntries(Object.entries(feeds).map(([k, v]) => [k, v.dims]));
  if (process.argv.includes('--samples')) out.samples_ms = ms;
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(`ort_bench: ${e.message}`); process.exit(1); });
