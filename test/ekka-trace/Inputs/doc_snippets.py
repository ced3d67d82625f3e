"""Runs the Python snippets of one section of a doc, as written, in a
directory: what a reader who copies them gets. Usage:
doc_snippets.py DOC 'SECTION HEADING' DIR (the snippets' relative paths
are DIR's). Each snippet's output follows a `snippet N` line."""
import os
import re
import sys

doc, heading, where = sys.argv[1:4]
text = open(doc).read()
section = text[text.index("\n## " + heading + "\n"):]
end = section.find("\n## ", 1)
section = section if end < 0 else section[:end]
os.chdir(where)
for n, code in enumerate(re.findall(r"```python\n(.*?)```", section, re.S), 1):
    print("snippet", n, flush=True)
    exec(compile(code, f"{doc} snippet {n}", "exec"), {"__name__": "__main__"})
