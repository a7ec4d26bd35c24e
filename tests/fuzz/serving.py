"""Fuzzing what an export serves and what the package reads of an export: three kinds.

``serving-request``: damaged and hostile requests to the four signatures of a tiny export,
answered by ONE long-lived child process that loads the SavedModel with ``tf.saved_model.load``,
as TensorFlow Serving loads it, and reads requests from a pipe (``_serve``). A bad request must
fail alone: the child answers it with an error (``InvalidArgumentError`` from the graph, which
TF Serving returns as a 400; ``TypeError``/``ValueError`` from the Python signature binding, which
turns wrong dtypes and ranks away before the graph; ``ValueError`` from the REST body's
``{"b64": ...}`` rule) within the time limit, and then still serves a good request. A hang, a
death of the child (a crash, or a decompression bomb over the child's memory limit) or any other
error type is a violation; a dead child is restarted for the next case. The cases: batches of
mutated PNG/JPEG/GIF/BMP/WebP files, empty and random strings, small files whose headers
declare gigapixels (PNG, JPEG, BMP, GIF frames), GIFs of tiny sub-blocks, good and bad pictures
mixed; ``images`` arrays of any dtype, rank and shape holding NaN, infinities and negatives;
mutated ``tf.train.Example`` protos for ``serving_examples`` and ``classify``; REST bodies with
bad base64 and damaged JSON.

``export``: an export folder as ``client`` and ``evaluation.offline`` read it, its files damaged
(``assets.extra/export.json``, ``class_names.txt``, ``eval_metrics.json``, ``saved_model.pb``),
missing, or beside numbered folders of odd names. Reading ``saved_model.pb`` means loading the
SavedModel (about 1 s), so only the cases that damage it load it.

``hostile-export``: well-formed SavedModels that act outside the model (issue 41), each of
which the package loaded before ``serving.trust``: built with TensorFlow (a serving_default
that writes, reads or lists files, saves or restores checkpoints, or calls Python; a WriteFile
hidden three functions deep; a TF1 main_op and a TF2 resource initializer that write a file
while the SavedModel loads), or our own export with its proto edited (an op replaced, called
through a function attribute, hidden in a function nothing calls or only a gradient or a
While's body does, or in a second function of an existing name; the saver's functions called
by a signature or named by the object graph; other init ops, collections, assets and objects;
a saved_model.pb past the size bound). ``client.load_model`` must refuse each in one
line naming the op or what it found, and nothing may be written in the canaries' folder.

The kinds share one tiny export per run (``_tiny_export``), trained 3 steps as
``trainer_fixtures.tiny_export`` makes one.
"""

import base64
import dataclasses
import functools
import io
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
from hypothesis import strategies as st

from cifar10_estimator.data import images
from fuzz import harness

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
NUM_CLASSES = 10
# The child's address-space limit: a decompression bomb that got past the export's bound would
# fail an allocation (and kill the child: a violation) instead of taking the machine's memory.
CHILD_MEMORY = 8 << 30
REQUEST_SECONDS = 15.0  # an answer later than this is a hang (the kind's limit is 30 s)
MAX_PIXELS = images.MAX_PIXELS  # the export's bound (data/images.py imports no TensorFlow)


# ---------------------------------------------------------------------------------------------
# The tiny export both kinds read.


def _tiny_export(folder: str) -> str:
    """The numbered SavedModel folder of a tiny ResNet trained 3 steps, made under ``folder``
    once (in a child process, so the parent stays free of the trainer's state) and reused."""
    export_dir = os.path.join(folder, "job", "export")
    found = sorted(n for n in os.listdir(export_dir) if n.isdigit()) if os.path.isdir(
        export_dir) else []
    if not found:
        code = ("import sys; from trainer_fixtures import write_records, trainer_args; "
                "from cifar10_estimator import train; "
                "write_records(sys.argv[1], {'train': 32, 'validation': 8, 'eval': 8}); "
                "train.run(trainer_args(sys.argv[1], sys.argv[2], '--train-steps', '3', "
                "'--eval-throttle-secs', '100000'))")
        proc = subprocess.run([sys.executable, "-c", code, os.path.join(folder, "data"),
                               os.path.join(folder, "job")], cwd=folder, env=_child_env(),
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"the tiny export could not be made:\n{proc.stderr[-3000:]}")
        found = sorted(n for n in os.listdir(export_dir) if n.isdigit())
    return os.path.join(export_dir, found[-1])


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS, env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# The serving child and its protocol: frames of a 4-byte big-endian length and JSON. Bytes
# travel as base64 and arrays as their raw bytes, dtype and shape, so NaN and inf survive.


def _send(stream, message: dict) -> None:
    data = json.dumps(message).encode()
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _receive(stream) -> dict | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return json.loads(stream.read(size))


def _decode_rest(body: str) -> tuple[str, dict]:
    """TF Serving's REST rule for a predict body: ``instances`` (rows) or ``inputs`` (columns);
    a value ``{"b64": ...}`` becomes the bytes it encodes. ValueError for a bad body."""
    try:
        request = json.loads(body)
    except RecursionError:
        raise ValueError("the body is nested too deep") from None
    if not isinstance(request, dict):
        raise ValueError("the body is not a JSON object")

    def value(v):
        if isinstance(v, dict):
            if set(v) != {"b64"} or not isinstance(v["b64"], str):
                raise ValueError("an object value must be {\"b64\": string}")
            return base64.b64decode(v["b64"], validate=True)
        if isinstance(v, list):
            return [value(x) for x in v]
        return v

    columns: dict = {}
    if "instances" in request:
        rows = request["instances"]
        if not isinstance(rows, list):
            raise ValueError("instances is not a list")
        for row in rows:
            if not isinstance(row, dict):
                raise ValueError("an instance is not an object of named inputs")
            for key, v in row.items():
                columns.setdefault(key, []).append(value(v))
    elif isinstance(request.get("inputs"), dict):
        columns = {key: value(v) for key, v in request["inputs"].items()}
    else:
        raise ValueError("the body has neither instances nor inputs")
    return str(request.get("signature_name", "serving_default")), columns


