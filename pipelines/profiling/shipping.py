"""A kernel's output as a file, so its correctness is judged in a process it never ran in.

The kernel's process writes what `custom_kernel` returned (tensors inside tuples, lists and
dicts, plus plain numbers and strings) with `write_output`; the verifier reads it back with
`read_output` onto its own device. The format is ours and carries no code (never pickle):

    b"KCOUT001" | u64 header length | header JSON | tensor bytes, each at a 64-byte boundary

header = {"tree": node, "tensors": [{"dtype", "shape", "offset", "nbytes"}]}, where a node is
{"t": "tensor", "i": k} | {"t": "tuple"|"list", "items": [...]} | {"t": "dict", "items": [[key, node]]}
| {"t": "none"} | {"t": "bool"|"int"|"float"|"str", "v": value}. Tensors are written contiguous
(the checks compare values, not strides). The reader trusts nothing: dtypes come from an
allow-list, sizes and offsets must fit the file, nesting and counts are bounded.

On a GPU the bytes need not leave the device: `write_handles` writes the same header with
b"KCIPC001" and, per tensor, a CUDA IPC handle of its allocation (ipc_handles.py) instead of its
bytes; the reader maps each handle, copies the bytes into its own memory and checks offsets and
sizes against the mapped block. A reader that cannot map them raises `NeedsFile`, and the
kernel's process ships the same output as a file.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import torch

# Imported here, not where it is used: the integrity watch checks the harness modules loaded
# before the kernel runs, and a module first imported after it would go unwatched.
from pipelines.profiling import ipc_handles
from pipelines.profiling.sandbox import RefusedJSON, loads_bounded

MAGIC = b"KCOUT001"
IPC_MAGIC = b"KCIPC001"
ALIGN = 64
MAX_HEADER = 1 << 20  # bytes
MAX_TENSORS = 256
MAX_DEPTH = 8
MAX_STR = 4096
# JSON levels of a header: the tree's nodes (a dict item is [key, node] in a list in a node:
# three levels per level of the output) and the tensor table.
MAX_HEADER_DEPTH = 3 * (MAX_DEPTH + 1) + 4

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
                 "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64")
    if hasattr(torch, name)
}
_NAMES = {v: k for k, v in DTYPES.items()}


class ShippingError(ValueError):
    """An output that cannot be written, or a file that is not a valid output."""


class NeedsFile(ShippingError):
    """The output came as CUDA IPC handles this process cannot map: ship it as a file instead."""


def _encode(value: Any, tensors: list[torch.Tensor], depth: int = 0) -> dict:
    if depth > MAX_DEPTH:
        raise ShippingError(f"output nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, torch.Tensor):
        if value.dtype not in _NAMES:
            raise ShippingError(f"output tensor of dtype {value.dtype} cannot be checked")
        if len(tensors) >= MAX_TENSORS:
            raise ShippingError(f"output holds more than {MAX_TENSORS} tensors")
        tensors.append(value)
        return {"t": "tensor", "i": len(tensors) - 1}
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, int):
        return {"t": "int", "v": value}
    if isinstance(value, float):
        return {"t": "float", "v": value if math.isfinite(value) else repr(value)}
    if isinstance(value, str):
        return {"t": "str", "v": value[:MAX_STR]}
    if isinstance(value, (tuple, list)):
        return {"t": "tuple" if isinstance(value, tuple) else "list",
                "items": [_encode(x, tensors, depth + 1) for x in value]}
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise ShippingError(f"output dict key {k!r} is not a string or integer")
            items.append([k, _encode(v, tensors, depth + 1)])
        return {"t": "dict", "items": items}
    raise ShippingError(f"output of type {type(value).__name__} cannot be checked")


def write_output(path: str | Path, output: Any) -> int:
    """Write `output` to `path` (created, never followed if a link); returns the bytes written.

    Raises:
        ShippingError: the output holds something that cannot be shipped.
    """
    tensors: list[torch.Tensor] = []
    tree = _encode(output, tensors)
    entries, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        entries.append({"dtype": _NAMES[t.dtype], "shape": list(t.shape), "offset": offset, "nbytes": nbytes})
        offset += -(-nbytes // ALIGN) * ALIGN
    header = json.dumps({"tree": tree, "tensors": entries}).encode()
    head = MAGIC + len(header).to_bytes(8, "little") + header
    head += b"\0" * (-len(head) % ALIGN)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(head)
        for t, e in zip(tensors, entries):
            data = t.detach().contiguous()
            if data.device.type != "cpu":
                data = data.cpu()
            f.write(memoryview(data.view(torch.uint8).reshape(-1).numpy()) if data.numel() else b"")
            f.write(b"\0" * (-e["nbytes"] % ALIGN))
    return len(head) + offset


def write_handles(path: str | Path, output: Any) -> list[torch.Tensor] | None:
    """Write `output` to `path` as CUDA IPC handles; returns the tensors to keep alive until the
    verdict, or None when the output holds no tensor or one off the GPU (ship a file then).

    Raises:
        ShippingError: the output holds something that cannot be shipped.
        NeedsFile: this allocation or host cannot hand memory over.
    """
    tensors: list[torch.Tensor] = []
    tree = _encode(output, tensors)
    if not tensors or any(t.device.type != "cuda" for t in tensors):
        return None
    keep = [t.detach().contiguous() for t in tensors]
    torch.cuda.synchronize()  # the verifier reads the bytes from another process
    try:
        entries = [{"dtype": _NAMES[t.dtype], "shape": list(t.shape), "nbytes": t.numel() * t.element_size(),
                    **_handle_entry(t)} for t in keep]
    except ipc_handles.IpcUnavailable as e:
        raise NeedsFile(str(e)) from None
    header = json.dumps({"tree": tree, "tensors": entries}).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(IPC_MAGIC + len(header).to_bytes(8, "little") + header)
    return keep


def _handle_entry(t: torch.Tensor) -> dict:
    """An empty tensor has no memory to hand over (its pointer is 0): it travels as its shape."""
    if t.numel() == 0:
        return {"handle": None, "offset": 0, "device": ipc_handles.device_uuid(t.device.index or 0)}
    return ipc_handles.export(t)


def _valid_handle(e: dict, nbytes: int) -> bool:
    h = e.get("handle")
    if h is None:
        return nbytes == 0
    return isinstance(h, str) and len(h) == 2 * ipc_handles.HANDLE_BYTES and all(c in "0123456789abcdef" for c in h)


def _decode(node: Any, tensors: list[torch.Tensor], depth: int = 0) -> Any:
    if depth > MAX_DEPTH or not isinstance(node, dict):
        raise ShippingError("malformed output tree")
    kind = node.get("t")
    if kind == "tensor":
        i = node.get("i")
        if not isinstance(i, int) or not 0 <= i < len(tensors):
            raise ShippingError("output tree points at a missing tensor")
        return tensors[i]
    if kind == "none":
        return None
    if kind in ("bool", "int", "str"):
        v = node.get("v")
        want = {"bool": bool, "int": int, "str": str}[kind]
        if not isinstance(v, want) or (kind == "int" and isinstance(v, bool)):
            raise ShippingError(f"malformed {kind} in output")
        return v
    if kind == "float":
        v = node.get("v")
        return float(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
    if kind in ("tuple", "list", "dict"):
        items = node.get("items", [])
        if not isinstance(items, list):
            raise ShippingError("malformed output tree")
    if kind in ("tuple", "list"):
        values = [_decode(x, tensors, depth + 1) for x in items]
        return tuple(values) if kind == "tuple" else values
    if kind == "dict":
        out = {}
        for item in items:  # [key, node] pairs, keys as `_encode` writes them
            if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], (str, int))
                    or isinstance(item[0], bool)):
                raise ShippingError("malformed output tree")
            out[item[0]] = _decode(item[1], tensors, depth + 1)
        return out
    raise ShippingError(f"unknown node {kind!r} in output")


def read_output(path: str | Path, device: str = "cpu", owner: int | None = None) -> Any:
    """Read an output written by `write_output` or `write_handles`, its tensors placed on `device`
    (`read_shipped` also says which of the two wrote it)."""
    return read_shipped(path, device, owner)[0]


def read_shipped(path: str | Path, device: str = "cpu", owner: int | None = None) -> tuple[Any, str]:
    """(output, "file" | "ipc") of an output written by `write_output` or `write_handles`.

    Args:
        path: the file; a symlink is refused, and so is anything but a regular file.
        device: where the tensors go ("cpu" copies them out of the file, "cuda" uploads them).
        owner: when given, the uid the file must belong to.
    Raises:
        ShippingError: the file is missing, not ours or malformed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ShippingError(f"no output file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ShippingError("the output is not a regular file")
        if owner is not None and st.st_uid != owner:
            raise ShippingError("the output file belongs to another user")
        if st.st_size < 16:
            raise ShippingError("the output file is truncated")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if mm[:8] not in (MAGIC, IPC_MAGIC):
                raise ShippingError("the output file has no valid header")
            n = int.from_bytes(mm[8:16], "little")
            if n > MAX_HEADER or 16 + n > st.st_size:
                raise ShippingError("the output header is too large")
            try:  # bounded first: a header nested past the decoder's recursion limit is the kernel's
                header = loads_bounded(mm[16:16 + n], MAX_HEADER, MAX_HEADER_DEPTH)
            except RefusedJSON as e:
                raise ShippingError(f"the output header is refused ({e})") from None
            except ValueError:
                raise ShippingError("the output header is not JSON") from None
            start = -(-(16 + n) // ALIGN) * ALIGN
            tensors = []
            entries = header.get("tensors", []) if isinstance(header, dict) else None
            if not isinstance(entries, list) or len(entries) > MAX_TENSORS:
                raise ShippingError("malformed tensor table in output")
            if mm[:8] == IPC_MAGIC:
                return _decode(header.get("tree"), _mapped_tensors(entries, device)), "ipc"
            for e in entries:
                tensors.append(_tensor(mm, e, start, st.st_size, device))
            return _decode(header.get("tree"), tensors), "file"


def _entry_layout(e: Any) -> tuple[torch.dtype, list[int], int]:
    """(dtype, shape, nbytes) of a tensor entry, validated."""
    if not isinstance(e, dict) or not isinstance(e.get("dtype"), str) or e["dtype"] not in DTYPES:
        raise ShippingError("output tensor of an unknown dtype")
    dtype, shape, nbytes = DTYPES[e["dtype"]], e.get("shape"), e.get("nbytes")
    if (not isinstance(shape, list) or len(shape) > 16 or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(nbytes, int)):
        raise ShippingError("malformed tensor entry in output")
    if math.prod(shape) * torch.empty((), dtype=dtype).element_size() != nbytes:
        raise ShippingError("output tensor size does not match its shape")
    return dtype, shape, nbytes


def _entry_offset(e: dict) -> int:
    """A tensor entry's byte offset (into the file, or into its memory block), validated."""
    offset = e.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ShippingError("malformed tensor entry in output")
    return offset


def _mapped_tensors(entries: list, device: str) -> list[torch.Tensor]:
    """The tensors of an IPC output, copied out of the kernel process's memory blocks (each block
    mapped once, however many tensors it holds)."""
    layouts = [(*_entry_layout(e), _entry_offset(e)) for e in entries]
    if not all(_valid_handle(e, layout[2]) for e, layout in zip(entries, layouts)):
        raise ShippingError("malformed CUDA IPC entry in output")  # on any verifier, GPU or not
    if not device.startswith("cuda"):
        raise NeedsFile("this verifier has no GPU to map CUDA IPC handles on")
    try:
        here = ipc_handles.device_uuid(torch.device(device).index or 0)
        if any(e.get("device") != here for e in entries):
            raise NeedsFile("the output lies on another GPU")
        out: list[torch.Tensor | None] = [None if e["handle"] else torch.empty(layouts[i][1], dtype=layouts[i][0], device=device)
                                          for i, e in enumerate(entries)]
        for handle in dict.fromkeys(e["handle"] for e in entries if e["handle"]):
            with ipc_handles.opened(handle, device) as (ptr, size):
                for i, e in enumerate(entries):
                    if e["handle"] != handle:
                        continue
                    dtype, shape, nbytes, offset = layouts[i]
                    if offset + nbytes > size:
                        raise ShippingError("output tensor does not fit its memory block")
                    out[i] = ipc_handles.copy_out(ptr + offset, nbytes, device).view(dtype).reshape(shape)
    except (ipc_handles.IpcUnavailable, ValueError) as e:
        if isinstance(e, ShippingError):
            raise
        raise NeedsFile(str(e)) from None
    return out


def _tensor(mm: mmap.mmap, e: Any, start: int, size: int, device: str) -> torch.Tensor:
    dtype, shape, nbytes = _entry_layout(e)
    offset = _entry_offset(e)
    if start + offset + nbytes > size:
        raise ShippingError("output tensor does not fit the file")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mapping is read-only; the bytes are copied right away
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start + offset)
    out = raw.to(device, copy=True) if device != "cpu" else raw.clone()  # never keep a view of the mapping
    return out.view(dtype).reshape(shape)
