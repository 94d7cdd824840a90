"""Fused-op counts on the five benchmark models (issue 3, item 6): every conv of ResNet-50/101 and
EfficientNet-B4 sits in a fused op with its BatchNorm, activation and residual Add; the ResNet
head is one ConvPoolFc; every EfficientNet SE block is one SqueezeExcite; BERT-Base and ViT-B/16
have 12 FusedAttention ops and every LayerNorm and GELU fused. The `autofusion report --json`
counts must agree with the fused graph that `compile --export_onnx` writes.

How a model is examined. bench/export_models.py writes the original (cached in $AF_MODEL_CACHE, or
a session tmp dir). `compile --export_onnx` writes two graphs of it: the fused one, whose fused ops
(domain ai.autofusion) list in "fused_nodes" the nodes they replaced, and the canonical one
(--disable_fusion=ALL: simplify + canonicalize only), which names what the fuser saw. Canonicalize
replaces decomposed LayerNorm / GELU / SiLU groups by one node that writes the group's last value
(src/passes/canonicalize.c), so an original group and its canonical node are linked by that value
name, never by a naming convention. Each structural check runs at two levels:
  - test_fusion_complete: fusion is judged on the canonical graph's node names;
  - test_fusion_provenance: the same checks with the ORIGINAL node names (the decomposed ReduceMean
    ... Add of a LayerNorm, the Erf-form GELU nodes, SiLU's Sigmoid and Mul), which the spec's
    "fused_nodes: names of the original nodes it replaced" promises.
So a failure says whether the fusion or only its provenance is incomplete.

Invariant: every check collects all its problems and fails once, listing every unfused or split
node and the report's near misses, so one run tells the rule writer everything. Run with
    AF_BIN=build/autofusion AF_MODEL_CACHE=/tmp/af_models /usr/bin/python3 -m pytest \
        tests/models/test_fusion_counts.py
(first run exports the models, 1-3 minutes on 2 cores; the checks take well under a minute).
"""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import onnx
import pytest
from onnx import helper

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXPORT_SCRIPT = os.path.join(REPO, "bench", "export_models.py")
FUSED_DOMAIN = "ai.autofusion"

MODELS = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]
RESNET_CONVS = {"resnet50": 53, "resnet101": 104}
# 12 encoder layers: one attention block and one GELU each; two LayerNorms each plus one more
# (BERT: the embeddings' LayerNorm, ViT: the encoder's final one).
TRANSFORMER = {"attention": 12, "layernorm": 25, "gelu": 12}

LNMM = "LayerNormMatMulFusionOp"
MATMUL_OPS = ("MatMul", "Gemm")
# Ops that only move data: the fuser may re-create them under a new name when it moves them
# (e.g. across a LayerNorm so the LayerNorm can feed a MatMul directly).
DATA_MOVEMENT = {"Transpose", "Gather", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Flatten"}
MAX_LISTED = 40  # problems listed per failing test; the count of the rest follows


# ---- graphs -------------------------------------------------------------------------------------

@dataclass
class Graph:
    """Structure of one ONNX graph (weights dropped after loading: only names matter here)."""
    nodes: list
    by_name: dict
    producer: dict      # value name -> node
    consumers: dict     # value name -> [node]
    outputs: set        # graph output value names
    consts: set         # initializer and Constant output names


def load_graph(path):
    model = onnx.load(path, load_external_data=False)
    g = model.graph
    consts = {t.name for t in g.initializer}
    g.ClearField("initializer")
    producer, consumers = {}, defaultdict(list)
    for n in g.node:
        assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in n.attribute), f"{path}: {n.name} has a subgraph; not expected here"
        if n.op_type == "Constant":
            consts.update(n.output)
        for v in n.output:
            producer[v] = n
        for v in n.input:
            if v:
                consumers[v].append(n)
    return Graph(nodes=list(g.node), by_name={n.name: n for n in g.node}, producer=producer,
                 consumers=consumers, outputs={o.name for o in g.output}, consts=consts)


