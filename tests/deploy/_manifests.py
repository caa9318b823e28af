"""The manifests of ``deploy/`` read once, and what the tests of tests/deploy ask of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def documents(name: str) -> list[dict[str, Any]]:
    """The YAML documents of ``deploy/k8s/<name>``."""
    with open(K8S / name, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def one(name: str, kind: str) -> dict[str, Any]:
    """The one document of ``kind`` in ``deploy/k8s/<name>``."""
    found = [d for d in documents(name) if d["kind"] == kind]
    assert len(found) == 1, f"{name}: {len(found)} documents of kind {kind}"
    return found[0]


@dataclass(frozen=True)
class Worker:
    """The worker Deployment's container, as ``lbs worker`` will see it."""

    deployment: dict[str, Any]

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.deployment["spec"]["template"]["spec"]
        return spec

    @property
    def labels(self) -> dict[str, str]:
        """The pod template's labels (what a selector must match)."""
        return dict(self.deployment["spec"]["template"]["metadata"]["labels"])

    @property
    def annotations(self) -> dict[str, Any]:
        """The pod template's annotations."""
        return dict(self.deployment["spec"]["template"]["metadata"].get("annotations") or {})

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]
        return dict(container)

    @property
    def args(self) -> list[str]:
        return [str(a) for a in self.container.get("args", [])]

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        """Each variable's entry (``value`` or ``valueFrom``), by name."""
        return {e["name"]: e for e in self.container.get("env", [])}

    def values(self) -> dict[str, str]:
        """The plain ``value`` variables."""
        return {n: str(e["value"]) for n, e in self.env.items() if "value" in e}

    @property
    def service(self) -> str:
        return self.values()["LBS_SERVICE"]

    def port(self, name: str) -> int:
        for p in self.container.get("ports", []):
            if p.get("name") == name:
                return int(p["containerPort"])
        raise AssertionError(f"no container port named {name!r}")

    def secret_of(self, variable: str) -> tuple[str, str]:
        """(secret, key) a variable is read from."""
        ref = self.env[variable]["valueFrom"]["secretKeyRef"]
        return ref["name"], ref["key"]


def worker() -> Worker:
    return Worker(one("worker.yaml", "Deployment"))


def kustomization() -> dict[str, Any]:
    """``deploy/k8s/kustomization.yaml``: what ``kubectl apply -k deploy/k8s`` applies."""
    (doc,) = documents("kustomization.yaml")
    return doc


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a ``matchLabels`` selector (the only form deploy/ uses) selects ``labels``."""
    assert set(selector) == {"matchLabels"}, selector
    match: dict[str, str] = selector["matchLabels"]
    return bool(match) and match.items() <= labels.items()


def scaled_object() -> dict[str, Any]:
    return one("keda.yaml", "ScaledObject")


def trigger(name: str) -> dict[str, Any]:
    """The ScaledObject's trigger ``name``'s metadata."""
    for t in scaled_object()["spec"]["triggers"]:
        if t.get("name") == name:
            assert t["type"] == "redis-streams", t
            return dict(t["metadata"])
    raise AssertionError(f"keda.yaml has no trigger named {name!r}")
