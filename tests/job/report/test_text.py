"""Text nobody sanitised, made printable (keras_pipe_train.report.text.printable): the one function the
report's pictures, the launcher's messages and the server's log lines and 404s use."""

from __future__ import annotations

import pytest

from keras_pipe_train.report.text import printable


@pytest.mark.parametrize("text, expected", [
    ("/nowhere\r\nforged-line: x", "/nowhere\\r\\nforged-line: x"),  # a log line cannot be forged
    ("\x1b[2Jcleared", "\\x1b[2Jcleared"),  # nor a terminal cleared
    ("猫 café\u200b", "猫 café\\u200b"),  # printable text in any script stays as it is, a zero-width space is said
    ("tab\there", "tab\\there"),
    ("C:\\photos", "C:\\photos"),
])
def test_control_characters_are_said_and_printable_text_kept(text, expected):
    assert printable(text) == expected


def test_keep_leaves_the_characters_it_names():
    assert printable("a\tb\nc", keep="\t") == "a\tb\\nc"


def test_a_limit_cuts_the_text_before_its_characters_are_said():
    assert printable("ab\ncd", limit=3) == "ab\\n" and printable("x" * 500, limit=100) == "x" * 100
    assert printable("short", limit=100) == "short"


def test_the_server_says_paths_with_the_same_function():
    from keras_pipe_serve import app

    assert app.printable is printable and app.PATH_SHOWN == 100
