"""examples/onnx_client.py checks model.json against its contract before it runs a step: the
steps vision_tfm writes, in its order, each once; each key the client reads, of its type; the
file itself a regular one of a few kB, not nested deep. Anything else is one line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model_json import CLIENT, exported  # noqa: F401 (a fixture: one tiny export)

from vision_tfm.config import apply_overrides
from vision_tfm.data.config import IMAGENET_MEAN, IMAGENET_STD, MNIST_MEAN, MNIST_STD
from vision_tfm.tasks.classification import cls_preprocess
from vision_tfm.tasks.grasp import GraspConfig
from vision_tfm.tasks.grasp.spec import grasp_postprocess, grasp_preprocess

_spec = importlib.util.spec_from_file_location("onnx_client_contract", CLIENT)
client = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client)

IMAGE = Path(__file__).resolve().parents[1] / "fixtures" / "cornell" / "01" / "pcd0100r.png"
GRASP_KINDS = [(i, n) for i in ("rgbd", "rgb", "depth") for n in ("fixed", "image")]
K = [60.0, 60.0, 24.0, 20.0]  # intrinsics fx, fy, cx, cy for the small RGB-D pair


def grasp_meta(input: str = "rgbd", normalise: str = "fixed", crop: int = 300) -> dict:
    """A grasp model.json's contract part, from the functions export calls (no model)."""
    over = {"data.input": input, "data.normalise": normalise, "data.crop_size": crop}
    cfg = apply_overrides(GraspConfig(), {**over, "data.output_size": 32})
    meta = {
        "task": "grasp",
        "files": [{"name": "model.onnx", "bytes": 1, "sha256": "0" * 64}],
        "inputs": [{"name": "image"}],
        "preprocess": grasp_preprocess(cfg),
        "postprocess": grasp_postprocess(cfg),
    }
    return json.loads(json.dumps(meta))  # as the file holds it


def ops(steps: list[dict]) -> tuple[str, ...]:
    return tuple(s["op"] for s in steps)


def step(meta: dict, op: str, section: str = "preprocess") -> dict:
    return next(s for s in meta[section]["steps"] if s["op"] == op)


def refusal(meta: object) -> str:
    """check_meta's one-line refusal of ``meta`` (which it must refuse)."""
    with pytest.raises(client.InputError) as e:
        client.check_meta(meta, Path("model.json"))
    text = str(e.value)
    assert len(text.splitlines()) == 1, text
    return text


def run_client(model: Path, *args: object, timeout: float = 120) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(model), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,  # a FIFO read without the check would block forever
    )
    return done.returncode, done.stdout, done.stderr.strip()


def assert_one_line(run: tuple[int, str, str], words: str) -> None:
    """Exit code 2, nothing printed, and one line on stderr holding ``words``."""
    code, out, err = run
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert words in err and out == "", err


# --- the contract is what vision_tfm writes --------------------------------------------------


def test_the_orders_are_the_ones_vision_tfm_writes() -> None:
    """Every model kind export writes passes, and every order the client allows is written by
    some kind: the table cannot drift from tasks/grasp/spec.py and cls_preprocess."""
    written = {ops(grasp_meta(i, n)["preprocess"]["steps"]) for i, n in GRASP_KINDS}
    assert written == set(client.ORDERS[client.GRASP_CONTRACT])
    cls = [cls_preprocess(28, 0.875, 1, MNIST_MEAN, MNIST_STD)]
    cls.append(cls_preprocess(28, 0.875, 3, IMAGENET_MEAN, IMAGENET_STD))
    assert {ops(p["steps"]) for p in cls} == set(client.ORDERS[client.CONTRACT])
    metas = [grasp_meta(i, n, crop) for i, n in GRASP_KINDS for crop in (300, 0)]
    assert {ops(m["postprocess"]["steps"]) for m in metas} == {client.POST_ORDER}
    base = {"files": metas[0]["files"], "inputs": metas[0]["inputs"], "class_names": ["a"]}
    metas += [json.loads(json.dumps({**base, "task": "cls", "preprocess": p})) for p in cls]
    for meta in metas:
        assert client.check_meta(meta, Path("model.json")) is meta
        for s in meta["preprocess"]["steps"] + meta.get("postprocess", {}).get("steps", []):
            assert set(client.STEP_KEYS[s["op"]]) <= set(s), s["op"]  # written, not defaulted


