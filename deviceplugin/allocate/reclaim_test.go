package allocate

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
	"github.com/dynamig/dynamig/deviceplugin/instances"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
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

// TestReclaimContinuesPastAFailedDestroy: two ended pods' instances on one GPU, the first
// cannot be destroyed (NVML IN_USE); the pass goes on and destroys the second, reports the
// first, and keeps its checkpoint entry for the next pass.
func TestReclaimContinuesPastAFailedDestroy(t *testing.T) {
	for _, tc := range []struct {
		name string
		// busy makes the destroy of a's instance fail with IN_USE.
		busy func(e *env, migA string) error
		pass func(e *env) error
	}{
		{"reclaim loop, a process runs",
			func(e *env, migA string) error { return e.sim.AddProcess(migA, 4242) },
			func(e *env) error { return e.a.Reclaim(e.ctx) }},
		{"restart recovery, a process starts during the pass",
			func(e *env, _ string) error {
				e.sim.FailNext(0, sim.OpDestroyComputeInstance, nvml.ErrorInUse)
				return nil
			},
			func(e *env) error { _, err := e.a.Recover(e.ctx, false); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.realise("a", at(0, 2))
			e.realise("b", at(2, 2))
			migA := e.gis()[0].ComputeInstances[0].MigUUID
			for _, name := range []string{"a", "b"} {
				if err := e.client.CoreV1().Pods("default").Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.busy(e, migA); err != nil {
				t.Fatal(err)
			}
			err := tc.pass(e)
			if err == nil || !strings.Contains(err.Error(), "ERROR_IN_USE") {
				t.Errorf("the pass must report a's failed destroy: %v", err)
			}
			if gis := e.gis(); len(gis) != 1 || gis[0].Placement != at(0, 2) {
				t.Errorf("b's instance must be destroyed in the same pass, a's kept: %+v", gis)
			}
			if cp := e.cp.Entries(); len(cp) != 1 || cp[0].PodName != "a" {
				t.Errorf("a's entry must stay for the next pass, b's go: %+v", cp)
			}
		})
	}
}

// TestIntentNeverTakesAnotherPodsInstance: pod a's intent outlived its create (the create
// failed and the intent could not be removed), a ended, and pod b's instance, recorded
// under b's own entry, now sits at the same placement. Ownership is pod UID, container and
// device, never placement alone: nothing done for a's intent destroys b's instance.
func TestIntentNeverTakesAnotherPodsInstance(t *testing.T) {
	reclaimPass := func(e *env) error { return e.a.Reclaim(e.ctx) }
	recoverPass := func(e *env) error { _, err := e.a.Recover(e.ctx, false); return err }
	for _, tc := range []struct {
		name string
		// unrealised: b's result is recorded but not yet written back to b (the plugin died
		// in between), so no reservation names b's instance.
		unrealised bool
		// lost: b's entry is not in the checkpoint, only b's reservation names its instance.
		lost bool
		pass func(e *env) error
		// forgotten: the pass forgets a's stale intent.
		forgotten bool
	}{
		{"reclaim loop", false, false, reclaimPass, true},
		{"reclaim loop, b's entry lost", false, true, reclaimPass, true},
		{"restart recovery", false, false, recoverPass, true},
		{"restart recovery before b's write-back", true, false, recoverPass, true},
		{"a start whose reservation overlaps b's", false, false, func(e *env) error {
			if _, err := e.start(e.admit(e.pod("c", pls(at(0, 2))), "c0", 1)); err == nil || !strings.Contains(err.Error(), "double-book") {
				return fmt.Errorf("c must lose to running b: %v", err)
			}
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			a := e.pod("a", pls(at(0, 2)))
			stale := checkpoint.Entry{Key: checkpoint.Key{PodUID: string(a.UID)}, PodNamespace: "default", PodName: "a",
				GPUUUID: e.gpu, Profile: "2g.10gb", Placement: at(0, 2), State: checkpoint.Intent}
			if err := e.cp.Put(stale); err != nil {
				t.Fatal(err)
			}
			if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			b := e.realise("b", at(0, 2))
			migB := e.gis()[0].ComputeInstances[0].MigUUID
			if tc.unrealised {
				got := e.get("b")
				recs, _ := api.DecodeMigReservations(got.Annotations[api.MigReservationsAnnotation])
				recs[0].MigUUID, recs[0].GPUInstanceID, recs[0].ComputeInstanceID = "", nil, nil
				raw, _ := api.EncodeMigReservations(recs)
				got.Annotations[api.MigReservationsAnnotation] = raw
				if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, got, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lost {
				if err := e.cp.Remove(checkpoint.Key{PodUID: string(b.UID)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.pass(e); err != nil {
				t.Error(err)
			}
			if gis := e.gis(); len(gis) != 1 || gis[0].ComputeInstances[0].MigUUID != migB {
				t.Errorf("b's instance %s must stay: %+v", migB, gis)
			}
			if got, ok := e.cp.Get(checkpoint.Key{PodUID: string(b.UID)}); !tc.lost && (!ok || got.MigUUID != migB) {
				t.Errorf("b's entry must stay: %+v", got)
			}
			if _, kept := e.cp.Get(stale.Key); kept == tc.forgotten {
				t.Errorf("a's stale intent kept %v, want %v", kept, !tc.forgotten)
			}
		})
	}
}

// TestReclaimKeepsALostGPUsInstances: a pod ends while its GPU is off the bus (every NVML
// call on it fails). Reclaim cannot see the instance and must not forget it: the
// checkpoint keeps the entry, and once the GPU is back the instance is destroyed. (Found by
// the soak: the entry was dropped as "gone", and the instance, back with its GPU, belonged
// to no one.)
func TestReclaimKeepsALostGPUsInstances(t *testing.T) {
	e := newEnv(t)
	if _, err := e.start(e.admit(e.pod("a", pls(at(0, 2))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.sim.LoseGPU(0)
	if err := e.a.Reclaim(e.ctx); err == nil {
		t.Error("reclaim on a lost GPU reported nothing")
	}
	if n := len(e.cp.Entries()); n != 1 {
		t.Fatalf("%d checkpoint entries after reclaim on a lost GPU, want the pod's 1", n)
	}
	e.sim.RecoverGPU(0)
	if err := e.a.Reclaim(e.ctx); err != nil || len(e.gis()) != 0 || len(e.cp.Entries()) != 0 {
		t.Fatalf("with the GPU back the instance must go: %v, instances %+v, entries %+v", err, e.gis(), e.cp.Entries())
	}
}

// TestHalfDestroyedInstanceIsDestroyedNotForgotten: reclaim destroys an ended pod's compute
// instance and then fails on its GPU instance. The GPU instance left without its compute
// instance is still the entry's own: the next pass destroys it and only then forgets the
// entry, and the next pod reserved at that placement gets it.
func TestHalfDestroyedInstanceIsDestroyedNotForgotten(t *testing.T) {
	e := newEnv(t)
	e.realise("a", at(0, 2))
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.sim.FailNext(0, sim.OpDestroyGpuInstance, nvml.ErrorUnknown)
	if err := e.a.Reclaim(e.ctx); err == nil {
		t.Fatal("the failed GPU instance destroy must be reported")
	}
	if gis := e.gis(); len(gis) != 1 || len(gis[0].ComputeInstances) != 0 || len(e.cp.Entries()) != 1 {
		t.Fatalf("want a's GPU instance without its compute instance, and a's entry: %+v %+v", gis, e.cp.Entries())
	}
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	if gis := e.gis(); len(gis) != 0 || len(e.cp.Entries()) != 0 {
		t.Fatalf("the next pass must destroy what is left, then forget the entry: %+v %+v", gis, e.cp.Entries())
	}
	if _, err := e.start(e.admit(e.pod("b", pls(at(0, 2))), "c0", 1)); err != nil || e.gaveUp("b") {
		t.Fatalf("the next pod at the placement: %v", err)
	}
}

// TestHalfUndoneInstanceIsRedone: a container's second device cannot be made, and the
// rollback of its first fails half way (compute instance gone, GPU instance kept). The
// kubelet's retry finds the entry's own half instance, destroys it and makes the container's
// devices; the pod is never called a victim of someone else's instance.
func TestHalfUndoneInstanceIsRedone(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2), at(2, 2))), "c0", 2)
	creates := 0
	mgr, err := instances.New(hookedNVML{Interface: e.sim, hook: func() {
		if creates++; creates == 2 { // the second device's GPU instance cannot be made, nor the first's rolled back
			e.sim.FailNext(0, sim.OpCreateGpuInstance, nvml.ErrorInsufficientRes)
			e.sim.FailNext(0, sim.OpDestroyGpuInstance, nvml.ErrorUnknown)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.a.opts.Instances = mgr
	if _, err := e.start(ids); err == nil {
		t.Fatal("the second device's create must fail")
	}
	if gis := e.gis(); len(gis) != 1 || len(gis[0].ComputeInstances) != 0 || len(e.cp.Entries()) != 1 {
		t.Fatalf("want the first device's GPU instance without its compute instance, and its entry: %+v %+v", gis, e.cp.Entries())
	}
	if _, err := e.start(ids); err != nil || e.gaveUp("p") {
		t.Fatalf("the retry must redo the container's devices: %v (evicted %v)", err, e.gaveUp("p"))
	}
	if gis := e.gis(); len(gis) != 2 || len(gis[0].ComputeInstances) != 1 || len(gis[1].ComputeInstances) != 1 {
		t.Errorf("instances: %+v", gis)
	}
}

// TestFailedCreateWhoseRollbackFails: the compute instance cannot be made and the rollback
// of its GPU instance fails too. What is left is the intent's, which stays recorded: the
// kubelet's retry clears it and makes the instance; a pod that ends before its retry has it
// reclaimed. Never an instance no entry accounts for (found by the soak).
func TestFailedCreateWhoseRollbackFails(t *testing.T) {
	for _, retried := range []bool{true, false} {
		t.Run(map[bool]string{true: "retried", false: "pod deleted"}[retried], func(t *testing.T) {
			e := newEnv(t)
			ids := e.admit(e.pod("p", pls(at(4, 4))), "c0", 1)
			e.sim.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorUnknown)
			e.sim.FailNext(0, sim.OpDestroyGpuInstance, nvml.ErrorUnknown)
			if _, err := e.start(ids); err == nil || !strings.Contains(err.Error(), "rollback") {
				t.Fatalf("want the create and its rollback failing: %v", err)
			}
			if gis, entries := e.gis(), e.cp.Entries(); len(gis) != 1 || len(gis[0].ComputeInstances) != 0 || len(entries) != 1 || entries[0].State != checkpoint.Intent {
				t.Fatalf("want the GPU instance left and the intent that accounts for it: %+v %+v", gis, entries)
			}
			if e.gaveUp("p") {
				t.Fatal("a failed create is retried, not given up")
			}
			if retried {
				if _, err := e.start(ids); err != nil {
					t.Fatal(err)
				}
				if gis := e.gis(); len(gis) != 1 || len(gis[0].ComputeInstances) != 1 {
					t.Fatalf("want one complete instance: %+v", gis)
				}
				return
			}
			if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := e.a.Reclaim(e.ctx); err != nil {
				t.Fatal(err)
			}
			if gis, entries := e.gis(), e.cp.Entries(); len(gis) != 0 || len(entries) != 0 {
				t.Fatalf("reclaim must clear what the intent left: %+v %+v", gis, entries)
			}
		})
	}
}
