"""Property tests: random configs, files, checkpoints and tensors at the public entry points.

Every outcome must be a result or one of the package's own errors (a
:class:`~vision_tfm.errors.VisionTfmError`: ConfigError, DataError, CheckpointError,
InputError, ...), always in one line. Never another exception (a plain ValueError included),
a hang or a non-finite value in a result. Examples are few and derandomized so the
file runs in seconds and fails the same way everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vision_tfm.config import apply_overrides, parse_cli_overrides
from vision_tfm.data import load_image, read_data_pickle
from vision_tfm.data.grasp import MAX_COORD, load_depth, read_cornell_rects, read_jacquard_grasps
from vision_tfm.errors import VisionTfmError
from vision_tfm.io import load_checkpoint
from vision_tfm.models import create_model, load_pretrained
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.grasp import GraspConfig

PROP = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def outcome(fn, *args, **kw):
    """Call ``fn``; return its result or the package error it raised (checked as above)."""
    try:
        return fn(*args, **kw)
    except VisionTfmError as e:
        assert "\n" not in str(e), repr(e)
        return e


def _leaves(cfg, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += _leaves(value, f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def _flat(v) -> list:
    return list(v) if isinstance(v, (tuple, list)) else [v]


def _all_finite(cfg) -> bool:
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            if not _all_finite(v):
                return False
        elif any(isinstance(x, float) and not math.isfinite(x) for x in _flat(v)):
            return False
    return True


SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["nan", "inf", "-inf", "[1, 2", "{a: 1", "1e999", "''", "[]", "~", "0x10"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))


@pytest.mark.parametrize("default", [ClsConfig(), GraspConfig()], ids=["cls", "grasp"])
@PROP
@given(data=st.data())
def test_random_overrides_give_a_valid_config_or_a_config_error(default, data) -> None:
    keys = [*_leaves(default), "optim.lrr", "nope", "model.kwargs.depth", "data"]
    items = []
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(keys))
        value = data.draw(VALUES)
        raw = value if isinstance(value, str) else repr(value).replace("True", "true")
        items.append(f"{key}={raw}")
    result = outcome(lambda: apply_overrides(default, parse_cli_overrides(items)))
    if not isinstance(result, Exception):
        assert _all_finite(result), items


IMAGE_HEADS = [b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"II*\x00", b"BM", b"GIF89a"]


@PROP
@given(head=st.sampled_from(IMAGE_HEADS), body=st.binary(max_size=600))
def test_random_bytes_as_images(tmp_path_factory, head, body) -> None:
    path = tmp_path_factory.mktemp("img") / "x.png"
    path.write_bytes(head + body)
    for fn in (lambda: load_image(path, 3), lambda: load_image(path, 1), lambda: load_depth(path)):
        result = outcome(fn)
        if isinstance(result, np.ndarray):
            assert result.size and np.isfinite(result).all()


def _png_of(size: tuple[int, int], mode: str) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return buf.getvalue()


@PROP
@given(
    w=st.integers(1, 3000),
    h=st.integers(1, 40),
    mode=st.sampled_from(["L", "RGB", "RGBA", "I;16", "1", "P"]),
)
def test_random_image_sizes_and_modes(tmp_path_factory, w, h, mode) -> None:
    path = tmp_path_factory.mktemp("img") / "x.png"
    path.write_bytes(_png_of((w, h), mode))
    result = outcome(load_image, path, 3)
    if isinstance(result, np.ndarray):
        assert result.shape == (h, w, 3) and max(w, h) <= 32 * min(w, h)


TOKENS = st.one_of(
    st.floats(-1e6, 1e6).map(lambda v: f"{v:.3g}"),
    st.sampled_from(["nan", "inf", "-inf", "1e30", "-50", "0", "abc", "", " ", "1;2"]),
)


def _lines(fields: int, sep: str) -> st.SearchStrategy[str]:
    line = st.lists(TOKENS, min_size=fields - 1, max_size=fields + 1).map(sep.join)
    return st.lists(line, max_size=9).map("\n".join)


@PROP
@given(cornell=_lines(2, " "), jacquard=_lines(5, ";"), binary=st.booleans())
def test_random_annotation_files(tmp_path_factory, cornell, jacquard, binary) -> None:
    folder = tmp_path_factory.mktemp("ann")
    tail = b"\xff\xfe\x00\x81" if binary else b""
    (folder / "a_grasps.txt").write_bytes(jacquard.encode() + tail)
    (folder / "pcd0100cpos.txt").write_bytes(cornell.encode() + tail)
    rows = outcome(read_jacquard_grasps, folder / "a_grasps.txt")
    if isinstance(rows, np.ndarray):
        assert np.isfinite(rows).all() and (rows[:, 3:] > 0).all()
        assert (np.abs(rows) <= MAX_COORD).all()
    rects = outcome(read_cornell_rects, folder / "pcd0100cpos.txt")
    if isinstance(rects, tuple):
        assert np.isfinite(rects[0]).all() and (np.abs(rects[0]) <= MAX_COORD).all()


PLAIN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.binary(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@PROP
@given(obj=PLAIN, cut=st.integers(0, 64), junk=st.binary(max_size=16))
def test_random_cifar_pickles(tmp_path_factory, obj, cut, junk) -> None:
    path = tmp_path_factory.mktemp("cifar") / "data_batch_1"
    blob = pickle.dumps(obj, protocol=2)
    path.write_bytes(blob[: len(blob) - cut] + junk if cut else blob)
    outcome(read_data_pickle, path)


CKPT_HEADS = [b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x04\x95"]


@PROP
@given(head=st.sampled_from(CKPT_HEADS), body=st.binary(max_size=300))
def test_random_bytes_as_checkpoints(tmp_path_factory, head, body) -> None:
    path = tmp_path_factory.mktemp("ck") / "last.pt"
    path.write_bytes(head + body)
    result = outcome(load_checkpoint, path)
    assert isinstance(result, (Exception, dict))


@pytest.fixture(scope="module")
def tiny_state() -> dict:
    kw = {"embed_dim": 16, "depth": 1, "num_heads": 2}
    meta = {"task": "cls", "model_name": "vit_mnist", "num_classes": 10, "in_chans": 1}
    meta |= {"img_size": 28, "class_names": [str(i) for i in range(10)]}
    meta |= {"mean": [0.13], "std": [0.31]}
    sd = create_model("vit_mnist", **kw).state_dict()
    return {"model": sd, "config": {"model": {"name": "vit_mnist", "kwargs": kw}}, "meta": meta}


JSONISH = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.floats(),
    st.text(max_size=5),
    st.lists(st.one_of(st.floats(), st.text(max_size=3), st.integers(-5, 5)), max_size=12),
)
META_KEYS = ["task", "num_classes", "in_chans", "img_size", "class_names", "mean", "std"]
KWARGS = ["embed_dim", "depth", "num_heads", "patch_size", "mlp_ratio", "img_size"]


@PROP
@given(
    meta=st.dictionaries(st.sampled_from(META_KEYS), JSONISH, max_size=3),
    kwargs=st.dictionaries(st.sampled_from(KWARGS), st.integers(-4, 70000), max_size=2),
    nan=st.booleans(),
)
def test_random_checkpoint_contents(tiny_state, meta, kwargs, nan) -> None:
    ck = {
        "model": dict(tiny_state["model"]),
        "config": {
            "model": {
                "name": "vit_mnist",
                "kwargs": {**tiny_state["config"]["model"]["kwargs"], **kwargs},
            }
        },
        "meta": {**tiny_state["meta"], **meta},
    }
    if nan:
        w = ck["model"]["head.weight"].clone()
        w[0, 0] = math.nan
        ck["model"]["head.weight"] = w
    result = outcome(ClassificationTask.restore, ck)
    if not isinstance(result, Exception):
        model, _ = result
        assert all(torch.isfinite(p).all() for p in model.state_dict().values())


MODELS = {  # one per family, tiny: the checkpoint property builds one per example
    "vit": ("vit_test", {}),
    "swin": ("swin_test", {"depths": (1, 1), "num_heads": (1, 2)}),
    "hybrid": ("hybrid_test", {}),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request) -> torch.nn.Module:
    name, kw = MODELS[request.param]
    return create_model(name, num_classes=10, **kw).eval()


@PROP
@given(
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.uint8, torch.bool]),
)
def test_random_tensors_into_a_model(model, shape, dtype) -> None:
    x = torch.zeros(shape, dtype=dtype)
    with torch.no_grad():
        result = outcome(model, x)
    if isinstance(result, torch.Tensor):
        assert result.shape[0] == shape[0] and torch.isfinite(result).all()


@PROP
@given(
    keep=st.lists(st.booleans(), min_size=4, max_size=4),
    reshape=st.lists(st.integers(1, 9), max_size=3),
    fill=st.sampled_from([0.0, 1.0, math.nan, math.inf]),
)
def test_random_state_dicts_into_load_pretrained(model, keep, reshape, fill) -> None:
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    names = sorted(sd)
    for i, k in enumerate(names[:4]):
        if not keep[i]:
            del sd[k]
    if reshape:
        sd[names[-1]] = torch.full(reshape, fill)
    fresh = create_model(model.model_name, **dataclasses.asdict(model.cfg))
    result = outcome(load_pretrained, fresh, sd)
    if not isinstance(result, Exception):
        assert all(torch.isfinite(p).all() for p in fresh.state_dict().values())
