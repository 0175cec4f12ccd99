package manifests

import (
	"bytes"
	"fmt"
	"os"
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
	if got := cfg.Nvidia.MigProfileAllowlist; len(got) != 1 || len(got[0].Profiles) != 3 || cfg.Nvidia.DeviceSplitCount != 8 {
		t.Errorf("device-config.content not carried over: allowlist %+v, deviceSplitCount %d", got, cfg.Nvidia.DeviceSplitCount)
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
