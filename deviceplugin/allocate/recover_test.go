package allocate

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/checkpoint"
)

// restart builds a new Allocator over the same NVML and checkpoint file, as a restarted
// plugin process would (lose=true starts from an empty checkpoint file instead).
func (e *env) restart(lose bool) {
	e.t.Helper()
	path := e.a.opts.Checkpoint.Path()
	if lose {
		path = filepath.Join(e.t.TempDir(), "fresh-checkpoint")
	}
	cp, err := checkpoint.Open(path)
	if err != nil {
		e.t.Fatal(err)
	}
	opts := e.a.opts
	opts.Checkpoint = cp
	e.cp = cp
	e.a, err = New(opts)
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) realise(name string, placements ...api.Placement) *v1.Pod {
	e.t.Helper()
	p := e.pod(name, placements)
	if _, err := e.start(e.admit(p, "c0", len(placements))); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func TestRecoverAdoptsAndReclaims(t *testing.T) {
	e := newEnv(t)
	e.realise("kept", at(0, 2))
	e.realise("ended", at(2, 2))
	e.realise("busy", at(4, 2))
	busy := e.sim.Snapshot()[0].GpuInstances[2].ComputeInstances[0].MigUUID
	if err := e.sim.AddProcess(busy, 77); err != nil {
		t.Fatal(err)
	}
	// While the plugin is down, "ended" is deleted and "busy" finishes with a process left.
	e.client.CoreV1().Pods("default").Delete(e.ctx, "ended", metav1.DeleteOptions{})
	b := e.get("busy")
	b.Status.Phase = v1.PodFailed
	e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, b, metav1.UpdateOptions{})
	e.restart(false)
	rep, err := e.a.Recover(e.ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Adopted) != 1 || len(rep.Reclaimed) != 1 || len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0], "processes") {
		t.Fatalf("report: %+v", rep)
	}
	var left []api.Placement
	for _, gi := range e.gis() {
		left = append(left, gi.Placement)
	}
	if len(left) != 2 || left[0] != at(0, 2) || left[1] != at(4, 2) {
		t.Errorf("left: %v", left)
	}
}

func TestRecoverUnknownAndLegacy(t *testing.T) {
	e := newEnv(t)
	dev, _ := e.sim.DeviceByIndex(0)
	if _, err := dev.CreateGpuInstanceWithPlacement(19, at(6, 1)); err != nil {
		t.Fatal(err)
	}
	rep, err := e.a.Recover(e.ctx, false)
	if err != nil || len(rep.Unknown) != 1 || len(e.gis()) != 1 {
		t.Fatalf("unknown instances are reported and left: %+v %v", rep, err)
	}
	// A HAMi template/slot identity on this GPU protects it even with the operator flag.
	legacy := e.pod("legacy")
	legacy.Annotations[api.DevicesAllocatedAnnotation] = e.gpu + "[3-1],NVIDIA,4864,0:;"
	e.client.CoreV1().Pods("default").Update(e.ctx, legacy, metav1.UpdateOptions{})
	rep, _ = e.a.Recover(e.ctx, true)
	if len(rep.Legacy) != 1 || len(e.gis()) != 1 {
		t.Fatalf("legacy: %+v, instances %+v", rep, e.gis())
	}
	e.client.CoreV1().Pods("default").Delete(e.ctx, "legacy", metav1.DeleteOptions{})
	rep, _ = e.a.Recover(e.ctx, true)
	if len(e.gis()) != 0 {
		t.Errorf("--reclaim-unknown-instances must destroy an unknown, idle instance: %+v", rep)
	}
}

func TestRecoverWithLostCheckpointAdoptsNamedInstances(t *testing.T) {
	e := newEnv(t)
	e.realise("p", at(0, 4))
	e.restart(true)
	rep, err := e.a.Recover(e.ctx, true)
	if err != nil || len(rep.Adopted) != 1 || len(rep.Unknown) != 0 || len(e.gis()) != 1 {
		t.Fatalf("an instance a reservation names is ours: %+v %v", rep, err)
	}
	if got := e.cp.Entries(); len(got) != 1 || got[0].State != checkpoint.Created || got[0].PodName != "p" {
		t.Errorf("checkpoint rebuilt: %+v", got)
	}
}

// TestCrashBetweenCreateAndPatchIsRepaired: the instance was made and recorded, then the
// plugin died before writing the pod; the restarted plugin adopts it and the kubelet's retry
// writes the same identity instead of making another instance.
func TestCrashBetweenCreateAndPatchIsRepaired(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
	e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("plugin killed")
	})
	if _, err := e.start(ids); err == nil {
		t.Fatal("the write-back was supposed to fail")
	}
	e.client.ReactionChain = e.client.ReactionChain[1:]
	made := e.gis()[0].ComputeInstances[0].MigUUID
	e.restart(false)
	rep, err := e.a.Recover(e.ctx, false)
	if err != nil || len(rep.Adopted) != 1 {
		t.Fatalf("recover: %+v %v", rep, err)
	}
	if _, err := e.start(ids); err != nil {
		t.Fatal(err)
	}
	recs, _ := api.DecodeMigReservations(e.get("p").Annotations[api.MigReservationsAnnotation])
	if len(e.gis()) != 1 || recs[0].MigUUID != made {
		t.Errorf("repair must reuse %s: %+v, %+v", made, recs, e.gis())
	}
}

func TestRecoverRollsBackHalfMadeAndSkipsWhenAPIUnreadable(t *testing.T) {
	e := newEnv(t)
	p := e.pod("p", pls(at(4, 4)))
	key := checkpoint.Key{PodUID: string(p.UID)}
	e.cp.Put(checkpoint.Entry{Key: key, PodNamespace: "default", PodName: "p", GPUUUID: e.gpu, Profile: "3g.20gb", Placement: at(4, 4), State: checkpoint.Intent})
	dev, _ := e.sim.DeviceByIndex(0)
	dev.CreateGpuInstanceWithPlacement(9, at(4, 4))
	// The API cannot be listed: nothing is destroyed, only reported.
	e.client.PrependReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unreachable")
	})
	if _, err := e.a.Recover(e.ctx, true); err == nil {
		t.Error("Recover must say it could not read the pods")
	}
	if len(e.gis()) != 1 {
		t.Fatalf("an unreadable API destroyed something")
	}
	e.client.ReactionChain = e.client.ReactionChain[1:]
	rep, err := e.a.Recover(e.ctx, false)
	if err != nil || len(rep.RolledBack) != 1 || len(e.gis()) != 0 || len(e.cp.Entries()) != 0 {
		t.Errorf("half-made instance: %+v %v %+v", rep, err, e.gis())
	}
}
