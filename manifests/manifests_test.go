package manifests

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/dynamig/dynamig/config"
)

// TestGeneratedUpToDate fails when install.yaml or scheduler-config.yaml differ from what
// the chart renders: edit the chart, then run `make manifests`.
func TestGeneratedUpToDate(t *testing.T) {
	files, err := Generated()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("manifests/%s is not what the chart renders: run `make manifests` (and commit it)", name)
		}
	}
}

func render(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	out, err := Render(Namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func hamiValues(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("testdata/hami-v2.10-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v, err := ReadValues(raw)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRenderedObjectsDecode decodes every rendered object strictly (an unknown or misspelt
// field is an error) with the Kubernetes API types, under several value sets.
func TestRenderedObjectsDecode(t *testing.T) {
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	for name, values := range map[string]map[string]any{
		"defaults": nil,
		"install":  InstallValues(),
		"hami":     hamiValues(t),
		"options": {"serviceMonitor": map[string]any{"enabled": true}, "grafana": map[string]any{"dashboards": map[string]any{"enabled": true}}, "scheduler": map[string]any{"replicas": 1, "admissionWebhook": map[string]any{"enabled": false}},
			"devicePlugin": map[string]any{"deviceEdits": "nvcdi", "enableMIGMode": true, "nodeConfiguration": map[string]any{"externalConfigName": "my-node-config"}}},
	} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, values)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				if o.GetKind() == "ServiceMonitor" {
					continue // a CRD's kind, not in client-go's scheme
				}
				raw, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := strict.Decode(raw, nil, nil); err != nil {
					t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			for _, kind := range []string{"Deployment", "DaemonSet", "ConfigMap", "ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy", "Service"} {
				if kinds[kind] == 0 {
					t.Errorf("no %s rendered", kind)
				}
			}
		})
	}
}

// TestRenderedConfigsLoad parses the device config and node config the chart renders with
// dynamig's own parsers, as the binaries do at start.
func TestRenderedConfigsLoad(t *testing.T) {
	for name, values := range map[string]map[string]any{"defaults": nil, "hami": hamiValues(t)} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, values)
			dev, err := ConfigMapData(objs, "dynamig-device-config", "device-config.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.ParseDeviceConfig([]byte(dev))
			if err != nil {
				t.Fatalf("device-config.yaml: %v\n%s", err, dev)
			}
			node, err := ConfigMapData(objs, "dynamig-device-plugin", "config.json")
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.ParseNodeConfig([]byte(node), "config.json"); err != nil {
				t.Fatalf("config.json: %v\n%s", err, node)
			}
		})
	}
}

