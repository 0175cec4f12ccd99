package manifests

import (
	"encoding/json"
	"os"
	"testing"
)

// The dashboard as the chart ships it; test/metrics checks its queries against the metrics.
const dashboardFile = "charts/dynamig/dashboards/dynamig.json"

// TestGrafanaDashboard checks that the dashboard ConfigMap is rendered only when enabled,
// with the sidecar's label and the namespace and annotations asked for, and that it holds
// the dashboard file as it is.
func TestGrafanaDashboard(t *testing.T) {
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(want, &dashboard); err != nil || dashboard.UID == "" || len(dashboard.Panels) == 0 {
		t.Fatalf("%s is not a Grafana dashboard (uid %q, %d panels): %v", dashboardFile, dashboard.UID, len(dashboard.Panels), err)
	}
	const name = "dynamig-grafana-dashboard"
	if o := Find(render(t, InstallValues()), "ConfigMap", name); o != nil {
		t.Errorf("ConfigMap %s rendered by default", name)
	}
	for _, tc := range []struct {
		name                         string
		values                       map[string]any
		label, labelValue, namespace string
		annotation, annotationValue  string
	}{
		{name: "defaults", values: map[string]any{"enabled": true},
			label: "grafana_dashboard", labelValue: "1", namespace: Namespace},
		{name: "options", values: map[string]any{"enabled": true, "label": "grafana.com/dashboard", "labelValue": "dynamig",
			"namespace": "monitoring", "annotations": map[string]any{"k8s-sidecar-target-directory": "GPU"}},
			label: "grafana.com/dashboard", labelValue: "dynamig", namespace: "monitoring",
			annotation: "k8s-sidecar-target-directory", annotationValue: "GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, map[string]any{"grafana": map[string]any{"dashboards": tc.values}})
			cm := Find(objs, "ConfigMap", name)
			if cm == nil {
				t.Fatalf("no ConfigMap %s", name)
			}
			if got := cm.GetLabels()[tc.label]; got != tc.labelValue {
				t.Errorf("label %s = %q, want %q", tc.label, got, tc.labelValue)
			}
			if cm.GetNamespace() != tc.namespace {
				t.Errorf("namespace %q, want %q", cm.GetNamespace(), tc.namespace)
			}
			if tc.annotation != "" && cm.GetAnnotations()[tc.annotation] != tc.annotationValue {
				t.Errorf("annotations %v, want %s: %s", cm.GetAnnotations(), tc.annotation, tc.annotationValue)
			}
			got, err := ConfigMapData(objs, name, "dynamig.json")
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("the ConfigMap's dynamig.json differs from %s", dashboardFile)
			}
		})
	}
}
