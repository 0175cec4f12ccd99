package sandboxtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/sandbox"
)

// GPUPod is a GPU pod for dynamig-scheduler in namespace default: devices × MiB each, in
// mode, with annotations (key, value, …).
func GPUPod(name, mode string, devices, memory int, annotations ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
		Spec: v1.PodSpec{SchedulerName: "dynamig-scheduler", Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04",
			Command: []string{"sleep", "infinity"}, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				api.ResourceCount: *resource.NewQuantity(int64(devices), resource.DecimalSI)}}}}}}
	if memory > 0 {
		p.Spec.Containers[0].Resources.Limits[api.ResourceMemory] = *resource.NewQuantity(int64(memory), resource.DecimalSI)
	}
	if mode != "" {
		p.Annotations[api.VGPUModeAnnotation] = mode
	}
	for i := 0; i+1 < len(annotations); i += 2 {
		p.Annotations[annotations[i]] = annotations[i+1]
	}
	return p
}

// Running waits until the pods run with every reservation realised, and returns them.
func (w *World) Running(names ...string) map[string][]api.MigReservation {
	w.T.Helper()
	out := map[string][]api.MigReservation{}
	w.WaitFor(strings.Join(names, ", ")+" running", 90*time.Second, func() (bool, string) {
		for _, n := range names {
			p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if p.Status.Phase != v1.PodRunning {
				return false, fmt.Sprintf("%s is %s: %s", n, p.Status.Phase, w.LastEvent(p))
			}
			if raw, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
				recs, err := api.DecodeMigReservations(raw)
				if err != nil {
					return false, err.Error()
				}
				for _, r := range recs {
					if !r.Realized() {
						return false, n + " not realised"
					}
				}
				out[n] = recs
			}
		}
		return true, ""
	})
	return out
}

// Pending asserts the pod stays unscheduled and returns its FailedScheduling message.
func (w *World) Pending(name string) string {
	w.T.Helper()
	var msg string
	w.WaitFor(name+" reported unschedulable", 30*time.Second, func() (bool, string) {
		p := w.Get(name)
		if p.Spec.NodeName != "" {
			w.T.Fatalf("%s was bound to %s", name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
				msg = c.Message
				return true, ""
			}
		}
		return false, "no PodScheduled=False yet"
	})
	return msg
}

// LastEvent is the pod's newest event: "reason <how long> ago: message".
func (w *World) LastEvent(p *v1.Pod) string {
	evs, err := w.C.CoreV1().Events(p.Namespace).List(w.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err != nil || len(evs.Items) == 0 {
		return "no events"
	}
	e := evs.Items[len(evs.Items)-1]
	at := e.LastTimestamp.Time
	if e.Series != nil {
		at = e.Series.LastObservedTime.Time
	} else if at.IsZero() {
		at = e.EventTime.Time
	}
	return fmt.Sprintf("%s %v ago: %s", e.Reason, time.Since(at).Round(time.Second), e.Message)
}

// Instances is the simulated NVML state of a node, by pod name.
func (w *World) Instances(node string) map[string][]sandbox.Instance {
	w.T.Helper()
	list, err := w.SB.Instances(node)
	if err != nil {
		w.T.Fatal(err)
	}
	out := map[string][]sandbox.Instance{}
	for _, in := range list {
		out[in.PodName] = append(out[in.PodName], in)
	}
	return out
}

// SameHardware asserts that NVML holds exactly the pods' realised reservations.
func (w *World) SameHardware(node string, recs map[string][]api.MigReservation) {
	w.T.Helper()
	hw := w.Instances(node)
	for name, rs := range recs {
		got := hw[name]
		if len(got) != len(rs) {
			w.T.Errorf("%s: %d reservations, %d instances on %s: %v", name, len(rs), len(got), node, got)
			continue
		}
		for _, r := range rs {
			if !slices.ContainsFunc(got, func(in sandbox.Instance) bool {
				return in.GPUUUID == r.GPUUUID && in.Profile == r.Profile && in.Placement == r.Placement && uint32(in.GPUInstanceID) == *r.GPUInstanceID
			}) {
				w.T.Errorf("%s: reservation %s %s on %s has no matching instance: %v", name, r.Profile, r.Placement, r.GPUUUID, got)
			}
		}
	}
}

// NoOverlap fails the test where two reservations overlap on one GPU.
func NoOverlap(t *testing.T, recs map[string][]api.MigReservation) {
	t.Helper()
	var all []api.MigReservation
	var owner []string
	for name, rs := range recs {
		for _, r := range rs {
			for i, o := range all {
				if o.GPUUUID == r.GPUUUID && o.Placement.Overlaps(r.Placement) {
					t.Errorf("%s %s overlaps %s %s on %s", name, r.Placement, owner[i], o.Placement, r.GPUUUID)
				}
			}
			all, owner = append(all, r), append(owner, name)
		}
	}
}

// Delete deletes the pods of namespace default.
func (w *World) Delete(names ...string) {
	w.T.Helper()
	for _, n := range names {
		if err := w.C.CoreV1().Pods("default").Delete(w.Ctx, n, metav1.DeleteOptions{}); err != nil {
			w.T.Fatal(err)
		}
	}
}

// Gone waits until node's NVML holds no instance of the pods.
func (w *World) Gone(node string, names ...string) {
	w.T.Helper()
	w.WaitFor("instances of "+strings.Join(names, ", ")+" reclaimed on "+node, 60*time.Second, func() (bool, string) {
		hw := w.Instances(node)
		for _, n := range names {
			if len(hw[n]) > 0 {
				return false, fmt.Sprintf("%s still has %v", n, hw[n])
			}
		}
		return true, ""
	})
}
