"""Checks an ekka-diagnose --json report: each suspect's R over the joined
steps lies within its steps' own (a whole is a mixture of its parts, up to
the noise floor's switch), so the steps it reports are readings of the same
tensors as its R. Prints one line per suspect with steps."""
import json
import sys

report = json.load(open(sys.argv[1]))
for s in report["suspects"]:
    steps = [x["ratio"] for x in s["step_ratios"] if x["ratio"] is not None]
    if not steps or s["ratio"] is None:
        continue
    low, high = min(steps), max(steps)
    inside = 0.9 * low <= s["ratio"] <= 1.1 * high
    print("%s: R %.3g within its steps' %.3g..%.3g: %s"
          % (s["component"], s["ratio"], low, high, "yes" if inside else "NO"))
