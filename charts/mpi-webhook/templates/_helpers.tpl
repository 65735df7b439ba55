{{- /*
The chart has no copy of the objects it installs: it reads manifests/ (files/ holds links to its
folders), the very files `kubectl kustomize` renders, and changes only what a value says. So a
change to manifests/ is a change to the chart; tests/helm.rs renders both and compares them.
*/ -}}

{{- /* The documents of one file under files/, as a list of objects (comment-only ones dropped). */ -}}
{{- define "mpi-webhook.objects" -}}
{{- $objects := list }}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" (.root.Files.Get .file) -1 }}
{{- $obj := fromYaml $doc }}
{{- if hasKey $obj "Error" }}
{{- fail (printf "%s does not parse: %s" $.file $obj.Error) }}
{{- end }}
{{- if $obj }}
{{- $objects = append $objects $obj }}
{{- end }}
{{- end }}
{{- toYaml (dict "objects" $objects) }}
{{- end }}

{{- /* The image both containers run: the values', else the kustomize base's `images:` entry. */ -}}
{{- define "mpi-webhook.image" -}}
{{- $kustomization := fromYaml (.Files.Get "files/base/kustomization.yaml") }}
{{- $entry := first $kustomization.images }}
{{- $repository := .Values.image.repository | default ($entry.newName | default $entry.name) }}
{{- $tag := .Values.image.tag | default ($entry.newTag | default .Chart.AppVersion) }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{- define "mpi-webhook.preflightImage" -}}
{{- .Values.preflightImage | default (include "mpi-webhook.image" .) }}
{{- end }}

{{- /*
The changes every object gets: the release's namespace for the manifests' `mpi-webhook`, Helm's
labels, and the Service's DNS names in the serving certificate.
*/ -}}
{{- define "mpi-webhook.common" -}}
{{- $obj := .obj }}
{{- $root := .root }}
{{- $ns := $root.Release.Namespace }}
{{- $md := $obj.metadata }}
{{- if hasKey $md "namespace" }}
{{- $_ := set $md "namespace" $ns }}
{{- end }}
{{- $labels := $md.labels | default dict }}
{{- $_ := set $labels "helm.sh/chart" (printf "%s-%s" $root.Chart.Name ($root.Chart.Version | replace "+" "_")) }}
{{- $_ := set $labels "app.kubernetes.io/managed-by" $root.Release.Service }}
{{- $_ := set $md "labels" $labels }}
{{- range $subject := $obj.subjects | default list }}
{{- if hasKey $subject "namespace" }}
{{- $_ := set $subject "namespace" $ns }}
{{- end }}
{{- end }}
{{- if eq $obj.kind "Certificate" }}
{{- $names := list }}
{{- range $name := $obj.spec.dnsNames | default list }}
{{- $names = append $names (replace "mpi-webhook.mpi-webhook.svc" (printf "mpi-webhook.%s.svc" $ns) $name) }}
{{- end }}
{{- if $obj.spec.dnsNames }}
{{- $_ := set $obj.spec "dnsNames" $names }}
{{- end }}
{{- end }}
{{- end }}

{{- /* The Deployment, as the values say. */ -}}
{{- define "mpi-webhook.deployment" -}}
{{- $obj := .obj }}
{{- $v := .root.Values }}
{{- $image := include "mpi-webhook.image" .root }}
{{- $preflight := include "mpi-webhook.preflightImage" .root }}
{{- $_ := set $obj.spec "replicas" (int $v.replicas) }}
{{- $pod := $obj.spec.template.spec }}
{{- $_ := set $pod "terminationGracePeriodSeconds" (int $v.terminationGracePeriodSeconds) }}
{{- with $v.imagePullSecrets }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end }}
{{- with $v.nodeSelector }}{{ $_ := set $pod "nodeSelector" . }}{{ end }}
{{- with $v.tolerations }}{{ $_ := set $pod "tolerations" . }}{{ end }}
{{- with $v.podAnnotations }}{{ $_ := set $obj.spec.template.metadata "annotations" . }}{{ end }}
{{- range $c := $pod.containers }}
{{- $_ := set $c "image" $image }}
{{- $_ := set $c "imagePullPolicy" $v.image.pullPolicy }}
{{- if not (hasKey $v.resources $c.name) }}
{{- fail (printf "manifests/base/deployment.yaml has a container %q that values.yaml's resources do not name" $c.name) }}
{{- end }}
{{- $_ := set $c "resources" (index $v.resources $c.name) }}
{{- range $e := $c.env | default list }}
{{- if eq $e.name "MPI_WEBHOOK_PREFLIGHT_IMAGE" }}
{{- $_ := set $e "value" $preflight }}
{{- end }}
{{- end }}
{{- $args := list }}
{{- $prev := "" }}
{{- range $a := $c.args }}
{{- if eq $prev "--shutdown-delay" }}
{{- $args = append $args $v.shutdownDelay }}
{{- else if and (eq $a "--leader-elect") (not $v.leaderElection) }}
{{- else }}
{{- $args = append $args $a }}
{{- end }}
{{- $prev = $a }}
{{- end }}
{{- if and (eq $c.name "reconciler") $v.networkPolicyDefault }}
{{- $args = append $args "--network-policy-default" }}
{{- end }}
{{- $_ := set $c "args" $args }}
{{- end }}
{{- end }}

{{- /* A webhook configuration: the Service's namespace, the selector, the CA. */ -}}
{{- define "mpi-webhook.webhooks" -}}
{{- $obj := .obj }}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $ns := $root.Release.Namespace }}
{{- if eq $v.tls.mode "cert-manager" }}
{{- $annotations := $obj.metadata.annotations | default dict }}
{{- $_ := set $annotations "cert-manager.io/inject-ca-from" (printf "%s/mpi-webhook-serving-cert" $ns) }}
{{- $_ := set $obj.metadata "annotations" $annotations }}
{{- end }}
{{- range $hook := $obj.webhooks }}
{{- $_ := set $hook.clientConfig.service "namespace" $ns }}
{{- if eq $v.tls.mode "certs" }}
{{- $_ := set $hook.clientConfig "caBundle" ($v.tls.certs.ca | b64enc) }}
{{- end }}
{{- $selector := $hook.namespaceSelector | default dict }}
{{- $expressions := list }}
{{- range $e := $selector.matchExpressions | default list }}
{{- if and (eq $e.key "kubernetes.io/metadata.name") (eq $e.operator "NotIn") }}
{{- $values := list }}
{{- range $n := $e.values }}
{{- $values = append $values (ternary $ns $n (eq $n "mpi-webhook")) }}
{{- end }}
{{- $_ := set $e "values" ($values | uniq) }}
{{- end }}
{{- $expressions = append $expressions $e }}
{{- end }}
{{- $expressions = concat $expressions $v.webhooks.namespaceSelector.matchExpressions }}
{{- if $expressions }}
{{- $_ := set $selector "matchExpressions" $expressions }}
{{- end }}
{{- with $v.webhooks.namespaceSelector.matchLabels }}
{{- $_ := set $selector "matchLabels" (merge (deepCopy .) ($selector.matchLabels | default dict)) }}
{{- end }}
{{- $_ := set $hook "namespaceSelector" $selector }}
{{- end }}
{{- end }}