def single(g, value, ops=None):
    """The only consumer of `value` (of one of `ops` when given), else None."""
    cs = g.consumers.get(value, [])
    if len(cs) != 1:
        return None
    if ops is not None and cs[0].op_type not in ((ops,) if isinstance(ops, str) else ops):
        return None
    return cs[0]


@dataclass
class FusedOp:
    node: object
    rules: list   # "fusion_rule" split on ','
    covers: list  # "fused_nodes"

    def label(self):
        return f"{self.node.op_type} {self.node.name}"


def fused_ops(g):
    ops = []
    for n in g.nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        # Canonical nodes (Gelu, Silu, LayerNormalization) carry "fused_nodes" too, but no rule.
        if n.domain == FUSED_DOMAIN and "fused_nodes" in attrs and "fusion_rule" in attrs:
            rule = attrs.get("fusion_rule", b"")
            rule = rule.decode() if isinstance(rule, bytes) else rule
            ops.append(FusedOp(n, [r for r in rule.split(",") if r],
                               [s.decode() for s in attrs["fused_nodes"]]))
    return ops


def covers_of(n):
    """What a node of the canonical graph stands for: the nodes canonicalize replaced by it (its
    "fused_nodes", which a fused op built from it inherits), else the node itself."""
    for a in n.attribute:
        if a.name == "fused_nodes":
            return [s.decode() for s in helper.get_attribute_value(a)]
    return [n.name]


# ---- patterns of the original graph ------------------------------------------------------------

@dataclass
class Group:
    """A decomposed group canonicalize turns into one `kind` node writing `out`."""
    kind: str     # LayerNormalization, Gelu, Silu
    names: list   # original node names
    out: str


def find_layernorms(g):
    """ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, [Mul gamma], [Add beta] as torch
    exports LayerNorm below opset 17; or a LayerNormalization node."""
    found = []
    for n in g.nodes:
        if n.op_type == "LayerNormalization":
            found.append(Group("LayerNormalization", [n.name], n.output[0]))
            continue
        if n.op_type != "ReduceMean":
            continue
        x, mean = n.input[0], n.output[0]
        sub = next((c for c in g.consumers[mean]
                    if c.op_type == "Sub" and list(c.input) == [x, mean]), None)
        if sub is None:
            continue
        d = sub.output[0]
        sq_ = next((c for c in g.consumers[d] if c.op_type == "Pow"), None)
        div = next((c for c in g.consumers[d] if c.op_type == "Div" and c.input[0] == d), None)
        var = sq_ and single(g, sq_.output[0], "ReduceMean")
        eps = var and single(g, var.output[0], "Add")
        sqrt = eps and single(g, eps.output[0], "Sqrt")
        if div is None or sqrt is None or single(g, sqrt.output[0]) is not div:
            continue
        chain, last = [n, sub, sq_, var, eps, sqrt, div], div
        for op in ("Mul", "Add"):
            nxt = single(g, last.output[0], op)
            if nxt is None or not any(i in g.consts for i in nxt.input):
                break
            chain.append(nxt)
            last = nxt
        found.append(Group("LayerNormalization", [c.name for c in chain], last.output[0]))
    return found


def find_gelus(g):
    """Erf-form GELU: x/sqrt2 -> Erf -> +1 -> then x*(.)*0.5 (torch) or (x*0.5)*(.) (HF)."""
    found = []
    for e in g.nodes:
        if e.op_type == "Gelu":
            found.append(Group("Gelu", [e.name], e.output[0]))
            continue
        if e.op_type != "Erf":
            continue
        scale = g.producer.get(e.input[0])
        if scale is None or scale.op_type not in ("Div", "Mul"):
            continue
        x = scale.input[0]
        one = single(g, e.output[0], "Add")
        m1 = one and single(g, one.output[0], "Mul")
        if m1 is None:
            continue
        chain = [scale, e, one, m1]
        other = m1.input[1] if m1.input[0] == one.output[0] else m1.input[0]
        if other == x:
            m2 = single(g, m1.output[0], "Mul")
            if m2 is None:
                continue
            chain.append(m2)
            last = m2
        else:
            half = g.producer.get(other)
            if half is None or half.op_type != "Mul" or x not in half.input:
                continue
            chain.insert(0, half)
            last = m1
        found.append(Group("Gelu", [c.name for c in chain], last.output[0]))
    return found