def test_the_exported_model_json_runs(exported: Path) -> None:  # noqa: F811
    code, out, err = run_client(exported / "model.onnx", IMAGE, "--topk", "1")
    assert code == 0 and len(out.splitlines()) == 1, err


# --- the examples --------------------------------------------------------------------


def _normalize_twice(m: dict) -> None:
    m["preprocess"]["steps"].insert(5, copy.deepcopy(step(m, "normalize")))


def _no_resize(m: dict) -> None:
    m["preprocess"]["steps"].remove(step(m, "resize_short_side"))


def _crop_before_resize(m: dict) -> None:
    s = m["preprocess"]["steps"]
    s[2], s[3] = s[3], s[2]


def _no_std(m: dict) -> None:
    del step(m, "normalize")["std"]


def _size_as_text(m: dict) -> None:
    step(m, "resize_short_side")["size"] = "32"


def _size_as_bool(m: dict) -> None:
    step(m, "resize_short_side")["size"] = True


def _one_crop_side(m: dict) -> None:
    step(m, "center_crop")["size"] = [28]


def _mean_of_two(m: dict) -> None:
    step(m, "normalize")["mean"] = [0.5, 0.5]


def _no_inputs(m: dict) -> None:
    del m["inputs"]


def _no_class_names(m: dict) -> None:
    del m["class_names"]


def _no_steps(m: dict) -> None:
    del m["preprocess"]["steps"]


def _bytes_as_text(m: dict) -> None:
    m["files"][0]["bytes"] = str(m["files"][0]["bytes"])


def _grey_file(m: dict) -> None:
    step(m, "decode")["file"] = "rgb"


C = "vision_tfm.cls.preprocess/2"
CLS_CASES = [
    (_normalize_twice, f"preprocess.steps[5] is 'normalize'; {C} has 'to_tensor' there"),
    (_no_resize, f"preprocess.steps[2] is 'center_crop'; {C} has 'resize_short_side' there"),
    (_crop_before_resize, "preprocess.steps[2] is 'center_crop'"),
    (_no_std, "steps[4] normalize.std must be a list of 1 or 3 finite numbers > 0, it is missing"),
    (_size_as_text, 'resize_short_side.size must be a whole number in 1..16384, got "32"'),
    (_size_as_bool, "resize_short_side.size must be a whole number in 1..16384, got true"),
    (_one_crop_side, "center_crop.size must be 2 whole numbers in 1..16384, got [28]"),
    (_mean_of_two, "normalize.mean must be a list of 1 or 3 finite numbers, got [0.5, 0.5]"),
    (_no_inputs, "inputs must list the graph's inputs, got null"),
    (_no_class_names, "class_names must be a list of strings, got null"),
    (_no_steps, "preprocess.steps must be a list of steps, got null"),
    (_bytes_as_text, "files[0] (model.onnx) needs bytes (a whole number)"),
    (_grey_file, """preprocess.steps[0] decode.file must be 'image', got "rgb\""""),
]


@pytest.mark.parametrize("change, words", CLS_CASES, ids=[c.__name__ for c, _ in CLS_CASES])
def test_a_classifier_model_json_outside_the_contract_is_one_line(
    exported: Path,  # noqa: F811
    tmp_path: Path,
    change: Callable[[dict], None],
    words: str,
) -> None:
    meta = json.loads((exported / "model.json").read_text())
    change(meta)
    (tmp_path / "model.json").write_text(json.dumps(meta))
    run = run_client(exported / "model.onnx", IMAGE, "--meta", tmp_path / "model.json")
    assert_one_line(run, words)


def _peaks_before_blur(m: dict) -> None:
    s = m["postprocess"]["steps"]
    s[1], s[2] = s[2], s[1]


def _flip_no(m: dict) -> None:
    step(m, "flip_average", "postprocess")["enabled"] = "no"


def _min_distance_false(m: dict) -> None:
    step(m, "peaks", "postprocess")["min_distance"] = False


def _rgb_only_crop(m: dict) -> None:
    step(m, "center_crop_square")["applies_to"] = ["rgb"]


def _oblong_resize(m: dict) -> None:
    step(m, "resize_area")["size"] = [32, 64]


def _no_sigma_width(m: dict) -> None:
    del step(m, "gaussian_filter", "postprocess")["sigma"]["width"]


