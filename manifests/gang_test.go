package manifests

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// podGroupAPI is what Helm's capabilities hold where the cluster serves the Workload API's
// PodGroups (discovery, or `helm template --api-versions`).
const podGroupAPI = "scheduling.k8s.io/v1beta1/PodGroup"

// TestGangScheduling: scheduler.gangScheduling turns the scheduler's GenericWorkload gate on
// where the cluster serves PodGroups (auto), always from 1.37 (true), or never (false); true
// before 1.37 and values other than these three are refused, naming the value.
func TestGangScheduling(t *testing.T) {
	for _, tc := range []struct {
		kube, value string
		served      bool
		want        bool   // the scheduler gets --feature-gates=GenericWorkload=true
		refused     string // part of the error, "" for none
	}{
		{kube: "v1.37.2", value: "auto", served: false, want: false},
		{kube: "v1.37.2", value: "auto", served: true, want: true},
		{kube: "v1.36.3", value: "auto", served: true, want: false},
		{kube: "v1.35.0", value: "auto", served: false, want: false},
		{kube: "v1.37.2", value: "true", served: false, want: true},
		{kube: "v1.37.2", value: "false", served: true, want: false},
		{kube: "v1.36.3", value: "true", refused: "scheduler.gangScheduling: true needs Kubernetes 1.37 or later, where the Workload API is beta; this cluster is v1.36.3"},
		{kube: "v1.37.2", value: "yes", refused: `scheduler.gangScheduling: "yes": must be auto, true or false`},
	} {
		var apis []string
		if tc.served {
			apis = append(apis, podGroupAPI)
		}
		values := map[string]any{"scheduler": map[string]any{"gangScheduling": tc.value}}
		if tc.value == "true" || tc.value == "false" {
			values["scheduler"] = map[string]any{"gangScheduling": tc.value == "true"} // as --set writes a bool
		}
		name := tc.kube + " " + tc.value
		rendered, err := RenderFor(tc.kube, Namespace, values, apis...)
		if tc.refused != "" {
			if err == nil || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("%s: %v, want refused with %q", name, err, tc.refused)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs, err := Objects(rendered)
		if err != nil {
			t.Fatal(err)
		}
		d := Find(objs, "Deployment", "dynamig-scheduler")
		cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		if got := slices.Contains(args, "--feature-gates=GenericWorkload=true"); got != tc.want {
			t.Errorf("%s (PodGroups served: %v): scheduler args %q, want the GenericWorkload gate %v", name, tc.served, args, tc.want)
		}
	}
}
