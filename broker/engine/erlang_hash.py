"""Erlang's ``erlang:phash2/1`` and ``rand`` exs1024, bit for bit, for the hash exchanges.

RabbitMQ's consistent-hash exchange picks a bucket with jump consistent hash,
seeded from ``erlang:phash2`` of the routing key through ``rand:seed_s(exs1024,
{K, K, K})``; the modulus-hash exchange takes ``phash2`` of the routing-key
list. A queue gets the same share of keys as on RabbitMQ only if these match
exactly, so they follow the ERTS and stdlib algorithms (facts from
``erts/emulator/beam/utils.c`` make_hash2/block_hash and ``stdlib/src/rand.erl``);
the vectors in tests/test_plugin_exchanges.py were computed with Erlang/OTP 25.
"""

from __future__ import annotations

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = 0x9E3779B9
_HCONST_2 = 0x3C6EF372
_HCONST_3 = 0xDAA66D2B
_HCONST_13 = 0x08D12E65
_PHASH2_RANGE = 1 << 27
_NIL_DEF = 0x2  # NIL_DEF: the tag make_hash2 mixes in for the [] ending a list


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' 96-bit mix (lookup2), on unsigned 32-bit words."""
    a = (a - b - c) & _M32
    a ^= c >> 13
    b = (b - c - a) & _M32
    b ^= (a << 8) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 13
    a = (a - b - c) & _M32
    a ^= c >> 12
    b = (b - c - a) & _M32
    b ^= (a << 16) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 5
    a = (a - b - c) & _M32
    a ^= c >> 3
    b = (b - c - a) & _M32
    b ^= (a << 10) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 15
    return a, b, c


def block_hash(data: bytes, initval: int) -> int:
    a = b = _GOLDEN
    c = initval & _M32
    length = len(data)
    off = 0
    while length - off >= 12:
        a = (a + int.from_bytes(data[off : off + 4], "little")) & _M32
        b = (b + int.from_bytes(data[off + 4 : off + 8], "little")) & _M32
        c = (c + int.from_bytes(data[off + 8 : off + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        off += 12
    c = (c + length) & _M32
    tail = data[off:]
    # the last word's first byte is the length: its tail bytes start one byte up
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M32
    return _mix(a, b, c)[2]


def atom_hash(name: str) -> int:
    """The atom table's hashpjw of an atom's name (latin-1 names only)."""
    h = 0
    for v in name.encode("latin-1"):
        h = ((h << 4) + v) & _M32
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def _hash_binary(data: bytes, hash_: int) -> int:
    con = (_HCONST_13 + hash_) & _M32
    return con if not data else block_hash(data, con)


def make_hash2(term: bytes | str | list[bytes] | None) -> int:
    """make_hash2 for the terms the exchanges hash: a binary, an atom (str; None is
    ``undefined``) or a proper list of binaries."""
    if isinstance(term, bytes):
        return _hash_binary(term, 0)
    if term is None:
        return atom_hash("undefined")
    if isinstance(term, str):
        return atom_hash(term)
    if not term:
        return 3468870702  # the empty list alone
    hash_ = 0
    for element in term:
        hash_ = _hash_binary(element, hash_)
    # the tail: [] after a non-empty prefix is mixed like a 32-bit value
    return _mix((_HCONST_2 + _NIL_DEF) & _M32, _HCONST_2, hash_)[2]


def phash2(term: bytes | str | list[bytes] | None) -> int:
    return make_hash2(term) & (_PHASH2_RANGE - 1)


def _exs64_next(r: int) -> tuple[int, int]:
    r1 = r ^ (r >> 12)
    r2 = r1 ^ ((r1 << 25) & _M64)
    r3 = r2 ^ (r2 >> 27)
    return (r3 * 2685821657736338717) & _M64, r3


def _exs1024_seed(a1: int, a2: int, a3: int) -> list[int]:
    m21 = (1 << 21) - 1
    b1 = (((a1 & m21) + 1) * 2097131) & m21
    b2 = (((a2 & m21) + 1) * 2097133) & m21
    b3 = (((a3 & m21) + 1) * 2097143) & m21
    r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
    state: list[int] = []
    for _ in range(16):
        x, r = _exs64_next(r)
        state.insert(0, x)  # rand builds the list head first: the last one made leads
    return state


class _Exs1024:
    """xorshift1024* as rand's exs1024 steps it (a ring of 16 words)."""

    __slots__ = ("_pos", "_s")

    def __init__(self, seed: int) -> None:
        self._s = _exs1024_seed(seed, seed, seed)
        self._pos = 0

    def uniform(self) -> float:
        s = self._s
        p = self._pos
        s0 = s[p]
        q = (p + 1) & 15
        s1 = s[q]
        s11 = s1 ^ ((s1 << 31) & _M64)
        s12 = s11 ^ (s11 >> 11)
        s01 = s0 ^ (s0 >> 30)
        ns1 = s01 ^ s12
        s[q] = ns1
        self._pos = q
        # rand's legacy "max" algorithms: V / (Max + 1), a float division
        return ((ns1 * 1181783497276652981) & _M64) / 18446744073709551616.0


def jump_consistent_hash(key: int, buckets: int) -> int:
    """The consistent-hash exchange's bucket for an integer key (rand exs1024 as its RNG)."""
    if buckets == 1:
        return 0
    rng = _Exs1024(key)
    b, j = -1, 0
    while j < buckets:
        b = j
        r = rng.uniform()
        j = int((b + 1) / r) if r else buckets
    return b
