"""No foreign traceback: the CLIs print a library's known failures (a corrupt safetensors
file, torch's unpickling refusal, a full disk, memory, a graph onnxruntime cannot load) as
one ``error:`` line, exit 1 for a failed write and 2 for bad input; a bug keeps its traceback.
"""

from __future__ import annotations

import errno
import io
import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vision_tfm import cli
from vision_tfm.errors import ConfigError, error_line, exit_code
from vision_tfm.train.launch import run_cli


def _safetensor_error(tmp_path: Path) -> Exception:
    from safetensors.torch import load_file

    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(Exception) as e:
        load_file(tmp_path / "bad.safetensors")
    return e.value


def _unpickling_refusal(tmp_path: Path) -> Exception:
    buf = io.BytesIO()
    torch.save({"x": io.StringIO("code")}, buf)  # an object beyond plain data
    buf.seek(0)
    with pytest.raises(Exception) as e:
        torch.load(buf, weights_only=True)
    return e.value


def _ort_error(tmp_path: Path) -> Exception:
    import onnxruntime as ort

    (tmp_path / "bad.onnx").write_bytes(b"\x08garbage" * 10)
    with pytest.raises(Exception) as e:
        ort.InferenceSession(str(tmp_path / "bad.onnx"), providers=["CPUExecutionProvider"])
    return e.value


REAL = {"safetensors": _safetensor_error, "unpickling": _unpickling_refusal, "ort": _ort_error}


@pytest.mark.parametrize("make", REAL.values(), ids=REAL.keys())
@pytest.mark.parametrize("entry", ["vtfm", "train"])
def test_a_librarys_real_error_is_one_line_with_exit_2(
    tmp_path: Path, capsys, monkeypatch, make, entry: str
) -> None:
    error = make(tmp_path)
    assert type(error).__module__ != "vision_tfm.errors"

    def boom(*args) -> None:
        raise error

    monkeypatch.setattr(cli.predict, "cmd_predict", boom)
    with pytest.raises(SystemExit) as e:
        if entry == "vtfm":
            cli.main(["predict", "x.png", "--checkpoint", "c.pt"])
        else:
            run_cli(boom)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert len(err) < 400


WRITES = [
    OSError(errno.EFBIG, "File too large"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError("problem writing element"),
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"),
]


@pytest.mark.parametrize("error", WRITES, ids=lambda e: str(e)[:20])
def test_a_failed_write_exits_1(error: Exception, capsys) -> None:
    def boom() -> None:
        raise error

    with pytest.raises(SystemExit) as e:
        run_cli(boom)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("error: ") and len(err.splitlines()) == 1


def test_memory_error_is_one_line(capsys) -> None:
    def boom() -> None:
        raise MemoryError()

    with pytest.raises(SystemExit) as e:
        run_cli(boom)
    assert e.value.code == 2 and capsys.readouterr().err == "error: out of memory\n"


BUGS = st.sampled_from([KeyError, AttributeError, ZeroDivisionError, TypeError, IndexError])


@given(kind=BUGS, text=st.text(max_size=30))
def test_a_bug_keeps_its_traceback(kind: type, text: str) -> None:
    """Not caught blindly: an error that is no known failure propagates from both CLIs."""
    assert exit_code(kind(text)) is None
    assert exit_code(RuntimeError(text.replace("unexpected pos", ""))) is None or any(
        s in text for s in ("Weights only", "PytorchStreamWriter", "problem writing")
    )

    def boom() -> None:
        raise kind(text)

    with pytest.raises(kind):
        run_cli(boom)


@given(text=st.text(max_size=2000), lines=st.integers(1, 50))
def test_the_error_line_is_one_bounded_line(text: str, lines: int) -> None:
    for e in (ConfigError("\n".join([text] * lines)), pickle.UnpicklingError(text), OSError(text)):
        line = error_line(e)
        assert line.startswith("error: ") and "\n" not in line.strip() and len(line) < 340


def test_export_at_a_huge_img_size_is_refused_before_allocation(tmp_path: Path, capsys) -> None:
    """``vtfm export --img-size 700000``: one line naming the flag, no tensor made."""
    from test_cli_predict import TINY_VIT

    from vision_tfm.io import atomic_save
    from vision_tfm.models import create_model

    meta = {"task": "cls", "num_classes": 10, "in_chans": 1, "img_size": 28}
    meta |= {"class_names": [f"c{i}" for i in range(10)], "mean": [0.13], "std": [0.31]}
    model = create_model("vit_mnist", **TINY_VIT)
    ck = {"model": model.state_dict(), "config": {"model": {"name": "vit_mnist",
          "kwargs": TINY_VIT}}, "meta": meta}  # fmt: skip
    atomic_save(ck, tmp_path / "ck.pt")
    with pytest.raises(SystemExit) as e:
        cli.main(["export", "--checkpoint", str(tmp_path / "ck.pt"), "--img-size", "700000"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--img-size" in err, err
    assert not (tmp_path / "model.onnx").exists()


def test_cli_warnings_are_one_line_without_source() -> None:
    """Our own data warnings (a skipped rectangle) reach a CLI user as one line each."""
    import warnings as w

    from vision_tfm.errors import warning_line

    line = warning_line(UserWarning("a.txt: skipped 1 of 3\n rectangles"), UserWarning, "x.py", 3)
    assert line == "warning: a.txt: skipped 1 of 3 rectangles\n"
    assert warning_line("old", DeprecationWarning, "x.py", 3, "src") == (
        "warning: DeprecationWarning: old\n"
    )
    assert w.formatwarning is not warning_line  # vtfm's main restores Python's formatter