def _serve(export: str) -> None:
    """The child: loads ``export`` and answers requests from stdin until it closes."""
    import tensorflow as tf

    global _REQUEST_ERRORS
    # Errors a bad request may end in: InvalidArgumentError from the graph (TF Serving answers
    # 400), TypeError/ValueError from the Python signature binding or the REST body's rule
    # (JSON and base64 errors are ValueErrors, and so is UnicodeDecodeError: TensorFlow's
    # Python binding decodes an op's error message as UTF-8, and parse_example's quotes the
    # undecodable bytes it got).
    _REQUEST_ERRORS = (tf.errors.InvalidArgumentError, TypeError, ValueError)

    # The protocol owns the real stdout; anything printed goes to stderr (the child's log).
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    model = tf.saved_model.load(export)
    _send(out, {"ready": True})
    while True:
        request = _receive(requests)
        if request is None:
            return
        started = time.monotonic()
        try:
            if "rest" in request:
                name, columns = _decode_rest(request["rest"])
                inputs = {k: tf.constant(v) for k, v in columns.items()}
            else:
                name, inputs = request["signature"], {}
                for key, spec in request["inputs"].items():
                    if spec["kind"] == "png-bomb":  # made here: 0.4 MB that is slow to make
                        inputs[key] = tf.constant([_real_png_bomb(spec["side"])])
                    elif spec["kind"] == "bytes":
                        inputs[key] = tf.constant([base64.b64decode(b) for b in spec["items"]],
                                                  tf.string)
                    else:
                        inputs[key] = tf.constant(np.frombuffer(
                            base64.b64decode(spec["data"]), spec["dtype"]).reshape(spec["shape"]))
            if name not in model.signatures:  # TF Serving: a 400 naming the signature
                raise ValueError(f"no signature {name!r}")
            outputs = model.signatures[name](**inputs)
            reply = {"outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name,
                                     "values": (v.numpy().astype(str).tolist()
                                                if v.dtype == tf.string else
                                                v.numpy().astype(float).tolist())}
                                 for k, v in outputs.items()}}
        except Exception as e:  # every error is the request's answer; the parent judges it
            reply = {"error": type(e).__name__, "message": str(e)[:500],
                     "bad_request": isinstance(e, _REQUEST_ERRORS)}
        reply["seconds"] = time.monotonic() - started
        _send(out, reply)


_REQUEST_ERRORS: tuple = ()  # set in the child (``_serve``)
_CHILD = "import sys; from fuzz import serving; serving._serve(sys.argv[1])"


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


class Server:
    """The serving child of a run: started by ``start``, restarted after a death."""

    def __init__(self, folder: str):
        self.folder = folder
        self.export = _tiny_export(folder)
        self.log_path = os.path.join(folder, "serving-child.log")
        self.process = None
        self.deaths = 0  # children that died or hung (each was a violation)
        self.start()

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, self.export], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, cwd=self.folder, env=_child_env(),
                preexec_fn=_limit_memory)
        ready = self._answer(300.0)
        if not ready or not ready.get("ready"):
            self.kill()
            raise RuntimeError(f"the serving child did not start; see {self.log_path}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
        self.process = None

    def _answer(self, seconds: float) -> dict | None:
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        if not ready:
            return None
        return _receive(self.process.stdout)

    def ask(self, request: dict) -> dict:
        """The child's answer to ``request``; Violation (and a restart at the next request)
        if the child dies or takes longer than ``REQUEST_SECONDS``."""
        if self.process is None or self.process.poll() is not None:
            self.kill()
            self.start()
        try:
            _send(self.process.stdin, request)
            answer = self._answer(REQUEST_SECONDS)
        except (BrokenPipeError, struct.error, ValueError):
            answer = None
        except BaseException:  # the case's time limit: a late answer must not answer the next
            self.kill()
            raise
        if answer is None:
            try:
                what = f"died (status {self.process.wait(5)})"
            except subprocess.TimeoutExpired:
                what = f"gave no answer in {REQUEST_SECONDS:g} s"
            self.kill()
            self.deaths += 1
            raise harness.Violation(f"the serving child {what} on a request to "
                                    f"{request.get('signature', 'REST')}; see {self.log_path}")
        return answer


def _start_server(folder: str) -> Server:
    return Server(folder)


def _stop_server(server: Server) -> None:
    if server.process is not None and server.process.poll() is None:
        server.process.stdin.close()
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
    server.kill()


# ---------------------------------------------------------------------------------------------
# Seed inputs: valid pictures, examples and a REST body, made once.


@functools.cache
def _pictures() -> dict[str, bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (21, 17, 3), dtype=np.uint8))
    out = {}
    for name, image, fmt, options in (
            ("png", rgb, "PNG", {}), ("grey.png", rgb.convert("L"), "PNG", {}),
            ("rgba.png", rgb.convert("RGBA"), "PNG", {}),
            ("palette.png", rgb.convert("P"), "PNG", {}),
            ("interlaced.png", rgb, "PNG", {"interlace": 1}),
            ("jpeg", rgb, "JPEG", {}), ("progressive.jpeg", rgb, "JPEG", {"progressive": True}),
            ("gif", rgb.convert("P"), "GIF", {}),
            ("bmp", rgb, "BMP", {}), ("grey.bmp", rgb.convert("L"), "BMP", {}),
            ("webp", rgb, "WEBP", {})):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        out[name] = buffer.getvalue()
    frames = [Image.new("P", (9, 7), 1), Image.new("P", (12, 5), 2)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    out["animated.gif"] = buffer.getvalue()
    return out


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _bomb(fmt: str, width: int, height: int) -> bytes:
    """A small file whose header declares ``width`` x ``height`` pixels."""
    if fmt == "png":
        return (b"\x89PNG\r\n\x1a\n"
                + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b""))
    if fmt == "jpeg":  # the seed JPEG with its frame header's size rewritten
        data = bytearray(_pictures()["jpeg"])
        at = data.find(b"\xff\xc0")
        data[at + 5:at + 9] = struct.pack(">HH", min(height, 65535), min(width, 65535))
        return bytes(data)
    if fmt == "bmp":
        data = bytearray(_pictures()["bmp"])
        data[18:26] = struct.pack("<ii", min(width, 2 ** 31 - 1), -min(height, 2 ** 31 - 1))
        return bytes(data)
    # A GIF of a 1x1 screen whose one frame declares the size (TensorFlow's canvas is the
    # frames', not the screen's).
    return (b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
            + b"\x2c" + struct.pack("<HHHHB", 0, 0, min(width, 65535), min(height, 65535), 0)
            + b"\x02\x02\x44\x01\x00\x3b")


