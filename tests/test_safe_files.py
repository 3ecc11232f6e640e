"""The one safe reader and the writes' modes: files that never end, links that loop, temp
files a kill left, and ``--resume auto`` past runs it cannot read."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vision_tfm.config import safe_yaml
from vision_tfm.errors import ConfigError, DataError, MissingFileError, NotAFileError
from vision_tfm.files import (
    MAX_NESTING,
    atomic_save,
    atomic_write_text,
    glob_files,
    read_json,
    read_text,
    user_mode,
    walk_files,
)
from vision_tfm.train.rundir import mark_run_dir, newest_unfinished

pytestmark = pytest.mark.timeout(30)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # no writer: a plain open() would wait forever
    with pytest.raises(DataError, match=r"config\.json is not a regular file"):
        read_json(fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_device_that_never_ends_is_refused(tmp_path):
    link = tmp_path / "model.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(DataError, match="not a regular file"):
        read_text(link)


def test_missing_folder_loop_and_oversize_each_get_their_own_line(tmp_path):
    with pytest.raises(MissingFileError, match="file not found"):
        read_text(tmp_path / "absent.yaml")
    with pytest.raises(NotAFileError, match="is a folder"):
        read_text(tmp_path)
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    with pytest.raises(DataError, match="symlink loop"):
        read_text(loop)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(DataError, match="2,048 bytes, over the 1,024-byte limit"):
        read_json(big, max_bytes=1024)
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match="not UTF-8"):
        read_text(tmp_path / "bin.yaml")


@pytest.mark.parametrize(
    "depth,ok", [(MAX_NESTING, True), (MAX_NESTING + 1, False), (10**5, False)]
)
def test_json_and_yaml_nesting_is_bounded(tmp_path, depth, ok):
    doc = "[" * depth + "]" * depth
    (tmp_path / "c.json").write_text(doc)
    if ok:
        value = read_json(tmp_path / "c.json")
        for _ in range(depth - 1):
            value = value[0]
        assert value == []
        assert safe_yaml(doc) == read_json(tmp_path / "c.json")
        return
    with pytest.raises(ConfigError, match=f"nests deeper than {MAX_NESTING} levels"):
        read_json(tmp_path / "c.json")
    with pytest.raises(ConfigError, match=f"nests deeper than {MAX_NESTING} levels"):
        safe_yaml(doc)


def test_a_yaml_alias_bomb_is_refused():
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefghijk", "bcdefghijkl"):
        rows.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    bomb = "\n".join(rows)  # under 1 KB; 10**12 leaves if expanded
    assert len(bomb) < 1024
    with pytest.raises(ConfigError, match="YAML aliases"):
        safe_yaml(bomb)
    shared = "a: &a [x]\n" + "".join(f"b{i}: [*a, *a]\n" for i in range(40))
    assert len(safe_yaml(shared)) == 41  # aliases a config may well use
    with pytest.raises(ConfigError, match="holds itself"):
        safe_yaml("a: &a [*a]")


def _tree(root, names):
    (root / "cls").mkdir()
    for n in names:
        (root / "cls" / n).write_bytes(b"x")


def test_walk_visits_each_real_file_once_through_looping_links(tmp_path):
    _tree(tmp_path, ["a.png", "b.png"])
    (tmp_path / "cls" / "self").symlink_to(tmp_path / "cls")  # a loop
    (tmp_path / "cls" / "up").symlink_to(tmp_path)  # a second loop: 2**depth paths
    (tmp_path / "cls" / "c.png").symlink_to(tmp_path / "cls" / "a.png")  # a second name
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a.png").write_bytes(b"x")
    (tmp_path / "cls" / "dangling.png").symlink_to(tmp_path / "nowhere.png")
    assert walk_files(tmp_path) == [tmp_path / "cls" / "a.png", tmp_path / "cls" / "b.png"]
    got = list(glob_files(str(tmp_path / "**" / "*.png")))
    assert got == [tmp_path / "cls" / "a.png", tmp_path / "cls" / "b.png"]
    assert list(glob_files(str(tmp_path / "cls" / "b.*"))) == [tmp_path / "cls" / "b.png"]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.lists(
        st.tuples(st.sampled_from(["d0", "d1", "d0/d2", "d1/d3"]), st.sampled_from(["f", "link"]),
                  st.sampled_from(["", "d0", "d1", "d0/d2", "d1/d3"])),
        min_size=1, max_size=12,
    )
)
def test_any_layout_of_files_and_links_walks_to_each_file_once(tmp_path_factory, layout):
    root = tmp_path_factory.mktemp("tree")
    for d in ["d0", "d1", "d0/d2", "d1/d3"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    for i, (where, kind, target) in enumerate(layout):
        if kind == "f":
            (root / where / f"{i}.png").write_bytes(b"x")
        else:  # a link to any folder, its own parents included
            (root / where / f"l{i}").symlink_to(root / target if target else root)
    found = walk_files(root)
    inodes = [os.stat(p).st_ino for p in found]
    assert len(inodes) == len(set(inodes)) == sum(kind == "f" for _, kind, _ in layout)


def test_writes_take_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text("x", tmp_path / "a.txt")
        atomic_save({"w": torch.zeros(1)}, tmp_path / "a.pt")
        assert user_mode() == 0o644
    finally:
        os.umask(old)
    for name in ("a.txt", "a.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def test_a_dead_writers_temp_is_removed_at_the_next_write_and_a_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f".model.safetensors.{dead}.abc123.tmp"  # what a kill mid-write leaves
    live = tmp_path / f".model.safetensors.{os.getpid()}.def456.tmp"  # another write going on
    left.write_bytes(b"x" * 1000)
    live.write_bytes(b"x")
    atomic_write_text("weights", tmp_path / "model.safetensors")
    assert not left.exists() and live.exists()
    assert (tmp_path / "model.safetensors").read_text() == "weights"


def _run(root, name, config_text, epoch, last=None):
    d = root / name
    d.mkdir(parents=True)
    mark_run_dir(d)
    (d / "config.yaml").write_text(config_text)
    ckpt = {"model": {}, "config": {}, "meta": {}, "optimizer": {}, "scheduler": {},
            "scaler": {}, "state": {"epoch": epoch}}
    atomic_save(ckpt, d / "last.pt")
    if last is not None:
        (d / "last.pt").write_bytes(last)
    return d


def test_resume_auto_says_which_runs_it_skipped_and_why(tmp_path):
    older = _run(tmp_path, "a_older", "seed: 1\n", epoch=1)
    bomb = "a: &a [x, x]\n" + "".join(f"b{i}: [*a, *a, *a, *a, *a, *a]\n" for i in range(30))
    broken_cfg = _run(tmp_path, "b_alias_bomb", bomb, epoch=1)
    torn = _run(tmp_path, "c_torn", "seed: 1\n", epoch=1)
    (torn / "last.pt").write_bytes((torn / "last.pt").read_bytes()[:100])  # truncated
    for i, d in enumerate([older, broken_cfg, torn]):
        os.utime(d / "last.pt", ns=(10**9 * (i + 1),) * 2)  # torn is the newest
    said: list[str] = []
    found = newest_unfinished(tmp_path, lambda c: c.get("seed") == 1, 2, say=said.append)
    assert found == older / "last.pt"
    assert len(said) == 2 and all("\n" not in s for s in said)
    assert said[0].startswith(f"run.resume=auto: skipped {broken_cfg}: ") and "alias" in said[0]
    assert said[1].startswith(f"run.resume=auto: skipped {torn}: ")
