"""One default per option: the C++ options structs (NodeOptions, SubscriberOptions,
PublisherOptions; their default member initialisers) are the one place a default is written. The
Python options classes read them back, the Python signatures take theirs from them, and every
`viper` option named after a field (--keep-host-versions: keep_host_versions) shows the field's
default in its --help, or says there that it differs on purpose. The real `viper` binary of this
build."""
import inspect
import os
import pathlib
import re
import subprocess

import viper
from viper import _viper

BINARY_DIR = pathlib.Path(os.environ.get("VIPER_BINARY_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
VIPER = str(BINARY_DIR / "bin" / "viper")

STRUCTS = {"NodeOptions": _viper._NodeOptions, "SubscriberOptions": _viper._SubscriberOptions,
           "PublisherOptions": _viper._PublisherOptions}
SECRETS = {"registry_password_file"}  # reads back whether one is set, never a value to pass again


def fields(options_class):
    return {name: getattr(options_class(), name) for name, v in vars(options_class).items()
            if isinstance(v, property)}


def test_every_field_reads_back_and_takes_its_default():
    for struct, cls in STRUCTS.items():
        defaults = fields(cls)
        assert len(defaults) >= 8, (struct, defaults)
        for name, value in defaults.items():
            if name in SECRETS:
                continue
            again = cls(**{name: value})  # the default, given explicitly, is accepted and kept
            assert getattr(again, name) == value, (struct, name)


def test_python_signatures_default_to_the_structs():
    checked = 0
    for wrapper, cls in ((viper.Node, _viper._NodeOptions), (viper.Publisher, _viper._PublisherOptions),
                         (viper.Subscriber, _viper._SubscriberOptions)):
        defaults = fields(cls)
        for p in inspect.signature(wrapper.__init__).parameters.values():
            if p.default is inspect.Parameter.empty or p.name not in defaults:
                continue
            assert p.default == defaults[p.name], (wrapper.__name__, p.name, p.default, defaults[p.name])
            checked += 1
    assert checked >= 3  # Node(listen), Publisher(listen), Subscriber(connect)


def help_options(command):
    """{name: (first line of the entry, whole entry text)} of `viper COMMAND --help`."""
    p = subprocess.run([VIPER, command, "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = p.stdout.split("Exit codes:", 1)[0]
    entries, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (-\S+)(.*)$", line)
        if m:
            names = m.group(1).split(",")
            current = next((n for n in names if n.startswith("--")), names[0])
            entries[current] = [m.group(2), line]
        elif current and line.startswith("   "):
            entries[current][1] += " " + line.strip()
        else:
            current = None
    return {name: (head, " ".join(whole.split())) for name, (head, whole) in entries.items()}


def shown_default(head):
    """The default CLI11 shows after the type ("--keep-host-versions UINT:INT in [1 - 100000]=2")."""
    kind = re.split(r"\s{2,}", head.strip(), maxsplit=1)[0]  # the description may follow on the line
    m = re.search(r"=(\S*)$", kind)
    return m.group(1) if m else None


# The commands whose options fill each struct (publish, pull, ls and stats connect as a subscriber).
COMMANDS = {"serve": "NodeOptions", "watch": "SubscriberOptions", "pull": "SubscriberOptions",
            "ls": "SubscriberOptions", "stats": "SubscriberOptions", "publish": "SubscriberOptions"}


def test_cli_options_named_after_fields_have_their_defaults():
    compared, differing = [], []
    for command, struct in COMMANDS.items():
        defaults = fields(STRUCTS[struct])
        for name, (head, whole) in help_options(command).items():
            field = name[2:].replace("-", "_")
            if field not in defaults:
                continue
            value, shown = defaults[field], shown_default(head)
            if isinstance(value, bool):  # a flag: set means the opposite of the default
                expected = None if value is False else "(a flag that defaults to True)"
            elif value in ("", None):
                expected = None
            else:
                expected = str(value)
            where = f"viper {command} {name} (default {shown!r}; {struct}.{field} = {value!r})"
            if shown == expected:
                compared.append(where)
                continue
            # A command that differs on purpose says so, naming the field it departs from.
            assert f"Differs on purpose from {struct}::{field}" in whole, where + ": " + whole
            differing.append(where)
    print("\n" + "\n".join(compared + ["differs on purpose: " + d for d in differing]))
    names = " ".join(compared)
    for expected in ("serve --keep-host-versions", "serve --keep-file-versions", "serve --delta-bases",
                     "serve --host-max-models", "serve --segment-prefix", "serve --delta ", "watch --connect",
                     "watch --path"):
        assert expected in names, (expected, compared)
    assert any("serve --listen" in d for d in differing), differing