def _real_png_bomb(side: int) -> bytes:
    """A PNG of ``side`` x ``side`` black pixels that decodes whole: 12000 makes 0.4 MB that
    decoded to 3 GB before the export's bound."""
    compressor = zlib.compressobj(9)
    row = b"\0" * (1 + 3 * side)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n"
            + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", data) + _png_chunk(b"IEND", b""))


def _tiny_blocks_gif(blocks: int) -> bytes:
    """A GIF whose frame data is ``blocks`` sub-blocks of one byte: long to walk."""
    return (b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
            + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02"
            + b"\x01\x44" * blocks + b"\x00\x3b")


@functools.cache
def _examples() -> dict[str, bytes]:
    import tensorflow as tf

    from cifar10_estimator.data import schema

    rng = np.random.default_rng(1)
    good = schema.encode_example(rng.integers(0, 256, schema.IMAGE_BYTES, np.uint8).tobytes(), 3)

    def example(**features):
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()

    def raw(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def ints(*values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    return {"good": good,
            "short image": example(image=raw(b"\0" * 3071), label=ints(1)),
            "long image": example(image=raw(b"\0" * 3073), label=ints(1)),
            "no image": example(label=ints(1)),
            "no label": example(image=raw(b"\0" * 3072)),
            "int image": example(image=ints(1, 2, 3), label=ints(1)),
            "two images": example(image=tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[b"\0" * 3072] * 2)), label=ints(1)),
            "huge label": example(image=raw(b"\0" * 3072), label=ints(2 ** 63 - 1)),
            "empty": b""}


# ---------------------------------------------------------------------------------------------
# serving-request


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@st.composite
def _picture_item(draw) -> bytes:
    how = draw(st.sampled_from(("good", "mutated", "mutated", "empty", "random", "bomb",
                                "blocks")))
    seeds = _pictures()
    if how == "good":
        return seeds[draw(st.sampled_from(sorted(seeds)))]
    if how == "mutated":
        return draw(harness.mutated(seeds[draw(st.sampled_from(sorted(seeds)))]))
    if how == "empty":
        return b""
    if how == "random":
        return draw(st.binary(max_size=256))
    if how == "blocks":
        return _tiny_blocks_gif(draw(st.sampled_from((10, 19_000, 21_000, 60_000))))
    side = st.one_of(st.integers(1, 70_000), st.sampled_from((0, 65_535, 100_000, 2 ** 31 - 1,
                                                              2 ** 32 - 1)))
    return _bomb(draw(st.sampled_from(("png", "jpeg", "bmp", "gif"))), draw(side), draw(side))


@st.composite
def _bytes_request(draw) -> dict:
    items = draw(st.lists(_picture_item(), min_size=0, max_size=4))
    return {"signature": "serving_bytes",
            "inputs": {"image_bytes": {"kind": "bytes", "items": [_b64(b) for b in items]}}}


_SPECIAL = (0.0, 255.0, -1.0, 256.0, -1e30, 1e30, float("nan"), float("inf"), float("-inf"))


@st.composite
def _images_request(draw) -> dict:
    dtype = draw(st.sampled_from(("float32", "float32", "float64", "float16", "int32", "uint8",
                                  "int64", "bool")))
    if draw(st.booleans()):
        shape = [draw(st.integers(0, 3)), 32, 32, 3]
    else:
        shape = draw(st.lists(st.integers(0, 40), max_size=5))
    count = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    values = rng.uniform(0, 255, count)
    for _ in range(draw(st.integers(0, 3))):
        if count:
            values[draw(st.integers(0, count - 1))] = draw(st.sampled_from(_SPECIAL))
    with np.errstate(invalid="ignore", over="ignore"):
        array = values.astype(dtype).reshape(shape)
    key = draw(st.sampled_from(("images", "images", "images", "image", "examples")))
    return {"signature": "serving_default",
            "inputs": {key: {"kind": "array", "dtype": dtype, "shape": list(array.shape),
                             "data": _b64(array.tobytes())}},
            "in_range": bool(np.all((values >= 0) & (values <= 255)))}


@st.composite
def _examples_request(draw) -> dict:
    seeds = _examples()
    items = []
    for _ in range(draw(st.integers(0, 3))):
        seed = seeds[draw(st.sampled_from(sorted(seeds)))]
        items.append(draw(st.one_of(st.just(seed), harness.mutated(seed),
                                    st.binary(max_size=64))))
    signature = draw(st.sampled_from(("serving_examples", "classify")))
    key = "examples" if signature == "serving_examples" else "inputs"
    return {"signature": signature,
            "inputs": {key: {"kind": "bytes", "items": [_b64(b) for b in items]}}}


