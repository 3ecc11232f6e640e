"""One exception hierarchy: every error vision_tfm raises on purpose is a ``VisionTfmError``.

The AST scan finds ``raise X(...)`` of a builtin exception class anywhere in the package; each
such raise should be one of :mod:`vision_tfm.errors` (which also derive from the builtin, so
``except ValueError`` keeps working). A bare re-raise (``raise`` / ``raise e``) is fine, as is
``raise NotImplementedError`` as the whole body of an abstract method, and the control-flow
exceptions below.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle
from pathlib import Path

import pytest

import vision_tfm as vt
from vision_tfm import errors
from vision_tfm.config import apply_overrides
from vision_tfm.data.datasets import check_image_size, read_data_pickle
from vision_tfm.data.grasp.dataset import CornellGrasp, _select
from vision_tfm.data.mnist import load_mnist, parse_idx, read_idx
from vision_tfm.layers.norm import get_norm_layer
from vision_tfm.models.convert import check_checkpoint_path

PACKAGE = Path(vt.__file__).parent

# Not errors: signal handlers end the process or the loop with these on purpose.
CONTROL_FLOW = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "StopIteration"}

def _builtin_exception(name: str) -> bool:
    obj = getattr(builtins, name, None)
    return isinstance(obj, type) and issubclass(obj, BaseException)


def _raised_name(node: ast.Raise) -> str | None:
    """``X`` of ``raise X`` / ``raise X(...)`` / ``raise builtins.X(...)``, else None."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute) and isinstance(exc.value, ast.Name):
        return exc.attr if exc.value.id == "builtins" else None
    return None


def _is_abstract_stub(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The body is (a docstring and) only ``raise NotImplementedError``."""
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and body[0].exc is not None
        and _raised_name(body[0]) == "NotImplementedError"
    )


def builtin_raises(files: list[Path], root: Path = PACKAGE.parent) -> list[str]:
    """``file:line: Name`` (relative to ``root``) for each raise of a builtin exception class."""
    found = []
    for path in sorted(files):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        stubs = {
            id(n.body[-1])
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_abstract_stub(n)
        }
        raises = [n for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc is not None]
        for node in sorted(raises, key=lambda n: n.lineno):
            if id(node) in stubs:
                continue
            name = _raised_name(node)
            # `raise e` of a caught exception names a variable, not a builtin class
            if name and name not in CONTROL_FLOW and _builtin_exception(name):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_no_builtin_exception_is_raised_anywhere() -> None:
    offenders = builtin_raises(list(PACKAGE.rglob("*.py")))
    print("\n".join(["raises of builtin exceptions left:", *offenders]))
    assert not offenders, f"{len(offenders)} raises of builtin exceptions:\n" + "\n".join(offenders)


def test_scan_finds_builtin_raises_and_spares_reraises_and_stubs(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import builtins\n"
        "def f(x):\n"
        "    try:\n"
        "        pass\n"
        "    except OSError as e:\n"
        "        raise e\n"
        "    except KeyError:\n"
        "        raise\n"
        "    if x:\n"
        "        raise ValueError('bad')\n"  # line 10
        "    raise builtins.TypeError('bad') from None\n"  # line 11
        "def g():\n"
        "    '''abstract'''\n"
        "    raise NotImplementedError\n"
        "def h(x):\n"
        "    if x:\n"
        "        raise NotImplementedError('only some x')\n"  # line 17: not a stub
        "    raise SystemExit(1)\n"
    )
    found = builtin_raises([tmp_path / "m.py"], root=tmp_path)
    assert found == ["m.py:10: ValueError", "m.py:11: TypeError", "m.py:17: NotImplementedError"]


def test_every_error_class_is_a_vision_tfm_error_with_a_builtin_twin() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)]
    classes = [c for c in classes if c.__module__ == errors.__name__]
    assert set(errors.__all__) == {c.__name__ for c in classes}
    for cls in classes:
        assert issubclass(cls, errors.VisionTfmError), cls
        if cls is errors.VisionTfmError:
            continue
        twins = [
            b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, object)
        ]
        assert twins and twins[0] is not BaseException, f"{cls.__name__} has no builtin twin"
        instance = cls("a one-line message")
        assert str(instance) == "a one-line message"  # UnknownKeyError: no KeyError quotes
        assert pickle.loads(pickle.dumps(instance)).args == instance.args  # DataLoader workers


def _cases(tmp_path: Path):
    """(call, our type, the builtin it replaced) for representative converted raises."""
    folder = tmp_path / "folder"
    folder.mkdir()
    return [
        (lambda: vt.create_model("no_such_model"), errors.ConfigError, ValueError),
        (
            lambda: read_idx(tmp_path / "none-idx3-ubyte.gz"),
            errors.MissingFileError,
            FileNotFoundError,
        ),
        (lambda: parse_idx(b"\x00\x00", "digits.idx"), errors.DataError, ValueError),
        (lambda: load_mnist("test"), errors.ConfigError, ValueError),
        (
            lambda: read_data_pickle(tmp_path / "data_batch_1"),
            errors.MissingFileError,
            FileNotFoundError,
        ),
        (lambda: check_image_size(0, 5, "x.png"), errors.DataError, ValueError),
        (lambda: check_checkpoint_path(folder), errors.NotAFileError, IsADirectoryError),
        (
            lambda: check_checkpoint_path(folder / "none.pt"),
            errors.MissingFileError,
            FileNotFoundError,
        ),
        (lambda: get_norm_layer("batchnorm"), errors.ConfigError, ValueError),
        (lambda: apply_overrides(object(), {}), errors.InputTypeError, TypeError),
        (lambda: _select([], ["pcd0100"]), errors.UnknownKeyError, KeyError),
        (
            lambda: vt.create_model("vit_test", features_only=True, out_indices=("last",)),
            errors.InputTypeError,
            TypeError,
        ),
    ]


def test_converted_errors_have_our_type_and_are_still_the_builtin(tmp_path: Path) -> None:
    for call, ours, builtin in _cases(tmp_path):
        with pytest.raises(ours) as info:
            call()
        assert isinstance(info.value, builtin), (ours, builtin)
        assert isinstance(info.value, errors.VisionTfmError)
        message = str(info.value)
        assert message and "\n" not in message, message


def test_dataset_index_error_still_ends_iteration() -> None:
    """``for item in dataset`` (no ``__iter__``: the sequence protocol) stops on IndexError."""
    cornell = Path(__file__).parent / "fixtures" / "cornell"
    (first, *_) = CornellGrasp(cornell, input="rgb").ids
    ds = CornellGrasp(cornell, ids=[first], input="rgb", output_size=32, crop_size=0)
    assert len(list(ds)) == 1
    with pytest.raises(errors.InputIndexError):
        ds[1]
