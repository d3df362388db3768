"""Unit tests of the names a CEL selector reads (controller/admission/cel_refs.py)."""

import pytest

from controller.admission.cel_refs import Reference, references

D = "gpu.fracgpu.dev"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'device.attributes["{D}"].model == "A100"', [Reference("attribute", D, "model")]),
        (f"device.attributes['{D}']['model'] == 'A100'", [Reference("attribute", D, "model")]),
        (f'has(device.attributes["{D}"].profile)', [Reference("attribute", D, "profile", test=True)]),
        (f'"profile" in device.attributes["{D}"]', [Reference("attribute", D, "profile", test=True)]),
        (
            f'device.capacity["{D}"].gpumem.compareTo(quantity("10Gi")) >= 0',
            [Reference("capacity", D, "gpumem")],
        ),
        ('"gpu.nvidia.com" == device.driver', [Reference("driver", "", "gpu.nvidia.com")]),
        (
            f'device.attributes["{D}"].?model.orValue("") == "x" && device.capacity["{D}"][?"vram"].hasValue()',
            [Reference("attribute", D, "model", test=True), Reference("capacity", D, "vram", test=True)],
        ),
        (
            # inside a member call, a macro and a map literal, in the order written
            f'device.attributes["{D}"].productName.contains("H100") && [1].all(x, device.capacity["{D}"].memory > x)'
            f' && {{"k": device.attributes["resource.kubernetes.io"].pcieRoot}}.size() == 1',
            [
                Reference("attribute", D, "productName"),
                Reference("capacity", D, "memory"),
                Reference("attribute", "resource.kubernetes.io", "pcieRoot"),
            ],
        ),
        # the same name read twice counts once; text inside a string literal is no reference
        (f'device.attributes["{D}"].uuid == "x" || device.attributes["{D}"].uuid == "device.driver"', None),
    ],
)
def test_references_in_each_spelling(expression: str, expected: list[Reference] | None) -> None:
    if expected is None:
        expected = [Reference("attribute", D, "uuid")]
    assert list(references(expression)) == expected


@pytest.mark.parametrize(
    "expression",
    [
        f'device.attributes["{D}"].model ==',  # does not parse: the API server has refused it already
        'cel.bind(a, device.attributes["d"], a.x)',  # a name read through a variable
        f'device.attributes[["{D}"][0]].model == "x"',  # a computed domain
        "device.driver != 'gpu.nvidia.com'",  # true on every device of ours: nothing to say
    ],
)
def test_what_is_not_a_reference(expression: str) -> None:
    assert references(expression) == ()


def test_a_reference_is_written_back_as_cel() -> None:
    assert Reference("attribute", D, "productName").cel == f'device.attributes["{D}"].productName'
    assert Reference("capacity", D, "memory").cel == f'device.capacity["{D}"].memory'
    assert Reference("attribute", D, "a/b").cel == f'device.attributes["{D}"]["a/b"]'
    assert Reference("driver", "", "x").cel == 'device.driver == "x"'
