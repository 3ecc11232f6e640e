"""model.json as a deployment contract: the files it lists run on their own, and its steps,
implemented in plain numpy from the spec (spec_numpy.py), give the package's input bit for bit.
"""

from __future__ import annotations

import ast
import io
import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import spec_numpy
from test_export import cls_checkpoint, vtfm

from vision_tfm.export import load_source
from vision_tfm.tasks.predict import Classifier

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "examples" / "onnx_client.py"


def png_by_hand(samples: np.ndarray, colour_type: int, depth: int = 16) -> bytes:
    """A PNG written by hand (filter 0) at a bit depth Pillow does not write for this colour
    type (16-bit colour, 2-bit grey); ``samples`` is (H, W) or (H, W, C)."""
    h, w = samples.shape[:2]
    if depth == 16:
        rows = [samples[y].astype(">u2").tobytes() for y in range(h)]
    else:  # one sample per pixel, packed high bits first
        bits = (samples[..., None] >> np.arange(depth - 1, -1, -1)) & 1
        rows = [np.packbits(bits[y].ravel()).tobytes() for y in range(h)]
    raw = b"".join(b"\x00" + row for row in rows)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    head = struct.pack(">IIBBBBB", w, h, depth, colour_type, 0, 0, 0)
    body = chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return spec_numpy.PNG_SIGNATURE + body