def find_silus(g):
    """x * Sigmoid(x), keyed by x."""
    found = {}
    for s in g.nodes:
        if s.op_type == "Silu":
            found[s.input[0]] = Group("Silu", [s.name], s.output[0])
        if s.op_type != "Sigmoid":
            continue
        for m in g.consumers[s.output[0]]:
            if m.op_type == "Mul" and sorted(m.input) == sorted([s.input[0], s.output[0]]):
                found[s.input[0]] = Group("Silu", [s.name, m.name], m.output[0])
    return found


def find_se_blocks(g, silus):
    """GlobalAveragePool -> Conv -> act -> Conv -> Sigmoid|HardSigmoid -> Mul(pool input, gate).
    Returns lists of parts (node names or Groups)."""
    blocks = []
    for gap in g.nodes:
        if gap.op_type != "GlobalAveragePool":
            continue
        c1 = single(g, gap.output[0], "Conv")
        if c1 is None:
            continue
        parts, v = [gap.name, c1.name], c1.output[0]
        if v in silus:
            parts.append(silus[v])
            v = silus[v].out
        else:
            act = single(g, v)
            if act is None or act.op_type == "Conv":
                act = None
            if act is not None:
                parts.append(act.name)
                v = act.output[0]
        c2 = single(g, v, "Conv")
        gate = c2 and single(g, c2.output[0], ("Sigmoid", "HardSigmoid"))
        mul = gate and single(g, gate.output[0], "Mul")
        if mul is None or gap.input[0] not in mul.input:
            continue
        blocks.append(parts + [c2.name, gate.name, mul.name])
    return blocks


# ---- one compiled model ------------------------------------------------------------------------

