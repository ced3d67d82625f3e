"""Silent bugs planted in the real vLLM (filled in below)."""
BUGS = {}


def plant(name, engine):
    BUGS[name](engine)