// TestHAMiValues renders the chart with a HAMi v2.10 values file and checks that every key
// whose meaning the two charts share lands where dynamig reads it.
func TestHAMiValues(t *testing.T) {
	objs := render(t, hamiValues(t))

	sched, err := ConfigMapData(objs, "dynamig-scheduler-config", "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// As written, not decoded: a default must not hide a key the chart failed to render.
	args, profile, err := config.DynamicMIGArgsAsWritten([]byte(sched), "")
	if err != nil {
		t.Fatal(err)
	}
	if profile != "hami-scheduler" {
		t.Fatalf("schedulerName: want the profile hami-scheduler, got %q", profile)
	}
	for key, want := range map[string]any{
		"nodeSchedulerPolicy":        "spread",  // scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy
		"hamiCoreGPUSchedulerPolicy": "binpack", // scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy
		"resourceCountName":          "nvidia.com/gpu",
		"resourceMemoryName":         "nvidia.com/gpumem",
		"resourceCoreName":           "nvidia.com/gpucores",
		"legacyMetrics":              true,
		"metricsBindAddress":         ":9395",
	} {
		if args[key] != want {
			t.Errorf("DynamicMIG args %s = %v, want %v", key, args[key], want)
		}
	}

	// device-config.content is the device config as it is.
	dev, _ := ConfigMapData(objs, "dynamig-device-config", "device-config.yaml")
	cfg, err := config.ParseDeviceConfig([]byte(dev))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Nvidia.MigProfileAllowlist; len(got) != 1 || len(got[0].Profiles) != 3 || cfg.Nvidia.DeviceSplitCount != 8 || cfg.Nvidia.DefaultGPUNum != 2 {
		t.Errorf("device-config.content not carried over: allowlist %+v, deviceSplitCount %d, defaultGPUNum %d", got, cfg.Nvidia.DeviceSplitCount, cfg.Nvidia.DefaultGPUNum)
	}
	// The webhook, which gives a container asking only for GPU memory or cores defaultGPUNum
	// devices, reads that device config.
	if !mountsDeviceConfig(Find(objs, "Deployment", "dynamig-webhook")) {
		t.Error("the webhook does not read the dynamig-device-config ConfigMap (defaultGPUNum)")
	}
	// devicePlugin.nodeConfiguration.config is the node config.
	node, _ := ConfigMapData(objs, "dynamig-device-plugin", "config.json")
	if err := cfg.ParseNodeConfig([]byte(node), "config.json"); err != nil {
		t.Fatal(err)
	}
	if n := cfg.Node("gpu-node-1"); n.OperatingMode != "mig" {
		t.Errorf("nodeconfig of gpu-node-1: %+v", n)
	}

	ds := Find(objs, "DaemonSet", "dynamig-device-plugin")
	if sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector"); sel["gpu"] != "on" {
		t.Errorf("devicePlugin.nvidiaNodeSelector: nodeSelector %v", sel)
	}
	for kind, name := range map[string]string{"DaemonSet": "dynamig-device-plugin", "Deployment": "dynamig-scheduler"} {
		o := Find(objs, kind, name)
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		image := containers[0].(map[string]any)["image"].(string)
		// global.imageRegistry applies; HAMi's image keys (projecthami/hami) and imageTag do not.
		if !strings.HasPrefix(image, "registry.example.com/dynamig/") || strings.Contains(image, "v2.10.0") {
			t.Errorf("%s image %q", name, image)
		}
		secrets, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "imagePullSecrets")
		if len(secrets) != 1 || secrets[0].(map[string]any)["name"] != "regcred" {
			t.Errorf("%s imagePullSecrets %v", name, secrets)
		}
	}
	dep := Find(objs, "Deployment", "dynamig-scheduler")
	if r, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); fmt.Sprint(r) != "1" {
		t.Errorf("scheduler.replicas: %v", r)
	}
	if Find(objs, "PodDisruptionBudget", "dynamig-scheduler") != nil {
		t.Error("a PodDisruptionBudget for one scheduler replica would block every drain")
	}
	for name, want := range map[string]int64{"dynamig-scheduler": 31993, "dynamig-device-plugin": 31992} {
		ports, _, _ := unstructured.NestedSlice(Find(objs, "Service", name).Object, "spec", "ports")
		if got := ports[0].(map[string]any)["nodePort"]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Service %s nodePort %v, want %d", name, got, want)
		}
	}

	// The webhook and the policies follow schedulerName and the admission settings.
	wh := Find(objs, "Deployment", "dynamig-webhook")
	containers, _, _ := unstructured.NestedSlice(wh.Object, "spec", "template", "spec", "containers")
	webhookArgs, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !contains(webhookArgs, "--scheduler-name=hami-scheduler") {
		t.Errorf("webhook args %v", webhookArgs)
	}
	mwc := Find(objs, "MutatingWebhookConfiguration", "dynamig-webhook")
	hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
	hook := hooks[0].(map[string]any)
	if hook["failurePolicy"] != "Ignore" || hook["reinvocationPolicy"] != "Never" {
		t.Errorf("admissionWebhook failurePolicy/reinvocationPolicy: %v/%v", hook["failurePolicy"], hook["reinvocationPolicy"])
	}
	if raw, _ := yaml.Marshal(hook["namespaceSelector"]); !strings.Contains(string(raw), "kube-system") {
		t.Errorf("whitelistNamespaces not in the namespaceSelector:\n%s", raw)
	}
	vap := Find(objs, "ValidatingAdmissionPolicy", "dynamig-gpu-pods")
	if raw, _ := yaml.Marshal(vap.Object); !strings.Contains(string(raw), "== 'hami-scheduler'") {
		t.Errorf("dynamig-gpu-pods does not require hami-scheduler:\n%s", raw)
	}
}

