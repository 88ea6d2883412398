"""htpasswd credentials for the index server: bcrypt and SHA-512 crypt, nothing weaker.

Accepted: bcrypt (``$2y$``/``$2b$``, what ``htpasswd -B`` writes) through the ``bcrypt``
package, and SHA-512 crypt (``$6$``, what ``mkpasswd -m sha-512`` writes) through the system's
libcrypt (libxcrypt; Python 3.13 removed the ``crypt`` module). Plain text, ``{SHA}``, apr1-MD5
and DES are refused when the file is read, with a line naming the user: DES compares only the
first 8 characters and the others are unsalted or fast.

Verification runs outside any lock (both hashes release the GIL), so slow wrong guesses do not
queue the right ones; recent successes sit in a small bounded cache keyed by a keyed hash of the
credentials, dropped when the user's hash changes.

Every check costs the same, whatever the user: it runs one hash of each kind of hash in the
file (scheme and cost), the user's own for the user's kind and a dummy (a hash no password
matches) for each other kind and for an unknown user. With one cost in the file that is one
hash, as before; a file that mixes costs (bcrypt 4 and 12, or bcrypt and SHA-512) is warned
about at start, since each check then costs the sum. Imitating only the most expensive entry
told users apart: unknown and bcrypt-10 users were refused in 61 ms, bcrypt-4 and SHA-512
users in 2 ms (docs/BENCHMARKS.md, "htpasswd timing").
"""

from __future__ import annotations

import base64
import binascii
import collections
import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from pathlib import Path

import bcrypt

from factory.errors import AuthError

_BCRYPT_RE = re.compile(r"^\$2[by]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{53}$")
_SHA512_RE = re.compile(
    r"^\$6\$(?:rounds=(?P<rounds>\d{1,9})\$)?(?P<salt>[./A-Za-z0-9]{8,16})\$[./A-Za-z0-9]{86}$"
)
_BCRYPT_MAX_BYTES = 72  # bcrypt 5 refuses longer passwords; htpasswd and bcrypt 4 truncate
_CRYPT_DATA_SIZE = 256 * 1024  # >= sizeof(struct crypt_data) in libxcrypt and in old glibc
CACHE_SIZE = 1024
CACHE_SECONDS = 300.0


def _scheme_name(hashed: str) -> str:
    if hashed.startswith("$apr1$"):
        return "apr1-MD5"
    if hashed.startswith("{SHA}"):
        return "unsalted {SHA}"
    if hashed.startswith(("$1$", "$5$", "$2a$", "$2x$")):
        return f"{hashed[:3].rstrip('$')}$ crypt"
    if re.fullmatch(r"[./A-Za-z0-9]{13}", hashed):
        return "DES crypt"
    return "plain text or unknown"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HashEntry:
    user: str
    hashed: str
    scheme: str  # 'bcrypt' | 'sha512-crypt'
    cost: int  # bcrypt log2 rounds, or SHA-512 crypt rounds


def parse_entry(user: str, hashed: str, where: str) -> HashEntry:
    """One htpasswd line's hash, or AuthError naming the user when its scheme is refused."""
    if m := _BCRYPT_RE.match(hashed):
        cost = int(m["cost"])
        if not 4 <= cost <= 31:
            raise AuthError(f"{where}: user {user!r}: bcrypt cost {cost} is outside 4-31")
        return HashEntry(user=user, hashed=hashed, scheme="bcrypt", cost=cost)
    if m := _SHA512_RE.match(hashed):
        rounds = int(m["rounds"] or 5000)
        if rounds < 5000:
            raise AuthError(f"{where}: user {user!r}: SHA-512 crypt with {rounds} rounds (< 5000)")
        return HashEntry(user=user, hashed=hashed, scheme="sha512-crypt", cost=rounds)
    raise AuthError(
        f"{where}: user {user!r} has a {_scheme_name(hashed)} password hash; "
        "only bcrypt ($2y$/$2b$) and SHA-512 crypt ($6$) are accepted",
        tip=f"set it again with: htpasswd -B {where.rsplit(':', 1)[0]} {user}",
    )


