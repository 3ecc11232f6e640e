"""The embedded default dataset: the 10,000-image MNIST test set, shipped inside the package.

The two original gzipped idx files (1.6 MB) live in `vision_tfm/data/assets/`, so a fresh
install trains and evaluates with no download and no network. They are split once into
8,000 train / 2,000 val images by a seeded permutation that is the same on every run.
"""

from __future__ import annotations

import gzip
import io
import math
import zlib
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from ..config import check_memory
from ..errors import ConfigError, DataError, MissingFileError

MNIST_CLASSES = [str(d) for d in range(10)]
MNIST_NUM_TRAIN = 8000
MNIST_SPLIT_SEED = 0

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_IMAGES_FILE = "t10k-images-idx3-ubyte.gz"
_LABELS_FILE = "t10k-labels-idx1-ubyte.gz"

# idx type code (third magic byte) -> big-endian numpy dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(
    data: bytes, source: str = "<bytes>", expected_magic: int | None = None
) -> np.ndarray:
    """Decode uncompressed idx bytes (big-endian magic, then one uint32 per dimension) into the
    array its header declares, in native byte order.

    ``source`` names the data in errors; ``expected_magic`` (2051 images, 2049 labels), when
    given, is the magic number it must carry. A bad magic number, an unknown type code or a
    body shorter or longer than declared is a :class:`~vision_tfm.errors.DataError`.
    """
    shape, dtype, header_len, expected = _idx_header(data, source, expected_magic)
    if len(data) != expected:
        raise DataError(f"{source}: {len(data)} bytes, header shape {shape} needs {expected}")
    arr = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def _idx_header(
    data: bytes, source: str, expected_magic: int | None
) -> tuple[tuple[int, ...], np.dtype, int, int]:
    """``(shape, dtype, header length, total bytes)`` an idx header declares; the total is
    an exact Python integer, so dimensions whose product overflows int64 cannot wrap to a
    small size that passes the length check."""
    if len(data) < 4:
        raise DataError(f"{source}: {len(data)} bytes is too short for an idx header")
    magic = int.from_bytes(data[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise DataError(f"{source}: idx magic number {magic}, expected {expected_magic}")
    type_code, ndim = data[2], data[3]
    if data[:2] != b"\x00\x00" or type_code not in _IDX_DTYPES or ndim == 0:
        raise DataError(f"{source}: {magic} is not a valid idx magic number")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{source}: header declares {ndim} dims but the file ends at {len(data)}")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    return shape, dtype, header_len, header_len + math.prod(shape) * dtype.itemsize


def read_idx(path: str | Path, expected_magic: int | None = None) -> np.ndarray:
    """Read an idx file, gzipped (by `.gz` suffix) or not; see `parse_idx`."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"idx file not found: {path}")
    return _decode(path.read_bytes(), str(path), path.suffix == ".gz", expected_magic)


def _decode(raw: bytes, source: str, gzipped: bool, expected_magic: int | None) -> np.ndarray:
    if gzipped:
        try:
            raw = _gunzip_idx(raw, source, expected_magic)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{source}: not a valid gzip file ({e})") from None
    return parse_idx(raw, source, expected_magic)


def _gunzip_idx(raw: bytes, source: str, expected_magic: int | None) -> bytes:
    """Decompress an idx file only as far as its header says it reaches: the header first,
    then its declared size checked against the gzip trailer and the machine's memory, then at
    most one byte past it. An 18 MB file that expands to 4 GB is refused before expanding."""
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
        head = f.read(4)
        head += f.read(4 * head[3]) if len(head) == 4 else b""
        shape, _, _, expected = _idx_header(head, source, expected_magic)
        trailer = int.from_bytes(raw[-4:], "little") if len(raw) >= 4 else None
        if trailer is not None and trailer != expected % 2**32:  # ISIZE: the size mod 2**32
            raise DataError(
                f"{source}: header shape {shape} needs {expected} bytes, but the gzip "
                f"trailer says it expands to {trailer}"
            )
        try:  # the bytes and the array made from them
            check_memory(2 * expected, source, f"the idx header's shape {shape}")
        except ConfigError as e:
            raise DataError(str(e)) from None
        return head + f.read(expected - len(head) + 1)


def _read_asset(name: str, magic: int) -> np.ndarray:
    # Read through importlib.resources so it also works from a wheel or zipped install.
    raw = resources.files("vision_tfm.data").joinpath("assets").joinpath(name).read_bytes()
    return _decode(raw, name, True, magic)


@lru_cache(maxsize=1)
def _load_embedded() -> tuple[np.ndarray, np.ndarray]:
    images = _read_asset(_IMAGES_FILE, IDX_IMAGES_MAGIC)
    labels = _read_asset(_LABELS_FILE, IDX_LABELS_MAGIC)
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise DataError(f"embedded MNIST: images {images.shape} vs labels {labels.shape}")
    if labels.max() >= len(MNIST_CLASSES):
        raise DataError(f"embedded MNIST: label {labels.max()} is out of range 0..9")
    images.flags.writeable = False
    labels = labels.astype(np.int64)
    labels.flags.writeable = False
    return images, labels


def mnist_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Train and val indices into the 10,000 embedded images.

    A `numpy.random.default_rng(0)` permutation: PCG64 is platform-independent, so every run
    and every machine sees the same 8,000 / 2,000 split (a test pins its first indices).
    """
    n = len(_load_embedded()[1])
    perm = np.random.default_rng(MNIST_SPLIT_SEED).permutation(n)
    return perm[:MNIST_NUM_TRAIN], perm[MNIST_NUM_TRAIN:]


def load_mnist(split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """Load the embedded MNIST digits into memory.

    Args:
        split: "all" (file order, 10,000), "train" (8,000) or "val" (2,000).

    Returns:
        images: uint8 (N, 28, 28), white digits on black; labels: int64 (N,), values 0..9.
    """
    images, labels = _load_embedded()
    if split == "all":
        return images.copy(), labels.copy()
    if split not in ("train", "val"):
        raise ConfigError(f"MNIST split {split!r} is unknown; expected 'all', 'train' or 'val'")
    idx = mnist_split_indices()[0 if split == "train" else 1]
    return images[idx], labels[idx]
