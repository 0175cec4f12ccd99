package manifests

import (
	"bytes"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dynamig/dynamig/k8s"
)

// TestSchedulerImagePerMinor installs the chart as `helm template --kube-version V` does
// (Helm's own install action, client only) for clusters of every minor around the matrix: a
// supported minor gets the scheduler image built for it, any other is refused with the range
// of supported minors; the device plugin's and webhook's images are one each.
func TestSchedulerImagePerMinor(t *testing.T) {
	chrt, err := Chart()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kube, image string // image "": refused
	}{
		{"v1.34.4", ""},
		{"v1.35.0", "dynamig/dynamig-scheduler:0.1.0-k8s1.35"},
		{"v1.36.3", "dynamig/dynamig-scheduler:0.1.0-k8s1.36"},
		{"v1.37.2", "dynamig/dynamig-scheduler:0.1.0-k8s1.37"},
		{"v1.37.2-gke.100", "dynamig/dynamig-scheduler:0.1.0-k8s1.37"},
		{"v1.38.0", ""},
		{"v1.39.0", ""},
	} {
		kv, err := chartutil.ParseKubeVersion(tc.kube)
		if err != nil {
			t.Fatal(err)
		}
		install := action.NewInstall(&action.Configuration{})
		install.DryRun, install.ClientOnly, install.Replace = true, true, true
		install.KubeVersion, install.ReleaseName, install.Namespace = kv, ReleaseName, Namespace
		rel, err := install.Run(chrt, map[string]any{})
		if tc.image == "" {
			if err == nil || !strings.Contains(err.Error(), `chart requires kubeVersion: >=1.35.0-0 <1.38.0-0 which is incompatible with Kubernetes `+tc.kube) {
				t.Errorf("%s: %v, want refused naming the supported range", tc.kube, err)
			}
			if _, ours := RenderFor(tc.kube, Namespace, nil); ours == nil || err == nil || ours.Error() != err.Error() {
				t.Errorf("%s: RenderFor says %v, Helm %v", tc.kube, ours, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.kube, err)
		}
		objs, err := Objects([]byte(rel.Manifest))
		if err != nil {
			t.Fatal(err)
		}
		images := map[string]string{}
		for _, name := range []string{"dynamig-scheduler", "dynamig-webhook", "dynamig-device-plugin"} {
			kind := "Deployment"
			if name == "dynamig-device-plugin" {
				kind = "DaemonSet"
			}
			o := Find(objs, kind, name)
			if o == nil {
				t.Fatalf("%s: no %s %s", tc.kube, kind, name)
			}
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			images[name] = cs[0].(map[string]any)["image"].(string)
		}
		if images["dynamig-scheduler"] != tc.image {
			t.Errorf("%s: scheduler image %s, want %s", tc.kube, images["dynamig-scheduler"], tc.image)
		}
		if images["dynamig-webhook"] != "dynamig/dynamig-webhook:0.1.0" || images["dynamig-device-plugin"] != "dynamig/dynamig-device-plugin:0.1.0" {
			t.Errorf("%s: images %v: the webhook's and device plugin's are one for every minor", tc.kube, images)
		}
	}
}

// TestInstallYAMLPerMinor: install.yaml is rendered for the newest supported minor, and for
// every other supported minor the chart renders the same manifest but for the scheduler
// image's tag, as docs/operations.md tells users to change it.
func TestInstallYAMLPerMinor(t *testing.T) {
	ms, err := k8s.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	newest := k8s.Newest(ms)
	if KubeVersion() != "v"+newest.Minor+".0" {
		t.Errorf("install.yaml is rendered for %s, want the newest supported minor %s", KubeVersion(), newest.Minor)
	}
	want, err := RenderFor(KubeVersion(), Namespace, InstallValues())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Status != k8s.Supported {
			continue
		}
		got, err := RenderFor("v"+m.Minor+".0", Namespace, InstallValues())
		if err != nil {
			t.Fatalf("%s: %v", m.Minor, err)
		}
		got = bytes.ReplaceAll(got, []byte("-k8s"+m.Minor), []byte("-k8s"+newest.Minor))
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the manifest differs from install.yaml's in more than the scheduler image's minor", m.Minor)
		}
	}
}