@st.composite
def _rest_request(draw) -> dict:
    picture = _pictures()[draw(st.sampled_from(sorted(_pictures())))]
    text = _b64(picture)
    damage = draw(st.sampled_from(("none", "alphabet", "padding", "cut", "urlsafe", "json",
                                   "shape")))
    if damage == "alphabet":
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from("!*. \n\u00e9-_")) + text[at + 1:]
    elif damage == "padding":
        text = text.rstrip("=") + draw(st.sampled_from(("", "=", "==", "===")))
    elif damage == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif damage == "urlsafe":
        text = base64.urlsafe_b64encode(picture).decode()
    value = {"b64": text}
    if damage == "shape":
        value = draw(st.sampled_from(({"b64": 3}, {"b64": text, "x": 1}, text, [value], None,
                                      {})))
    body = json.dumps({"signature_name": "serving_bytes",
                       "instances": [{"image_bytes": value}] * draw(st.integers(1, 2))})
    if damage == "json":
        body = draw(harness.mutated(body.encode())).decode("utf-8", "replace")
    return {"rest": body}


def _request_strategy():
    return st.one_of(_bytes_request(), _bytes_request(), _images_request(),
                     _examples_request(), _rest_request())


_PROBE = None


def _probe_request() -> dict:
    global _PROBE
    if _PROBE is None:
        _PROBE = {"signature": "serving_bytes",
                  "inputs": {"image_bytes": {"kind": "bytes",
                                             "items": [_b64(_pictures()["png"])]}}}
    return _PROBE


def _sound_outputs(outputs: dict, rows: int, finite: bool) -> None:
    if "probabilities" in outputs:
        probabilities = np.array(outputs["probabilities"]["values"], float)
        if probabilities.shape != (rows, NUM_CLASSES):
            raise harness.Violation(f"probabilities of shape {probabilities.shape} for "
                                    f"{rows} inputs")
        classes = np.array(outputs["classes"]["values"])
        if finite and (not np.all(np.isfinite(probabilities)) or not np.allclose(
                probabilities.sum(axis=1), 1, atol=1e-4)
                       or not np.all((classes >= 0) & (classes < NUM_CLASSES))):
            raise harness.Violation(f"unsound outputs for sound pixels: {probabilities}")
    else:  # classify
        scores = np.array(outputs["scores"]["values"], float)
        if scores.shape != (rows, NUM_CLASSES) or not np.all(np.isfinite(scores)):
            raise harness.Violation(f"classify scores of shape {scores.shape}: {scores}")


def _check_request(case: dict, scratch: str, server: Server) -> str:
    request = {k: v for k, v in case.items() if k != "in_range"}
    answer = server.ask(request)
    if "error" in answer:
        if not answer["bad_request"]:
            raise harness.Violation(f"a bad request ended in {answer['error']} (not a request "
                                    f"error): {answer['message']}")
        outcome = harness.REFUSED
    else:
        if "rest" in case:
            rows = len(json.loads(case["rest"])["instances"])
        else:
            spec = next(iter(case["inputs"].values()))
            rows = (len(spec["items"]) if "items" in spec else 1 if spec["kind"] == "png-bomb"
                    else (spec["shape"] or [0])[0])
        _sound_outputs(answer["outputs"], rows, case.get("in_range", True))
        outcome = harness.ACCEPTED
    probe = server.ask(_probe_request())
    if "error" in probe:
        raise harness.Violation(f"after that request, a good one failed: {probe}")
    return outcome


# ---------------------------------------------------------------------------------------------
# export

# The files of an export the package reads, and what a case may do to one.
_TARGETS = ("assets.extra/export.json", "assets.extra/class_names.txt",
            "assets.extra/eval_metrics.json", "saved_model.pb", "versions")


@st.composite
def _export_case(draw) -> dict:
    target = draw(st.sampled_from(_TARGETS + _TARGETS[:3] * 3))  # saved_model.pb is slow
    if target == "versions":
        odd = st.sampled_from(("0", "007", "-1", "1.5", "\u00b2", "\u0661\u0662",
                               "99999999999999999999",
                               " 1", "1 ", "abc", ".1.tmp", "temp-1"))
        return {"target": target, "names": draw(st.lists(odd, min_size=1, max_size=3,
                                                         unique=True)),
                "with_pb": draw(st.booleans()), "as_file": draw(st.booleans()),
                "keep_base": draw(st.booleans())}
    how = draw(st.sampled_from(("mutated", "missing", "generated")))
    case = {"target": target, "how": how}
    if how == "mutated":
        case["data"] = draw(harness.mutated(_export_seed(target)))
    elif how == "generated":
        case["data"] = draw(st.one_of(
            st.binary(max_size=64),
            st.sampled_from((b"[" * 100_000, b"{\"global_step\": Infinity}",
                             b"{\"global_step\": NaN}", b"{\"global_step\": 1e400}",
                             b"{\"global_step\": \"3\"}", b"{\"global_step\": [3]}",
                             b"{\"compute_dtype\": null}", b"{\"accuracy\": [1]}",
                             b"[]", b"\xff\xfe",
                             b"cat\n" * 20, b"\n" * 10, b"\x00" * 10))))
    return case


@functools.cache
def _export_seed(target: str) -> bytes:
    with open(os.path.join(_EXPORT[0], target), "rb") as f:
        return f.read()


_EXPORT: list[str] = []  # the seed export of the run (``_start_export``)


def _start_export(folder: str) -> str:
    from cifar10_estimator.evaluation import offline  # noqa: F401  (imports TensorFlow once)

    export = _tiny_export(folder)
    _EXPORT[:] = [export]
    return export


