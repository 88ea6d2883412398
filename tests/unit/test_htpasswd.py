"""htpasswd credentials: only bcrypt and SHA-512 crypt, refused schemes named at start,
verification outside any lock, a bounded cache, unknown users doing a wrong password's work.
tests/integration/test_htpasswd_cli.py runs this module again under bcrypt 4.x."""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path

import pytest

from factory.errors import AuthError
from factory.index import htpasswd
from factory.index.htpasswd import Credentials, bcrypt_line, read_htpasswd, sha512_crypt

# The example from the SHA-crypt specification (Drepper), default 5000 rounds.
SPEC_SETTING = "$6$saltstring"
SPEC_HASH = (
    "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOf"
    "aS35inz1"
)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_sha512_crypt_matches_the_specification() -> None:
    assert sha512_crypt(b"Hello world!", SPEC_SETTING) == SPEC_HASH


@pytest.mark.parametrize(
    ("line", "scheme"),
    [
        ("alice:secret", "plain text"),
        ("alice:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=", "unsalted {SHA}"),
        ("alice:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/", "apr1-MD5"),
        ("alice:rqXexS6ZhobKA", "DES crypt"),
        ("alice:$5$rounds=5000$saltsaltsaltsalt$" + "a" * 43, "$5$ crypt"),
        ("alice:$2a$12$" + "a" * 53, "$2a$ crypt"),
        ("alice:$6$$" + "a" * 86, "plain text or unknown"),  # unsalted SHA-512
    ],
)
def test_weak_schemes_are_refused_naming_the_user(tmp_path: Path, line: str, scheme: str) -> None:
    path = tmp_path / "htpasswd"
    path.write_text(bcrypt_line("bob", "pw", cost=4) + "\n" + line + "\n")
    with pytest.raises(AuthError) as info:
        Credentials(path)
    assert "user 'alice'" in info.value.message and scheme in info.value.message
    assert ":2:" in info.value.message and "\n" not in info.value.message


def test_bcrypt_2y_2b_and_sha512_are_accepted(tmp_path: Path) -> None:
    b = bcrypt_line("b", "pw-b", cost=4)
    y = b.replace("$2b$", "$2y$").replace("b:", "y:", 1)
    path = tmp_path / "htpasswd"
    path.write_text(f"# comment\n{b}\n{y}\nsha:{SPEC_HASH}\n\n")
    creds = Credentials(path)
    assert {e.scheme for e in read_htpasswd(path).values()} == {"bcrypt", "sha512-crypt"}
    assert creds.check(_basic("b", "pw-b")) and creds.check(_basic("y", "pw-b"))
    assert creds.check(_basic("sha", "Hello world!"))
    assert not creds.check(_basic("sha", "Hello world"))
    assert not creds.check(_basic("b", "pw-b\0extra"))  # no C-string truncation
    assert not creds.check("Basic !!!") and not creds.check("Bearer x") and not creds.check(None)


def test_long_passwords_work_like_htpasswd(tmp_path: Path) -> None:
    """bcrypt uses 72 bytes; bcrypt 5 raises on longer ones unless we cut them like htpasswd."""
    long = "p" * 100
    path = tmp_path / "htpasswd"
    path.write_text(bcrypt_line("u", long, cost=4) + "\n")
    assert Credentials(path).check(_basic("u", long))


def test_changes_to_the_file_apply_and_drop_cached_successes(tmp_path: Path) -> None:
    path = tmp_path / "htpasswd"
    path.write_text(bcrypt_line("u", "old", cost=4) + "\n")
    creds = Credentials(path)
    assert creds.check(_basic("u", "old")) and creds.check(_basic("u", "old"))  # cached
    path.write_text(bcrypt_line("u", "new", cost=4) + "\n")
    os.utime(path, ns=(0, 1))  # a different mtime even within the clock's resolution
    assert not creds.check(_basic("u", "old"))
    assert creds.check(_basic("u", "new"))
    path.write_text("u:plaintext\n")  # an invalid edit keeps the users the server had
    os.utime(path, ns=(0, 2))
    assert creds.check(_basic("u", "new"))


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "htpasswd"
    path.write_text("".join(bcrypt_line(f"u{i}", "pw", cost=4) + "\n" for i in range(5)))
    creds = Credentials(path, cache_size=3)
    for i in range(5):
        assert creds.check(_basic(f"u{i}", "pw"))
    assert len(creds._ok) == 3


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[htpasswd.HashEntry]:
    checked: list[htpasswd.HashEntry] = []
    real = htpasswd.verify

    def counting(entry: htpasswd.HashEntry, password: bytes) -> bool:
        checked.append(entry)
        return real(entry, password)

    monkeypatch.setattr(htpasswd, "verify", counting)
    return checked


