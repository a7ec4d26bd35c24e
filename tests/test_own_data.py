"""Your own data end to end: CIFAR-100 and image folders, generator -> trainer -> export -> predict.

Tiny datasets in the true formats: CIFAR-100's python layout (``train``, ``test``, ``meta``
with fine and coarse labels), served as the official tar.gz from a real HTTP server on
127.0.0.1; an image folder of PNG, JPEG, GIF and BMP files of mixed sizes and modes encoded by
TensorFlow's own encoders.
"""

import io
import os
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import generate, predict, train
from cifar10_estimator.data import archives, images, metadata, pickles, schema, sources
from cifar10_estimator.model import resnet
from cifar10_estimator.errors import UserError
from cifar10_estimator.serving import client
from conftest import md5
from trainer_fixtures import bomb_png, trainer_args

FINE = [f"fine{i:02d}" for i in range(100)]
COARSE = [f"coarse{i:02d}" for i in range(20)]


def write_cifar100(root: str, train: int = 50, test: int = 20, seed: int = 0) -> dict:
    """Writes ``root/cifar-100-python/{train,test,meta}`` as the real files are laid out."""
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    out = {}
    for name, n in (("train", train), ("test", test)):
        fine = [int(v) for v in rng.integers(0, 100, n)]
        body = {"filenames": [f"img{i}.png" for i in range(n)], "batch_label": f"{name}",
                "fine_labels": fine, "coarse_labels": [v // 5 for v in fine],
                "data": rng.integers(0, 256, (n, schema.IMAGE_BYTES), dtype=np.uint8)}
        with open(os.path.join(folder, name), "wb") as f:
            f.write(pickles.dumps_py2(body))
        out[name] = body
    with open(os.path.join(folder, "meta"), "wb") as f:
        f.write(pickles.dumps_py2({"fine_label_names": FINE, "coarse_label_names": COARSE}))
    return out


def cifar100_tarball(root: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(os.path.join(root, "cifar-100-python"), arcname="cifar-100-python")
    return buffer.getvalue()


def test_cifar100_downloaded_splits_4_to_1_with_fine_or_coarse_labels(tmp_path, http_server):
    source = str(tmp_path / "source")
    body = write_cifar100(source)
    archive = cifar100_tarball(source)
    http_server.routes["/cifar-100-python.tar.gz"] = archive
    data_dir = str(tmp_path / "data")
    assert generate.main(["--data-dir", data_dir, "--dataset", "cifar100",
                          "--source-url", http_server.url("/cifar-100-python.tar.gz"),
                          "--source-md5", md5(archive)]) == 0
    info = metadata.dataset_info(data_dir)
    assert (info.dataset, info.num_classes, info.class_names[:2]) == (
        "cifar100-fine", 100, ("fine00", "fine01"))
    assert {k: v.records for k, v in info.splits.items()} == {
        "train": 40, "validation": 10, "eval": 20}  # the last fifth of train is held out
    first = next(iter(tf.data.TFRecordDataset(schema.record_path(data_dir, "validation"))))
    parsed = tf.io.parse_single_example(first, schema.FEATURE_SPEC)
    assert parsed["label"].numpy() == body["train"]["fine_labels"][40]
    assert parsed["image"].numpy() == body["train"]["data"][40].tobytes()

    coarse_dir = str(tmp_path / "coarse")
    assert generate.main(["--data-dir", data_dir, "--output-dir", coarse_dir, "--dataset",
                          "cifar100", "--label-mode", "coarse"]) == 0  # extracted folder now
    coarse = metadata.dataset_info(coarse_dir)
    assert (coarse.dataset, coarse.num_classes, coarse.class_names[-1]) == (
        "cifar100-coarse", 20, "coarse19")


def test_the_cifar100_archive_has_its_own_md5_and_refuses_foreign_members(tmp_path):

    assert archives.CIFAR100.md5 == "eb9058c3a382ffc7106e4002c42a8d85"
    assert archives.CIFAR100.url == "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    source = str(tmp_path / "source")
    write_cifar100(source)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(os.path.join(source, "cifar-100-python"), arcname="cifar-100-python")
        info = tarfile.TarInfo("cifar-100-python/../evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "cifar-100-python.tar.gz").write_bytes(buffer.getvalue())
    with pytest.raises(Exception, match="refused archive member .*evil"):
        sources.load_source(str(data_dir), source_md5=md5(buffer.getvalue()),
                             dataset="cifar100", log=lambda _: None)
    assert not (data_dir / "cifar-100-python").exists()


def test_a_100_class_resnet20_has_the_papers_count_with_a_wider_dense_layer():
    with tf.Graph().as_default():
        resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=False, num_layers=20,
                            num_classes=100)
        count = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
    assert count == 269_722 - 650 + 6_500


@pytest.mark.slow
def test_cifar100_trains_exports_and_predict_names_its_classes(tmp_path, capsys):
    source = str(tmp_path / "data")
    write_cifar100(source, train=40, test=16)
    assert generate.main(["--data-dir", source, "--dataset", "cifar100"]) == 0
    job_dir = str(tmp_path / "job")
    result = train.run(trainer_args(source, job_dir, "--train-steps", "2",
                                    "--eval-throttle-secs", "100000"))
    names = open(os.path.join(result.export_path, "assets.extra", "class_names.txt")).read()
    assert names.splitlines() == FINE
    png = tmp_path / "picture.png"
    png.write_bytes(tf.io.encode_png(np.full((40, 24, 3), 90, np.uint8)).numpy())
    capsys.readouterr()
    assert predict.main(["--saved-model", result.export_path, "--top", "5", str(png)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{png}: fine") and line.count("fine") == 5
    # A job dir of 100 classes refuses records of 10, by name.
    ten = str(tmp_path / "ten")
    from trainer_fixtures import write_records

    write_records(ten, {"train": 16, "validation": 8, "eval": 8})
    assert train.main(trainer_args(ten, job_dir, "--train-steps", "4")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds checkpoints of a model with 100 classes, but the records in --data-dir " \
           "have 10" in err


def _encode(kind: str, pixels: np.ndarray) -> bytes:
    if kind == "png":
        return tf.io.encode_png(pixels).numpy()
    if kind == "jpg":
        return tf.io.encode_jpeg(pixels, quality=95).numpy()
    if kind == "bmp":  # 24-bit BMP, bottom-up rows, written by hand (TF has no BMP encoder)
        h, w, _ = pixels.shape
        row = (w * 3 + 3) // 4 * 4
        body = b"".join(pixels[y, :, ::-1].tobytes().ljust(row, b"\0") for y in range(h - 1, -1, -1))
        header = b"BM" + (54 + len(body)).to_bytes(4, "little") + b"\0" * 4 + (54).to_bytes(4, "little")
        info = (40).to_bytes(4, "little") + w.to_bytes(4, "little") + h.to_bytes(4, "little") + \
            (1).to_bytes(2, "little") + (24).to_bytes(2, "little") + b"\0" * 24
        return header + info + body
    raise ValueError(kind)


def write_image_folder(root, rng) -> dict:
    """3 classes by colour, PNG/JPEG/BMP, sizes 20..70 px, RGB, grayscale and RGBA."""
    colours = {"apple": (200, 30, 30), "grass": (30, 180, 40), "sky": (40, 60, 210)}
    written = {}
    for folder, count in (("train", 8), ("test", 3)):
        for name, colour in colours.items():
            d = root / folder / name
            d.mkdir(parents=True)
            for i in range(count):
                h, w = rng.integers(20, 70, 2)
                pixels = np.clip(np.array(colour) + rng.integers(-20, 21, (h, w, 3)), 0, 255)
                pixels = pixels.astype(np.uint8)
                kind = ("png", "jpg", "bmp")[i % 3]
                if i % 4 == 1 and kind == "png":  # grayscale
                    data = tf.io.encode_png(pixels.mean(axis=2, keepdims=True).astype(np.uint8))
                    data = data.numpy()
                elif i % 4 == 3 and kind == "png":  # RGBA
                    alpha = np.full((h, w, 1), 255, np.uint8)
                    data = tf.io.encode_png(np.concatenate([pixels, alpha], 2)).numpy()
                else:
                    data = _encode(kind, pixels)
                path = d / f"{i:02d}.{kind.upper() if i == 2 else kind}"
                path.write_bytes(data)
                written[str(path)] = name
    (root / "train" / "sky" / "notes.txt").write_text("not an image")
    return written


@pytest.mark.slow
def test_an_image_folder_trains_and_serves_the_same_pixels(tmp_path, capsys):
    root = tmp_path / "pictures"
    written = write_image_folder(root, np.random.default_rng(0))
    data_dir = str(tmp_path / "data")
    # No --data-dir needed: nothing is read from it.
    assert generate.main(["--image-folder", str(root), "--output-dir", data_dir]) == 0
    out = capsys.readouterr().out
    assert "1 non-image file(s) left out" in out
    info = metadata.dataset_info(data_dir)
    assert info.class_names == ("apple", "grass", "sky") and info.dataset == "image-folder"
    assert {k: v.records for k, v in info.splits.items()} == {"train": 24, "eval": 9}
    assert not os.path.exists(schema.record_path(data_dir, "validation"))
    # The records hold exactly the pixels predict feeds the model for the same file.
    first_test = sorted(p for p in written if "/test/apple/" in p)[0]
    record = next(iter(tf.data.TFRecordDataset(schema.record_path(data_dir, "eval"))))
    parsed = tf.io.parse_example(record[None], schema.FEATURE_SPEC)
    stored = schema.decode_images(parsed["image"])[0].numpy()
    np.testing.assert_array_equal(stored, client.load_image(first_test).numpy())
    assert parsed["label"].numpy()[0] == 0

    job_dir = str(tmp_path / "job")
    result = train.run(trainer_args(data_dir, job_dir, "--train-steps", "30",
                                    "--eval-throttle-secs", "100000",
                                    "--use-distortion-for-training=false"))
    assert result.eval_metrics["global_step"] == 30
    capsys.readouterr()
    assert predict.main(["--saved-model", result.export_path, first_test]) == 0
    shown = capsys.readouterr().out.strip()
    assert shown.startswith(f"{first_test}: ") and {"apple", "grass", "sky"} == {
        part.split()[0] for part in shown.split(": ", 1)[1].split(", ")}


def test_damaged_pictures_are_left_out_and_counted_naming_the_first(tmp_path, capsys):
    root = tmp_path / "pictures"
    write_image_folder(root, np.random.default_rng(1))
    bad = root / "train" / "grass" / "99.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"broken" * 10)
    (root / "train" / "sky" / "empty.jpg").write_bytes(b"")
    data_dir = tmp_path / "data"
    assert generate.main(["--data-dir", str(data_dir), "--image-folder", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"2 damaged picture(s) left out (first: {bad})" in out
    info = metadata.dataset_info(str(data_dir))
    assert {k: v.records for k, v in info.splits.items()} == {"train": 24, "eval": 9}


def test_a_split_with_no_readable_picture_stops_the_conversion_and_writes_nothing(tmp_path,
                                                                                  capsys):
    root = tmp_path / "pictures"
    write_image_folder(root, np.random.default_rng(1))
    for path in (root / "test").rglob("*.*"):
        path.write_bytes(b"broken")
    data_dir = tmp_path / "data"
    assert generate.main(["--data-dir", str(data_dir), "--image-folder", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"cifar10_estimator.generate: error: {root / 'test'} has no readable "
                          f"picture: all 9 are damaged")
    assert not data_dir.exists() or not list(data_dir.glob("*.tfrecords"))


def test_a_picture_whose_header_promises_gigapixels_is_left_out_before_decoding(tmp_path,
                                                                                capsys):
    root = tmp_path / "pictures"
    write_image_folder(root, np.random.default_rng(2))
    bomb = root / "test" / "sky" / "bomb.png"
    bomb.write_bytes(bomb_png(60_000, 60_000))
    assert generate.main(["--data-dir", str(tmp_path / "data"), "--image-folder",
                          str(root)]) == 0
    assert f"1 damaged picture(s) left out (first: {bomb})" in capsys.readouterr().out
    with pytest.raises(UserError, match="too large to decode safely"):
        images.check_file(str(bomb), str(bomb))


@pytest.mark.parametrize("kind", ["png", "jpg", "bmp"])
def test_the_header_check_passes_every_kind_of_picture_and_refuses_pixel_floods(kind, tmp_path):
    # Pillow's limit (89,478,485 pixels): a picture just under it passes on its header alone,
    # one just over it is refused; neither is decoded.
    picture = tmp_path / f"ok.{kind}"
    picture.write_bytes(_encode(kind, np.zeros((7, 5, 3), np.uint8)))
    images.check_file(str(picture), str(picture))
    images.check_file(io.BytesIO(bomb_png(9_000, 9_000)), "just under")  # 81 megapixels
    with pytest.raises(UserError, match="over the limit is too large to decode safely"):
        images.check_file(io.BytesIO(bomb_png(9_500, 9_500)), "over the limit")
