class BeforeError:
    def ok(self):
        return 1


def broken(:
    return )


class AfterError(BeforeError):
    def still_found(self):
        return 2