def run_af(af_bin, *args):
    proc = subprocess.run([af_bin, *args], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, (f"{af_bin} {' '.join(args)}: exit {proc.returncode}\n"
                                  f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}")
    return proc


def ensure_exported(model_dir, name):
    """DIR/NAME.onnx from bench/export_models.py; its NAME.json is written last, so its presence
    marks a complete export."""
    path = os.path.join(model_dir, name + ".onnx")
    if not (os.path.isfile(path) and os.path.isfile(os.path.join(model_dir, name + ".json"))):
        proc = subprocess.run([sys.executable, EXPORT_SCRIPT, "--out", model_dir,
                               "--models", name], capture_output=True, text=True,
                              timeout=900, check=False)
        assert proc.returncode == 0, f"export of {name} failed:\n{proc.stdout}\n{proc.stderr}"
    return path


@dataclass
class Bench:
    name: str
    orig: Graph
    fused: Graph
    canon: Graph
    report: dict          # `autofusion report --json`
    compile_report: dict  # `compile --report=F.json`
    canon_report: dict    # `compile --disable_fusion=ALL --report=F.json`
    ops: list = field(default_factory=list)           # FusedOp of the fused graph
    owners: dict = field(default_factory=dict)        # covered name -> [FusedOp]

    def __post_init__(self):
        self.ops = fused_ops(self.fused)
        self.owners = defaultdict(list)
        for op in self.ops:
            for nm in op.covers:
                self.owners[nm].append(op)

    def remaining(self, *op_types):
        """Nodes with one of `op_types` left in the fused graph, fused ops excepted (canonical
        Gelu and Silu live in our domain too, so the domain does not tell them apart)."""
        fused = {id(op.node) for op in self.ops}
        return [n for n in self.fused.nodes if n.op_type in op_types and id(n) not in fused]

    def near_misses(self):
        lines = [f"  {rule}: {m['op_type']} {m['node']}: {m['reason']}"
                 for rule, e in self.report["graph_fusion"].items() for m in e["near_misses"]]
        return "near misses in the report:\n" + ("\n".join(lines) if lines else "  (none)")

    def leftovers(self):
        fused = {id(op.node) for op in self.ops}
        hist = Counter(n.op_type for n in self.fused.nodes if id(n) not in fused)
        return "unfused ops left in the fused graph: " + (
            ", ".join(f"{k} x{v}" for k, v in sorted(hist.items())) or "none")


def compile_graph(af_bin, src, work, stem, extra=()):
    """compile SRC with --export_onnx; the graph and the JSON report; the files are removed."""
    out = os.path.join(work, stem)
    onnx_path, rep_path = out + ".onnx", out + ".report.json"
    run_af(af_bin, "compile", f"--model={src}", f"--output={out}", f"--export_onnx={onnx_path}",
           f"--report={rep_path}", *extra)
    try:
        with open(rep_path) as f:
            rep = json.load(f)
        return load_graph(onnx_path), rep
    finally:
        for p in (out + ".afm", onnx_path, rep_path):
            if os.path.exists(p):
                os.remove(p)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """$AF_MODEL_CACHE (kept), else a session tmp dir, removed at the end: the five exports
    weigh about 1.1 GB."""
    d = os.environ.get("AF_MODEL_CACHE")
    if d:
        os.makedirs(d, exist_ok=True)
        yield d
        return
    d = str(tmp_path_factory.mktemp("bench_models"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def bench(af_bin, model_dir, tmp_path_factory):
    """bench(name) -> Bench, built once per session (export, two compiles, one report)."""
    work = str(tmp_path_factory.mktemp("fusion_counts"))
    cache = {}

    def get(name):
        if name not in cache:
            src = ensure_exported(model_dir, name)
            fused, crep = compile_graph(af_bin, src, work, name + "_fused")
            canon, nrep = compile_graph(af_bin, src, work, name + "_canon",
                                        ["--disable_fusion=ALL"])
            rep = json.loads(run_af(af_bin, "report", src, "--json").stdout)
            cache[name] = Bench(name, load_graph(src), fused, canon, rep, crep, nrep)
        return cache[name]
    return get


# ---- checks shared by both levels --------------------------------------------------------------

class Checker:
    """Structural checks on one Bench at one level ("canonical" or "original"); every problem is
    collected in self.problems."""

    def __init__(self, b, level):
        self.b, self.level, self.problems = b, level, []

    def units(self, part):
        """Names to look up in "fused_nodes" for one part (a node name or a Group)."""
        if isinstance(part, str):
            return [part]
        if self.level == "original":
            return part.names
        node = self.b.canon.producer.get(part.out)
        if node is None or node.op_type != part.kind:
            self.problems.append(
                f"canonicalize did not make {part.kind} of {part.names}: its value {part.out} is "
                f"written by {node.op_type + ' ' + node.name if node is not None else 'nothing'}")
            return part.names
        # The ONNX export leaves provenance off standard ops (LayerNormalization): the group's
        # own names are then what a fused op built from it lists.
        covers = covers_of(node)
        return part.names if covers == [node.name] else covers

    def canonical_name(self, group):
        node = self.b.canon.producer.get(group.out)
        return node.name if node is not None and node.op_type == group.kind else None

    def common_op(self, parts, what, op_types=None):
        """The fused op covering every part (of one of op_types), else None with a problem."""
        names = [u for p in parts for u in self.units(p)]
        sets = [{id(op) for op in self.b.owners.get(u, [])} for u in names]
        common = set.intersection(*sets) if sets else set()
        ops = [op for op in self.b.ops if id(op) in common
               and (op_types is None or op.node.op_type in op_types)]
        if ops:
            return ops[0]
        # Name the parts that are unfused, then where the others went.
        unfused = [u for u in names if not self.b.owners.get(u)]
        placed = defaultdict(list)
        for u in names:
            for o in self.b.owners.get(u, []):
                placed[o.label()].append(u.rsplit("/", 1)[-1])
        where = "; ".join(f"in {lbl}: {' '.join(us)}" for lbl, us in placed.items())
        want = f" (a {'/'.join(op_types)})" if op_types else ""
        found = ([f"in no fused_nodes: {' '.join(unfused)}"] if unfused else []) + \
            ([where] if where else [])
        msg = f"{what} not in one fused op{want}: " + "; ".join(found)
        if self.level == "original":
            # Say where the canonical node that replaced a group went, so a provenance gap is
            # told apart from a missing fusion.
            for p in parts:
                cname = None if isinstance(p, str) else self.canonical_name(p)
                if cname is not None and set(p.names) & set(unfused):
                    owners = ", ".join(o.label() for o in self.b.owners.get(cname, []))
                    msg += (f" [canonicalize replaced {p.kind} group {p.names[-1]} by {cname}, "
                            f"which is in: {owners or 'no fused op'}]")
        self.problems.append(msg)
        return None

    def none_left(self, *op_types):
        left = self.b.remaining(*op_types)
        if left:
            self.problems.append(f"{len(left)} {'/'.join(op_types)} node(s) left unfused: "
                                 + ", ".join(f"{n.op_type} {n.name}" for n in left[:20]))

    def fail_if_any(self):
        if self.problems:
            head = f"{self.b.name} ({self.level} names): {len(self.problems)} problem(s)"
            more = len(self.problems) - MAX_LISTED
            pytest.fail("\n".join([head] + self.problems[:MAX_LISTED]
                                  + ([f"... and {more} more"] if more > 0 else [])
                                  + [self.b.leftovers(), self.b.near_misses()]), pytrace=False)


def check_resnet(c):
    g, b = c.b.orig, c.b
    convs = [n for n in g.nodes if n.op_type == "Conv"]
    want = RESNET_CONVS[b.name]
    if len(convs) != want:
        c.problems.append(f"the original has {len(convs)} Conv nodes, expected {want}")
    for conv in convs:
        bn = single(g, conv.output[0], "BatchNormalization")
        if bn is None:
            c.problems.append(f"Conv {conv.name} is not followed by its own BatchNormalization")
            continue
        parts = [conv.name, bn.name]
        relu = single(g, bn.output[0], "Relu")
        if relu is not None:
            parts.append(relu.name)
        op = c.common_op(parts, f"Conv {conv.name} with its BN/Relu",
                         ("FusedConv", "ConvPoolFc"))
        if op is not None:
            n_convs = sum(1 for u in op.covers if u in g.by_name and g.by_name[u].op_type == "Conv")
            if n_convs != 1:
                c.problems.append(f"{op.label()} holds {n_convs} convs, expected exactly 1")
    # A residual Add (and the Relu after it) belongs with one of the two conv branches feeding it.
    for add in (n for n in g.nodes if n.op_type == "Add"):
        relu = single(g, add.output[0], "Relu")
        tail = [add.name] + ([relu.name] if relu is not None else [])
        feeding = []  # convs whose BatchNorm feeds the Add
        for v in add.input:
            bn = g.producer.get(v)
            conv = g.producer.get(bn.input[0]) if bn is not None and \
                bn.op_type == "BatchNormalization" else None
            if conv is not None and conv.op_type == "Conv":
                feeding.append(conv.name)
        tail_ops = {id(o) for o in b.owners.get(add.name, [])}
        if not any(tail_ops & {id(o) for o in b.owners.get(cv, [])} for cv in feeding):
            c.problems.append(f"residual Add {add.name} is not fused with a conv feeding it: "
                              f"owners {[o.label() for o in b.owners.get(add.name, [])]}")
        c.common_op(tail, f"residual Add {add.name} with its Relu")
    literal = [n for n in g.nodes if n.op_type in ("Conv", "BatchNormalization", "Relu", "Add")
               and n.name not in b.owners]
    if literal:
        c.problems.append(f"{len(literal)} Conv/BN/Relu/Add not in any fused_nodes: "
                          + ", ".join(f"{n.op_type} {n.name}" for n in literal[:20]))
    head = [n.name for t in ("GlobalAveragePool", "Flatten", "Gemm")
            for n in g.nodes if n.op_type == t]
    if len(head) != 3:
        c.problems.append(f"head not found as GlobalAveragePool, Flatten, Gemm: {head}")
    else:
        c.common_op(head, "the head GlobalAveragePool+Flatten+Gemm", ("ConvPoolFc",))
    n_cpf = sum(op.node.op_type == "ConvPoolFc" for op in b.ops)
    if n_cpf != 1:
        c.problems.append(f"{n_cpf} ConvPoolFc ops, expected 1")
    c.none_left("Conv", "BatchNormalization", "Relu")


def check_efficientnet(c):
    g, b = c.b.orig, c.b
    silus = find_silus(g)
    se_blocks = find_se_blocks(g, silus)
    if not se_blocks:
        c.problems.append("no SE block found in the original graph")
    se_convs = set()
    for parts in se_blocks:
        se_convs.update(p for p in parts if isinstance(p, str) and p in g.by_name
                        and g.by_name[p].op_type == "Conv")
        c.common_op(parts, f"SE block at {parts[0]}", ("SqueezeExcite",))
    n_se = sum(op.node.op_type == "SqueezeExcite" for op in b.ops)
    if n_se != len(se_blocks):
        c.problems.append(f"{n_se} SqueezeExcite ops for {len(se_blocks)} SE blocks")
    convs = [n for n in g.nodes if n.op_type == "Conv" and n.name not in se_convs]
    for conv in convs:
        bn = single(g, conv.output[0], "BatchNormalization")
        if bn is None:
            c.problems.append(f"Conv {conv.name} is not followed by its own BatchNormalization")
            continue
        parts, what = [conv.name, bn.name], f"Conv {conv.name} with its BN"
        if bn.output[0] in silus:
            parts.append(silus[bn.output[0]])
            what += " and SiLU"
        else:
            add = single(g, bn.output[0], "Add")
            if add is not None:
                parts.append(add.name)
                what += " and residual Add"
        op = c.common_op(parts, what, ("FusedConv", "ConvPoolFc"))
        if op is not None:
            n_convs = sum(1 for u in op.covers
                          if u in b.canon.by_name and b.canon.by_name[u].op_type == "Conv")
            if n_convs != 1:
                c.problems.append(f"{op.label()} holds {n_convs} convs, expected exactly 1")
    c.none_left("Conv", "BatchNormalization", "Sigmoid", "Mul", "Silu", "GlobalAveragePool")


def check_transformer(c):
    """Attention blocks, LayerNorms and GELUs of BERT-Base / ViT-B/16.

    What "a LayerNorm is fused" means here (issue 3: "LayerNorm feeding one or more MatMuls,
    normalisation done while the MatMul reads its input (prologue), including the case where the
    LayerNorm output also feeds a residual"): the LayerNorm is in the fused_nodes of at least one
    fused op, and EVERY MatMul/Gemm that reads its output in the canonical graph got it as a
    prologue (the LayerNorm is in that MatMul's fused op). In a post-LN model like BERT the
    normalised tensor is also the residual stream (and for the last layer a graph output), so a
    LayerNormalization node legitimately stays to materialise it once: the normalisation then
    runs twice (standalone for the residual, and as prologue inside each MatMul), which saves the
    MatMuls' read of a stored normalised tensor but does not remove the LayerNorm. We allow that
    only when the canonical graph shows such a non-MatMul reader (or a graph output), and count
    those LayerNorms separately. ViT (pre-LN) has no such case: its LayerNorms disappear."""
    g, b = c.b.orig, c.b
    softmax = [n for n in g.nodes if n.op_type == "Softmax"]
    attn = [op for op in b.ops if op.node.op_type == "FusedAttention"]
    if len(softmax) != TRANSFORMER["attention"]:
        c.problems.append(f"the original has {len(softmax)} Softmax, expected "
                          f"{TRANSFORMER['attention']}")
    if len(attn) != TRANSFORMER["attention"]:
        c.problems.append(f"{len(attn)} FusedAttention ops, expected {TRANSFORMER['attention']}")
    for s in softmax:
        c.common_op([s.name], f"attention Softmax {s.name}", ("FusedAttention",))
    c.none_left("Softmax")

    lns = find_layernorms(g)
    if len(lns) != TRANSFORMER["layernorm"]:
        c.problems.append(f"found {len(lns)} LayerNorms in the original, expected "
                          f"{TRANSFORMER['layernorm']}")
    kept = 0
    for ln in lns:
        cname = c.canonical_name(ln)
        if c.common_op([ln], f"LayerNorm {ln.names[-1]}") is None or cname is None:
            continue
        cnode = b.canon.by_name[cname]
        readers = b.canon.consumers.get(cnode.output[0], [])
        for mm in (r for r in readers if r.op_type in MATMUL_OPS):
            c.common_op([ln, mm.name], f"LayerNorm {cname} as prologue of {mm.name}",
                        ("FusedMatMul",))
        stays = [n for n in b.remaining("LayerNormalization")
                 if n.name == cname or n.output[0] == cnode.output[0]]
        if stays:
            other = [r for r in readers if r.op_type not in MATMUL_OPS]
            if not other and cnode.output[0] not in b.canon.outputs:
                c.problems.append(f"LayerNorm {cname} stays although only MatMuls read it")
            kept += 1
    if c.level == "canonical":
        print(f"{b.name}: {len(lns)} LayerNorms, {kept} of them also kept as a LayerNormalization "
              "node for a residual / graph output")

    gelus = find_gelus(g)
    if len(gelus) != TRANSFORMER["gelu"]:
        c.problems.append(f"found {len(gelus)} GELUs in the original, expected "
                          f"{TRANSFORMER['gelu']}")
    for ge in gelus:
        c.common_op([ge], f"GELU {ge.names[-1]}")
    c.none_left("Gelu", "Erf")


CHECKS = {"resnet50": check_resnet, "resnet101": check_resnet,
          "efficientnet_b4": check_efficientnet, "vit_b_16": check_transformer,
          "bert_base": check_transformer}


# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_fusion_complete(bench, name):
    """Every pattern instance is fused, judged on the names of the graph the fuser saw."""
    c = Checker(bench(name), "canonical")
    CHECKS[name](c)
    c.fail_if_any()


@pytest.mark.parametrize("name", MODELS)
def test_fusion_provenance(bench, name):
    """The same, with the original model's node names in "fused_nodes"."""
    c = Checker(bench(name), "original")
    CHECKS[name](c)
    c.fail_if_any()


def graph_rule_counts(b):
    """Applications of each rule as the fused graph shows them: a fused op names every rule that
    built it, once each. LayerNormMatMul is the exception: one application adds the prologue to
    every MatMul reading that LayerNorm, so it counts distinct LayerNorms."""
    counts = Counter()
    lnmm = set()
    # A fused op lists a LayerNorm by its original nodes (provenance kept by canonicalize) or,
    # for a model that had LayerNormalization already, by that node's name.
    ln_of = {nm: grp.out for grp in find_layernorms(b.orig) for nm in grp.names}
    for op in b.ops:
        for r in op.rules:
            if r != LNMM:
                counts[r] += 1
        if LNMM in op.rules:
            lnmm.update(ln_of[u] for u in op.covers if u in ln_of)
            lnmm.update(u for u in op.covers if u in b.canon.by_name
                        and b.canon.by_name[u].op_type == "LayerNormalization")
    if lnmm:
        counts[LNMM] = len(lnmm)
    return counts


@pytest.mark.parametrize("name", MODELS)
def test_report_matches_graph(bench, name):
    b = bench(name)
    rep, problems = b.report, []
    gf = rep["graph_fusion"]
    counts = graph_rule_counts(b)
    for rule, e in gf.items():
        if e["effect_times"] != counts.get(rule, 0):
            problems.append(f"{rule}: report effect_times {e['effect_times']}, fused graph "
                            f"shows {counts.get(rule, 0)}")
        if e["match_times"] != e["effect_times"] + len(e["near_misses"]):
            problems.append(f"{rule}: match_times {e['match_times']} != effect_times "
                            f"{e['effect_times']} + {len(e['near_misses'])} near misses")
        if (e["estimated_speedup"] is None) != (e["effect_times"] == 0):
            problems.append(f"{rule}: estimated_speedup {e['estimated_speedup']} with "
                            f"effect_times {e['effect_times']}")
    for rule in set(counts) - set(gf):
        problems.append(f"fused graph names rule {rule} that the report does not list")

    # ops_before counts the graph as imported (ONNX Constant nodes become constants, not nodes).
    imported = sum(n.op_type != "Constant" for n in b.orig.nodes)
    if rep["ops_before"] != imported:
        problems.append(f"ops_before {rep['ops_before']}, the original has {imported} non-Constant "
                        "nodes")
    if rep["ops_after"] != len(b.fused.nodes):
        problems.append(f"ops_after {rep['ops_after']}, the exported fused graph has "
                        f"{len(b.fused.nodes)} nodes")
    if not rep["ops_after"] < rep["ops_before"]:
        problems.append(f"ops_after {rep['ops_after']} is not below ops_before {rep['ops_before']}")
    if not rep["overall_estimated_speedup"] > 1.0:
        problems.append(f"overall_estimated_speedup {rep['overall_estimated_speedup']}")

    # `compile --report` and `report --json` describe the same optimisation.
    for key in ("ops_before", "ops_after"):
        if b.compile_report[key] != rep[key]:
            problems.append(f"compile --report {key} {b.compile_report[key]} vs report "
                            f"{rep[key]}")
    for rule, e in gf.items():
        ce = b.compile_report["graph_fusion"].get(rule, {})
        if (ce.get("match_times"), ce.get("effect_times")) != (e["match_times"],
                                                              e["effect_times"]):
            problems.append(f"{rule}: compile --report {ce.get('match_times')}/"
                            f"{ce.get('effect_times')} vs report {e['match_times']}/"
                            f"{e['effect_times']}")

    # With every rule off: nothing applied, every rule shown disabled, same ops_before, and
    # ops_after is the canonical graph exported.
    nrep = b.canon_report
    for rule, e in nrep["graph_fusion"].items():
        if e["effect_times"] or not e["disabled"]:
            problems.append(f"--disable_fusion=ALL: {rule} effect_times {e['effect_times']} "
                            f"disabled {e['disabled']}")
    if nrep["ops_before"] != rep["ops_before"] or nrep["ops_after"] != len(b.canon.nodes):
        problems.append(f"--disable_fusion=ALL: ops_before {nrep['ops_before']} ops_after "
                        f"{nrep['ops_after']}, canonical graph has {len(b.canon.nodes)} nodes")
    if fused_ops(b.canon):
        problems.append("--disable_fusion=ALL still wrote fused ops")

    # Nothing the fuser saw is lost: each canonical node survives by name or is covered by a
    # fused op; only data-movement ops may come back under a new name (moved by a rule).
    # LayerNormalization nodes lose their provenance in the ONNX export: use the groups'.
    group_names = {grp.out: grp.names for grp in find_layernorms(b.orig)}

    def covered(n):
        covers = group_names.get(n.output[0], covers_of(n)) if n.output else covers_of(n)
        return all(u in b.owners for u in covers)

    lost = [n for n in b.canon.nodes if n.name not in b.fused.by_name
            and not covered(n) and n.op_type not in DATA_MOVEMENT]
    if lost:
        problems.append("canonical nodes neither kept nor covered by a fused op: "
                        + ", ".join(f"{n.op_type} {n.name}" for n in lost[:20]))
    unknown = sorted({u for op in b.ops for u in op.covers
                      if u not in b.canon.by_name and u not in b.orig.by_name})
    if unknown:
        problems.append(f"fused_nodes names that are in neither graph: {unknown[:20]}")
    if problems:
        pytest.fail("\n".join([f"{name}: report vs graph"] + problems + [b.near_misses()]),
                    pytrace=False)