def read_htpasswd(path: Path) -> dict[str, HashEntry]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuthError(f"htpasswd file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthError(f"cannot read htpasswd file {path}: {exc}") from None
    entries: dict[str, HashEntry] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user:
            raise AuthError(f"{path}:{number}: not a 'user:hash' line")
        entries[user] = parse_entry(user, hashed, f"{path}:{number}")
    return entries


@functools.lru_cache(maxsize=1)
def _libcrypt() -> tuple[ctypes.CDLL, bool]:
    name = ctypes.util.find_library("crypt")
    if name is None:
        raise AuthError(
            "SHA-512 crypt ($6$) needs the system's libcrypt, which is missing",
            tip="install libcrypt1 (libxcrypt) or use bcrypt hashes (htpasswd -B)",
        )
    lib = ctypes.CDLL(name)
    rn = hasattr(lib, "crypt_rn")  # libxcrypt: checks the buffer size itself
    fn = lib.crypt_rn if rn else lib.crypt_r
    fn.restype = ctypes.c_char_p
    fn.argtypes = (
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
        if rn
        else [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
    )
    return lib, rn


def sha512_crypt(password: bytes, setting: str) -> str:
    """crypt(3) for a ``$6$`` setting, thread-safe (crypt_rn / crypt_r with our own buffer)."""
    lib, rn = _libcrypt()
    data = ctypes.create_string_buffer(_CRYPT_DATA_SIZE)
    if rn:
        out = lib.crypt_rn(password, setting.encode(), data, _CRYPT_DATA_SIZE)
    else:
        out = lib.crypt_r(password, setting.encode(), data)
    if not out or out.startswith(b"*"):
        raise AuthError("libcrypt refused a SHA-512 crypt setting")
    return str(out.decode("ascii"))


def verify(entry: HashEntry, password: bytes) -> bool:
    if b"\0" in password:  # C strings: everything after a NUL would be ignored
        return False
    if entry.scheme == "bcrypt":
        return bool(bcrypt.checkpw(password[:_BCRYPT_MAX_BYTES], entry.hashed.encode()))
    return hmac.compare_digest(sha512_crypt(password, entry.hashed), entry.hashed)


Kind = tuple[str, int]  # (scheme, cost): the hashes that cost the same


def _kind(entry: HashEntry) -> Kind:
    return (entry.scheme, entry.cost)


def _dummy(kind: Kind) -> HashEntry:
    """A hash of ``kind`` that no password matches (a random secret's)."""
    scheme, cost = kind
    secret = secrets.token_urlsafe(24).encode()
    if scheme == "bcrypt":
        hashed = bcrypt.hashpw(secret, bcrypt.gensalt(rounds=cost)).decode()
    else:
        salt = secrets.token_urlsafe(12).replace("-", ".").replace("_", "/")[:16]
        hashed = sha512_crypt(secret, f"$6$rounds={cost}${salt}")
    return HashEntry(user="", hashed=hashed, scheme=scheme, cost=cost)


def dummies_for(entries: dict[str, HashEntry]) -> dict[Kind, HashEntry]:
    """One dummy of each kind in the file, cheapest first: what every check runs (the user's
    own hash in place of its kind's dummy)."""
    kinds = sorted({_kind(e) for e in entries.values()}, key=lambda k: (k[0] == "bcrypt", k[1]))
    return {k: _dummy(k) for k in kinds}


def mixed_costs(entries: dict[str, HashEntry]) -> str | None:
    """A warning when the file mixes kinds of hash, naming them and their users; else None."""
    users: dict[Kind, list[str]] = collections.defaultdict(list)
    for e in entries.values():
        users[_kind(e)].append(e.user)
    if len(users) < 2:
        return None
    parts = []
    for (scheme, cost), names in sorted(users.items()):
        what = f"bcrypt cost {cost}" if scheme == "bcrypt" else f"SHA-512 crypt {cost} rounds"
        shown = ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more" if len(names) > 3
                                                else "")
        parts.append(f"{what} ({shown})")
    return (
        f"mixes {len(users)} kinds of password hash: {'; '.join(parts)}. Every check runs one "
        "hash of each kind so that refusals take as long for every user; hash them alike "
        "(htpasswd -B -C 12) to make a check cost one"
    )


class Credentials:
    """Checks ``Authorization: Basic`` headers against an htpasswd file (reread when it changes)."""

    def __init__(self, path: Path, *, cache_size: int = CACHE_SIZE) -> None:
        self.path = path
        self._lock = threading.Lock()  # guards the fields below, never held while hashing
        self._stamp = self._stat()
        self._entries = read_htpasswd(path)
        for entry in self._entries.values():
            if entry.scheme == "sha512-crypt":
                _libcrypt()  # a missing libcrypt is a start-up error, not a 500 later
        self._dummies = dummies_for(self._entries)
        _warn_mixed(path, self._entries)
        self._key = secrets.token_bytes(32)
        self._ok: collections.OrderedDict[bytes, tuple[str, float]] = collections.OrderedDict()
        self._cache_size = cache_size

    def _stat(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.path)
        except OSError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _current(self) -> tuple[dict[str, HashEntry], dict[Kind, HashEntry]]:
        stamp = self._stat()
        with self._lock:
            if stamp == self._stamp:
                return self._entries, self._dummies
        try:
            entries = read_htpasswd(self.path)
            dummies = dummies_for(entries)
        except AuthError:
            logging.getLogger("factory.index.server").error(
                "htpasswd file %s changed and is now invalid; keeping the previous users",
                self.path,
            )
            entries, dummies = self._entries, self._dummies
        else:
            _warn_mixed(self.path, entries)
        with self._lock:
            self._stamp, self._entries, self._dummies = stamp, entries, dummies
            self._ok.clear()
        return entries, dummies

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:], validate=True)
        except (binascii.Error, ValueError):
            return False
        user_bytes, sep, password = decoded.partition(b":")
        if not sep:
            return False
        try:
            user = user_bytes.decode()
        except UnicodeDecodeError:
            return False
        entries, dummies = self._current()
        entry = entries.get(user)
        digest = hmac.new(self._key, decoded, hashlib.sha256).digest()
        now = time.monotonic()
        if entry is not None:
            with self._lock:
                hit = self._ok.get(digest)
                if hit is not None and hit[0] == entry.hashed and now - hit[1] < CACHE_SECONDS:
                    self._ok.move_to_end(digest)
                    return True
        if not verify_equally(entry, dummies, password):
            return False
        assert entry is not None  # verify_equally is False for an unknown user
        with self._lock:
            self._ok[digest] = (entry.hashed, now)
            self._ok.move_to_end(digest)
            while len(self._ok) > self._cache_size:
                self._ok.popitem(last=False)
        return True


def verify_equally(entry: HashEntry | None, dummies: dict[Kind, HashEntry],
                   password: bytes) -> bool:
    """``password`` against the user's ``entry`` (None: an unknown user), doing the same work
    for every user: one hash of each kind in ``dummies`` order, the user's own in its kind's
    place. Nothing returns early."""
    ok = False
    for kind, dummy in dummies.items():
        if entry is not None and _kind(entry) == kind:
            ok = verify(entry, password)
        else:
            verify(dummy, password)
    return ok


def _warn_mixed(path: Path, entries: dict[str, HashEntry]) -> None:
    warning = mixed_costs(entries)
    if warning:
        logging.getLogger("factory.index.server").warning("htpasswd file %s %s", path, warning)


def bcrypt_line(user: str, password: str, *, cost: int = 12) -> str:
    """An htpasswd line with a bcrypt hash (what ``htpasswd -nbB`` prints)."""
    hashed = bcrypt.hashpw(password.encode()[:_BCRYPT_MAX_BYTES], bcrypt.gensalt(rounds=cost))
    return f"{user}:{hashed.decode()}"
