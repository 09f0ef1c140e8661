"""Credentials inside URLs (https://user:password@host, ?token=...), found and hidden: the job's
MLflow tracking URI and the errors that quote it (report/tracking.py), and what the launcher prints
or refuses to keep (keras_pipe_launch/common/secrets.py). One rule for both, lenient in what it
hides: a log that shows `https://***@host/a@b` loses a path's first part; one that shows a
password loses the password.

Why not urllib.parse.urlsplit alone: it ends the user part at the first "/" ("https://u:p/w@h" is
host "u", path "/w@h", though MLflow's requests send "p/w" as the password) and reads
"https://u:p@ss@h" as password "p@ss"; a URL in an error's text also has no clear end.
"""

from __future__ import annotations

import re

MARK = "***"
_URL = re.compile(r"(?i)\b(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<rest>[^\s'\"<>]+)")
_WHOLE = re.compile(r"(?is)(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<rest>.+)")
# a query parameter whose name says it is secret: ?token=, &api_key=, X-Amz-Signature=, sig=, ...
_SECRET_QUERY = re.compile(
    r"(?i)(?P<name>[?&;][\w.-]*(token|key|secret|passw|pwd|signature|sig|credential|auth|session)[\w.-]*=)[^&;#\s'\"<>]*")


def _user_part(rest: str) -> str | None:
    """What precedes the host in a URL's text after "scheme://": up to its last "@" when that "@"
    comes before the path, or when the path seems to begin inside a password ("u:pa/ss@h": what
    precedes the first "/" holds a ":" that starts no port); None when there is none (an "@" in
    a path: s3://bucket/key@2x.png, http://host:5000/file@2x.png)."""
    if "@" not in rest:
        return None
    user = rest.rsplit("@", 1)[0]
    if "/" not in user:
        return user
    first = user.split("/", 1)[0]
    return user if ":" in first and not re.fullmatch(r"[^:@]*:\d{1,5}", first) else None


def has_credentials(value: str) -> bool:
    """Whether `value` holds a URL with a user, a password or a secret query parameter: `value` as
    one URL when it is one (surrounding spaces ignored; quotes and spaces inside are part of it, as
    a password may hold them), else any URL in it."""
    whole = _WHOLE.match(value.strip())
    return any(_user_part(url["rest"]) is not None or _SECRET_QUERY.search(url["rest"])
               for url in ([whole] if whole else _URL.finditer(value)))


def redacted_value(value: str, mark: str = MARK) -> str:
    """`value` (a setting: one URL, as has_credentials reads it, or text) with its URLs' users,
    passwords and secret query values replaced by `mark`."""
    whole = _WHOLE.match(value.strip())
    return _hidden(whole, mark) if whole else redacted(value, mark)


def redacted(text: str, mark: str = MARK) -> str:
    """`text` with every URL's user and password, and its secret-named query values, replaced by
    `mark` (a URL in text ends at a space or a quote: an error's text that quotes one)."""
    return _URL.sub(lambda url: _hidden(url, mark), text)


def _hidden(url: re.Match, mark: str) -> str:
    rest = url["rest"]
    user = _user_part(rest)
    if user is not None:
        rest = mark + rest[len(user):]
    return url["scheme"] + _SECRET_QUERY.sub(lambda q: q["name"] + mark, rest)
