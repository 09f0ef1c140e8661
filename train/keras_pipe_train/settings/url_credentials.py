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
# a query parameter whose name says it is secret: ?token=, &api_key=, X-Amz-Signature=, sig=, ...
_SECRET_QUERY = re.compile(
    r"(?i)(?P<name>[?&;][\w.-]*(token|key|secret|passw|pwd|signature|sig|credential|auth|session)[\w.-]*=)[^&;#\s'\"<>]*")


def _user_part(rest: str) -> str | None:
    """What precedes the host in a URL's text after "scheme://": up to its last "@" when that "@"
    comes before the path, or when what precedes it holds a ":" (a password with "/" in it); None
    when there is none (an "@" in a path: s3://bucket/key@2x.png)."""
    if "@" not in rest:
        return None
    user = rest.rsplit("@", 1)[0]
    return user if "/" not in user or ":" in user else None


def has_credentials(url: str) -> bool:
    """Whether `url` (surrounding spaces ignored) holds a user, a password or a secret query parameter."""
    found = _URL.search(url.strip())
    return bool(found and (_user_part(found["rest"]) is not None or _SECRET_QUERY.search(found["rest"])))


def redacted(text: str, mark: str = MARK) -> str:
    """`text` with every URL's user and password, and its secret-named query values, replaced by `mark`."""
    def one(url: re.Match) -> str:
        rest = url["rest"]
        user = _user_part(rest)
        if user is not None:
            rest = mark + rest[len(user):]
        return url["scheme"] + _SECRET_QUERY.sub(lambda q: q["name"] + mark, rest)

    return _URL.sub(one, text)
