#!/usr/bin/python3
"""Write hostile (and a few valid) ONNX model files for the importer's tests.

    /usr/bin/python3 tests/gen_bad_models.py OUT_DIR

Each case is OUT_DIR/<case>/model.onnx (with its external data files beside it), and
OUT_DIR/expected.tsv lists one case per line: name, expected af_status name, and a word the
error message must contain (empty for cases that must load). tests/test_import.c reads it.

The bytes are written with a small protobuf encoder rather than the onnx package, so that the
files can break the format in exact ways (wrong wire types, lengths past the end, groups) that a
protobuf library refuses to produce. Running it twice gives identical files.
"""

import os
import shutil
import struct
import sys

# ---- a minimal protobuf encoder -------------------------------------------------------------

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(num, wire):
    return varint(num << 3 | wire)


def f_int(num, v):
    return tag(num, VARINT) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return tag(num, LEN) + varint(len(b)) + b


def f_float(num, x):
    return tag(num, FIXED32) + struct.pack("<f", x)


# ---- ONNX messages (field numbers of onnx.proto) ----------------------------------------------

FLOAT, INT64, STRING, BOOL = 1, 7, 8, 9


def tensor(name, dtype, dims, raw=None, ext=None, location=None):
    b = b"".join(f_int(1, d) for d in dims) + f_int(2, dtype) + f_bytes(8, name)
    if raw is not None:
        b += f_bytes(9, raw)
    if ext is not None:
        for k, v in ext:
            b += f_bytes(13, f_bytes(1, k) + f_bytes(2, v))
        b += f_int(14, 1 if location is None else location)
    return b


def tensor_type(elem, dims):
    shape = f_bytes(2, b"".join(f_bytes(1, f_int(1, d)) for d in dims)) if dims is not None else b""
    return f_bytes(1, f_int(1, elem) + shape)


def value_info(name, elem=FLOAT, dims=(2,), type_bytes=None):
    if type_bytes is None:
        type_bytes = tensor_type(elem, dims)
    return f_bytes(1, name) + f_bytes(2, type_bytes)


def attr_graph(name, g):
    return f_bytes(1, name) + f_int(20, 5) + f_bytes(6, g)


def attr_float(name, x):
    return f_bytes(1, name) + f_int(20, 1) + f_float(2, x)


def node(op, ins, outs, name="", attrs=()):
    b = b"".join(f_bytes(1, i) for i in ins) + b"".join(f_bytes(2, o) for o in outs)
    b += f_bytes(3, name) + f_bytes(4, op)
    return b + b"".join(f_bytes(5, a) for a in attrs)


def graph(nodes, inputs, outputs, inits=(), name="g"):
    b = b"".join(f_bytes(1, n) for n in nodes) + f_bytes(2, name)
    b += b"".join(f_bytes(5, t) for t in inits)
    b += b"".join(f_bytes(11, v) for v in inputs) + b"".join(f_bytes(12, v) for v in outputs)
    return b


def model(g, opset=13):
    # The graph goes last so that truncating the file cuts it.
    opset_import = f_bytes(8, f_bytes(1, "") + f_int(2, opset))
    return f_int(1, 8) + opset_import + f_bytes(2, "gen_bad_models") + f_bytes(7, g)


def floats(*xs):
    return struct.pack("<%df" % len(xs), *xs)


# y = Relu(x + w), w an initializer: the valid base most cases break in one place.
W = tensor("w", FLOAT, [2], raw=floats(1.0, -2.0))


def base_graph(nodes=None, inits=(W,), inputs=None, outputs=None):
    if nodes is None:
        nodes = [node("Add", ["x", "w"], ["s"], "add"), node("Relu", ["s"], ["y"], "relu")]
    return graph(nodes, inputs if inputs is not None else [value_info("x")],
                 outputs if outputs is not None else [value_info("y")], inits)


def ext_model(location, offset=None, length=None):
    ext = [("location", location)]
    if offset is not None:
        ext.append(("offset", str(offset)))
    if length is not None:
        ext.append(("length", str(length)))
    return model(base_graph(inits=[tensor("w", FLOAT, [2], ext=ext)]))


def nested_if(levels):
    """`levels` If nodes, each in the then_branch of the one outside it."""
    def leaf(out):
        const = node("Constant", [], [out], "c_" + out, [attr_float("value_float", 1.0)])
        return graph([const], [], [value_info(out, dims=())])
    g = leaf("out%d" % levels)
    for k in range(levels - 1, -1, -1):
        out = "out%d" % k
        branches = [attr_graph("then_branch", g), attr_graph("else_branch", leaf("e%d" % k))]
        g = graph([node("If", ["cond"], [out], "if%d" % k, branches)],
                  [] if k else [value_info("cond", BOOL, ())], [value_info(out, dims=())])
    return model(g)


# ---- the cases ----------------------------------------------------------------------------------