def _percentile_text(m: dict) -> None:
    m["postprocess"]["metric"]["percentile"] = "10"


G = "vision_tfm.grasp.preprocess/4"
GRASP_CASES = [
    (_peaks_before_blur, f"postprocess.steps[1] is 'peaks'; {G} has 'gaussian_filter' there"),
    (_flip_no, 'postprocess.steps[0] flip_average.enabled must be true or false, got "no"'),
    (_min_distance_false, "peaks.min_distance must be a whole number in 0..32, got false"),
    (_rgb_only_crop, """center_crop_square.applies_to must be ['rgb', 'depth'], got ["rgb"]"""),
    (_oblong_resize, "resize_area.size must be 2 equal whole numbers in 1..8192, got [32, 64]"),
    (_no_sigma_width, "gaussian_filter.sigma must be {quality, cos, sin, width}, each a number"),
    (_percentile_text, 'postprocess.metric.percentile must be a number in 0..100, got "10"'),
]


@pytest.mark.parametrize("change, words", GRASP_CASES, ids=[c.__name__ for c, _ in GRASP_CASES])
def test_a_grasp_model_json_outside_the_contract_is_one_line(
    tmp_path: Path, change: Callable[[dict], None], words: str
) -> None:
    """Refused from model.json alone: no model file is read (there is none here)."""
    meta = grasp_meta()
    change(meta)
    (tmp_path / "model.json").write_text(json.dumps(meta))
    depth = IMAGE.with_name("pcd0100d.tiff")
    assert_one_line(run_client(tmp_path / "model.onnx", IMAGE, "--depth", depth), words)


# --- the file itself -------------------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(2**30)  # sparse: 1 GB on paper, nothing on disk


def _recursing(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)  # json.loads raises RecursionError


def _deep(path: Path) -> None:  # within Python's recursion limit, past the client's bound
    path.write_text(json.dumps({"task": "cls", "x": json.loads("[" * 40 + "]" * 40)}))


def _latin1(path: Path) -> None:
    path.write_bytes(b'{"task": "cls\xff"}')


FILE_CASES = [
    (_fifo, "model.json must be a regular file, not a special one"),
    (_dev_zero, "model.json must be a regular file, not a special one"),
    (_huge, "model.json is over 4,194,304 bytes"),
    (_recursing, "model.json nests deeper than 32 levels"),
    (_deep, "model.json nests deeper than 32 levels"),
    (_latin1, "not JSON ('utf-8' codec can't decode"),
]


@pytest.mark.parametrize("make, words", FILE_CASES, ids=[c.__name__ for c, _ in FILE_CASES])
def test_a_model_json_that_is_no_small_regular_file_is_one_line(
    exported: Path,  # noqa: F811
    tmp_path: Path,
    make: Callable[[Path], None],
    words: str,
) -> None:
    if make is _fifo and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    if make is _dev_zero and not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    make(tmp_path / "model.json")
    run = run_client(exported / "model.onnx", IMAGE, "--meta", tmp_path / "model.json", timeout=60)
    assert_one_line(run, f"{tmp_path / 'model.json'}: {words}")


# --- any mutation: refused, or the same result -----------------------------------------------


def _paths(v: Any, at: tuple = ()) -> list[tuple]:
    """Every path into ``v``'s dicts and lists (keys and indices)."""
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    return [p for k, x in items for p in [(*at, k), *_paths(x, (*at, k))]]


def _retyped(v: Any, how: str) -> Any:
    """``v`` as another JSON type, keeping its value where that type can hold it."""
    if how == "number":  # 28 -> 28.0, 1.0 -> 1; 0.5 stays (an int cannot hold it)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return 1
        return float(v) if isinstance(v, int) else int(v) if float(v).is_integer() else v
    return {
        "string": lambda: v if isinstance(v, str) else json.dumps(v),
        "bool": lambda: int(v) if isinstance(v, bool) else True,
        "no": lambda: "no",
        "null": lambda: None,
        "list": lambda: [v],
        "object": lambda: {"v": v},
    }[how]()