def odd_images(folder: Path) -> list[Path]:
    """Files whose decoding leans on rules a reader without Pillow must be told."""
    from PIL import Image

    rng = np.random.default_rng(1)

    def noise(*shape: int) -> np.ndarray:
        return rng.integers(0, 256, shape, dtype=np.uint8)

    folder.mkdir()
    rotated = Image.Exif()
    rotated[0x0112] = 6  # orientation: rotate 90 degrees to display
    kinds = {
        "grey16.png": Image.fromarray(rng.integers(0, 65536, (40, 30)).astype(np.uint16)),
        "rgba.png": Image.fromarray(noise(41, 43, 4), "RGBA"),
        "palette.png": Image.fromarray(noise(33, 47, 3)).quantize(colors=37),
        "grey_alpha.png": Image.fromarray(noise(30, 36, 2), "LA"),
        "bilevel.png": Image.fromarray(noise(30, 40) > 127),
        "nonsquare.png": Image.fromarray(noise(64, 97, 3)),  # long side 48.5 -> 48 (half even)
        "upscaled.png": Image.fromarray(noise(7, 10, 3)),
    }
    for name, im in kinds.items():
        im.save(folder / name)
    Image.fromarray(noise(40, 52, 3)).save(folder / "exif.png", exif=rotated)
    Image.fromarray(noise(40, 52, 3)).save(folder / "exif.jpg", exif=rotated, quality=90)
    Image.fromarray(noise(29, 31, 3)).quantize(colors=11).save(folder / "palette4.png", bits=4)
    rgb16 = rng.integers(0, 65536, (35, 29, 3)).astype(np.uint16)
    (folder / "rgb16.png").write_bytes(png_by_hand(rgb16, 2))
    grey_alpha16 = rng.integers(0, 65536, (31, 33, 2)).astype(np.uint16)
    (folder / "grey_alpha16.png").write_bytes(png_by_hand(grey_alpha16, 4))
    grey2 = rng.integers(0, 4, (27, 30)).astype(np.uint8)
    (folder / "grey2.png").write_bytes(png_by_hand(grey2, 0, depth=2))
    with Image.open(folder / "grey16.png") as im:
        assert im.mode.startswith("I;16")
    with Image.open(folder / "exif.jpg") as im:
        assert im.getexif()[0x0112] == 6
    assert spec_numpy.read_png((folder / "palette4.png").read_bytes())[2] == 4  # bit depth
    return sorted(folder.iterdir())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A tiny RGB classifier (crop_pct 0.875: a real resize, then a crop), exported."""
    d = tmp_path_factory.mktemp("rgb")
    vtfm("export", "--checkpoint", cls_checkpoint(d, "vit_mnist", in_chans=3, crop_pct=0.875))
    return d


def test_the_numpy_spec_imports_nothing_of_ours() -> None:
    tree = ast.parse(Path(spec_numpy.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] in ("vision_tfm", "cv2", "torch")]


@pytest.mark.parametrize("in_chans", [3, 1])
def test_spec_in_numpy_gives_the_packages_input_bit_for_bit(
    exported: Path, tmp_path: Path, in_chans: int
) -> None:
    """16-bit grey and colour, RGBA, 8- and 4-bit palettes, grey + alpha, 1- and 2-bit grey,
    EXIF-rotated (PNG and JPEG), non-square and upscaled files; grey models take the integer
    luma of colour files."""
    if in_chans == 3:
        ckpt = exported / "vit_mnist.pt"
        meta = json.loads((exported / "model.json").read_text())
    else:  # what export writes into model.json, without running one
        ckpt = cls_checkpoint(tmp_path, "vit_mnist", in_chans=1, crop_pct=0.875)
        meta = json.loads(json.dumps(load_source(ckpt).describe()))
    clf = Classifier(ckpt)
    for path in odd_images(tmp_path / "images"):
        ours = spec_numpy.preprocess(path, meta)[0]
        ref = clf.preprocess(path).numpy()
        assert ours.dtype == ref.dtype == np.float32 and ours.shape == ref.shape, path.name
        assert np.array_equal(ours, ref), (path.name, np.abs(ours - ref).max())


def test_the_files_model_json_lists_run_the_client_alone(
    exported: Path, tmp_path: Path, capsys
) -> None:
    """Copy model.json, the files it lists and the client to a fresh folder: it reproduces
    vtfm predict there (the issue: model.onnx + model.json used to need model.onnx.data)."""
    meta = json.loads((exported / "model.json").read_text())
    assert [f["name"] for f in meta["files"]] == ["model.onnx"]
    device = tmp_path / "device"
    device.mkdir()
    for name in [f["name"] for f in meta["files"]] + ["model.json"]:
        shutil.copy(exported / name, device / name)
    shutil.copy(CLIENT, device / CLIENT.name)
    images = odd_images(tmp_path / "images")
    cmd = [sys.executable, CLIENT.name, "model.onnx", *map(str, images), "--probs", "--verify"]
    done = subprocess.run(cmd, cwd=device, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    probs = [np.asarray(json.loads(line)) for line in done.stdout.splitlines()]
    table = tmp_path / "p.jsonl"
    vtfm("predict", *images, "--checkpoint", exported / "vit_mnist.pt", "--topk", "10")
    capsys.readouterr()
    vtfm("predict", *images, "--checkpoint", exported / "vit_mnist.pt", "--output", table)
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert [r["path"] for r in rows] == [str(p) for p in images] and len(probs) == len(images)
    for row, prob in zip(rows, probs):
        for t in row["top"]:
            assert abs(prob[int(t["label"])] - t["score"]) <= 1e-5, row["path"]


def test_a_model_too_large_for_one_file_lists_its_weights_file(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Past the single-file limit the weights go to model.onnx.data: model.json lists both
    with their sha256, vtfm export says to ship both, and a copy of the listed files runs."""
    import hashlib

    import onnxruntime as ort

    from vision_tfm.export import onnx as onnx_export

    monkeypatch.setattr(onnx_export, "SINGLE_FILE_LIMIT", 1000)  # bytes: any model is larger
    ckpt = cls_checkpoint(tmp_path, "vit_mnist")
    capsys.readouterr()
    vtfm("export", "--checkpoint", ckpt)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "ship together: model.onnx, model.onnx.data, model.json"
    meta = json.loads((tmp_path / "model.json").read_text())
    assert [f["name"] for f in meta["files"]] == ["model.onnx", "model.onnx.data"]
    for f in meta["files"]:
        assert f["sha256"] == hashlib.sha256((tmp_path / f["name"]).read_bytes()).hexdigest()
    device = tmp_path / "device"
    device.mkdir()
    shutil.copy(tmp_path / "model.onnx", device)
    shutil.copy(tmp_path / "model.json", device)
    cmd = [sys.executable, str(CLIENT), str(device / "model.onnx"), str(ROOT / "README.md")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "model.onnx.data" in done.stderr  # named, not ORT's error
    shutil.copy(tmp_path / "model.onnx.data", device)
    sess = ort.InferenceSession(str(device / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.zeros((2, 1, 28, 28), np.float32)
    assert sess.run(None, {"image": x})[0].shape == (2, 10)


def test_client_help_is_whole_sentences() -> None:
    done = subprocess.run(
        [sys.executable, str(CLIENT), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())  # argparse wraps lines
    assert "copy this file and the files model.json lists to the device. positional" in text


def test_png_reader_reads_what_pillow_writes(tmp_path: Path) -> None:
    """The test's own PNG reader agrees with Pillow on 8-bit files of every colour type and
    filter Pillow picks (so the numpy spec test rests on the rules, not on the reader)."""
    from PIL import Image

    rng = np.random.default_rng(2)
    for mode, shape in (("L", (20, 23)), ("RGB", (20, 23, 3)), ("RGBA", (17, 9, 4))):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, "PNG")
        samples, *_ = spec_numpy.read_png(buf.getvalue())
        buf.seek(0)
        assert np.array_equal(samples.reshape(shape), np.asarray(Image.open(buf)))
