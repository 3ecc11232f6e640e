"""Sizes are checked arithmetically before anything is allocated: one line naming the key."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import pytest
import torch
from conftest import assert_names
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_tfm.config import ConfigError, apply_overrides, machine_memory
from vision_tfm.data.mnist import parse_idx, read_idx
from vision_tfm.errors import DataError
from vision_tfm.export.benchmark import BenchOptions
from vision_tfm.models import check_input_memory, create_model, list_models
from vision_tfm.models._common import param_floor
from vision_tfm.tasks import ClassificationTask, ClsConfig

pytestmark = pytest.mark.skipif(machine_memory() is None, reason="no memory figure here")


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"depth": 10**6}, ("depth", 1024)),  # narrow enough to fit memory: too many to build
        ({"depth": 1000, "embed_dim": 8192, "num_heads": 8}, ("depth", "GiB")),
        (
            {"attn_type": "linear", "feature_map": "favor", "favor_features": 10**9},
            ("favor_features", "GiB"),
        ),
        ({"img_size": 700000 * 16, "patch_size": 16}, ("img_size", "GiB")),
        ({"embed_dim": 2**20, "num_heads": 1}, ("embed_dim", "GiB")),
    ],
)
def test_huge_model_configs_are_refused_before_building(kw, key) -> None:
    """depth=10**6 used to build a million blocks, even on the meta device."""
    with pytest.raises(ConfigError) as info:
        create_model("vit_test", **kw)  # arithmetic, not a million modules
    assert_names(str(info.value), *key)


@pytest.mark.parametrize(
    ("name", "kw", "key"),
    [
        ("swin_test", {"depths": [600, 600], "num_heads": [1, 2]}, "depths"),
        ("hybrid_test", {"stem_depths": [0, 700, 700]}, "stem_depths"),
    ],
)
def test_block_counts_are_bounded_in_every_family(name, kw, key) -> None:
    with pytest.raises(ConfigError) as info:
        create_model(name, **kw)
    assert_names(str(info.value), key, 1024)


@pytest.mark.parametrize("name", [n for n in list_models() if "224" not in n])
def test_param_floor_stays_under_the_real_count(name) -> None:
    """A floor: the bound never refuses a model that would fit."""
    model = create_model(name)
    assert sum(param_floor(model.cfg).values()) <= sum(p.numel() for p in model.parameters())


def test_batch_and_image_size_are_bounded() -> None:
    with torch.device("meta"):
        model = create_model("vit_base_patch16_224")
    check_input_memory(model, 2, (224, 224), "data.batch_size", training=True)
    with pytest.raises(ConfigError) as info:
        check_input_memory(model, 4096, (224, 224), "data.batch_size", training=True)
    assert_names(str(info.value), "data.batch_size", 4096)
    with pytest.raises(ConfigError) as info:
        check_input_memory(model, 1, (700000, 700000), "--img-size")
    assert_names(str(info.value), "--img-size", "700000x700000")


def test_num_workers_are_bounded_by_the_cores() -> None:
    most = 4 * (os.cpu_count() or 1)
    cfg = apply_overrides(ClsConfig(), {"data.num_workers": most})
    assert ClassificationTask(cfg).num_workers == most
    cfg = apply_overrides(ClsConfig(), {"data.num_workers": 1000 + most})
    with pytest.raises(ConfigError) as info:
        ClassificationTask(cfg).num_workers  # noqa: B018
    assert_names(str(info.value), "data.num_workers", 1000 + most)


def test_benchmark_threads_are_bounded_by_the_cores() -> None:
    with pytest.raises(ConfigError) as info:
        BenchOptions(threads=100000).validate()
    assert_names(str(info.value), "--threads", 100000)


def _idx(shape: tuple[int, ...], body: bytes) -> bytes:
    return struct.pack(">BBBB", 0, 0, 8, len(shape)) + struct.pack(f">{len(shape)}I", *shape) + body


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6), st.binary(max_size=64))
def test_idx_header_never_wraps(shape, body) -> None:
    """Dimensions whose product overflows int64 no longer wrap to a size that passes."""
    data = _idx(tuple(shape), body)
    total = 4 + 4 * len(shape)
    prod = 1
    for n in shape:
        prod *= n
    try:
        arr = parse_idx(data)
    except DataError:
        assert total + prod != len(data)
    else:
        assert arr.size == prod and total + prod == len(data)


def test_gzip_idx_that_expands_past_its_header_is_refused_unexpanded(tmp_path) -> None:
    path = tmp_path / "bomb-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx((10, 28, 28), bytes(50_000_000)), compresslevel=1))
    with pytest.raises(DataError) as info:
        read_idx(path)
    assert_names(str(info.value), path, "trailer")


def test_gzip_idx_declaring_more_than_memory_is_refused(tmp_path) -> None:
    path = tmp_path / "big-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx((2**31, 2**16, 2**16), b"")))
    with pytest.raises(DataError) as info:
        read_idx(path)
    assert_names(str(info.value), path, "GiB")


def test_gzip_idx_still_reads(tmp_path) -> None:
    path = tmp_path / "ok-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx((2, 2, 3), bytes(range(12)))))
    assert read_idx(path).tolist() == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]


def test_benchmark_batch_is_bounded_before_allocation(tmp_path, capsys) -> None:
    """``vtfm benchmark --batch 10**9``: one line naming the flag, before any image is read."""
    from test_cli_predict import TINY_VIT

    from vision_tfm.cli import main
    from vision_tfm.io import atomic_save
    from vision_tfm.models import create_model

    meta = {"task": "cls", "num_classes": 10, "in_chans": 1, "img_size": 28}
    meta |= {"class_names": [f"c{i}" for i in range(10)], "mean": [0.13], "std": [0.31]}
    ck = {"model": create_model("vit_mnist", **TINY_VIT).state_dict(), "meta": meta,
          "config": {"model": {"name": "vit_mnist", "kwargs": TINY_VIT}}}  # fmt: skip
    atomic_save(ck, tmp_path / "ck.pt")
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--checkpoint", str(tmp_path / "ck.pt"), "--batch", str(10**9)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert_names(err, "--batch", 10**9)


def test_training_threads_are_bounded_by_the_cores(tmp_path, monkeypatch) -> None:
    from vision_tfm.train.engine import Trainer

    cfg = apply_overrides(ClsConfig(), {"run.threads": 100000, "run.out_dir": str(tmp_path)})
    trainer = Trainer.__new__(Trainer)
    trainer.cfg, trainer.resume_path, trainer._run_dir = cfg, Path("x"), None
    with pytest.raises(ConfigError) as info:
        trainer._setup()
    assert_names(str(info.value), "run.threads", 100000)
