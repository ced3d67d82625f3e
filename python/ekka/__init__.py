"""Ekka's Python side.

Today: ``ekka.codeindex``, read-only access to an index that ``ekka-index build``
wrote, with the standard ``sqlite3`` module only. The tracing shim (global
module hooks) joins it with ``ekka-trace``.
"""

__version__ = "0.1.0"
