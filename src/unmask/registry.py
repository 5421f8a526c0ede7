"""The one registry mechanism behind commit policies, cache policies and compat modes: a dict
from name to class (or to an instance), filled by a `register` decorator, whose lookup error
names the unknown value and the choices."""


class Registry(dict):
    def __init__(self, kind: str, instances: bool = False) -> None:
        super().__init__()
        self.kind, self.instances = kind, instances

    def register(self, cls: type) -> type:
        """Class decorator: add `cls` (or `cls()`) under `cls.name`."""
        if cls.name in self:
            raise ValueError(f"{self.kind} {cls.name!r} is registered twice")
        self[cls.name] = cls() if self.instances else cls
        return cls

    def lookup(self, name, error: type[Exception] = ValueError):
        try:
            return self[name]
        except (KeyError, TypeError):
            raise error(f"unknown {self.kind} {name!r}; choose one of {', '.join(self)}") from None
