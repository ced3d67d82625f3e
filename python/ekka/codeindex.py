"""Read an Ekka code index from Python, with the standard library only.

    from ekka.codeindex import CodeIndex
    idx = CodeIndex("transformers.idx")
    for d in idx.get_class_definition("LlamaAttention"):
        print(d["file"], d["line_start"], d["source"])

Each result is a dict with the keys of ``ekka-index query --json``. The
queries are plain SQL over the schema in docs/CodeIndex.md; ekka-index is the
reference implementation (find_kernel's demangling lives there).
"""
import json
import sqlite3

FORMAT = "ekka-index 1"

_COLUMNS = (
    "d.name, d.qualified_name, d.language, d.kind, f.path, d.line_start, d.line_end, "
    "d.bases, d.methods, d.decorators, d.is_async, d.is_template, d.mangled_name, "
    "d.found_by, CAST(substr(f.text, d.byte_start + 1, d.byte_end - d.byte_start) AS TEXT)"
)


class CodeIndexError(Exception):
    pass


class CodeIndex:
    def __init__(self, path):
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        except sqlite3.DatabaseError as e:
            raise CodeIndexError(f"'{path}' is not an Ekka code index ({e})") from None
        if not row or row[0] != FORMAT:
            raise CodeIndexError(f"'{path}' has format {row and row[0]!r}, expected {FORMAT!r}")

    def _select(self, where, params):
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM definitions d JOIN files f ON f.id = d.file_id "
            f"WHERE {where} ORDER BY f.path, d.line_start", params)
        keys = ("name", "qualified_name", "language", "kind", "file", "line_start", "line_end",
                "bases", "methods", "decorators", "is_async", "is_template", "mangled_name",
                "found_by", "source")
        out = []
        for row in rows:
            d = dict(zip(keys, row))
            for k in ("bases", "methods", "decorators"):
                d[k] = json.loads(d[k])
            d["is_async"], d["is_template"] = bool(d["is_async"]), bool(d["is_template"])
            out.append(d)
        return out

    def get_class_definition(self, name):
        """Every class/struct named `name` (simple, qualified or a qualified suffix)."""
        return self._select(
            "d.kind IN ('class', 'struct', 'union') AND (d.name = ?1 OR d.qualified_name = ?1 "
            "OR d.qualified_name GLOB '*.' || ?1 OR d.qualified_name GLOB '*::' || ?1)", (name,))

    def subclasses(self, name):
        """Direct subclasses of the classes named `name`."""
        return self._select(
            "d.id IN (SELECT l.sub_id FROM subclass_links l JOIN definitions b ON b.id = l.base_id "
            "WHERE b.name = ?1 OR b.qualified_name = ?1)", (name,))

    def kernels(self, name):
        """Kernels whose name or qualified name is `name`."""
        return self._select("d.kind = 'kernel' AND (d.name = ?1 OR d.qualified_name = ?1)", (name,))
