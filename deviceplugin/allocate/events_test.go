package allocate

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/runtimecdi"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/sim"
)

// drain returns the events recorded since the last drain, as FakeRecorder writes them:
// "<type> <reason> <message>".
func (e *env) drain() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// wantEvent is an event that starts with "<type> <reason> " and contains every part.
type wantEvent struct {
	typeReason string
	parts      []string
}

// expectEvents checks that exactly the wanted events were recorded, in order.
func expectEvents(t *testing.T, got []string, want ...wantEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %q", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w.typeReason+" ") {
			t.Errorf("event %d %q is not a %s", i, got[i], w.typeReason)
		}
		for _, part := range w.parts {
			if !strings.Contains(got[i], part) {
				t.Errorf("event %d %q does not say %q", i, got[i], part)
			}
		}
	}
}

type failingEdits struct{}

func (failingEdits) Edits([]string) (specs.ContainerEdits, error) {
	return specs.ContainerEdits{}, errors.New("no CDI device spec for the MIG device")
}

// TestRefusalEvents: every refusal and failure of PreStartContainer whose pod is known gets
// exactly one Warning on the pod naming the container, the device where there is one, and
// the cause; retried ones say the kubelet retries, final ones that the pod is evicted. Before
// the pod is known there is no event.
func TestRefusalEvents(t *testing.T) {
	retried := "; the kubelet will retry"
	for _, tc := range []struct {
		name string
		// setup returns the device IDs of the PreStartContainer call under test.
		setup func(e *env) []string
		want  []wantEvent
	}{
		{"devices no container holds", func(e *env) []string { return []string{e.gpu + "::9"} }, nil},
		{"a container the pod does not have", func(e *env) []string {
			return e.admit(e.pod("p", pls(at(0, 2))), "ghost", 1)
		}, nil},
		{"unsigned", func(e *env) []string {
			ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
			p := e.get("p")
			delete(p.Annotations, api.ReservationSignatureAnnotation)
			e.client.CoreV1().Pods("default").Update(e.ctx, p, metav1.UpdateOptions{})
			return ids
		}, []wantEvent{{"Warning " + ReasonUnrealisable, []string{`Evicting: container "c0": pod default/p carries no dynamig.io/reservation-signature`}}}},
		{"more devices than reservations", func(e *env) []string {
			return e.admit(e.pod("p", pls(at(0, 2))), "c0", 2)
		}, []wantEvent{{"Warning " + ReasonUnrealisable, []string{`Evicting: container "c0": pod default/p container 0 has 1 MIG reservations but the kubelet gave it 2 devices`}}}},
		{"illegal placement", func(e *env) []string {
			return e.admit(e.pod("p", pls(at(1, 2))), "c0", 1)
		}, []wantEvent{{"Warning " + ReasonUnrealisable, []string{`Evicting: container "c0" device 0 (2g.10gb at [1,3) on GPU-`, "placement [1,3) is not legal for 2g.10gb"}}}},
		{"instance dynamig did not create", func(e *env) []string {
			dev, _ := e.sim.DeviceByIndex(0)
			if _, err := dev.CreateGpuInstanceWithPlacement(14, at(2, 2)); err != nil {
				t.Fatal(err)
			}
			return e.admit(e.pod("p", pls(at(0, 2), at(2, 2))), "c0", 2)
		}, []wantEvent{{"Warning " + ReasonUnrealisable, []string{`Evicting: container "c0" device 1 (2g.10gb at [2,4) on GPU-`, "which dynamig did not create"}}}},
		{"compute instance create fails", func(e *env) []string {
			e.sim.FailNext(0, sim.OpCreateComputeInstance, nvml.ErrorUnknown)
			return e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
		}, []wantEvent{{"Warning " + ReasonRealisationFailed, []string{`container "c0" device 0 (2g.10gb at [0,2) on GPU-`, "creating the compute instance", retried}}}},
		{"placement held by a pod going away", func(e *env) []string {
			if _, err := e.start(e.admit(e.pod("victim", pls(at(0, 8))), "c0", 1)); err != nil {
				t.Fatal(err)
			}
			v := e.get("victim")
			v.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), v, "default")
			return e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
		}, []wantEvent{{"Warning " + ReasonPlacementBusy, []string{`container "c0" device 0 (2g.10gb at [0,2) on GPU-`, "still held by the instance of pod default/victim, which is going away" + retried}}}},
		{"write-back fails", func(e *env) []string {
			e.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("connection reset")
			})
			return e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
		}, []wantEvent{{"Warning " + ReasonRealisationFailed, []string{`container "c0": writing to pod default/p: connection reset` + retried}}}},
		{"CDI edits fail", func(e *env) []string {
			e.a.opts.DeviceEdits = failingEdits{}
			return e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
		}, []wantEvent{{"Warning " + ReasonRealisationFailed, []string{`container "c0": no CDI device spec for the MIG device` + retried}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ids := tc.setup(e)
			e.drain()
			if err := e.a.PreStartContainer(e.ctx, ids); err == nil {
				t.Fatal("PreStartContainer was supposed to fail")
			}
			expectEvents(t, e.drain(), tc.want...)
		})
	}
}