def _copy_export(export: str, scratch: str) -> str:
    """A copy of the export as a numbered folder of ``scratch/export/best`` (the folder
    ``best_export.BestExport`` of the export folder ``scratch/export`` keeps)."""
    folder = os.path.join(scratch, "export", "best", "1700000000")
    shutil.copytree(export, folder)
    return folder


def _check_export(case: dict, scratch: str, export: str) -> str:
    from cifar10_estimator.evaluation import offline
    from cifar10_estimator.serving import best_export, client

    folder = _copy_export(export, scratch)
    base = os.path.dirname(folder)
    if case["target"] == "versions":
        if not case["keep_base"]:
            shutil.rmtree(folder)
        for name in case["names"]:
            path = os.path.join(base, name)
            if case["as_file"]:
                with open(path, "wb") as f:
                    f.write(b"x")
            else:
                os.makedirs(path)
                if case["with_pb"]:
                    shutil.copy(os.path.join(export, "saved_model.pb"), path)
        outcome, newest = harness.refused(lambda: client.newest_export(base), base)
        if newest is not None and not os.path.isfile(os.path.join(newest, "saved_model.pb")):
            raise harness.Violation(f"newest_export chose {newest}, which holds no "
                                    f"saved_model.pb")
        return outcome
    path = os.path.join(folder, case["target"])
    if case["how"] == "missing":
        os.remove(path)
    elif case["how"] == "replace":  # one name in the file changed (a regression's minimal form)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data.replace(case["old"], case["new"]))
    else:
        with open(path, "wb") as f:
            f.write(case["data"])
    if case["target"] == "saved_model.pb":
        outcome, _ = harness.refused(lambda: client.load_model(folder), folder)
        return outcome
    if case["target"].endswith("export.json"):
        info = offline.export_info(folder)
        if not isinstance(info, dict):
            raise harness.Violation(f"export_info gave {info!r}")
        offline._computes_in(offline._export_dtype(folder))
    elif case["target"].endswith("class_names.txt"):
        for count in (NUM_CLASSES, 3):
            names = client.class_names(folder, count)
            if len(names) != count or not all(isinstance(n, str) and n for n in names):
                raise harness.Violation(f"class_names gave {names!r} for {count} classes")
    else:
        step = offline.export_step(folder)
        if step is not None and not isinstance(step, int):
            raise harness.Violation(f"export_step gave {step!r}")
        best = best_export.BestExport(None, os.path.dirname(base)).best_accuracy()
        if best is not None and not isinstance(best, float):
            raise harness.Violation(f"best_accuracy gave {best!r}")
    return harness.ACCEPTED


# ---------------------------------------------------------------------------------------------
# hostile-export: well-formed SavedModels that act outside the model (issue 41). Each one the
# package loaded before serving.trust; each must be refused before anything of it runs.

# Ops that act outside the model: files (written, read, listed; checkpoints saved and restored
# anywhere), Python, a print to a file (PrintV2's output_stream "file://..."), a file mapped
# into memory (ImmutableConst).
HOSTILE_OPS = ("WriteFile", "ReadFile", "MatchingFiles", "Save", "SaveV2", "SaveSlices",
               "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints", "PyFunc",
               "EagerPyFunc", "PyFuncStateless", "PrintV2", "ImmutableConst")
CANARIES = "canaries"  # the folder a hostile export's writes go to, which must stay empty


def _images_spec():
    import tensorflow as tf

    return tf.TensorSpec([None, 32, 32, 3], tf.float32, name="images")


def _probabilities(images):
    """What our serving_default returns, computed with ops our exports use too (Mean, Tile,
    Softmax, StridedSlice), so the one foreign op of a hostile build is its hostile one."""
    import tensorflow as tf

    return tf.nn.softmax(tf.tile(tf.reduce_mean(images, axis=[1, 2, 3])[:, None], [1, 10]))


def _save_tf2(folder: str, act, module=None) -> str:
    """A TF2 SavedModel whose ``serving_default`` (``images`` -> ``probabilities``, as ours)
    also runs ``act()`` on every call."""
    import tensorflow as tf

    module = module or tf.Module()

    @tf.function(input_signature=[_images_spec()])
    def serve(images):
        with tf.control_dependencies(tf.nest.flatten(act())):
            return {"probabilities": tf.identity(_probabilities(images))}

    module.serve = serve
    tf.saved_model.save(module, folder, signatures={"serving_default": serve})
    return folder


def _nested_write(canary: str):
    """A WriteFile three functions deep: a tf.function called in a while_loop's body in a
    cond's branch (the If's branch, the While's body, the inner function are each a function
    of the library; ``saved_model_cli scan`` follows none of the first two)."""
    import tensorflow as tf

    @tf.function
    def inner(i):
        with tf.control_dependencies([tf.io.write_file(canary, "nested")]):
            return i + 1

    def act():
        def loop():
            return tf.while_loop(lambda i: i < 1, inner, [tf.constant(0)])[0]
        return tf.cond(tf.random.uniform([]) >= 0, loop, lambda: tf.constant(0))
    return act


def _resource_module(canary: str):
    """A module holding a resource whose initializer writes ``canary``:
    ``tf.saved_model.load`` runs it while it loads (TF 2.15's load.py, for every restored
    CapturableResource)."""
    import tensorflow as tf

    class WritingResource(tf.saved_model.experimental.TrackableResource):
        def _create_resource(self):
            return tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)

        def _initialize(self):
            return tf.io.write_file(canary, "initialized")

    module = tf.Module()
    module.resource = WritingResource()
    return module