def test_unknown_users_do_the_work_of_a_wrong_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "htpasswd"
    path.write_text(bcrypt_line("u", "pw", cost=4) + "\n" + bcrypt_line("v", "pw", cost=4) + "\n")
    creds = Credentials(path)
    checked = _counting(monkeypatch)
    assert not creds.check(_basic("nobody", "pw"))
    assert not creds.check(_basic("v", "wrong"))
    # One bcrypt check each at the file's cost, the unknown user's against a hash no password
    # matches.
    assert [(e.scheme, e.cost) for e in checked] == [("bcrypt", 4), ("bcrypt", 4)]
    assert checked[0].user == "" and checked[1].user == "v"


def test_every_check_costs_the_same_whatever_the_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file mixing bcrypt costs and SHA-512: unknown, cheap and expensive users, right and
    wrong passwords, each check runs one hash of every kind in the same order (the timing of
    a refusal tells nothing; docs/BENCHMARKS.md measures it), and the mix is warned about."""
    path = tmp_path / "htpasswd"
    path.write_text(
        bcrypt_line("cheap", "pw", cost=4) + "\n" + bcrypt_line("dear", "pw", cost=6) + "\n"
        + f"sha:{SPEC_HASH}\n"
    )
    with caplog.at_level("WARNING", logger="factory.index.server"):
        creds = Credentials(path)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "mixes 3 kinds of password hash" in warnings[0], warnings
    assert "bcrypt cost 4 (cheap)" in warnings[0]
    assert "SHA-512 crypt 5000 rounds (sha)" in warnings[0]
    checked = _counting(monkeypatch)
    kinds = []
    for user, password, ok in [
        ("nobody", "pw", False), ("cheap", "wrong", False), ("dear", "wrong", False),
        ("sha", "wrong", False), ("cheap", "pw", True), ("dear", "pw", True),
        ("sha", "Hello world!", True),
    ]:
        checked.clear()
        assert creds.check(_basic(user, password)) is ok
        kinds.append([(e.scheme, e.cost) for e in checked])
    assert all(k == [("sha512-crypt", 5000), ("bcrypt", 4), ("bcrypt", 6)] for k in kinds), kinds


def test_one_kind_of_hash_is_one_check_and_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "htpasswd"
    path.write_text("".join(bcrypt_line(f"u{i}", "pw", cost=4) + "\n" for i in range(3)))
    with caplog.at_level("WARNING", logger="factory.index.server"):
        creds = Credentials(path)
    assert not caplog.records
    checked = _counting(monkeypatch)
    assert not creds.check(_basic("nobody", "pw"))
    assert len(checked) == 1


def test_a_slow_check_does_not_hold_up_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password being hashed must not block a valid one (no lock around hashing)."""
    path = tmp_path / "htpasswd"
    path.write_text(bcrypt_line("u", "pw", cost=4) + "\n")
    creds = Credentials(path)
    assert creds.check(_basic("u", "pw"))  # now cached
    inside, release = threading.Event(), threading.Event()
    real = htpasswd.verify

    def stalls(entry: htpasswd.HashEntry, password: bytes) -> bool:
        inside.set()
        release.wait(30)
        return real(entry, password)

    monkeypatch.setattr(htpasswd, "verify", stalls)
    slow = threading.Thread(target=creds.check, args=(_basic("u", "wrong"),))
    slow.start()
    try:
        assert inside.wait(30)
        assert creds.check(_basic("u", "pw"))  # answered while the other is mid-hash
    finally:
        release.set()
        slow.join()
