"""Exact weight digests: one 64-bit number per tensor that changes whenever any element's bits do.

Why this definition and not a byte hash (sha256 of the tensor's bytes):
- the server does not hold the checkpoint's tensors as they are written: vLLM fuses q/k/v and
  gate/up projections into one tensor, pads the vocabulary, and on CPU keeps linear weights only
  inside packed kernel copies that are read back a block of columns at a time. The digest must be
  computable from such pieces. It is a *sum over elements* of a mix of each element's bits and its
  position in the checkpoint tensor, so the digest of a tensor is the sum of the digests of any
  blocks it is cut into, each computed with its global positions;
- it runs in torch on the device the tensor lives on (a GPU reads 27B bf16 weights in well under
  a second); a byte hash would first copy every weight to the host.

Definition (pinned by a pure-Python reference in tests/test_digest.py):
    digest(T) = sum over i of fmix64(bits(T[i]) XOR (i * C1 mod 2^64))   (mod 2^64)
where i is the element's flat (row-major) index in the checkpoint tensor, bits() the element's
IEEE bit pattern in the served dtype read as an unsigned integer, and fmix64 MurmurHash3's
finalizer (a bijection of 64-bit words, logical shifts). For a fixed position the summand is a
bijection of the bits, so changing any single element always changes the digest. Canonical
forms first: -0.0 reads as +0.0, every NaN as one NaN, subnormals as zero (a matmul on an
identity matrix, how packed kernel copies are read back, cannot reproduce these distinctions,
and no kernel computes differently with them).

Runs in both environments (the trainer's and vLLM's): imports only torch.
"""
from __future__ import annotations

import hashlib

import torch

MASK64 = (1 << 64) - 1
C1, M1, M2 = 0x9E3779B97F4A7C15, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
CHUNK = 1 << 16                     # elements per pass on a CPU: int64 temporaries stay in cache (64K measured fastest)
GPU_CHUNK = 1 << 24                 # on a GPU: few kernel launches, ~0.5 GB of temporaries beside the served model
# dtype -> (integer view, bit mask, exponent field, canonical NaN)
_BITS = {torch.float32: (torch.int32, 0xFFFFFFFF, 0x7F800000, 0x7FC00000),
         torch.bfloat16: (torch.int16, 0xFFFF, 0x7F80, 0x7FC0),
         torch.float16: (torch.int16, 0xFFFF, 0x7C00, 0x7E00)}
_LOW31 = (1 << 31) - 1
_ARANGE_C1: torch.Tensor | None = None     # CPU only: arange(CHUNK) * C1


def _s64(c: int) -> int:
    """An unsigned 64-bit constant as torch's signed int64 (same bits)."""
    c &= MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


def dtype_of(name) -> torch.dtype:
    dt = name if isinstance(name, torch.dtype) else getattr(torch, str(name).removeprefix("torch."), None)
    if dt not in _BITS:
        raise ValueError(f"no weight digest for dtype {str(name).removeprefix('torch.')!r} (float32, bfloat16, float16)")
    return dt


def _fmix64(z: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 64-bit finalizer on int64 words, in place (wrapping multiply, logical shifts)."""
    z.bitwise_xor_((z >> 33) & _LOW31)
    z.mul_(_s64(M1))
    z.bitwise_xor_((z >> 33) & _LOW31)
    z.mul_(_s64(M2))
    return z.bitwise_xor_((z >> 33) & _LOW31)


def canonical_bits(x: torch.Tensor) -> torch.Tensor:
    """IEEE bit patterns as non-negative int64, after the canonical forms: ±0 and subnormals -> 0,
    every NaN -> one NaN (integer ops only: bf16/fp16 float ops are slow on many CPUs)."""
    view, mask, exp, nan = _BITS[x.dtype]
    b = x.contiguous().view(view).to(torch.int64).bitwise_and_(mask)
    e = b & exp
    b = b.masked_fill_(e == 0, 0)
    special = e == exp                      # inf or NaN: rare, so the NaN test runs only when present
    if bool(special.any()):
        b = b.masked_fill_(special & ((b & (mask >> 1) & ~exp) != 0), nan)
    return b


def _chunk(device: torch.device) -> int:
    return CHUNK if device.type == "cpu" else GPU_CHUNK


def _positions(start: int, n: int, device: torch.device) -> torch.Tensor:
    """(start + arange(n)) * C1 mod 2^64, as int64 (on a CPU from a cached arange: one add a pass)."""
    global _ARANGE_C1
    if device.type != "cpu":
        return torch.arange(start, start + n, dtype=torch.int64, device=device).mul_(_s64(C1))
    if _ARANGE_C1 is None or _ARANGE_C1.numel() < n:
        _ARANGE_C1 = torch.arange(max(n, CHUNK), dtype=torch.int64).mul_(_s64(C1))
    return _ARANGE_C1[:n] + _s64(start * C1)


def _mixed_sum(values: torch.Tensor, pos_c1: torch.Tensor) -> int:
    return int(_fmix64(canonical_bits(values).bitwise_xor_(pos_c1)).sum().item())


def block_digest(block: torch.Tensor, row0: int = 0, col0: int = 0, cols: int | None = None) -> int:
    """Digest contribution of `block`, the rows [row0, row0+R) x columns [col0, col0+C) of a
    checkpoint tensor with `cols` columns (a 1-D or whole tensor: the defaults). Contributions of
    disjoint blocks add (mod 2^64) to the tensor's digest."""
    b = block.detach()
    b = b.reshape(1, -1) if b.ndim <= 1 else b.reshape(b.shape[0], -1)
    rows, width = b.shape
    cols = width if cols is None else cols
    total, chunk = 0, _chunk(b.device)
    if width == cols:                       # whole rows: positions are contiguous
        flat, start = b.reshape(-1), row0 * cols
        for s in range(0, flat.numel(), chunk):
            part = flat[s:s + chunk]
            total += _mixed_sum(part, _positions(start + s, part.numel(), b.device))
        return total & MASK64
    step = max(1, chunk // max(width, 1))
    col_c1 = (torch.arange(width, dtype=torch.int64, device=b.device) + col0).mul_(_s64(C1))
    for r in range(0, rows, step):
        part = b[r:r + step]
        row_c1 = torch.arange(row0 + r, row0 + r + part.shape[0], dtype=torch.int64, device=b.device).mul_(_s64(cols * C1))
        total += _mixed_sum(part.reshape(-1), (row_c1[:, None] + col_c1[None, :]).reshape(-1))
    return total & MASK64


def tensor_digest(t: torch.Tensor, dtype: torch.dtype | str | None = None) -> int:
    """Digest of a whole tensor, cast to `dtype` first (the dtype the server computes in)."""
    return block_digest(t.detach().to(dtype_of(dtype) if dtype is not None else t.dtype))


def hexd(d: int) -> str:
    return f"{d & MASK64:016x}"


def total_digest(tensors: dict[str, str]) -> str:
    """One digest of a whole model: sha256 over 'name digest' lines in name order (first 16 hex)."""
    text = "\n".join(f"{n} {tensors[n]}" for n in sorted(tensors))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
