import pkg


class Gadget(pkg.Widget):
    pass