@st.composite
def mutations(draw: st.DrawFn, meta: dict) -> dict:
    """``meta`` with one key dropped, two steps swapped, a step duplicated or a value's type
    changed."""
    meta = copy.deepcopy(meta)
    kind = draw(st.sampled_from(["drop", "swap", "duplicate", "retype"]))
    if kind in ("swap", "duplicate"):
        sections = [k for k in ("preprocess", "postprocess") if "steps" in meta[k]]
        steps = meta[draw(st.sampled_from(sections))]["steps"]
        i, j = (draw(st.integers(0, len(steps) - 1)) for _ in range(2))
        if kind == "swap":
            steps[i], steps[j] = steps[j], steps[i]
        else:
            steps.insert(j, copy.deepcopy(steps[i]))
        return meta
    paths = [p for p in _paths(meta) if kind == "retype" or isinstance(p[-1], str)]
    *head, last = draw(st.sampled_from(paths))
    parent = meta
    for k in head:
        parent = parent[k]
    if kind == "drop":
        del parent[last]
    else:
        how = ["number", "string", "bool", "no", "null", "list", "object"]
        parent[last] = _retyped(parent[last], draw(st.sampled_from(how)))
    return meta


def assert_refused_or_same(
    meta: dict, run: Callable[[dict], Any], want: Any, later: tuple[str, ...]
) -> None:
    """check_meta refuses ``meta`` in one line, or the run gives ``want`` exactly; the run
    may refuse only what needs more than model.json to see (a refusal starting with one of
    ``later``); any other exception fails the test."""
    try:
        client.check_meta(meta, Path("model.json"))
    except client.InputError as e:
        assert len(str(e).splitlines()) == 1 and str(e).startswith("model.json"), e
        return
    try:
        got = run(meta)
    except client.InputError as e:
        assert str(e).startswith(later), e
        return
    assert got == want


@pytest.fixture(scope="module")
def cls_run(exported: Path) -> tuple[dict, Callable[[dict], Any]]:  # noqa: F811
    import onnxruntime as ort

    sess = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    meta = json.loads((exported / "model.json").read_text())

    def run(m: dict) -> list[float]:
        client.check_session(sess, m)  # as the client does, once the model is loaded
        return client.classify(sess, IMAGE, m).tolist()

    return meta, run


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_mutated_classifier_model_json_is_refused_or_changes_nothing(cls_run, data) -> None:
    """Refused, or the same probabilities; only the graph can tell that model.json names
    an input it lacks."""
    meta, run = cls_run
    later = ("model.json names input ",)
    assert_refused_or_same(data.draw(mutations(meta)), run, run(meta), later)


class MapsSession:
    """Stands in for a grasp graph: four deterministic maps computed from its input."""

    def run(self, _names: None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        (x,) = feed.values()
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        first, last = x[:, :1], x[:, -1:]
        maps = [sig(x.mean(1, keepdims=True)), np.tanh(first), np.tanh(last), sig(first - last)]
        return [np.concatenate(maps, 1).astype(np.float32)]


@pytest.fixture(scope="module")
def grasp_run(tmp_path_factory) -> tuple[dict, Callable[[dict], Any]]:
    """A 48x40 RGB-D pair with depth holes, and the client's grasps on it in pixels and metres."""
    from PIL import Image

    d = tmp_path_factory.mktemp("rgbd")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(d / "r.png")
    depth = rng.uniform(0.5, 0.8, (40, 48)).astype(np.float32)
    depth[5:9, 10:14] = 0
    Image.fromarray(depth, "F").save(d / "d.tiff")
    args = argparse.Namespace(
        images=[str(d / "r.png")],
        depth=str(d / "d.tiff"),
        top=5,
        json=True,
        intrinsics=",".join(map(str, K)),
    )

    def run(m: dict) -> list[dict]:  # the client's --json --intrinsics output
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            client.print_grasps(MapsSession(), args, m)
        return json.loads(out.getvalue())

    return grasp_meta(), run  # crop 300 on a 40-pixel view: null would crop the same


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mutated_grasp_model_json_is_refused_or_changes_nothing(grasp_run, data) -> None:
    """Refused, or the same grasps in pixels and metres; only the metric may be found
    missing late, by --intrinsics, as older exports lack it."""
    meta, run = grasp_run
    want = run(meta)
    assert len(want) >= 2 and all(g["z_m"] is not None for g in want)
    later = ("model.json has no postprocess.metric: export the model again",)
    assert_refused_or_same(data.draw(mutations(meta)), run, want, later)
