"""YAML config I/O shared by the reference trainer, the parity tests and the benchmark.

Contract:
  load_yaml(path) / parse_yaml(text) -> dict
      Reads the YAML subset mmtrain configs use: block mappings and sequences, flow
      collections ({a: 1, b: [x, "y"]}), plain / single- / double-quoted scalars, comments.
      Scalars resolve like yaml-cpp / the YAML 1.2 core schema (so `1e-3` is a float, which
      PyYAML's 1.1 rules would leave a string). Anchors, aliases, tags, block scalars (| >)
      and multi-document files raise ConfigSyntaxError instead of being misread.
  dump_yaml(cfg) -> str / write_yaml(cfg, path)
      Block-style YAML that load_yaml, yaml-cpp and PyYAML all read back to the same values
      (floats always carry a '.', strings are double-quoted).
  apply_overrides(cfg, ["a.b.c=value", ...]) -> new dict
      mmtrain's `--set key=value` semantics: dotted path, value parsed as a YAML flow value.
No third-party dependency on purpose: the project venv only carries torch/numpy/safetensors/pytest.
"""
from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

__all__ = ["ConfigSyntaxError", "parse_yaml", "load_yaml", "dump_yaml", "write_yaml",
           "apply_overrides", "parse_scalar"]


class ConfigSyntaxError(ValueError):
    pass


_INT_RE = re.compile(r"^[-+]?[0-9]+$")
_HEX_RE = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT_RE = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def parse_scalar(text: str) -> Any:
    """Resolves an unquoted scalar (YAML 1.2 core schema, as yaml-cpp's as<T>() accepts it)."""
    s = text.strip()
    if s in ("", "~", "null", "Null", "NULL"):
        return None
    if s in ("true", "True", "TRUE"):
        return True
    if s in ("false", "False", "FALSE"):
        return False
    if _INT_RE.match(s):
        return int(s)
    if _HEX_RE.match(s):
        return int(s, 16)
    if _FLOAT_RE.match(s):
        return float(s)
    low = s.lower()
    if low in (".inf", "+.inf"):
        return math.inf
    if low == "-.inf":
        return -math.inf
    if low == ".nan":
        return math.nan
    return s


# ----------------------------------------------------------------------------- flow values

