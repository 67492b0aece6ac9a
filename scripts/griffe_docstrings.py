"""A griffe extension for the API reference: the package's docstrings write numpy-style
lists as ``name : what it is`` on one line (numpy style reads the text after the colon as
a type), a Returns section as a sentence that starts with the type, and "Raises ValueError
for ..." as a sentence. This rewrites those into numpy sections before griffe parses them,
so the docstrings render as written, with no warnings. Shapes such as ``(*batch, L, L)`` keep
their asterisk (Markdown would read it as emphasis)."""

from __future__ import annotations

import re

import griffe

_ITEM = re.compile(r"^(?P<names>[A-Za-z_][\w, /]*?) : (?P<text>.*)$")
_RAISES = re.compile(r"^Raises (?P<error>[A-Z]\w*(?:Error|Exception)) (?P<text>.*)$")


def _underlined(line: str, nxt: str) -> bool:
    return line.strip() in ("Parameters", "Returns") and bool(nxt.strip()) and set(nxt.strip()) == {"-"}


def numpyish_to_numpy(text: str) -> str:
    """The (dedented) docstring with its numpy-ish sections as numpy sections."""
    out, section = [], None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _underlined(line, nxt):
            section = line.strip()
            out += [line, nxt]
            i += 2
            if section == "Returns" and i < len(lines):  # "Type and the rest" -> Type / indented rest
                kind, _, rest = lines[i].partition(" ")
                out += [kind, f"    {rest}"] if rest else [kind]
                i += 1
            continue
        raises = _RAISES.match(line)
        if raises:
            out += ["Raises", "------", raises["error"], f"    {raises['text']}"]
            section = "Raises"
        elif not line.strip() or line.startswith(" "):
            out.append(line)
        elif section == "Parameters" and (item := _ITEM.match(line)):
            out += [item["names"], f"    {item['text']}"]
        elif section in ("Returns", "Raises"):
            out.append(f"    {line}")  # a continuation of the sentence
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def escape_shapes(text: str) -> str:
    """``*batch`` in a shape, escaped for Markdown outside code spans (where it shows as is)."""
    parts = re.split(r"(`+[^`]*`+)", text)
    return "".join(p if p.startswith("`") else re.sub(r"(?<!\\)\*batch", r"\\*batch", p) for p in parts)


class NumpyishDocstrings(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        if obj.docstring is None:
            return
        value = obj.docstring.value = escape_shapes(obj.docstring.value)
        if re.search(r"^(Parameters|Returns)\n-+$", value, re.M):
            obj.docstring.value = numpyish_to_numpy(value)
