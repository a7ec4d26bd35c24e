"""Fuzzing what an export serves and what the package reads of an export: two kinds.

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

Both kinds share one tiny export per run (``_tiny_export``), trained 3 steps as
``trainer_fixtures.tiny_export`` makes one.
"""

import base64
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
]