class _FlowParser:
    """Recursive descent over one flow value: {k: v, ...}, [a, b], quoted or plain scalars."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, msg: str) -> ConfigSyntaxError:
        return ConfigSyntaxError(f"{msg} at column {self.pos} in {self.text!r}")

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def parse_all(self) -> Any:
        value = self.value(top=True)
        self.skip_ws()
        if self.pos != len(self.text):
            raise self.error("unexpected trailing text")
        return value

    def value(self, top: bool = False) -> Any:
        self.skip_ws()
        if self.pos >= len(self.text):
            return None
        c = self.text[self.pos]
        if c == "{":
            return self.mapping()
        if c == "[":
            return self.sequence()
        if c in "'\"":
            return self.quoted()
        if c in "&*!|>":
            raise self.error(f"unsupported YAML construct {c!r} (anchors, aliases, tags, block scalars)")
        return self.plain(top)

    def quoted(self) -> str:
        quote = self.text[self.pos]
        i = self.pos + 1
        out = []
        while i < len(self.text):
            c = self.text[i]
            if quote == "'" and c == "'":
                if i + 1 < len(self.text) and self.text[i + 1] == "'":
                    out.append("'")
                    i += 2
                    continue
                self.pos = i + 1
                return "".join(out)
            if quote == '"' and c == "\\":
                out.append(self.text[i:i + 2])
                i += 2
                continue
            if quote == '"' and c == '"':
                self.pos = i + 1
                # Double-quoted escapes are a superset of JSON's; JSON covers what configs use.
                return json.loads('"' + "".join(out) + '"')
            out.append(c)
            i += 1
        raise self.error("unterminated quoted string")

    def plain(self, top: bool) -> Any:
        start = self.pos
        stops = "" if top else ",]}"
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in stops:
                break
            if not top and c == ":" and (self.pos + 1 == len(self.text) or self.text[self.pos + 1] in " ,]}"):
                break
            self.pos += 1
        return parse_scalar(self.text[start:self.pos])

    def mapping(self) -> dict:
        self.pos += 1
        result: dict = {}
        while True:
            self.skip_ws()
            if self.pos < len(self.text) and self.text[self.pos] == "}":
                self.pos += 1
                return result
            key = self.value()
            self.skip_ws()
            if self.pos >= len(self.text) or self.text[self.pos] != ":":
                raise self.error("expected ':' in flow mapping")
            self.pos += 1
            if key in result:
                raise self.error(f"duplicate key {key!r}")
            result[key] = self.value()
            self.skip_ws()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
            elif self.pos < len(self.text) and self.text[self.pos] == "}":
                continue
            else:
                raise self.error("expected ',' or '}' in flow mapping")

    def sequence(self) -> list:
        self.pos += 1
        result: list = []
        while True:
            self.skip_ws()
            if self.pos < len(self.text) and self.text[self.pos] == "]":
                self.pos += 1
                return result
            result.append(self.value())
            self.skip_ws()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
            elif self.pos < len(self.text) and self.text[self.pos] == "]":
                continue
            else:
                raise self.error("expected ',' or ']' in flow sequence")


def _parse_flow(text: str) -> Any:
    return _FlowParser(text).parse_all()


# ----------------------------------------------------------------------------- block structure

def _strip_comment(line: str) -> str:
    """Drops a '#' comment that is outside quotes and starts a line or follows whitespace."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _split_key(content: str) -> tuple[str, str] | None:
    """Splits 'key: rest' at the first ': ' (or trailing ':') outside quotes and brackets."""
    quote = None
    depth = 0
    for i, c in enumerate(content):
        if quote:
            if c == quote:
                quote = None
            continue
        if c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == ":" and depth == 0 and (i + 1 == len(content) or content[i + 1] in " \t"):
            return content[:i].strip(), content[i + 1:].strip()
    return None


def _balanced(text: str) -> bool:
    depth, quote = 0, None
    for c in text:
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
    return depth <= 0