def cases():
    """(name, expected status, word of the message, model bytes, setup(folder) or None)"""
    valid = model(base_graph())
    seq_of_float = f_bytes(4, tensor_type(FLOAT, [2]))  # TypeProto.sequence_type
    g_wire = f_bytes(1, b"\x08\x01")  # ir_version (a varint field) sent length-delimited
    bad_node = node("Relu", ["s"], ["y"], "relu")
    # The Relu's op_type field claims 1000 bytes: more than its NodeProto holds.
    bad_node = bad_node[:-len(f_bytes(4, "Relu"))] + tag(4, LEN) + varint(1000) + b"Relu"

    def data(folder, name="data.bin", content=floats(1.0, -2.0)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)

    def symlink(folder):
        data(folder, "real.bin")
        os.symlink("real.bin", os.path.join(folder, "data.bin"))

    def outside(folder):
        os.makedirs(os.path.join(folder, "..", "outside_dir"), exist_ok=True)
        data(os.path.join(folder, "..", "outside_dir"))
        os.symlink(os.path.join("..", "outside_dir"), os.path.join(folder, "linkdir"))

    def hardlink(folder):
        data(folder)
        os.link(os.path.join(folder, "data.bin"), os.path.join(folder, "other.bin"))

    return [
        ("valid", "AF_OK", "", valid, None),
        ("truncated", "AF_ERR_PARSE", "remain", valid[:-7], None),
        ("wrong_wire_type", "AF_ERR_PARSE", "wire type", g_wire + valid, None),
        ("length_past_end", "AF_ERR_PARSE", "remain",
         model(base_graph(nodes=[node("Add", ["x", "w"], ["s"]), bad_node])), None),
        ("group_wire_type", "AF_ERR_PARSE", "group", tag(99, 3) + valid, None),
        ("overlong_varint", "AF_ERR_PARSE", "varint",
         valid + tag(5, VARINT) + b"\xff" * 10 + b"\x01", None),
        ("field_zero", "AF_ERR_PARSE", "field number 0", valid + b"\x00\x00", None),
        ("nesting_31", "AF_OK", "", nested_if(31), None),
        ("nesting_101", "AF_ERR_UNSUPPORTED", "nested deeper", nested_if(101), None),
        ("negative_dims", "AF_ERR_INVALID_MODEL", "negative",
         model(base_graph(inits=[tensor("w", FLOAT, [-1], raw=b"")])), None),
        ("overflow_dims", "AF_ERR_INVALID_MODEL", "overflow",
         model(base_graph(inits=[tensor("w", FLOAT, [1 << 62, 1 << 62], raw=floats(1.0))])), None),
        ("unknown_op", "AF_ERR_UNSUPPORTED", "NoSuchOp",
         model(base_graph(nodes=[node("NoSuchOp", ["x", "w"], ["y"], "weird")])), None),
        ("opset_0", "AF_ERR_UNSUPPORTED", "opset 0", model(base_graph(), opset=0), None),
        ("opset_99", "AF_ERR_UNSUPPORTED", "opset 99", model(base_graph(), opset=99), None),
        ("type_mismatch", "AF_ERR_INVALID_MODEL", "raw_data",
         model(base_graph(inits=[tensor("w", FLOAT, [2], raw=struct.pack("<2q", 1, 2))])), None),
        ("string_tensor", "AF_ERR_UNSUPPORTED", "string",
         model(base_graph(inits=[tensor("w", STRING, [1])])), None),
        ("sequence_input", "AF_ERR_UNSUPPORTED", "sequence",
         model(base_graph(inputs=[value_info("x", type_bytes=seq_of_float)])), None),
        ("cycle", "AF_ERR_INVALID_MODEL", "cycle",
         model(base_graph(nodes=[node("Add", ["x", "t"], ["s"], "a"),
                                 node("Relu", ["s"], ["t"], "b"),
                                 node("Relu", ["s"], ["y"], "c")])), None),
        ("missing_input", "AF_ERR_INVALID_MODEL", "nothing produces",
         model(base_graph(nodes=[node("Add", ["x", "nowhere"], ["y"], "a")])), None),
        ("produced_twice", "AF_ERR_INVALID_MODEL", "produced twice",
         model(base_graph(nodes=[node("Relu", ["x"], ["y"], "a"),
                                 node("Relu", ["x"], ["y"], "b")])), None),
        ("ext_ok", "AF_OK", "", ext_model("data.bin", offset=0, length=8), data),
        ("ext_ok_subdir", "AF_OK", "", ext_model("sub/data.bin"),
         lambda f: (os.makedirs(os.path.join(f, "sub")), data(os.path.join(f, "sub")))),
        ("ext_absolute", "AF_ERR_INVALID_MODEL", "absolute", ext_model("/etc/passwd"), None),
        ("ext_dotdot", "AF_ERR_INVALID_MODEL", "'..'", ext_model("../data.bin"), data),
        ("ext_symlink", "AF_ERR_INVALID_MODEL", "symlink", ext_model("data.bin"), symlink),
        ("ext_outside", "AF_ERR_INVALID_MODEL", "outside", ext_model("linkdir/data.bin"), outside),
        ("ext_hardlink", "AF_ERR_INVALID_MODEL", "hard link", ext_model("data.bin"), hardlink),
        ("ext_offset_past_end", "AF_ERR_INVALID_MODEL", "past the end",
         ext_model("data.bin", offset=1000), data),
        ("ext_offset_overflow", "AF_ERR_INVALID_MODEL", "offset",
         ext_model("data.bin", offset=1 << 64), data),
        ("ext_length_mismatch", "AF_ERR_INVALID_MODEL", "length",
         ext_model("data.bin", length=4), data),
        ("ext_missing_file", "AF_ERR_IO", "cannot resolve", ext_model("absent.bin"), None),
        ("ext_directory", "AF_ERR_INVALID_MODEL", "regular file", ext_model("sub"),
         lambda f: os.makedirs(os.path.join(f, "sub"))),
    ]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_bad_models.py OUT_DIR")
    out = sys.argv[1]
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    lines = []
    for name, status, word, data, setup in cases():
        folder = os.path.join(out, name)
        os.makedirs(folder)
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(data)
        if setup:
            setup(folder)
        lines.append("%s\t%s\t%s\n" % (name, status, word))
    with open(os.path.join(out, "expected.tsv"), "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