// TestRealisedAndAdoptedEvents: a container's first start says which MIG instance each
// device got; a restart that adopts them says so; after a reboot they are realised again.
func TestRealisedAndAdoptedEvents(t *testing.T) {
	e := newEnv(t)
	ids := e.admit(e.pod("p", pls(at(0, 2), at(4, 4))), "c0", 2)
	for _, step := range []struct {
		name, want string
		before     func()
	}{
		{"first start", "Normal " + ReasonRealised, func() {}},
		{"container restart", "Normal " + ReasonAdopted, func() {}},
		{"reboot", "Normal " + ReasonRealised, func() {
			list, _ := e.mgr.List(e.gpu)
			for _, in := range list {
				if err := e.mgr.Destroy(e.ctx, e.gpu, in.GPUInstanceID); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		step.before()
		if _, err := e.start(ids); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		recs, _ := api.DecodeMigReservations(e.get("p").Annotations[api.MigReservationsAnnotation])
		var want []wantEvent
		for _, r := range recs {
			verb := "created"
			if step.want == "Normal "+ReasonAdopted {
				verb = "adopted"
			}
			want = append(want, wantEvent{step.want, []string{fmt.Sprintf(`container "c0" device %d: %s MIG instance %s (%s at %s on %s, GPU instance %d, compute instance %d)`,
				r.DeviceIndex, verb, r.MigUUID, r.Profile, r.Placement, r.GPUUUID, *r.GPUInstanceID, *r.ComputeInstanceID)}})
		}
		t.Run(step.name, func(t *testing.T) { expectEvents(t, e.drain(), want...) })
	}
}

// TestReclaimEvents: the reclaim loop, a create that reclaims an overlapping instance, and
// restart recovery each tell an ended pod that its instance was destroyed; a pod that is
// gone gets no event.
func TestReclaimEvents(t *testing.T) {
	e := newEnv(t)
	migUUID := map[string]string{}
	for i, name := range []string{"gone", "done", "overlapped", "recovered"} {
		e.realise(name, at(i, 1))
		recs, _ := api.DecodeMigReservations(e.get(name).Annotations[api.MigReservationsAnnotation])
		migUUID[name] = recs[0].MigUUID
	}
	end := func(name string, phase v1.PodPhase) {
		p := e.get(name)
		p.Status.Phase = phase
		if _, err := e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reclaimed := func(name, placement string, phase v1.PodPhase) wantEvent {
		return wantEvent{"Normal " + ReasonReclaimed, []string{fmt.Sprintf(`container "c0" device 0: destroyed MIG instance %s (1g.5gb at %s on %s, GPU instance `, migUUID[name], placement, e.gpu),
			"the pod is " + string(phase)}}
	}
	e.drain()

	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	end("done", v1.PodSucceeded)
	if err := e.a.Reclaim(e.ctx); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, e.drain(), reclaimed("done", "[1,2)", v1.PodSucceeded))

	end("overlapped", v1.PodFailed)
	if _, err := e.start(e.admit(e.pod("next", pls(at(2, 1))), "c0", 1)); err != nil {
		t.Fatal(err)
	}
	got := e.drain()
	if len(got) != 2 || !strings.HasPrefix(got[1], "Normal "+ReasonRealised) {
		t.Fatalf("want the reclaim, then next's Realised: %q", got)
	}
	expectEvents(t, got[:1], reclaimed("overlapped", "[2,3)", v1.PodFailed))

	end("recovered", v1.PodSucceeded)
	e.restart(false)
	if _, err := e.a.Recover(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, e.drain(), reclaimed("recovered", "[3,4)", v1.PodSucceeded))
}

// TestCDINotAppliedWarning: on a runtime that ignores CDI, every start of a GPU container
// gets a Warning that names the container and says it has no GPU, beside the Normal events;
// on one that applies CDI, or when nothing is known, there is none.
func TestCDINotAppliedWarning(t *testing.T) {
	for _, tc := range []struct {
		state runtimecdi.State
		warn  bool
	}{{runtimecdi.Ignores, true}, {runtimecdi.Applies, false}, {runtimecdi.Unknown, false}} {
		t.Run(string(tc.state), func(t *testing.T) {
			e := newEnv(t)
			e.a.opts.RuntimeCDI = func() runtimecdi.Verdict {
				return runtimecdi.Verdict{State: tc.state, Runtime: "containerd v1.7.22", Why: "enable_cdi = false"}
			}
			ids := e.admit(e.pod("p", pls(at(0, 2))), "c0", 1)
			if _, err := e.start(ids); err != nil {
				t.Fatal(err)
			}
			want := []wantEvent{{"Normal " + ReasonRealised, []string{`container "c0" device 0`}}}
			if tc.warn {
				want = append([]wantEvent{{"Warning " + ReasonCDINotApplied, []string{`container "c0"`, "containerd v1.7.22", "NVIDIA_VISIBLE_DEVICES=void", "enable_cdi = true"}}}, want...)
			}
			expectEvents(t, e.drain(), want...)
		})
	}
}
