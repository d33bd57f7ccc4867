"""What a 404 means: a missing namespace is named as such; "CRDs not installed" only
when discovery says the kind is unknown."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from reversi.cli.api import CliError, Connection


def _404(body: dict) -> ApiException:
    err = ApiException(status=404, reason="Not Found")
    err.body = json.dumps({"kind": "Status", "code": 404, "reason": "NotFound", **body})
    return err


class FakeCustom:
    def __init__(self, kinds: list[str] | None):
        self.kinds = kinds

    def get_api_resources(self, group, version, **_):
        if self.kinds is None:
            raise _404({"message": "the server could not find the requested resource"})
        return {"resources": [{"name": k} for k in self.kinds]}

    def get_namespaced_custom_object(self, group, version, ns, plural, name, **_):
        raise _404({"message": f'{plural}.{group} "{name}" not found', "details": {"name": name, "kind": plural}})

    def create_namespaced_custom_object(self, group, version, ns, plural, body, **_):
        raise _404({"message": f'namespaces "{ns}" not found', "details": {"name": ns, "kind": "namespaces"}})


class FakeCore:
    def __init__(self, namespaces: set[str]):
        self.namespaces = namespaces

    def read_namespace(self, name, **_):
        if name not in self.namespaces:
            raise _404({"message": f'namespaces "{name}" not found', "details": {"name": name, "kind": "namespaces"}})
        return {"metadata": {"name": name}}


def conn(namespace: str, namespaces: set[str], kinds: list[str] | None = ("runs", "halts")) -> Connection:
    c = Connection.__new__(Connection)
    c.namespace, c.context, c.server = namespace, None, "https://example"
    c.custom = FakeCustom(None if kinds is None else list(kinds))
    c.__dict__["core"] = FakeCore(namespaces)
    return c


def test_a_missing_object_in_a_missing_namespace_names_the_namespace():
    with pytest.raises(CliError) as err:
        conn("shop-typo", {"shop"}).get("runs", "my-run", missing="check the name")
    assert str(err.value).startswith("namespace shop-typo not found; check -n/--namespace")


def test_a_missing_object_in_an_existing_namespace_names_the_object():
    with pytest.raises(CliError) as err:
        conn("shop", {"shop"}).get("runs", "my-run", missing="check the name")
    assert str(err.value) == "Run shop/my-run not found; check the name"


def test_creating_in_a_missing_namespace_names_the_namespace_not_the_crds():
    with pytest.raises(CliError) as err:
        conn("shop-typo", {"shop"}).create("halts", {"metadata": {"name": "h"}})
    assert "namespace shop-typo not found" in str(err.value) and "CRDs" not in str(err.value)


def test_crds_not_installed_only_when_discovery_says_so():
    missing_crds = conn("shop", {"shop"}, kinds=None)
    err = missing_crds.api_error(_404({"message": "the server could not find the requested resource"}),
                                 "listing halts", "halts", "shop")
    assert "the Reversi CRDs are not installed" in str(err)
    known = conn("shop", {"shop"})
    err = known.api_error(_404({"message": "the server could not find the requested resource"}),
                          "listing halts", "halts", "shop")
    assert "CRDs" not in str(err) and "refused (NotFound)" in str(err)
