#!/usr/bin/env python3
"""Checks a Chrome trace-event JSON file against the format's rules, and
against the Ekka trace it was exported from.

    check-trace-events.py EXPORT.json [TRACE_DIR ...]

The rules (Chrome's "Trace Event Format" document, as Perfetto's JSON
importer and chrome://tracing read it), as a schema of our own:
  - the file is one JSON object with a traceEvents array; displayTimeUnit,
    if present, is "ms" or "ns"; otherData, if present, an object;
  - every event has ph, pid (an integer) and name (a non-empty string);
  - "X" (complete): ts and dur numbers >= 0, tid an integer, cat a string,
    args an object;
  - "M" (metadata): name one of process_name, process_sort_index,
    thread_name, thread_sort_index; a *_name has args.name (a string), a
    *_sort_index args.sort_index (an integer); thread_* have a tid;
  - "i" (instant): ts >= 0, tid, s one of g, p, t;
  - "b" and "e" (async begin and end): ts >= 0, tid, cat and id; each "b"
    ends in one "e" of the same pid, cat, id and name, no earlier;
  - on each thread the complete events nest: one that starts inside another
    ends inside it too (no partial overlap, which viewers draw wrongly);
  - every pid and thread with events is named by a metadata event.

Given the trace directories (one per process, in pid order), it checks the
events against them: each span of the trace is one event with its id; each
op's event lies within its module call's event where both ran on one
thread; each captured tensor named in args is a key of its shard's header.

Prints one fact per line for FileCheck; exits 1 on the first broken rule.
"""
import json
import os
import sqlite3
import struct
import sys
from collections import defaultdict

EPS = 1e-3  # microseconds: the export's times are whole nanoseconds


def fail(msg):
    print("BROKEN:", msg)
    sys.exit(1)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_schema(doc):
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("not an object with a traceEvents array")
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        fail("displayTimeUnit must be ms or ns")
    if not isinstance(doc.get("otherData", {}), dict):
        fail("otherData must be an object")
    named_pids, named_threads, open_async = set(), set(), {}
    for n, e in enumerate(doc["traceEvents"]):
        where = f"event {n} ({e.get('name')!r})"
        if not isinstance(e, dict) or e.get("ph") not in ("X", "M", "i", "b", "e"):
            fail(f"{where}: ph must be X, M, i, b or e")
        if not is_int(e.get("pid")) or not isinstance(e.get("name"), str) or not e["name"]:
            fail(f"{where}: needs an integer pid and a name")
        ph = e["ph"]
        if ph == "X":
            if not (is_num(e.get("ts")) and e["ts"] >= 0 and is_num(e.get("dur")) and e["dur"] >= 0):
                fail(f"{where}: a complete event needs ts and dur >= 0")
            if not is_int(e.get("tid")) or not isinstance(e.get("cat"), str):
                fail(f"{where}: a complete event needs an integer tid and a cat")
            if not isinstance(e.get("args"), dict):
                fail(f"{where}: args must be an object")
        elif ph == "M":
            if e["name"] not in ("process_name", "process_sort_index", "thread_name",
                                 "thread_sort_index"):
                fail(f"{where}: unknown metadata event")
            args = e.get("args")
            if not isinstance(args, dict):
                fail(f"{where}: metadata needs args")
            if e["name"].endswith("_name") and not isinstance(args.get("name"), str):
                fail(f"{where}: a name's metadata needs args.name, a string")
            if e["name"].endswith("_sort_index") and not is_int(args.get("sort_index")):
                fail(f"{where}: a sort index's metadata needs args.sort_index, an integer")
            if e["name"].startswith("thread_"):
                if not is_int(e.get("tid")):
                    fail(f"{where}: thread metadata needs a tid")
                if e["name"] == "thread_name":
                    named_threads.add((e["pid"], e["tid"]))
            elif e["name"] == "process_name":
                named_pids.add(e["pid"])
        elif ph == "i":
            if not (is_num(e.get("ts")) and e["ts"] >= 0 and is_int(e.get("tid"))):
                fail(f"{where}: an instant event needs ts >= 0 and a tid")
            if e.get("s", "t") not in ("g", "p", "t"):
                fail(f"{where}: an instant event's scope is g, p or t")
        else:
            if not (is_num(e.get("ts")) and e["ts"] >= 0 and is_int(e.get("tid"))):
                fail(f"{where}: an async event needs ts >= 0 and a tid")
            if not isinstance(e.get("cat"), str) or not isinstance(e.get("id"), (str, int)):
                fail(f"{where}: an async event needs a cat and an id")
            key = (e["pid"], e["cat"], e["id"])
            if ph == "b":
                if key in open_async:
                    fail(f"{where}: async id {e['id']!r} begun twice")
                open_async[key] = e
            else:
                b = open_async.pop(key, None)
                if b is None or b["name"] != e["name"] or e["ts"] < b["ts"] - EPS:
                    fail(f"{where}: an async end without its begin, or before it")
    if open_async:
        fail(f"{len(open_async)} async events never end")
    events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    for e in events:
        if e["pid"] not in named_pids:
            fail(f"pid {e['pid']} has no process_name")
        if (e["pid"], e["tid"]) not in named_threads:
            fail(f"thread {e['pid']}/{e['tid']} has no thread_name")
    # Nesting, thread by thread.
    by_thread = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append(e)
    for thread, xs in by_thread.items():
        xs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in xs:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
                fail(f"thread {thread}: {e['name']!r} overlaps {stack[-1]['name']!r} partly")
            stack.append(e)
    return by_thread


