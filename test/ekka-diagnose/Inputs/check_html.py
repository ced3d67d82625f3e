"""Checks that a report is well-formed HTML with the plot and the suspect."""
import sys
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "input", "link", "hr", "circle", "line", "polyline"}


class Checker(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.points, self.in_svg, self.suspect = [], [], 0, False, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg" and attrs.get("id") == "error-ratio":
            self.in_svg = True
        if tag == "circle" and self.in_svg:
            self.points += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "b" and self.suspect is None:
            self.suspect = data


c = Checker()
c.feed(open(sys.argv[1]).read())
print("well-formed" if not c.errors and not c.stack else f"MALFORMED {c.errors} {c.stack}")
print(f"svg error-ratio with {c.points} points")
print(f"suspect {c.suspect}")