// mountsDeviceConfig is whether the workload's first container reads the device config
// (--config) from a volume of the ConfigMap dynamig-device-config.
func mountsDeviceConfig(o *unstructured.Unstructured) bool {
	volumes, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
	for _, v := range volumes {
		name, _, _ := unstructured.NestedString(v.(map[string]any), "name")
		cm, _, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name")
		if cm != "dynamig-device-config" {
			continue
		}
		for _, m := range mounts {
			mn, _, _ := unstructured.NestedString(m.(map[string]any), "name")
			path, _, _ := unstructured.NestedString(m.(map[string]any), "mountPath")
			if mn == name && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--config="+path+"/") }) {
				return true
			}
		}
	}
	return false
}

// TestRenderRefusesNvcdiOnRootDriver: nvcdi needs the driver mounted at its host path, which
// "/" cannot be.
func TestRenderRefusesNvcdiOnRootDriver(t *testing.T) {
	_, err := Render(Namespace, map[string]any{"devicePlugin": map[string]any{"deviceEdits": "nvcdi", "driverRoot": "/"}})
	if err == nil || !strings.Contains(err.Error(), "devicePlugin.driverRoot") {
		t.Fatalf("want an error naming devicePlugin.driverRoot, got %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestPercentageOfNodesToScore renders scheduler.percentageOfNodesToScore into the
// KubeSchedulerConfiguration only when it is set, so kube-scheduler's adaptive default holds
// otherwise.
func TestPercentageOfNodesToScore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   any // nil: not rendered
	}{
		{name: "default", values: nil, want: nil},
		{name: "every node", values: map[string]any{"scheduler": map[string]any{"percentageOfNodesToScore": 100}}, want: float64(100)},
		{name: "ten percent", values: map[string]any{"scheduler": map[string]any{"percentageOfNodesToScore": 10}}, want: float64(10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := ConfigMapData(render(t, tc.values), "dynamig-scheduler-config", "config.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := yaml.Unmarshal([]byte(raw), &doc); err != nil {
				t.Fatalf("config.yaml: %v\n%s", err, raw)
			}
			got, ok := doc["percentageOfNodesToScore"]
			if tc.want == nil {
				if ok {
					t.Fatalf("percentageOfNodesToScore rendered as %v without the value", got)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("percentageOfNodesToScore = %v (%T), want %v\n%s", got, got, tc.want, raw)
			}
		})
	}
}

// TestRuntimeSockets: the device plugin asks the runtime sockets devicePlugin.runtimeSockets
// lists at the path its container sees them (the host's /run at /host/run, following the
// host's mounts), and nothing is mounted when the list is empty; a socket outside /run is
// refused, naming the field and the value.
func TestRuntimeSockets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sockets any // nil: the chart's default
		want    string
	}{
		{"default", nil, "unix:///host/run/containerd/containerd.sock,unix:///host/run/crio/crio.sock,unix:///host/run/k3s/containerd/containerd.sock"},
		{"var run", []any{"/var/run/containerd/containerd.sock"}, "unix:///host/run/containerd/containerd.sock"},
		{"off", []any{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := map[string]any{}
			if tc.sockets != nil {
				values["devicePlugin"] = map[string]any{"runtimeSockets": tc.sockets}
			}
			ds := Find(render(t, values), "DaemonSet", "dynamig-device-plugin")
			if ds == nil {
				t.Fatal("no DaemonSet dynamig-device-plugin")
			}
			pod, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
			c := pod["containers"].([]any)[0].(map[string]any)
			var args []string
			for _, a := range c["args"].([]any) {
				args = append(args, a.(string))
			}
			if !contains(args, "--runtime-endpoints="+tc.want) {
				t.Errorf("args %v, want --runtime-endpoints=%s", args, tc.want)
			}
			var mount map[string]any
			for _, m := range c["volumeMounts"].([]any) {
				if m := m.(map[string]any); m["name"] == "host-run" {
					mount = m
				}
			}
			var hostPath any
			for _, v := range pod["volumes"].([]any) {
				if v := v.(map[string]any); v["name"] == "host-run" {
					hostPath = v["hostPath"]
				}
			}
			if tc.want == "" {
				if mount != nil || hostPath != nil {
					t.Errorf("the check is off, yet the host's /run is mounted: %v %v", mount, hostPath)
				}
				return
			}
			if mount["mountPath"] != "/host/run" || mount["readOnly"] != true || mount["mountPropagation"] != "HostToContainer" {
				t.Errorf("host-run mount %v, want /host/run read-only, HostToContainer", mount)
			}
			if hp, _ := hostPath.(map[string]any); hp["path"] != "/run" || hp["type"] != "Directory" {
				t.Errorf("host-run volume %v, want hostPath /run (Directory)", hostPath)
			}
		})
	}
	_, err := Render(Namespace, map[string]any{"devicePlugin": map[string]any{"runtimeSockets": []any{"/opt/containerd.sock"}}})
	if err == nil || !strings.Contains(err.Error(), "devicePlugin.runtimeSockets") || !strings.Contains(err.Error(), "/opt/containerd.sock") {
		t.Fatalf("want an error naming devicePlugin.runtimeSockets and /opt/containerd.sock, got %v", err)
	}
}

