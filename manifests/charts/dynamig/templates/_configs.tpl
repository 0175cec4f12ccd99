{{/* The configuration files the ConfigMaps hold, named so that pods can carry their checksum. */}}

{{/* device-config.yaml: HAMi v2.10's format, as HAMi's chart writes it. */}}
{{- define "dynamig.deviceConfig" -}}
{{- if (index .Values "device-config" "content") }}
{{- index .Values "device-config" "content" | trim | nindent 0 }}
{{- else }}
nvidia:
  resourceCountName: {{ .Values.resourceName }}
  resourceMemoryName: {{ .Values.resourceMem }}
  resourceMemoryPercentageName: {{ .Values.resourceMemPercentage }}
  resourceCoreName: {{ .Values.resourceCores }}
  resourcePriorityName: {{ .Values.resourcePriority }}
  overwriteEnv: {{ .Values.scheduler.overwriteEnv | default "false" }}
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  preConfiguredDeviceMemory: {{ .Values.devicePlugin.preConfiguredDeviceMemory | default 0 }}
  memoryFactor: 1
  deviceSplitCount: {{ .Values.devicePlugin.deviceSplitCount }}
  deviceMemoryScaling: {{ .Values.devicePlugin.deviceMemoryScaling }}
  deviceCoreScaling: {{ .Values.devicePlugin.deviceCoreScaling }}
  enableNumaTopology: {{ .Values.devicePlugin.enableNumaTopology | default false }}
  gpuCorePolicy: {{ .Values.devices.nvidia.gpuCorePolicy | default "default" }}
  libCudaLogLevel: {{ .Values.devices.nvidia.libCudaLogLevel | default 1 }}
  runtimeClassName: {{ .Values.devicePlugin.runtimeClassName | quote }}
  # The MIG profiles each GPU model may be split into (HAMi v2.10's defaults); the first
  # entry whose models match a GPU applies.
  migProfileAllowlist:
  - models: [ "A30" ]
    profiles: [ "1g.6gb", "2g.12gb", "4g.24gb" ]
  - models: [ "A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
    profiles: [ "1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb" ]
  - models: [ "A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"]
    profiles: [ "1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb" ]
  - models: [ "H100-PCIE-80GB", "H100-SXM5-80GB"]
    profiles: [ "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb" ]
  - models: [ "H100-PCIE-94GB", "H100-SXM5-94GB"]
    profiles: [ "1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb" ]
  - models: [ "H20", "H100 on GH200"]
    profiles: [ "1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb" ]
  - models: [ "H200 NVL", "H200-SXM5"]
    profiles: [ "1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb" ]
  - models: [ "B200" ]
    profiles: [ "1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb" ]
  - models: [ "RTX PRO 6000 Blackwell Server Edition" ]
    profiles: [ "1g.24gb", "2g.48gb", "4g.96gb" ]
{{- end }}
{{- end }}

{{/* The KubeSchedulerConfiguration. */}}
{{- define "dynamig.schedulerConfig" -}}
{{- $ns := include "dynamig.namespace" . -}}
{{- $policy := .Values.scheduler.defaultSchedulerPolicy -}}
# dynamig-scheduler's KubeSchedulerConfiguration: kube-scheduler's default plugins plus
# DynamicMIG, in one profile. Run: dynamig-scheduler --config <this file>.
# cmd/dynamig-scheduler/app's tests load this file exactly as the binary does.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  # One active dynamig-scheduler per cluster; the sandbox and tests run it with
  # --leader-elect=false.
  leaderElect: {{ .Values.scheduler.leaderElect }}
  # Not kube-scheduler's Lease (kube-system/kube-scheduler): the cluster's default scheduler
  # holds that one, and sharing it would keep one of the two schedulers idle.
  resourceName: dynamig-scheduler
  resourceNamespace: {{ $ns }}
clientConnection:
  # kube-scheduler's defaults are qps 50 / burst 100, and every pod costs a write (its
  # Binding) on top of the events, so the defaults would cap the binding rate.
  qps: {{ .Values.scheduler.kubeQPS }}
  burst: {{ .Values.scheduler.kubeBurst }}
{{- with .Values.scheduler.percentageOfNodesToScore }}
# Share of the nodes kube-scheduler filters per pod above 100 nodes; 100: every node, so
# nodeSchedulerPolicy orders them all (docs/configuration.md, node order on large clusters).
percentageOfNodesToScore: {{ . }}
{{- end }}
profiles:
- schedulerName: {{ .Values.schedulerName }}
  plugins:
    # multiPoint enables DynamicMIG at every extension point it implements: PreFilter,
    # Filter, PreScore, Score, Reserve (and Unreserve), Bind; the defaults stay enabled.
    # Weight 10 at Score: for a GPU pod, where its devices fit best (occupancy and
    # fragmentation) outweighs the default plugins' scores (weight 1 each).
    multiPoint:
      enabled:
      - name: DynamicMIG
        weight: 10
    # DynamicMIG's Score ranks every pod's nodes by their CPU and memory too, by the node
    # policy (nodeSchedulerPolicy, or the pod's hami.io/node-scheduler-policy): binpack
    # fills them, spread empties them. NodeResourcesFit's score (LeastAllocated) would
    # spread them whatever the policy, so it is off; NodeResourcesFit still filters. Its
    # PreScore only prepares its Score (the pod's requests, for every pod and, in a batch,
    # again at each re-score of the hinted node), so it is off too.
    preScore:
      disabled:
      - name: NodeResourcesFit
    score:
      disabled:
      - name: NodeResourcesFit
    # A plugin enabled by multiPoint lands after the default ones, i.e. after DefaultBinder,
    # which would bind every pod and leave DynamicMIG's Bind unused (a GPU pod bound without
    # its reservation). So bind is ordered explicitly: DynamicMIG binds GPU pods (one
    # Binding carrying the signed reservation) and returns Skip for the others, which
    # DefaultBinder binds.
    bind:
      disabled:
      - name: "*"
      enabled:
      - name: DynamicMIG
      - name: DefaultBinder
  pluginConfig:
  - name: NodeResourcesFit
    args:
      # No node advertises these: they describe the GPU request, which DynamicMIG fits.
      # Kubelet drops extended resources its node lacks before its own admission check.
      # The other fields (ignoredResourceGroups, scoringStrategy) are left unset and take
      # kube-scheduler's defaults (its scoringStrategy is unused: its score is off above).
      ignoredResources:
      - {{ .Values.resourceMem }}
      - {{ .Values.resourceMemPercentage }}
      - {{ .Values.resourceCores }}
      # HAMi-core's task priority (a hami-core container's limit), no resource either.
      - {{ .Values.resourcePriority }}
  # Batching: kube-scheduler reuses one pod's filtering and scoring for the next identical
  # pod only if every plugin signs the pod. PodTopologySpread refuses any pod while it has
  # default constraints (defaultingType System), InterPodAffinity signs pod labels unless
  # existing pods' preferred terms are ignored (docs/configuration.md, batching).
  {{- $defaulting := .Values.scheduler.podTopologySpreadDefaulting }}
  {{- if not (has $defaulting (list "List" "System")) }}
  {{- fail (printf "scheduler.podTopologySpreadDefaulting: %q: must be List or System (kube-scheduler's PodTopologySpread defaultingType)" (toString $defaulting)) }}
  {{- end }}
  - name: PodTopologySpread
    args:
      defaultingType: {{ $defaulting }}
  - name: InterPodAffinity
    args:
      ignorePreferredTermsOfExistingPods: {{ .Values.scheduler.ignorePreferredTermsOfExistingPods }}
  - name: DynamicMIG
    args:
      # The dynamig-device-config ConfigMap, mounted; "" = HAMi v2.10's defaults.
      deviceConfigFile: /etc/dynamig/device-config.yaml
      # Extended resource counting devices per container; must equal the device config's.
      resourceCountName: {{ .Values.resourceName }}
      # Extended resource for MiB per device; must equal the device config's.
      resourceMemoryName: {{ .Values.resourceMem }}
      # Extended resource for percent of a device's memory; must equal the device config's.
      resourceMemoryPercentageName: {{ .Values.resourceMemPercentage }}
      # Extended resource for percent of a device's SMs; must equal the device config's.
      resourceCoreName: {{ .Values.resourceCores }}
      # Node order for GPU pods: binpack or spread (a pod's hami.io/node-scheduler-policy wins).
      nodeSchedulerPolicy: {{ $policy.nodeSchedulerPolicy }}
      # GPU order within a node for MIG GPUs: binpack keeps whole GPUs free for large profiles.
      migGPUSchedulerPolicy: {{ .Values.scheduler.migGPUSchedulerPolicy }}
      # GPU order within a node for hami-core (shared) GPUs (HAMi's gpuSchedulerPolicy).
      hamiCoreGPUSchedulerPolicy: {{ $policy.gpuSchedulerPolicy }}
      # Add a placement's fragmentation cost to its score; false only for ablation benchmarks.
      fragmentationAware: {{ .Values.scheduler.fragmentationAware }}
      # Namespace of the device plugins' dynamig-heartbeat-<node> Leases and of the ConfigMap
      # dynamig-signing-public-keys, which the device plugins read.
      leaseNamespace: {{ $ns }}
      # Namespace of the Secret dynamig-signing-key, the key that signs every reservation;
      # only the scheduler may read Secrets there.
      signingKeyNamespace: {{ .Values.signingKeyNamespace }}
      # Create the signing key on first start when the Secret does not exist; false: an
      # operator provides it (PKCS #8 PEM of an ed25519 key under private.pem).
      createSigningKey: {{ .Values.scheduler.createSigningKey }}
      # Ignored by dynamig-scheduler: its --dynamig-metrics-bind-address flag wins.
      metricsBindAddress: {{ .Values.scheduler.metricsBindAddress | quote }}
      # Also export HAMi's scheduler series under their legacy names (nodeGPUMigInstance,
      # GPUDeviceMemoryLimit, vGPUMemoryAllocated, QuotaUsed, …; docs/metrics.md).
      legacyMetrics: {{ .Values.legacyMetrics }}
      # Relocation: evict pods annotated dynamig.io/relocatable to make room for a pending
      # MIG pod (docs/configuration.md, relocation).
      relocation:
        enabled: {{ .Values.scheduler.relocation.enabled }}
        interval: {{ .Values.scheduler.relocation.interval | quote }}
        maxPods: {{ .Values.scheduler.relocation.maxPods }}
{{- end }}
