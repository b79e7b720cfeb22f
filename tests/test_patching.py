"""`wrap_attribute`: every vLLM hook goes through it, on instance methods and inherited classmethods."""

from __future__ import annotations

from minipic_server.patching import wrap_attribute


class Base:
    @classmethod
    def pick(cls, name: str) -> str:
        return f"{cls.__name__}:{name}"

    def run(self, value: int) -> int:
        return value + 1


class Platform(Base):  # inherits both, like vLLM's CudaPlatform and its classmethods
    pass


def tag(original):
    def wrapped(*args, **kwargs):
        return ("wrapped", original(*args, **kwargs))

    return wrapped


def test_inherited_classmethod_stays_callable_on_class_and_instance() -> None:
    wrap_attribute(Platform, "pick", tag)
    assert Platform.pick("a") == ("wrapped", "Platform:a")
    assert Platform().pick("b") == ("wrapped", "Platform:b")
    assert Base.pick("c") == "Base:c"  # the base class is left alone


def test_instance_method_keeps_self_and_is_wrapped_once() -> None:
    wrap_attribute(Platform, "run", tag)
    wrap_attribute(Platform, "run", tag)  # register() runs several times per process
    assert Platform().run(1) == ("wrapped", 2)
    assert Platform.run.__name__ == "run"