def shard_keys(path, cache={}):
    if path not in cache:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            cache[path] = set(json.loads(f.read(n))) - {"__metadata__"}
    return cache[path]


def check_against(doc, dirs):
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for pid, d in enumerate(dirs, start=1):
        db = sqlite3.connect(f"file:{os.path.join(d, 'trace.db')}?mode=ro", uri=True)
        spans = db.execute("SELECT owner, owner_id FROM spans").fetchall()
        mine = [e for e in xs if e["pid"] == pid and e["cat"] in ("module", "op")]
        mine += [e for e in doc["traceEvents"]
                 if e["ph"] == "b" and e["pid"] == pid and e["cat"] in ("module", "op")]
        got = sorted((("module_call" if e["cat"] == "module" else "op"),
                      e["args"]["module_call_id" if e["cat"] == "module" else "op_id"])
                     for e in mine)
        if got != sorted(spans):
            fail(f"pid {pid}: the events are not the trace's {len(spans)} spans")
        calls = db.execute("SELECT count(*) FROM module_calls").fetchone()[0]
        ops = db.execute("SELECT count(*) FROM ops").fetchone()[0]
        print(f"process {pid}: {sum(o == 'module_call' for o, _ in spans)} of {calls} module "
              f"calls, {sum(o == 'op' for o, _ in spans)} of {ops} ops, "
              f"{len({e['tid'] for e in mine})} threads")
        # An op within its module call, where both ran on one thread.
        # (async events, which need not nest, aside)
        call_event = {e["args"]["module_call_id"]: e for e in mine
                      if e["cat"] == "module" and e["ph"] == "X"}
        outside = 0
        for e in mine:
            if e["ph"] != "X":
                continue
            c = call_event.get(e["args"].get("module_call_id")) if e["cat"] == "op" else None
            if c and c["tid"] == e["tid"] and not (
                    c["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + EPS):
                outside += 1
        if outside:
            fail(f"pid {pid}: {outside} ops lie outside their module call on its thread")
        named = 0
        for e in mine:
            for t in e["args"].get("tensors", []):
                if "shard" in t:
                    if t["key"] not in shard_keys(os.path.join(d, t["shard"])):
                        fail(f"tensor {t['tensor_id']}: no key {t['key']} in {t['shard']}")
                    named += 1
        print(f"process {pid}: {named} captured tensors named, each found in its shard")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    by_thread = check_schema(doc)
    counts = defaultdict(int)
    for e in doc["traceEvents"]:
        counts[e["ph"]] += 1
    print(f"valid trace events: {counts['X']} complete, {counts['M']} metadata, "
          f"{counts['i']} instant" + (f", {counts['b']} async" if counts['b'] else ""))
    print(f"nested on each of {len(by_thread)} threads")
    for cat in ("module", "op", "kernel"):
        print(f"{cat}: {sum(1 for e in doc['traceEvents'] if e.get('cat') == cat and e['ph'] in 'Xb')}")
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            print(f"process {e['pid']}: {e['args']['name']}")
    for e in doc["traceEvents"]:
        if e["ph"] == "i":
            marked = [x for x in by_thread.get((e["pid"], e["tid"]), [])
                      if abs(x["ts"] - e["ts"]) < EPS and x["args"].get("ekka") == e["name"]]
            print(f"mark: {e['name']} (on {marked[0]['name'] if marked else 'NOTHING'})")
    check_against(doc, sys.argv[2:])


if __name__ == "__main__":
    main()