class _BlockParser:
    def __init__(self, text: str):
        self.lines: list[tuple[int, str, int]] = []  # (indent, content, 1-based line number)
        for number, raw in enumerate(text.splitlines(), start=1):
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise ConfigSyntaxError(f"line {number}: tabs are not allowed in indentation")
            line = _strip_comment(raw)
            if not line.strip():
                continue
            if line.strip() in ("---", "...") and not raw.startswith(" "):
                if self.lines:
                    raise ConfigSyntaxError(f"line {number}: multi-document YAML is not supported")
                continue
            self.lines.append((len(line) - len(line.lstrip(" ")), line.strip(), number))
        self.i = 0

    def error(self, msg: str) -> ConfigSyntaxError:
        number = self.lines[min(self.i, len(self.lines) - 1)][2] if self.lines else 0
        return ConfigSyntaxError(f"line {number}: {msg}")

    def parse(self) -> Any:
        if not self.lines:
            return None
        indent, content, _ = self.lines[0]
        if _split_key(content) is None and not content.startswith("-"):
            value = self.inline_value(content)
        else:
            value = self.block(indent)
        if self.i != len(self.lines):
            raise self.error("unexpected indentation")
        return value

    def inline_value(self, rest: str) -> Any:
        """A value on the same line as its key or dash; flow collections may span lines."""
        if rest[:1] in ("|", ">"):
            raise self.error("block scalars (| and >) are not supported")
        if rest[:1] in ("[", "{"):
            while not _balanced(rest) and self.i + 1 < len(self.lines):
                self.i += 1
                rest += " " + self.lines[self.i][1]
        self.i += 1
        try:
            return _parse_flow(rest)
        except ConfigSyntaxError as exc:
            self.i -= 1
            raise self.error(str(exc)) from None

    def block(self, indent: int) -> Any:
        if self.lines[self.i][1].startswith("- ") or self.lines[self.i][1] == "-":
            return self.sequence(indent)
        return self.mapping(indent)

    def nested(self, parent_indent: int, allow_same_indent_sequence: bool) -> Any:
        """The block after 'key:' or '-' with nothing else on the line."""
        if self.i >= len(self.lines):
            return None
        indent, content, _ = self.lines[self.i]
        if indent > parent_indent:
            return self.block(indent)
        if allow_same_indent_sequence and indent == parent_indent and (content.startswith("- ") or content == "-"):
            return self.sequence(indent)
        return None

    def mapping(self, indent: int) -> dict:
        result: dict = {}
        while self.i < len(self.lines):
            line_indent, content, _ = self.lines[self.i]
            if line_indent < indent:
                break
            if line_indent > indent:
                raise self.error("unexpected indentation")
            if content.startswith("- "):
                break
            split = _split_key(content)
            if split is None:
                raise self.error(f"expected 'key: value', got {content!r}")
            key_text, rest = split
            key = _parse_flow(key_text) if key_text[:1] in "'\"" else parse_scalar(key_text)
            if key in result:
                raise self.error(f"duplicate key {key!r}")
            if rest:
                result[key] = self.inline_value(rest)
            else:
                self.i += 1
                result[key] = self.nested(indent, allow_same_indent_sequence=True)
        return result

    def sequence(self, indent: int) -> list:
        result: list = []
        while self.i < len(self.lines):
            line_indent, content, number = self.lines[self.i]
            if line_indent < indent:
                break
            if line_indent > indent:
                raise self.error("unexpected indentation")
            if not (content.startswith("- ") or content == "-"):
                break
            rest = content[1:].strip()
            if not rest:
                self.i += 1
                result.append(self.nested(indent, allow_same_indent_sequence=False))
            elif _split_key(rest) is not None and rest[:1] not in "[{'\"":
                # '- key: value' opens a mapping whose keys sit two columns right of the dash.
                item_indent = indent + (len(content) - len(rest))
                self.lines[self.i] = (item_indent, rest, number)
                result.append(self.mapping(item_indent))
            elif rest.startswith("- ") or rest == "-":
                raise self.error("nested '- - ' sequences are not supported")
            else:
                result.append(self.inline_value(rest))
        return result


def parse_yaml(text: str) -> Any:
    return _BlockParser(text).parse()


def load_yaml(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        value = parse_yaml(f.read())
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigSyntaxError(f"{path}: top level must be a mapping")
    return value


# ----------------------------------------------------------------------------- writing

def _scalar_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        # YAML 1.1 readers (PyYAML) only take floats with a '.': 1e-05 -> 1.0e-05.
        if "." not in text:
            text = text.replace("e", ".0e") if "e" in text else text + ".0"
        return text
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} to YAML")


def _key_text(key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY_RE.match(key) and parse_scalar(key) == key:
        return key
    return _scalar_text(key)


def _flow_text(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key_text(k)}: {_flow_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow_text(v) for v in value) + "]"
    return _scalar_text(value)


def _dump(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict) and v:
                out.append(f"{pad}{_key_text(k)}:")
                _dump(v, indent + 2, out)
            elif isinstance(v, (list, tuple)) and any(isinstance(x, (dict, list, tuple)) for x in v):
                out.append(f"{pad}{_key_text(k)}:")
                _dump(v, indent + 2, out)
            else:
                out.append(f"{pad}{_key_text(k)}: {_flow_text(v)}")
    elif isinstance(value, (list, tuple)):
        for v in value:
            out.append(f"{pad}- {_flow_text(v)}")
    else:
        out.append(pad + _scalar_text(value))


def dump_yaml(cfg: dict) -> str:
    out: list[str] = []
    _dump(cfg, 0, out)
    return "\n".join(out) + "\n"


def write_yaml(cfg: dict, path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump_yaml(cfg))
    return path


# ----------------------------------------------------------------------------- overrides

def apply_overrides(cfg: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Returns a copy of cfg with each 'a.b.c=value' applied (value parsed as a flow value)."""
    result = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigSyntaxError(f"override {item!r} is not key=value")
        path, text = item.split("=", 1)
        keys = path.strip().split(".")
        node = result
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[keys[-1]] = _parse_flow(text.strip()) if text.strip() else None
    return result