def _save_tf1_main_op(folder: str, canary: str) -> str:
    """A TF1 SavedModel (``tf.compat.v1.saved_model.Builder``) whose main_op writes ``canary``:
    ``tf.saved_model.load`` and TF Serving run it while they load."""
    import tensorflow as tf

    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3], name="images")
        signature = tf.compat.v1.saved_model.predict_signature_def(
            {"images": images}, {"probabilities": _probabilities(images)})
        main_op = tf.io.write_file(canary, "main_op")
        with tf.compat.v1.Session() as session:
            builder = tf.compat.v1.saved_model.Builder(folder)
            builder.add_meta_graph_and_variables(
                session, [tf.saved_model.SERVING], main_op=main_op,
                signature_def_map={"serving_default": signature})
            builder.save()
    return folder


def benign_foreign_export(folder: str) -> str:
    """A harmless SavedModel not of this package: ``serving_default`` as ours, over a variable
    (ops and objects our frozen exports lack). Refused unless trusted."""
    import tensorflow as tf

    module = tf.Module()
    module.weights = tf.Variable(tf.ones([3, 10]))

    @tf.function(input_signature=[_images_spec()])
    def serve(images):
        return {"probabilities": tf.nn.softmax(tf.reduce_mean(images, [1, 2]) @ module.weights)}

    module.serve = serve
    tf.saved_model.save(module, folder, signatures={"serving_default": serve})
    return folder


def hostile_exports(root: str, canaries: str) -> dict[str, str]:
    """Builds the hostile SavedModels, each in ``root/<name>``; whatever they write goes to
    the folder ``canaries``. Returns name -> folder. The name says what each runs and when:
    ``WriteFile``, ..., when ``serving_default`` is called; ``tf1-main-op`` and
    ``resource-init`` while the SavedModel loads."""
    import tensorflow as tf

    def at(name: str) -> str:
        return os.path.join(canaries, name)

    one = tf.constant  # a scalar for the checkpoint ops' tensors
    builds = {
        "WriteFile": lambda f: _save_tf2(f, lambda: tf.io.write_file(at("write"), "x")),
        "ReadFile": lambda f: _save_tf2(f, lambda: tf.io.read_file(os.devnull)),
        "MatchingFiles": lambda f: _save_tf2(f, lambda: tf.io.matching_files(at("*"))),
        "SaveV2": lambda f: _save_tf2(f, lambda: tf.raw_ops.SaveV2(
            prefix=at("savev2"), tensor_names=["x"], shape_and_slices=[""],
            tensors=[one(1.0)])),
        "Save": lambda f: _save_tf2(f, lambda: tf.raw_ops.Save(
            filename=at("save"), tensor_names=["x"], data=[one(1.0)])),
        "RestoreV2": lambda f: _save_tf2(f, lambda: tf.raw_ops.RestoreV2(
            prefix=at("savev2"), tensor_names=["x"], shape_and_slices=[""],
            dtypes=[tf.float32])),
        "Restore": lambda f: _save_tf2(f, lambda: tf.raw_ops.Restore(
            file_pattern=at("save"), tensor_name="x", dt=tf.float32)),
        # The Python runs only in the process that saved it: a SavedModel names it by a token
        # of the loading process's own registry (pyfunc_0, ...).
        "EagerPyFunc": lambda f: _save_tf2(f, lambda: tf.py_function(
            lambda: open(at("py_function"), "w").close() or 0.0, [], tf.float32)),
        "PyFunc": lambda f: _save_tf2(f, lambda: tf.numpy_function(
            lambda: open(at("numpy_function"), "w").close() or np.float32(0), [], tf.float32)),
        "nested-WriteFile": lambda f: _save_tf2(f, _nested_write(at("nested"))),
        "resource-init": lambda f: _save_tf2(f, lambda: [], _resource_module(at("resource"))),
        "tf1-main-op": lambda f: _save_tf1_main_op(f, at("main_op")),
    }
    os.makedirs(canaries, exist_ok=True)
    return {name: build(os.path.join(root, name)) for name, build in builds.items()}


# What each build is refused for: the op it runs that acts outside the model, which the refusal
# names before the other ops it lacks (the resource's HashTableV2, the cond's RandomUniform).
HOSTILE_BUILD_OPS = {"nested-WriteFile": "WriteFile", "resource-init": "WriteFile",
                     "tf1-main-op": "WriteFile"}


# The names tf.saved_model.save gives the saver's save and restore functions.
_SAVER_FUNCTIONS = ("__inference__traced_save", "__inference__traced_restore")