// TestBatchingProfile: the dynamig-scheduler profile sets PodTopologySpread's defaultingType
// and InterPodAffinity's ignorePreferredTermsOfExistingPods from the values (List and true
// by default, so GPU pods can be batched), and a defaultingType other than List or System
// fails the render naming the value.
func TestBatchingProfile(t *testing.T) {
	for _, tc := range []struct {
		name       string
		values     map[string]any
		defaulting string
		ignore     bool
	}{
		{name: "default", defaulting: "List", ignore: true},
		{name: "system defaults back", values: map[string]any{"scheduler": map[string]any{"podTopologySpreadDefaulting": "System", "ignorePreferredTermsOfExistingPods": false}},
			defaulting: "System", ignore: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := ConfigMapData(render(t, tc.values), "dynamig-scheduler-config", "config.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Profiles []struct {
					PluginConfig []struct {
						Name string         `json:"name"`
						Args map[string]any `json:"args"`
					} `json:"pluginConfig"`
				} `json:"profiles"`
			}
			if err := yaml.Unmarshal([]byte(raw), &doc); err != nil {
				t.Fatalf("config.yaml: %v\n%s", err, raw)
			}
			args := map[string]map[string]any{}
			for _, pc := range doc.Profiles[0].PluginConfig {
				args[pc.Name] = pc.Args
			}
			if got := args["PodTopologySpread"]["defaultingType"]; got != tc.defaulting {
				t.Errorf("PodTopologySpread defaultingType = %v, want %s", got, tc.defaulting)
			}
			if got := args["InterPodAffinity"]["ignorePreferredTermsOfExistingPods"]; got != tc.ignore {
				t.Errorf("InterPodAffinity ignorePreferredTermsOfExistingPods = %v, want %v", got, tc.ignore)
			}
		})
	}
	_, err := Render("dynamig-system", map[string]any{"scheduler": map[string]any{"podTopologySpreadDefaulting": "Spread"}})
	if err == nil || !strings.Contains(err.Error(), `scheduler.podTopologySpreadDefaulting: "Spread"`) {
		t.Errorf("defaultingType Spread: %v, want an error naming the value", err)
	}
}
