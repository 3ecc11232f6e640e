"""examples/onnx_client.py on hostile input: a model.json, a model or an image that would give
NaN scores, exhaust memory, read outside the model's folder or end in a traceback is refused
in one line, with exit code 2."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model_json import CLIENT, exported  # noqa: F401 (a fixture)

_spec = importlib.util.spec_from_file_location("onnx_client", CLIENT)
client = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client)

IMAGE = Path(__file__).resolve().parents[1] / "fixtures" / "cornell" / "01" / "pcd0100r.png"


def _meta() -> dict:
    """A classifier's model.json as export writes it (no export needed to check its rules)."""
    step = lambda op, **kw: {"op": op, **kw}  # noqa: E731
    return {
        "task": "cls",
        "class_names": [str(i) for i in range(10)],
        "files": [{"name": "model.onnx", "bytes": 1, "sha256": "0" * 64}],
        "inputs": [{"name": "image"}],
        "preprocess": {
            "contract": client.CONTRACT,
            "steps": [
                step("decode", file="image"),
                step("convert", to="RGB"),
                step("resize_short_side", size=32),
                step("center_crop", size=[28, 28]),
                step("normalize", mean=[0.5] * 3, std=[0.25] * 3),
                step("to_tensor"),
            ],
        },
    }


def _step(meta: dict, op: str) -> dict:
    return next(s for s in meta["preprocess"]["steps"] if s["op"] == op)


def test_the_exported_model_json_passes(exported: Path) -> None:  # noqa: F811
    meta = json.loads((exported / "model.json").read_text())
    assert client.check_meta(meta, exported / "model.json") is meta
    assert client.check_meta(_meta(), Path("model.json"))


BAD_NUMBER = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, "1", None, True, [], [1.0, 2.0]]),
    st.floats(max_value=0.0, allow_nan=False),
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["mean", "std"]), value=BAD_NUMBER, at=st.integers(0, 2))
def test_a_normalisation_that_would_give_nan_is_refused(key: str, value, at: int) -> None:
    """A zero, negative or non-finite std, a non-finite mean, or a value that is no number
    (``mean`` may be any finite number, so only its non-finite or non-numbers are bad)."""
    meta = _meta()
    if key == "mean" and isinstance(value, float) and math.isfinite(value):
        return
    _step(meta, "normalize")[key][at] = value
    with pytest.raises(client.InputError, match=f"normalize.{key}"):
        client.check_meta(meta, Path("model.json"))


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(["resize_short_side", "center_crop"]),
    size=st.one_of(
        st.integers(max_value=0), st.integers(min_value=client.MAX_SIDE + 1), st.just(1e6)
    ),
)
def test_sizes_outside_the_bounds_are_refused(op: str, size) -> None:
    meta = _meta()
    _step(meta, op)["size"] = size if op == "resize_short_side" else [size, 28]
    with pytest.raises(client.InputError, match=f"{op}.size"):
        client.check_meta(meta, Path("model.json"))


@settings(max_examples=60, deadline=None)
@given(
    name=st.one_of(
        st.sampled_from(["", ".", "..", "/etc/passwd", "C:model.onnx", "a\\b", 5, None]),
        st.builds(lambda a, b: f"{a}/{b}", st.text(max_size=5), st.text(max_size=5)),
    )
)
def test_file_names_that_leave_the_model_folder_are_refused(name) -> None:
    meta = _meta()
    meta["files"][0]["name"] = name
    with pytest.raises(client.InputError, match="not a plain file name"):
        client.check_meta(meta, Path("model.json"))


def _run(model: Path, *args: object) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(model), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr.strip()


def _device(exported: Path, tmp_path: Path, change: Callable[[dict], None]) -> Path:  # noqa: F811
    """The exported model beside a model.json that ``change`` edits."""
    meta = json.loads((exported / "model.json").read_text())
    change(meta)
    shutil.copy(exported / "model.onnx", tmp_path)
    (tmp_path / "model.json").write_text(json.dumps(meta))
    return tmp_path / "model.onnx"


def _fewer_names(m: dict) -> None:
    m["class_names"] = m["class_names"][:3]


def _huge_resize(m: dict) -> None:
    _step(m, "resize_short_side")["size"] = 10**9


def _zero_std(m: dict) -> None:
    _step(m, "normalize")["std"] = [0, 0, 0]


def _crop_past_image(m: dict) -> None:
    _step(m, "center_crop")["size"] = [40, 40]  # inside the bounds, past the 32-pixel resize


def _underflowing_std(m: dict) -> None:
    _step(m, "normalize")["std"] = [1e-45]  # positive, but 0 in float32: inf inputs


@pytest.mark.parametrize(
    "change, words",
    [
        (_fewer_names, "10 scores but model.json has 3 class names"),
        (_huge_resize, "resize_short_side.size must be a whole number in 1..16384"),
        (_zero_std, "normalize.std"),
        (_crop_past_image, "center_crop size [40, 40] is larger than the resized image"),
        (_underflowing_std, "input values are NaN or inf after preprocessing"),
    ],
)
def test_the_client_refuses_a_bad_model_json_in_one_line(
    exported: Path,  # noqa: F811
    tmp_path: Path,
    change: Callable[[dict], None],
    words: str,
) -> None:
    code, err = _run(_device(exported, tmp_path, change), IMAGE)
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert words in err


def test_the_client_refuses_garbage_and_path_escaping_models(
    exported: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """onnxruntime's own load errors (a file that is no ONNX graph; weights stored outside
    the model's folder) are one line, not its traceback."""
    import onnx
    from onnx import TensorProto

    garbage = tmp_path / "garbage"
    garbage.mkdir()

    def sized(m: dict) -> None:
        m["files"][0]["bytes"] = 800

    model = _device(exported, garbage, sized)
    model.write_bytes(b"\x08garbage" * 100)
    code, err = _run(model, IMAGE)
    assert code == 2 and len(err.splitlines()) == 1 and "error: onnxruntime:" in err, err

    escape = tmp_path / "escape"
    escape.mkdir()
    graph = onnx.load(exported / "model.onnx")
    init = graph.graph.initializer[0]
    init.ClearField("raw_data")
    init.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../../etc/hostname"), ("offset", "0"), ("length", "4")):
        entry = init.external_data.add()
        entry.key, entry.value = k, v
    onnx.save(graph, escape / "escape.onnx")
    model = _device(exported, escape, lambda m: None)
    shutil.move(escape / "escape.onnx", model)
    meta = json.loads((escape / "model.json").read_text())
    meta["files"][0]["bytes"] = model.stat().st_size
    (escape / "model.json").write_text(json.dumps(meta))
    code, err = _run(model, IMAGE)
    assert code == 2 and len(err.splitlines()) == 1 and "escapes" in err, err


def test_a_nan_image_is_refused(exported: Path, tmp_path: Path) -> None:  # noqa: F811
    """A float image (NaN pixels) is outside the decoding contract: refused, not scored."""
    from PIL import Image

    Image.fromarray(np.full((30, 30), np.nan, np.float32), "F").save(tmp_path / "nan.tiff")
    code, err = _run(exported / "model.onnx", tmp_path / "nan.tiff")
    assert (
        code == 2
        and err == f"error: {tmp_path / 'nan.tiff'}: mode F is outside the decoding contract"
    ), err
