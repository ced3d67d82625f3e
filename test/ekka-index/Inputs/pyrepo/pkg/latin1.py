class Latin1:
    name = "café"
