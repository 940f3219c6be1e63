"""Avro's schema resolution rules as a check: can data written with one schema be read
with another?

fastavro resolves a writer schema to a reader schema while it decodes, and fails on the
first value that does not resolve; a state's schema change must be judged before any
value is read, so this module checks the rules of the Avro specification ("Schema
Resolution") on the two schemas alone and names every problem with its path:

- primitives: the same type, or a promotion (int to long, float or double; long to float
  or double; float to double; string and bytes either way);
- records: the same name (or the writer's name among the reader's aliases); every reader
  field is in the writer (by name or alias) with a resolvable type, or has a default;
  writer fields the reader lacks are skipped;
- enums: the same name; every writer symbol is a reader symbol, or the reader has a
  default symbol;
- fixed: the same name and size; arrays and maps: their items and values resolve;
- unions: every branch of a writer union resolves to the reader; a non-union writer
  resolves to some branch of a reader union.
"""

from __future__ import annotations

from typing import Any

import fastavro

from .avro_names import schema_data

#: The promotions Avro allows, by writer type.
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def resolution_problems(writer: dict[str, Any] | str, reader: dict[str, Any] | str
                        ) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (each problem with
    the path of the field it is at); empty when it can. Both are Avro schemas (JSON
    data, JSON text, or a type's name)."""
    written = fastavro.parse_schema(schema_data(writer), _write_hint=False)
    wanted = fastavro.parse_schema(schema_data(reader), _write_hint=False)
    check = _Check(_named(written), _named(wanted))
    check.resolve(_strip(written), _strip(wanted), "")
    return check.problems


def _named(parsed: Any) -> dict[str, Any]:
    return dict(parsed.get("__named_schemas", {})) if isinstance(parsed, dict) else {}


def _strip(parsed: Any) -> Any:
    if isinstance(parsed, dict):
        return {k: v for k, v in parsed.items() if not k.startswith("__")}
    return parsed


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Check:
    def __init__(self, writer_names: dict[str, Any], reader_names: dict[str, Any]) -> None:
        self.writer_names = writer_names
        self.reader_names = reader_names
        self.problems: list[str] = []
        self._seen: set[tuple[str, str]] = set()  # named pairs under way: recursive types

    def _deref(self, schema: Any, names: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return names.get(schema, schema)
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES and len(schema) == 1:
            return schema["type"]
        return schema

    def _type(self, schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            return str(schema["type"])
        return str(schema)

    def resolves(self, writer: Any, reader: Any) -> bool:
        """Whether ``writer`` resolves to ``reader`` (problems not recorded)."""
        trial = _Check(self.writer_names, self.reader_names)
        trial._seen = set(self._seen)
        trial.resolve(writer, reader, "")
        return not trial.problems

    def resolve(self, writer: Any, reader: Any, path: str) -> None:
        writer = self._deref(writer, self.writer_names)
        reader = self._deref(reader, self.reader_names)
        w, r = self._type(writer), self._type(reader)
        where = path or "the value"
        if w == "union":
            for branch in writer:
                self.resolve(branch, reader, path)
            return
        if r == "union":
            if not any(self.resolves(writer, branch) for branch in reader):
                branches = [self._type(self._deref(b, self.reader_names)) for b in reader]
                self.problems.append(f"{where}: {w} is none of the reader's union {branches}")
            return
        if w in _PRIMITIVES or r in _PRIMITIVES:
            if w != r and r not in _PROMOTIONS.get(w, set()):
                self.problems.append(f"{where}: {w} cannot be read as {r}")
            return
        if w != r:
            self.problems.append(f"{where}: {w} cannot be read as {r}")
            return
        if w in ("record", "error", "enum", "fixed"):
            pair = (str(writer["name"]), str(reader["name"]))
            if not self._same_name(writer, reader):
                self.problems.append(f"{where}: {w} {writer['name']} cannot be read as "
                                     f"{reader['name']} (another name, not an alias)")
                return
            if pair in self._seen:
                return
            self._seen.add(pair)
        if w in ("record", "error"):
            self._record(writer, reader, path)
        elif w == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                self.problems.append(f"{where}: enum symbols {missing} are not in the "
                                     "reader's enum, which has no default")
        elif w == "fixed":
            if writer["size"] != reader["size"]:
                self.problems.append(f"{where}: fixed of size {writer['size']} cannot be "
                                     f"read as size {reader['size']}")
        elif w == "array":
            self.resolve(writer["items"], reader["items"], f"{path}[]")
        elif w == "map":
            self.resolve(writer["values"], reader["values"], f"{path}{{}}")

    def _same_name(self, writer: dict[str, Any], reader: dict[str, Any]) -> bool:
        names = {reader["name"], _short(reader["name"])}
        names.update(reader.get("aliases", ()))
        names.update(_short(a) for a in reader.get("aliases", ()))
        return writer["name"] in names or _short(writer["name"]) in names

    def _record(self, writer: dict[str, Any], reader: dict[str, Any], path: str) -> None:
        by_name = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            found = by_name.get(field["name"])
            if found is None:
                found = next((by_name[a] for a in field.get("aliases", ()) if a in by_name),
                             None)
            where = f"{path}.{field['name']}" if path else field["name"]
            if found is None:
                if "default" not in field:
                    self.problems.append(f"field {where!r} is new and has no default")
                continue
            self.resolve(found["type"], field["type"], where)


__all__ = ["resolution_problems"]
