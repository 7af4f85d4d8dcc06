"""The shipped gVisor admission policy, played as a mutating admission webhook.

``deploy/modes/pod-snapshots/gvisor-admission-policy.yaml`` is what puts a Workspace's pods in
GKE Sandbox in mode ``pod-snapshots``: a ``MutatingAdmissionPolicy`` (and its binding) setting
``runtimeClassName: gvisor``. Kubernetes serves that kind from 1.36 (GKE 1.36); the tests' real
kube-apiserver is 1.20, which has no admission policies at all. So ``GvisorAdmission`` plays it
as what 1.20 has, a mutating admission webhook, served by the test process over HTTPS with a CA
of its own and registered by URL (as ``control_plane.py`` registers the GKE add-on's), doing
exactly what the policy says, read from the shipped file at start so the two cannot drift:

* **what it matches**: the policy's ``matchConstraints`` become the webhook's own ``rules``
  (``resourceRules``), ``objectSelector``, ``namespaceSelector`` and ``matchPolicy``, so the API
  server itself decides which requests reach it, as it would for the policy; its
  ``failurePolicy`` and ``reinvocationPolicy`` are the webhook's;
* **what it does**: each ``ApplyConfiguration`` mutation's CEL expression is parsed (the object
  construction syntax only: ``Object{field: Object.field{...}, field: "literal"}``) into the
  partial object it denotes, and merged into the admitted object as an apply configuration
  merges (maps field by field, anything else replaced), answered as a JSON patch;
* anything else the file might come to use (``matchConditions``, ``variables``, a ``JSONPatch``
  mutation, a binding with ``paramRef`` or ``matchResources``, a list in an apply configuration,
  any CEL beyond object construction and literals) is refused when the file is read: a test
  then fails naming it, instead of playing something the policy does not say.

Registration is per test (``register``/``unregister``, the ``gvisor_admission`` fixture): a
test without it plays a cluster where the policy is not installed (GKE before 1.36, or never
applied), whose pods run outside gVisor. Both return once the API server applies the change
(a dry-run Pod of a matching Workspace comes back in gVisor, or no longer does): it loads
webhook configurations asynchronously, and ``failurePolicy: Ignore`` would otherwise let a pod
through unmutated without a word.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from ..server_process import free_port
from .control_plane import ControlPlane, wait_until, webhook_pki

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "deploy" / "modes" / "pod-snapshots" / "gvisor-admission-policy.yaml"
#: The played policy's MutatingWebhookConfiguration (the policy's own name, so a log says which).
CONFIGURATION = "played-mutating-admission-policy-jupyter-pause-gvisor"
PROBE_NAMESPACE = "gvisor-admission-probe"


class Unsupported(Exception):
    """The shipped policy uses something this player does not play."""


# -- the policy as shipped --------------------------------------------------------------------
@dataclass(frozen=True)
class ShippedPolicy:
    """What the shipped MutatingAdmissionPolicy and its binding say, as the player needs it."""

    name: str
    failure_policy: str
    reinvocation_policy: str
    match_policy: str
    resource_rules: list[dict[str, Any]]
    object_selector: dict[str, Any]
    namespace_selector: dict[str, Any]
    configurations: list[dict[str, Any]]  # each mutation's apply configuration, parsed

    @classmethod
    def read(cls, path: Path = POLICY_FILE) -> ShippedPolicy:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        kinds = {d["kind"]: d for d in documents}
        if sorted(kinds) != ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]:
            raise Unsupported(f"{path}: expected a policy and its binding, found {sorted(kinds)}")
        policy = kinds["MutatingAdmissionPolicy"]
        binding = kinds["MutatingAdmissionPolicyBinding"]
        name = policy["metadata"]["name"]
        spec = policy["spec"]
        binding_spec = binding["spec"]
        if binding_spec.get("policyName") != name:
            raise Unsupported(f"{path}: the binding names {binding_spec.get('policyName')!r}")
        unplayed = sorted(set(binding_spec) - {"policyName"})
        unplayed += sorted(set(spec) - {"failurePolicy", "reinvocationPolicy", "matchConstraints",
                                        "mutations"})  # fmt: skip
        if unplayed:
            raise Unsupported(f"{path}: the player does not play {unplayed}")
        constraints = spec["matchConstraints"]
        unplayed = sorted(
            set(constraints)
            - {"resourceRules", "objectSelector", "namespaceSelector", "matchPolicy"}
        )
        if unplayed:
            raise Unsupported(f"{path}: the player does not play matchConstraints {unplayed}")
        configurations = []
        for mutation in spec["mutations"]:
            if mutation.get("patchType") != "ApplyConfiguration":
                raise Unsupported(f"{path}: mutation {mutation.get('patchType')!r}")
            configurations.append(parse_apply_configuration(mutation["applyConfiguration"]
                                                            ["expression"]))  # fmt: skip
        return cls(
            name=name,
            # the API's defaults where the file leaves a field out
            failure_policy=spec.get("failurePolicy", "Fail"),
            reinvocation_policy=spec.get("reinvocationPolicy", "Never"),
            match_policy=constraints.get("matchPolicy", "Equivalent"),
            resource_rules=constraints["resourceRules"],
            object_selector=constraints.get("objectSelector") or {},
            namespace_selector=constraints.get("namespaceSelector") or {},
            configurations=configurations,
        )


# -- CEL object construction ------------------------------------------------------------------
_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')'
    r"|(?P<number>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[{}:,.]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise Unsupported(f"CEL the player does not parse, at {text[position:]!r}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


def parse_apply_configuration(expression: str) -> dict[str, Any]:
    """The partial object a MutatingAdmissionPolicy's ApplyConfiguration expression builds:
    ``Object{spec: Object.spec{runtimeClassName: "gvisor"}}`` is ``{"spec": {"runtimeClassName":
    "gvisor"}}``. Each nested type must be its parent's type and field (``Object.spec`` under
    ``spec``), as CEL's type checker requires; literals are strings, integers, true, false."""
    tokens = _tokens(expression)
    position = 0

    def take(kind: str, value: str | None = None) -> str:
        nonlocal position
        if position >= len(tokens):
            raise Unsupported(f"{expression!r} ends early")
        found_kind, found = tokens[position]
        if found_kind != kind or (value is not None and found != value):
            raise Unsupported(f"{expression!r}: {found!r} where {value or kind} was expected")
        position += 1
        return found

    def peek() -> tuple[str, str]:
        return tokens[position] if position < len(tokens) else ("", "")

    def type_name() -> str:
        parts = [take("name")]
        while peek() == ("punct", "."):
            take("punct", ".")
            parts.append(take("name"))
        return ".".join(parts)

    def value(expected_type: str) -> Any:
        kind, text = peek()
        if kind == "string":
            take("string")
            return json.loads('"' + text[1:-1].replace('\\"', '"').replace("\\'", "'") + '"')
        if kind == "number":
            take("number")
            return int(text)
        if kind == "name" and text in ("true", "false"):
            take("name")
            return text == "true"
        if kind == "name":
            return construction(expected_type)
        raise Unsupported(f"{expression!r}: {text!r} is not a value the player knows")

    def construction(expected_type: str) -> dict[str, Any]:
        name = type_name()
        if name != expected_type:
            raise Unsupported(f"{expression!r}: type {name} where {expected_type} belongs")
        take("punct", "{")
        fields: dict[str, Any] = {}
        while peek() != ("punct", "}"):
            field_name = take("name")
            take("punct", ":")
            fields[field_name] = value(f"{expected_type}.{field_name}")
            if peek() == ("punct", ","):
                take("punct", ",")
        take("punct", "}")
        return fields

    built = construction("Object")
    if position != len(tokens):
        raise Unsupported(f"{expression!r}: {tokens[position][1]!r} after the object")
    return built