def _parse(folder: str):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(folder, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def _function(graph, prefix: str):
    return next(f for f in graph.library.function if f.signature.name.startswith(prefix))


def edit_export(folder: str, edit: dict) -> str:
    """Edits the SavedModel proto of one of our exports in ``folder`` in place, as ``edit``
    says (``_edit_case``); returns the op (or the fact) its refusal must name."""
    if edit["edit"] == "huge":  # a sparse file: no disk, and never read
        path = os.path.join(folder, "saved_model.pb")
        from cifar10_estimator.serving import trust

        os.truncate(path, trust.MAX_SAVED_MODEL_BYTES + edit.get("extra", 1))
        return f"{trust.MAX_SAVED_MODEL_BYTES + edit.get('extra', 1):,} bytes"
    proto = _parse(folder)
    meta = proto.meta_graphs[0]
    graph = meta.graph_def
    op = edit.get("op", "WriteFile")
    named = op
    how = edit["edit"]
    if how == "op":  # one node of one function (or of the graph) becomes the op
        functions = sorted(graph.library.function, key=lambda f: f.signature.name)
        function = None if edit["function"] < 0 else functions[
            edit["function"] % len(functions)]
        if function is not None and function.signature.name.startswith(_SAVER_FUNCTIONS):
            # The saver's own functions hold its checkpoint ops already: another one there is
            # what our exports hold, so the op there is WriteFile.
            op = named = "WriteFile"
        nodes = list(graph.node) if function is None else list(function.node_def)
        nodes[edit["node"] % len(nodes)].op = op
    elif how == "attr":  # a call names an op instead of a function: TensorFlow runs the op
        node = next(n for n in graph.node if n.op == "PartitionedCall")
        node.attr["f"].func.name = op
    elif how in ("uncalled", "gradient"):  # a function nothing calls, or only as a gradient
        function = graph.library.function.add()
        function.signature.name = f"hidden_{how}"
        node = function.node_def.add()
        node.name, node.op = "hidden", op
        if how == "gradient":
            gradient = graph.library.gradient.add()
            gradient.function_name = _function(graph, "__inference_network").signature.name
            gradient.gradient_func = function.signature.name
    elif how == "nested":  # the op in a new function that a While's body calls
        body = _function(graph, "map_while_body")
        function = graph.library.function.add()
        function.signature.name = "hidden_nested"
        inner = function.node_def.add()
        inner.name, inner.op = "hidden", op
        call = body.node_def.add()
        call.name, call.op = "hidden_call", "PartitionedCall"
        call.attr["f"].func.name = function.signature.name
    elif how == "duplicate":  # a second function of the network's name, holding the op
        function = graph.library.function.add()
        function.CopyFrom(_function(graph, "__inference_network"))
        function.node_def[0].op = op
    elif how == "object-saver":  # an object of the object graph names the saver's restore
        obj = meta.object_graph_def.nodes.add()
        obj.bare_concrete_function.concrete_function_name = _function(
            graph, "__inference__traced_restore").signature.name
        named = "outside the checkpoint saver's own functions"
    elif how == "saver-call":  # a signature calls the saver's save function
        save = _function(graph, "__inference__traced_save").signature.name
        wrapper = _function(graph, "__inference_signature_wrapper_by_images")
        next(n for n in wrapper.node_def if n.op == "PartitionedCall").attr["f"].func.name = save
        named = "outside the checkpoint saver's own functions"
    elif how == "init-op":  # the init NoOp becomes the op, or waits for another node
        node = next(n for n in graph.node if n.name == "NoOp")
        if edit.get("inputs"):
            node.input.append("^StatefulPartitionedCall_1")  # the saver's save
            named = "StatefulPartitionedCall_1"
        else:
            node.op = op
    elif how == "main-op":  # the main_op collection names the saver's save call
        meta.collection_def["saved_model_main_op"].node_list.value[:] = [
            "StatefulPartitionedCall_1"]
        named = "StatefulPartitionedCall"
    elif how == "legacy-init-op":
        meta.collection_def["legacy_init_op"].node_list.value.append("NoOp")
        named = "legacy init op"
    elif how == "asset":
        asset = meta.asset_file_def.add()
        asset.filename = "../../../etc/passwd"
        asset.tensor_info.name = "Const:0"
        named = "../../../etc/passwd"
    elif how == "object":  # an object of a kind our exports lack, or registered Python
        kind = edit["kind"]
        obj = meta.object_graph_def.nodes.add()
        if kind == "registered":
            obj.user_object.identifier = "_generic_user_object"
            obj.registered_name = "hostile.Loader"
            named = "hostile.Loader"
        else:
            getattr(obj, kind).SetInParent()
            named = kind
    else:
        raise ValueError(f"no edit {how!r}")
    with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
        f.write(proto.SerializeToString())
    return named


HOSTILE_BUILDS = ("WriteFile", "ReadFile", "MatchingFiles", "SaveV2", "Save", "RestoreV2",
                "Restore", "EagerPyFunc", "PyFunc", "nested-WriteFile", "resource-init",
                "tf1-main-op")


_EDITS = ("op", "attr", "uncalled", "gradient", "nested", "duplicate", "saver-call",
          "object-saver", "init-op", "main-op", "legacy-init-op", "asset", "object", "huge")


@st.composite
def _hostile_case(draw) -> dict:
    if draw(st.booleans()):
        return {"build": draw(st.sampled_from(sorted(HOSTILE_BUILDS)))}
    how = draw(st.sampled_from(_EDITS))
    case = {"edit": how, "op": draw(st.sampled_from(HOSTILE_OPS))}
    if how == "op":
        case.update(function=draw(st.integers(-1, 10_000)), node=draw(st.integers(0, 10_000)))
    elif how == "init-op":
        case["inputs"] = draw(st.booleans())
    elif how == "object":
        case["kind"] = draw(st.sampled_from(("resource", "asset", "variable", "constant",
                                             "captured_tensor", "registered")))
    elif how == "huge":
        case["extra"] = draw(st.integers(1, 1 << 30))
    return case


@dataclasses.dataclass
class _Hostile:
    """A run's seeds: our tiny export and the hostile builds, and the canaries' folder."""

    export: str
    builds: dict
    canaries: str


def _start_hostile(folder: str) -> _Hostile:
    from cifar10_estimator.serving import client  # noqa: F401  (imports TensorFlow once)

    canaries = os.path.join(folder, CANARIES)
    builds = hostile_exports(os.path.join(folder, "hostile"), canaries)
    assert sorted(builds) == sorted(HOSTILE_BUILDS)
    return _Hostile(_tiny_export(folder), builds, canaries)


def _check_hostile(case: dict, scratch: str, seeds: _Hostile) -> str:
    from cifar10_estimator.serving import client

    folder = os.path.join(scratch, "1700000000")
    if "build" in case:
        shutil.copytree(seeds.builds[case["build"]], folder)
        named = HOSTILE_BUILD_OPS.get(case["build"], case["build"])
    else:
        shutil.copytree(seeds.export, folder)
        named = edit_export(folder, case)
    try:
        outcome, _ = harness.refused(lambda: client.load_model(folder), folder, named)
    finally:
        written = os.listdir(seeds.canaries)
        for name in written:  # the next case starts clean
            os.remove(os.path.join(seeds.canaries, name))
    if written:
        raise harness.Violation(f"the hostile export wrote {written}")
    if outcome != harness.REFUSED:
        raise harness.Violation("a hostile export was loaded")
    return outcome


KINDS = [
    harness.Kind(
        name="serving-request",
        reader="the export's signatures (serving.signatures) in a tf.saved_model.load child",
        tried="serving_bytes batches of mutated PNG/JPEG/GIF/BMP/WebP, empty and random "
              "strings, headers declaring up to 4 gigapixels (PNG, JPEG, BMP, GIF frame), GIFs "
              "of 1-byte sub-blocks, good and bad mixed; serving_default arrays of 8 dtypes, "
              "ranks 0-5, NaN/inf/negative; mutated tf.Example protos for serving_examples "
              "and classify; REST bodies with bad base64 and damaged JSON",
        strategy=_request_strategy(),
        check=_check_request,
        start=_start_server,
        stop=_stop_server,
        time_limit=30.0,
        regressions=(
            # A 0.4 MB PNG of 12000x12000 pixels that decodes: 3 GB and seconds before the
            # export's bound, refused from its header now.
            {"signature": "serving_bytes", "inputs": {"image_bytes": {
                "kind": "png-bomb", "side": 12_000}}},
            # A scalar (rank 0) to serving_default: a CHECK failure aborted the process.
            {"signature": "serving_default", "inputs": {"images": {
                "kind": "array", "dtype": "float32", "shape": [], "data": _b64(b"\0" * 4)}}},
            # A GIF whose 1x1 screen hides a 60000x60000 frame.
            {"signature": "serving_bytes", "inputs": {"image_bytes": {
                "kind": "bytes", "items": [_b64(_bomb("gif", 60_000, 60_000))]}}},
        )),
    harness.Kind(
        name="export",
        reader="serving.client.newest_export, load_model, class_names; "
               "evaluation.offline.export_info, export_step; "
               "serving.best_export.BestExport.best_accuracy",
        tried="export.json, class_names.txt and eval_metrics.json mutated, missing or "
              "generated (deep nesting, Infinity/NaN steps, wrong types, bad UTF-8); "
              "saved_model.pb truncated and bit-flipped (loaded: about 1 s a case); numbered "
              "folders of odd names (Unicode digits, leading zeros, files, no saved_model.pb)",
        strategy=_export_case(),
        check=_check_export,
        start=_start_export,
        time_limit=30.0,
        regressions=(
            {"target": "assets.extra/eval_metrics.json", "how": "generated",
             "data": b"{\"global_step\": Infinity}"},
            {"target": "assets.extra/export.json", "how": "generated", "data": b"[" * 100_000},
            {"target": "versions", "names": ["\u00b2"], "with_pb": True, "as_file": False,
             "keep_base": True},
            {"target": "versions", "names": ["007"], "with_pb": True, "as_file": False,
             "keep_base": False},
            {"target": "assets.extra/eval_metrics.json", "how": "generated",
             "data": b"{\"accuracy\": [1]}"},
            # Found by the campaign: an op name the graph holds that TensorFlow lacks made
            # tf.saved_model.load raise RuntimeError.
            {"target": "saved_model.pb", "how": "replace", "old": b"AddV2", "new": b"AddV9"},
        )),
    harness.Kind(
        name="hostile-export",
        reader="serving.client.load_model (serving.trust.check_export first)",
        tried="well-formed SavedModels built with TensorFlow whose serving_default writes, "
              "reads or lists files (WriteFile, ReadFile, MatchingFiles), saves or restores "
              "checkpoints (Save, SaveV2, Restore, RestoreV2) or calls Python (PyFunc, "
              "EagerPyFunc), a WriteFile three functions deep (If, While, tf.function), a TF1 "
              "main_op and a TF2 resource initializer that write a file while loading; our "
              "export with a node made one of 15 file, Python or print ops, or that op named "
              "by a call's function attribute, put in a new function nothing calls, or only a "
              "gradient or a While's body calls, or in a second function of the network's "
              "name; the saver's save function called by a signature, its restore function "
              "named by the object graph; the init op made an op or given inputs, the main_op "
              "naming the saver, a legacy_init_op, a TF1 asset, TF2 objects of 5 other kinds "
              "or of registered Python; a saved_model.pb past the size bound",
        strategy=_hostile_case(),
        check=_check_hostile,
        start=_start_hostile,
        # The SavedModels of issue 41, each loaded before serving.trust: every build, and one
        # case of each way to hide an op or an init op in our own export.
        regressions=(
            *({"build": name} for name in HOSTILE_BUILDS),
            {"edit": "op", "op": "WriteFile", "function": 0, "node": 3},
            {"edit": "op", "op": "PrintV2", "function": -1, "node": 0},
            {"edit": "attr", "op": "WriteFile"},
            {"edit": "uncalled", "op": "EagerPyFunc"},
            {"edit": "gradient", "op": "WriteFile"},
            {"edit": "nested", "op": "ReadFile"},
            {"edit": "duplicate", "op": "WriteFile"},
            {"edit": "saver-call", "op": "SaveV2"},
            {"edit": "object-saver", "op": "RestoreV2"},
            {"edit": "init-op", "op": "WriteFile", "inputs": False},
            {"edit": "init-op", "op": "WriteFile", "inputs": True},
            {"edit": "main-op", "op": "WriteFile"},
            {"edit": "legacy-init-op", "op": "WriteFile"},
            {"edit": "asset", "op": "WriteFile"},
            {"edit": "object", "op": "WriteFile", "kind": "resource"},
            {"edit": "object", "op": "WriteFile", "kind": "registered"},
            {"edit": "huge", "op": "WriteFile", "extra": 1},
        )),
]
