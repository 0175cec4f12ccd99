package allocate

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/deviceplugin/metrics"
)

// instanceActions is dynamig_device_plugin_instance_actions_total{action} now.
func instanceActions(t *testing.T, action string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "dynamig_device_plugin_instance_actions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == action {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestReclaimFailureCounted: an ended pod's instance that still runs a process cannot be
// destroyed (NVML IN_USE): the reclaim fails, counted as reclaim_failed, and succeeds once
// the process is gone.
func TestReclaimFailureCounted(t *testing.T) {
	e := newEnv(t)
	if _, err := e.start(e.admit(e.pod("a", pls(at(0, 2))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	mig := e.cp.Entries()[0].MigUUID
	if err := e.sim.AddProcess(mig, 4242); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	failed, reclaimed := instanceActions(t, "reclaim_failed"), instanceActions(t, "reclaimed")
	if err := e.a.Reclaim(e.ctx); err == nil || len(e.gis()) != 1 {
		t.Fatalf("an instance running a process must stay: %v %+v", err, e.gis())
	}
	if got := instanceActions(t, "reclaim_failed"); got != failed+1 {
		t.Errorf("reclaim_failed %v, want %v", got, failed+1)
	}
	if err := e.sim.RemoveProcess(mig, 4242); err != nil {
		t.Fatal(err)
	}
	if err := e.a.Reclaim(e.ctx); err != nil || len(e.gis()) != 0 {
		t.Fatalf("the idle instance must go: %v %+v", err, e.gis())
	}
	if got := instanceActions(t, "reclaimed"); got != reclaimed+1 {
		t.Errorf("reclaimed %v, want %v", got, reclaimed+1)
	}
}