def merge_patch(target: Any, configuration: dict[str, Any], path: str = "") -> list[dict]:
    """JSON patch operations that merge ``configuration`` into ``target`` as an apply
    configuration does: a map field by field, any other value set as given."""
    operations = []
    for key, wanted in configuration.items():
        pointer = f"{path}/{key.replace('~', '~0').replace('/', '~1')}"
        present = isinstance(target, dict) and key in target
        if isinstance(wanted, dict) and present and isinstance(target[key], dict):
            operations += merge_patch(target[key], wanted, pointer)
        elif not present or target[key] != wanted:
            operations.append({"op": "add", "path": pointer, "value": copy.deepcopy(wanted)})
    return operations


# -- the webhook ------------------------------------------------------------------------------
class GvisorAdmission:
    """The shipped policy, served as a mutating webhook for ``plane`` (see the module's
    docstring); ``start`` serves it, ``register``/``unregister`` put it in force and take it
    out, ``stop`` ends it. ``admitted``: the pods it mutated (namespace, name or generateName)."""

    def __init__(self, plane: ControlPlane, workdir: Path, policy: ShippedPolicy | None = None):
        self.plane = plane
        self.workdir = workdir
        self.policy = policy or ShippedPolicy.read()
        self.admitted: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.ca_bundle = b""

    # -- serving ------------------------------------------------------------------------------
    def start(self) -> None:
        pki = webhook_pki(self.workdir / "gvisor-admission-pki", "gvisor-admission")
        self.ca_bundle = (pki / "ca.crt").read_bytes()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "tls.crt", pki / "tls.key")
        self.port = free_port()
        player = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    answer = json.dumps(player.review(review)).encode()
                except Exception as err:  # a player's bug must fail the test, not hide
                    player.errors.append(f"{type(err).__name__}: {err}")
                    self.send_error(500, str(err))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="gvisor-admission", daemon=True
        )
        self._thread.start()

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        """An AdmissionReview answered: the policy's mutations as one JSON patch."""
        request = review["request"]
        obj = copy.deepcopy(request["object"])
        operations: list[dict[str, Any]] = []
        for configuration in self.policy.configurations:
            step = merge_patch(obj, configuration)
            for operation in step:  # applied as they go: the next mutation sees the result
                apply_operation(obj, operation)
            operations += step
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if operations:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
            metadata = request["object"].get("metadata") or {}
            if not request.get("dryRun"):
                self.admitted.append(
                    (request.get("namespace", ""),
                     metadata.get("name") or metadata.get("generateName", ""))
                )  # fmt: skip
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": response}  # fmt: skip

    def stop(self) -> None:
        self.unregister()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        assert not self.errors, "the played gVisor admission policy failed:\n" + "\n".join(
            self.errors
        )

    # -- in force, or not -----------------------------------------------------------------------
    def _webhook(self) -> dict[str, Any]:
        policy = self.policy
        rules = []
        for rule in policy.resource_rules:
            unplayed = sorted(
                set(rule) - {"apiGroups", "apiVersions", "operations", "resources", "scope"}
            )
            if unplayed:
                raise Unsupported(f"{POLICY_FILE}: resourceRules {unplayed}")
            rules.append(dict(rule))
        return {
            "name": f"{policy.name}.played.jupyter-pause.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "timeoutSeconds": 10,
            "failurePolicy": policy.failure_policy,
            "reinvocationPolicy": policy.reinvocation_policy,
            "matchPolicy": policy.match_policy,
            "objectSelector": policy.object_selector,
            "namespaceSelector": policy.namespace_selector,
            "rules": rules,
            "clientConfig": {
                "url": f"https://127.0.0.1:{self.port}/mutate",
                "caBundle": base64.b64encode(self.ca_bundle).decode(),
            },
        }

    def register(self) -> None:
        """The policy in force (as ``kubectl apply -f`` the file would put it); returns once
        the API server applies it."""
        from kubernetes import client

        with self.plane.admin.api_client() as api:
            client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(
                {"metadata": {"name": CONFIGURATION}, "webhooks": [self._webhook()]}
            )
        self._wait_in_force(True)

    def unregister(self) -> None:
        """The policy taken out; returns once the API server no longer applies it."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.plane.admin.api_client() as api:
            try:
                client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                    CONFIGURATION
                )
            except ApiException as err:
                if err.status != 404:
                    raise
                return
        self._wait_in_force(False)

    def _probe_pod(self) -> dict[str, Any]:
        """A pod the policy matches: the labels its objectSelector asks for (matchLabels, and a
        value for each key that must exist)."""
        selector = self.policy.object_selector
        labels = dict(selector.get("matchLabels") or {})
        for expression in selector.get("matchExpressions") or []:
            if expression["operator"] == "Exists":
                labels[expression["key"]] = "probe"
            elif expression["operator"] == "In":
                labels[expression["key"]] = expression["values"][0]
            elif expression["operator"] not in ("NotIn", "DoesNotExist"):
                raise Unsupported(f"{POLICY_FILE}: objectSelector {expression}")
        return {"metadata": {"name": "probe", "labels": labels},
                "spec": {"containers": [{"name": "main", "image": "probe"}]}}  # fmt: skip

    def _wait_in_force(self, wanted: bool) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.plane.admin.api_client() as api:
            core = client.CoreV1Api(api)
            with contextlib.suppress(ApiException):  # 409: made by an earlier registration
                core.create_namespace({"metadata": {"name": PROBE_NAMESPACE}})
            last: list[str] = []

            def applied() -> bool:
                try:
                    answer = core.create_namespaced_pod(
                        PROBE_NAMESPACE, self._probe_pod(), dry_run="All"
                    )
                except ApiException as err:  # the new namespace's service account comes later
                    last[:] = [f"{err.status} {err.reason}"]
                    return False
                return (answer.spec.runtime_class_name == "gvisor") == wanted

            what = "apply" if wanted else "stop applying"
            try:
                wait_until(applied, 60, f"the API server to {what} the played gVisor policy")
            except AssertionError as err:
                raise AssertionError(f"{err}; last error: {last}; {self.errors}") from None


def apply_operation(obj: dict[str, Any], operation: dict[str, Any]) -> None:
    """One ``add`` operation of ``merge_patch`` applied to ``obj`` (what the API server does)."""
    *parents, last = [
        p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
    ]
    node = obj
    for part in parents:
        node = node[part]
    node[last] = copy.deepcopy(operation["value"])
