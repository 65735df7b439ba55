#!/usr/bin/env python3
"""Schema-validate every object mpi-webhook's manifests render to.

Renders, with `kubectl kustomize`, the base (manifests/), both certificate overlays, the optional
CRD overlay and manifests/runtimes/, then validates each object:

* Kubernetes built-in kinds: strict JSON-schema validation (unknown fields are errors) with the
  `kubernetes-validate` package, for every version in KUBERNETES_VERSIONS.
* Kinds defined by a CRD we have (ClusterTrainingRuntime from the rendered, patched CRDs; TrainJob
  and JobSet from the upstream CRDs in tests/fixtures/upstream/): the CRD's openAPIV3Schema, made strict the way
  the API server prunes (an unknown field is an error here). CEL rules are not evaluated.
* Other kinds (cert-manager's Issuer and Certificate): no schema is shipped, so only apiVersion,
  kind and metadata.name are checked; the script says so.

Also validates manifests/samples/*.yaml and the `request.object` of manifests/samples/reviews/*.json.

With FILE arguments (`python3 tests/validate_manifests.py FILE...`), validates the documents of those
YAML or JSON files instead, with the same schemas: tests/manifests.rs passes the sample JobSets as the
webhook patches them, and a Pod of each of their pod templates.

Exit status: 0 all valid, 1 something invalid, 77 a tool is missing and CI is not set (skipped).
With CI=true a missing tool is a failure. Run from anywhere: `python3 tests/validate_manifests.py`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The oldest Kubernetes Kubeflow Trainer supports, the version k8s-openapi is built for, and the
# newest kubernetes-validate 1.37.0 knows.
KUBERNETES_VERSIONS = ("1.31.0", "1.34.0", "1.37.0")
# Pinned in .ci/run; other versions may ship other schemas.
KUBERNETES_VALIDATE_VERSION = "1.37.0"

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = REPO / "manifests"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream"
UPSTREAM_CRDS = (
    "kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    "jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
)
# Kustomizations to render, relative to manifests/.
RENDERED = ("", "overlays/cert-manager", "overlays/cli-certs", "overlays/crds-intel-mpich", "runtimes")
SKIP = 77


def missing_tool(what: str) -> int:
    """A missing tool fails, unless SKIP_TEST_SUITES names `manifests` (tests/support/prerequisites.rs)."""
    if "manifests" not in [n.strip() for n in os.environ.get("SKIP_TEST_SUITES", "").split(",")]:
        print(f"FAIL: {what} is missing; scripts/install-test-deps.sh installs it "
              "(or skip with SKIP_TEST_SUITES=manifests)", file=sys.stderr)
        return 1
    print(f"SKIP (SKIP_TEST_SUITES=manifests): {what} is missing", file=sys.stderr)
    return SKIP


def kustomize(kubectl: str, path: str) -> list[dict]:
    """Render one kustomization. cli-certs needs tls/ files, so it is rendered from a copy."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "manifests"
        shutil.copytree(MANIFESTS, root)
        tls = root / "overlays" / "cli-certs" / "tls"
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (tls / name).write_text(f"placeholder {name}, written by tests/validate_manifests.py\n")
        out = subprocess.run(
            [kubectl, "kustomize", str(root / path)], capture_output=True, text=True, check=False
        )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize manifests/{path} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def strict(schema: dict) -> dict:
    """An openAPIV3Schema in which an unknown field is an error (the API server would drop it)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schemas(crds: list[dict]) -> dict[tuple[str, str], object]:
    import jsonschema

    out = {}
    for crd in crds:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(schema)
    return out


def repository_documents() -> list[tuple[str, dict]]:
    """The sample manifests and the objects of the sample AdmissionReviews."""
    import yaml

    sources: list[tuple[str, dict]] = []
    for path in sorted((MANIFESTS / "samples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                sources.append((str(path.relative_to(REPO)), doc))
    for path in sorted((MANIFESTS / "samples" / "reviews").glob("*.json")):
        review = json.loads(path.read_text())
        problems = [
            f for f in ("uid", "kind", "resource", "operation", "object") if f not in review.get("request", {})
        ]
        if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != "AdmissionReview" or problems:
            print(f"FAIL {path.relative_to(REPO)}: not an admission.k8s.io/v1 AdmissionReview request {problems}")
            sys.exit(1)
        sources.append((f"{path.relative_to(REPO)} request.object", review["request"]["object"]))
    return sources


def main() -> int:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return missing_tool("kubectl (for `kubectl kustomize`)")
    try:
        import jsonschema  # noqa: F401  (a dependency of kubernetes-validate)
        import kubernetes_validate
        import kubernetes_validate.utils as kv_utils
        import yaml
    except ImportError:
        return missing_tool(f"the Python package kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}")

    # Every validate() call re-reads the (large) definitions file; read each file once.
    kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)

    rendered: list[tuple[str, dict]] = []
    for path in RENDERED:
        for doc in kustomize(kubectl, path):
            rendered.append((f"kustomize manifests/{path}", doc))
    crds = [doc for _, doc in rendered if doc.get("kind") == "CustomResourceDefinition"]
    for rel in UPSTREAM_CRDS:
        crds.extend(d for d in yaml.safe_load_all((UPSTREAM / rel).read_text()) if d)
    by_kind = crd_schemas(crds)

    if len(sys.argv) > 1:
        sources = [(path, doc) for path in sys.argv[1:] for doc in yaml.safe_load_all(Path(path).read_text()) if doc is not None]
    else:
        sources = rendered + repository_documents()
    if not all(isinstance(doc, dict) for _, doc in sources):
        print("FAIL: a document that is not an object")
        return 1

    passed = failed = 0
    unchecked: set[str] = set()
    for origin, doc in sources:
        ident = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')} ({origin})"
        errors: list[str] = []
        if not (doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name")):
            errors.append("apiVersion, kind and metadata.name are required")
        elif (doc["apiVersion"], doc["kind"]) in by_kind:
            validator = by_kind[(doc["apiVersion"], doc["kind"])]
            errors.extend(
                f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                for e in validator.iter_errors(doc)
            )
        else:
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.SchemaNotFoundError:
                    unchecked.add(f"{doc['apiVersion']} {doc['kind']}")
                    break
                except kubernetes_validate.ValidationError as e:
                    path = ".".join(map(str, e.path)) or "<root>"
                    errors.append(f"Kubernetes {version}: {path}: {e.message}")
        if errors:
            failed += 1
            print(f"FAIL {ident}")
            for line in errors[:20]:
                print(f"    {line}")
        else:
            passed += 1
    for kind in sorted(unchecked):
        print(f"note: no schema for {kind}: checked apiVersion, kind and metadata.name only")
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
